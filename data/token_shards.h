#pragma once
// llm.c's token shard format, so data prepared for llm.c reads here unchanged:
//
//   [256 x int32 header] [count x uint16 tokens]          all little-endian
//
// header[0] is the magic 20240520, header[1] the version (1: uint16 tokens), header[2] the token
// count; the other 253 ints are reserved (llm.c writes zeros; they are written as zeros and not
// read). A file is 1024 + 2 · count bytes, exactly.
//
// Reading trusts nothing: the header is checked against the file's size before anything is
// allocated, so a lying count cannot make the reader allocate or read more than the file holds.
// Writing is atomic (core/atomic_file.h): the file appears whole or not at all.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mt {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kLlama3ShardMagic = 20240801;  // llm.c's uint32 shards: refused by name
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// The token count of the shard at `path`, from its header, checked: a file shorter than the
// header, a wrong magic or version, a negative count, or a count that does not match the file's
// size throws mt::Error naming the file and the field.
int64_t read_token_shard_header(const std::string& path);

// All the tokens of the shard at `path`, checked as read_token_shard_header checks them.
std::vector<uint16_t> read_token_shard(const std::string& path);

// Writes `tokens` as a shard at `path`, replacing any file there only once the new one is
// complete. Throws mt::Error for more tokens than the header's int32 count can hold.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

// Throws mt::Error, "<what>: token <id> at position <i> is not below the vocabulary size <V>",
// for the first token that is not a valid id: what a shard written for a larger vocabulary, or
// a damaged one, holds.
void check_token_ids(std::span<const uint16_t> tokens, int64_t vocab_size, const std::string& what);

// Tokenizer ids as shard tokens; throws mt::Error naming the first id outside 0 .. 65535 and its
// position (a vocabulary too large for llm.c's version-1 shards).
std::vector<uint16_t> to_shard_tokens(std::span<const int32_t> ids);

}  // namespace mt
