// llm.c's token shards (data/token_shards.h): round trips, the exact bytes on disk, and a clear
// mt::Error naming the file and the field for every header that lies and every cut-off file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "data/token_shards.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::TempDir;

namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

int32_t header_int(const std::vector<char>& bytes, int k) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * k, 4);
  return v;
}

void set_header_int(std::vector<char>& bytes, int k, int32_t v) {
  std::memcpy(bytes.data() + 4 * k, &v, 4);
}

// A valid shard of `n` tokens 0, 7, 14, ... as bytes.
std::vector<char> shard_bytes(const TempDir& dir, int n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = uint16_t(7 * i);
  const std::string p = dir / "valid.bin";
  write_token_shard(p, tokens);
  return read_bytes(p);
}

}  // namespace

TEST(TokenShards, RoundTripWithLlmcLayout) {
  const TempDir dir;
  const std::vector<uint16_t> tokens = {5962, 22307, 25, 198, 0, 65535, 50256};
  const std::string path = dir / "shard.bin";
  write_token_shard(path, tokens);
  EXPECT_EQ(read_token_shard(path), tokens);
  EXPECT_EQ(read_token_shard_header(path), 7);

  // The bytes: magic, version, count, 253 zeros, then the tokens, little-endian.
  const std::vector<char> bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 7);
  for (int k = 3; k < 256; ++k) EXPECT_EQ(header_int(bytes, k), 0) << "reserved int " << k;
  EXPECT_EQ(uint8_t(bytes[1024]), 5962 & 0xFF);
  EXPECT_EQ(uint8_t(bytes[1025]), 5962 >> 8);

  write_token_shard(path, {});  // replaces the file; an empty shard is a header alone
  EXPECT_TRUE(read_token_shard(path).empty());
  EXPECT_EQ(std::filesystem::file_size(path), 1024u);
}

TEST(TokenShards, RefusesAHeaderThatLies) {
  const TempDir dir;
  const std::vector<char> good = shard_bytes(dir, 10);
  const std::string path = dir / "bad.bin";
  auto with = [&](int k, int32_t v) {
    std::vector<char> b = good;
    set_header_int(b, k, v);
    write_bytes(path, b);
  };
  auto refused = [&](std::initializer_list<std::string> parts) {
    expect_error([&] { read_token_shard(path); }, parts);
    expect_error([&] { read_token_shard_header(path); }, parts);
  };
  with(0, 20240521);
  refused({path, "not a token shard", "field 'magic' (int 0) is 20240521, expected 20240520"});
  with(1, 2);
  refused({path, "field 'version' (int 1) is 2", "only version 1 (uint16 tokens)"});
  with(0, 20240801);  // llm.c's LLaMA 3 shards (version 7, uint32 tokens)
  refused({path, "an llm.c shard of LLaMA 3 tokens (magic 20240801, uint32 tokens)",
           "only GPT-2 shards (magic 20240520, version 1, uint16 tokens) are read"});
  with(1, 0);
  refused({path, "field 'version' (int 1) is 0"});
  with(2, -5);
  refused({path, "field 'count' (int 2) is negative: -5"});
  with(2, 11);  // one more than the file holds
  refused({path, "field 'count' (int 2) says 11 tokens, a file of 1046 bytes, but the file has 1044",
           "truncated"});
  with(2, 2147483647);  // a lie the reader must not believe before it allocates
  refused({path, "says 2147483647 tokens"});
  with(2, 9);  // fewer than the file holds
  refused({path, "says 9 tokens, a file of 1042 bytes, but the file has 1044 bytes"});
}

TEST(TokenShards, RefusesATruncatedFile) {
  const TempDir dir;
  std::vector<char> bytes = shard_bytes(dir, 10);
  const std::string path = dir / "cut.bin";
  bytes.resize(1024 + 2 * 10 - 1);  // the last token cut in half
  write_bytes(path, bytes);
  expect_error([&] { read_token_shard(path); },
               {path, "says 10 tokens", "has 1043 bytes", "truncated"});
  bytes.resize(100);  // inside the header
  write_bytes(path, bytes);
  expect_error([&] { read_token_shard(path); },
               {path, "the file has 100 bytes, fewer than the 1024-byte header"});
  write_bytes(path, {});
  expect_error([&] { read_token_shard(path); }, {path, "has 0 bytes"});
  expect_error([&] { read_token_shard(dir / "missing.bin"); },
               {"missing.bin: cannot open the token shard"});
  // A FIFO named like a shard is refused at once (reading it would wait for a writer).
  const std::string fifo = dir / "fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { read_token_shard(fifo); }, {"fifo.bin: cannot open the token shard", "FIFO"});
}

// Random damage to a shard's first bytes and its length: every result is a clear mt::Error or
// a read consistent with the file.
TEST(TokenShards, RandomDamageIsRefusedOrConsistent) {
  const TempDir dir;
  const std::vector<char> good = shard_bytes(dir, 50);
  const std::string path = dir / "damaged.bin";
  std::mt19937 rng(20240520);
  int read_back = 0;
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<char> b = good;
    if (trial % 10 != 0) {  // every tenth file is left whole
      b.resize(size_t(rng() % 2 ? b.size() : rng() % (b.size() + 8)));
      for (int k = 0; k < 3; ++k)
        if (!b.empty() && rng() % 2) b[rng() % std::min<size_t>(b.size(), 12)] = char(rng() % 256);
    }
    write_bytes(path, b);
    try {
      const std::vector<uint16_t> tokens = read_token_shard(path);
      ASSERT_EQ(1024 + 2 * tokens.size(), b.size());
      ASSERT_EQ(header_int(b, 2), int32_t(tokens.size()));
      ++read_back;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  EXPECT_GE(read_back, 12);  // at least the whole files read
}

TEST(TokenShards, ChecksTokenIdsAgainstTheVocabulary) {
  const std::vector<uint16_t> tokens = {1, 50256, 50257, 3};
  EXPECT_NO_THROW(check_token_ids(tokens, 50258, "train.bin"));
  expect_error([&] { check_token_ids(tokens, 50257, "train.bin"); },
               {"train.bin: token 50257 at position 2 is not below the vocabulary size 50257"});
  expect_error([&] { check_token_ids(tokens, 256, "bytes.bin"); },
               {"token 50256 at position 1", "size 256"});
}

TEST(TokenShards, ConvertsTokenizerIdsThatFit) {
  EXPECT_EQ(to_shard_tokens(std::vector<int32_t>{0, 65535, 198}),
            (std::vector<uint16_t>{0, 65535, 198}));
  expect_error([] { to_shard_tokens(std::vector<int32_t>{1, 65536}); },
               {"id 65536 at position 1", "uint16"});
  expect_error([] { to_shard_tokens(std::vector<int32_t>{-1}); }, {"id -1 at position 0"});
}

// Writing goes through AtomicFile (its own tests cover crashes and failures): a failure names the
// shard and leaves nothing behind.
TEST(TokenShards, AFailedWriteNamesTheShard) {
  const TempDir dir;
  expect_error([&] { write_token_shard(dir / "no-such-dir/shard.bin", std::vector<uint16_t>{4}); },
               {"no-such-dir/shard.bin"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}
