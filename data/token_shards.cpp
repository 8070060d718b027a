#include "data/token_shards.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"

namespace mt {
namespace {

// The header and tokens are read and written as this machine's ints and uint16s.
static_assert(std::endian::native == std::endian::little,
              "llm.c's token shards are little-endian; this reader assumes a little-endian host");

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

struct Shard {
  File file;
  int64_t count;
};

// Opens the shard and checks its header against its size; the file is left at the first token.
Shard open_shard(const std::string& path) {
  int fd = -1;
  try {
    fd = open_regular_file(path);  // a FIFO named like a shard must not hang the run
  } catch (const Error& e) {
    MT_THROW(path, ": cannot open the token shard (", e.what(), ")");
  }
  File f(::fdopen(fd, "rb"));
  if (!f) ::close(fd);
  MT_CHECK(f, path, ": cannot open the token shard: ", std::strerror(errno));
  MT_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, path, ": cannot seek: ", std::strerror(errno));
  const long size = std::ftell(f.get());
  MT_CHECK(size >= 0, path, ": cannot tell its size: ", std::strerror(errno));
  std::rewind(f.get());

  int32_t header[kShardHeaderInts];
  MT_CHECK(size >= kShardHeaderBytes, path, ": not a token shard: the file has ", size,
           " bytes, fewer than the ", kShardHeaderBytes, "-byte header (256 int32)");
  MT_CHECK(std::fread(header, sizeof header, 1, f.get()) == 1, path, ": read error in the header: ",
           std::strerror(errno));
  MT_CHECK(header[0] != kLlama3ShardMagic, path, ": an llm.c shard of LLaMA 3 tokens (magic ",
           kLlama3ShardMagic, ", uint32 tokens); only GPT-2 shards (magic ", kShardMagic,
           ", version ", kShardVersion, ", uint16 tokens) are read");
  MT_CHECK(header[0] == kShardMagic, path, ": not a token shard: header field 'magic' (int 0) is ",
           header[0], ", expected ", kShardMagic);
  MT_CHECK(header[1] == kShardVersion, path, ": header field 'version' (int 1) is ", header[1],
           "; only version ", kShardVersion, " (uint16 tokens) is read");
  const int64_t count = header[2];
  MT_CHECK(count >= 0, path, ": header field 'count' (int 2) is negative: ", count);
  const int64_t expected = kShardHeaderBytes + 2 * count;
  MT_CHECK(expected == size, path, ": header field 'count' (int 2) says ", count,
           " tokens, a file of ", expected, " bytes, but the file has ", size, " bytes",
           size < expected ? " (truncated?)" : "");
  return {std::move(f), count};
}

}  // namespace

int64_t read_token_shard_header(const std::string& path) { return open_shard(path).count; }

std::vector<uint16_t> read_token_shard(const std::string& path) {
  Shard s = open_shard(path);
  std::vector<uint16_t> tokens(size_t(s.count));
  MT_CHECK(std::fread(tokens.data(), 2, tokens.size(), s.file.get()) == tokens.size(), path,
           ": read error in the tokens: ", std::strerror(errno));
  return tokens;
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  MT_CHECK(tokens.size() <= size_t(std::numeric_limits<int32_t>::max()), path, ": ", tokens.size(),
           " tokens are more than one shard's int32 count can hold; split them into shards");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = int32_t(tokens.size());
  AtomicFile out(path);
  out.write(header, sizeof header);
  out.write(tokens.data(), tokens.size_bytes());
  out.commit();
}

void check_token_ids(std::span<const uint16_t> tokens, int64_t vocab_size,
                     const std::string& what) {
  for (size_t i = 0; i < tokens.size(); ++i)
    MT_CHECK(tokens[i] < vocab_size, what, ": token ", tokens[i], " at position ", i,
             " is not below the vocabulary size ", vocab_size);
}

std::vector<uint16_t> to_shard_tokens(std::span<const int32_t> ids) {
  std::vector<uint16_t> tokens(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] <= 65535, "token shard: id ", ids[i], " at position ", i,
             " does not fit the shard's uint16 tokens (0 .. 65535)");
    tokens[i] = uint16_t(ids[i]);
  }
  return tokens;
}

}  // namespace mt
