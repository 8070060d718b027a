// Checkpoint (safetensors) and dataset (IDX, CSV) file formats: round trips, the exact bytes on
// disk, and a clear mt::Error, never a crash, for every kind of damaged file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/csv.h"
#include "data/data.h"
#include "data/idx.h"
#include "tests/idx_file.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using namespace mt;
using mt::test::TempDir;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Rewrites a file of the same size in place: no truncation, which some filesystems make slow.
void overwrite_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The message of the mt::Error that f throws ("(no error)" if it returns normally).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR(expr, substring)                                               \
  do {                                                                              \
    const std::string msg_ = error_of([&] { (void)(expr); });                       \
    EXPECT_NE(msg_.find(substring), std::string::npos)                              \
        << "expected an error containing \"" << (substring) << "\", got: " << msg_; \
  } while (0)

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

StEntry entry(const std::string& name, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= size_t(d);
  return {name, dtype, std::move(shape), random_bytes(numel * dtype_size(dtype), seed)};
}

// Two tensors and some metadata: the file the damage tests start from.
std::vector<uint8_t> small_checkpoint(const TempDir& dir) {
  const std::string path = (dir / "good.safetensors");
  write_safetensors(path, {entry("a", DType::f32, {2, 3}, 1), entry("b", DType::i64, {2}, 2)},
                    {{"step", "7"}});
  return read_bytes(path);
}

// ---- safetensors ----

TEST(Safetensors, RoundTripsEveryDtypeEmptyTensorsAndMetadata) {
  TempDir dir;
  const std::string path = (dir / "ckpt.safetensors");
  const std::vector<StEntry> entries = {
      entry("layer.weight", DType::f32, {3, 5}, 1), entry("z_first_in_data", DType::f64, {4}, 2),
      entry("bf", DType::bf16, {2, 2, 3}, 3),       entry("half", DType::f16, {7}, 4),
      entry("labels", DType::i64, {5}, 5),          entry("ints", DType::i32, {1, 1}, 6),
      entry("scalar", DType::f32, {}, 7),           entry("empty", DType::f32, {0, 4}, 8),
      entry("also_empty", DType::i32, {0}, 9)};
  const std::map<std::string, std::string> metadata = {
      {"step", "300"}, {"config", "optim:\n  lr: 0.003\n"}, {"unicode", "λ → ∞"}};
  write_safetensors(path, entries, metadata);

  const StFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, metadata);
  ASSERT_EQ(f.entries.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    EXPECT_EQ(f.entries[i].name, entries[i].name);  // file order is entry order
    EXPECT_EQ(f.entries[i].dtype, entries[i].dtype);
    EXPECT_EQ(f.entries[i].shape, entries[i].shape);
    EXPECT_EQ(f.entries[i].data, entries[i].data);
  }
  EXPECT_TRUE(f.contains("half"));
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_EQ(f.at("labels").data, entries[4].data);
  EXPECT_ERROR(f.at("nope"), "ckpt.safetensors: no tensor named 'nope'");
}

TEST(Safetensors, RoundTripsNoEntriesAndNoMetadata) {
  TempDir dir;
  const std::string path = (dir / "empty.safetensors");
  write_safetensors(path, {}, {});
  const StFile f = read_safetensors(path);
  EXPECT_TRUE(f.entries.empty());
  EXPECT_TRUE(f.metadata.empty());
}

// Decodes the file byte by byte, as another implementation would, instead of trusting our reader.
TEST(Safetensors, BytesOnDiskFollowTheFormat) {
  TempDir dir;
  const std::string path = (dir / "w.safetensors");
  const float w[2] = {1.0f, -2.5f};
  const int64_t n[1] = {42};
  StEntry we{"w", DType::f32, {2}, std::vector<uint8_t>(8)};
  std::memcpy(we.data.data(), w, 8);
  StEntry ne{"n", DType::i64, {1}, std::vector<uint8_t>(8)};
  std::memcpy(ne.data.data(), n, 8);
  write_safetensors(path, {we, ne}, {{"k", "v"}});

  const std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(bytes[i]) << (8 * i);  // little-endian
  EXPECT_EQ(header_len % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + header_len + 16);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + long(header_len));
  const size_t json_end = header.find_last_not_of(' ') + 1;
  EXPECT_EQ(header.substr(0, json_end),
            R"({"__metadata__":{"k":"v"},)"
            R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("n":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})");
  EXPECT_EQ(header.substr(json_end), std::string(header_len - json_end, ' '));
  float w_back[2];
  int64_t n_back;
  std::memcpy(w_back, bytes.data() + 8 + header_len, 8);
  std::memcpy(&n_back, bytes.data() + 8 + header_len + 8, 8);
  EXPECT_EQ(w_back[0], 1.0f);
  EXPECT_EQ(w_back[1], -2.5f);
  EXPECT_EQ(n_back, 42);
}

// A file written by the reference implementation (Python safetensors 0.8, save_file of PyTorch
// tensors), byte for byte: its entry order, padding and metadata are its own choices, not ours.
TEST(Safetensors, ReadsAFileWrittenByPythonSafetensors) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"l":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]},)"
      R"("d":{"dtype":"F64","shape":[],"data_offsets":[8,16]},)"
      R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[16,16]},)"
      R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
      R"("i":{"dtype":"I32","shape":[2],"data_offsets":[40,48]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[48,52]},)"
      R"("h":{"dtype":"F16","shape":[1],"data_offsets":[52,54]}}    )";
  const std::vector<uint8_t> data = {
      0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x0a, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,
      0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40, 0x07, 0x00,
      0x00, 0x00, 0xf8, 0xff, 0xff, 0xff, 0xc0, 0x3f, 0x00, 0xc0, 0x00, 0x34};
  ASSERT_EQ(header.size(), 0x1a8u);
  std::vector<uint8_t> bytes = {0xa8, 0x01, 0, 0, 0, 0, 0, 0};
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  TempDir dir;
  const std::string path = (dir / "torch.safetensors");
  write_bytes(path, bytes);

  const StFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  std::vector<std::string> names;
  for (const StEntry& e : f.entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"l", "d", "e", "w", "i", "b", "h"}));

  auto element = [](const StEntry& e, size_t i, auto zero) {
    decltype(zero) v;
    std::memcpy(&v, e.data.data() + i * sizeof v, sizeof v);
    return v;
  };
  EXPECT_EQ(f.at("l").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(element(f.at("l"), 0, int64_t{}), 9);
  EXPECT_EQ(f.at("d").shape, std::vector<int64_t>{});
  EXPECT_EQ(element(f.at("d"), 0, double{}), 3.25);
  EXPECT_EQ(f.at("e").shape, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(f.at("e").data.empty());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(element(f.at("w"), i, float{}), float(i));
  EXPECT_EQ(element(f.at("i"), 1, int32_t{}), -8);
  EXPECT_EQ(f.at("b").dtype, DType::bf16);
  EXPECT_EQ(bf16_to_float(element(f.at("b"), 0, bf16{})), 1.5f);
  EXPECT_EQ(bf16_to_float(element(f.at("b"), 1, bf16{})), -2.0f);
  EXPECT_EQ(f.at("h").dtype, DType::f16);
  EXPECT_EQ(f16_to_float(element(f.at("h"), 0, f16{})), 0.25f);
}

TEST(Safetensors, InvalidEntriesAreRejectedAndTheOldFileKept) {
  TempDir dir;
  const std::string path = (dir / "ckpt.safetensors");
  write_safetensors(path, {entry("a", DType::f32, {2}, 1)}, {});
  const std::vector<uint8_t> before = read_bytes(path);

  StEntry short_data = entry("a", DType::f32, {2, 3}, 1);
  short_data.data.pop_back();
  EXPECT_ERROR(write_safetensors(path, {short_data}, {}),
               "tensor 'a': shape [2, 3] of f32 needs 24 bytes but its data has 23");
  EXPECT_ERROR(
      write_safetensors(path, {entry("a", DType::f32, {1}, 1), entry("a", DType::f32, {1}, 2)}, {}),
      "duplicate tensor name 'a'");
  EXPECT_ERROR(write_safetensors(path, {StEntry{"neg", DType::f32, {-1}, {}}}, {}),
               "tensor 'neg': invalid shape [-1]");
  EXPECT_ERROR(write_safetensors(path, {entry("", DType::f32, {1}, 1)}, {}), "empty name");
  EXPECT_ERROR(write_safetensors(path, {entry("__metadata__", DType::f32, {1}, 1)}, {}),
               "reserved");
  EXPECT_ERROR(write_safetensors(path, {}, {{"bad", "\xff\xfe"}}), "valid UTF-8");

  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1)
      << "a temp file was left behind";
}

TEST(Safetensors, FailedWriteKeepsTheOldFileAndRemovesTheTemp) {
  TempDir dir;
  const std::string path = (dir / "ckpt.safetensors");
  write_safetensors(path, {entry("a", DType::f32, {4}, 1)}, {{"step", "1"}});
  const std::vector<uint8_t> before = read_bytes(path);
  const std::vector<StEntry> big = {entry("big", DType::f32, {1 << 16}, 2)};

  // The disk "fills up" halfway through: a file size limit makes the writes fail with EFBIG.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string msg = error_of([&] { write_safetensors(path, big, {{"step", "2"}}); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;

  // The temp file's name is taken by a directory, so it cannot even be created.
  fs::create_directory(path + ".tmp." + std::to_string(::getpid()));
  EXPECT_ERROR(write_safetensors(path, big, {}), "cannot create temp file");
  fs::remove(path + ".tmp." + std::to_string(::getpid()));

  EXPECT_ERROR(write_safetensors((dir / "no/such/dir/x.safetensors"), big, {}),
               "No such file or directory");

  // A read-only directory (root ignores permissions, so only checked for other users).
  if (::geteuid() != 0) {
    fs::permissions(dir.path, fs::perms::owner_write, fs::perm_options::remove);
    EXPECT_ERROR(write_safetensors(path, big, {}), "Permission denied");
    fs::permissions(dir.path, fs::perms::owner_write, fs::perm_options::add);
  }

  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1)
      << "a temp file was left behind";
  EXPECT_EQ(read_safetensors(path).metadata.at("step"), "1");
}

TEST(Safetensors, EveryTruncationIsAnError) {
  TempDir dir;
  const std::vector<uint8_t> good = small_checkpoint(dir);
  const std::string path = (dir / "cut.safetensors");
  for (size_t len = 0; len < good.size(); ++len) {
    SCOPED_TRACE("length " + std::to_string(len));
    write_bytes(path, std::vector<uint8_t>(good.begin(), good.begin() + long(len)));
    EXPECT_THROW(read_safetensors(path), Error);
  }
  write_bytes(path, std::vector<uint8_t>(good.begin(), good.end() - 4));
  EXPECT_ERROR(read_safetensors(path),
               "cut.safetensors: truncated: header says 40 bytes of data but file has 36");
}

// Random damage must end in either a successful read (a flipped data bit is undetectable) or an
// mt::Error: never a crash, a hang, a huge allocation or another exception type.
TEST(Safetensors, RandomBitFlipsNeverCrash) {
  TempDir dir;
  const std::vector<uint8_t> good = small_checkpoint(dir);
  const std::string path = (dir / "flipped.safetensors");
  uint64_t header_end = 8;
  for (int i = 0; i < 8; ++i) header_end += uint64_t(good[i]) << (8 * i);
  write_bytes(path, good);
  std::mt19937 rng(1234);
  int errors = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<uint8_t> bad = good;
    const int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      // Mostly hit the length and the header, where the parsing is.
      const size_t limit = (trial % 4 == 0) ? bad.size() : size_t(header_end);
      bad[rng() % limit] ^= uint8_t(1u << (rng() % 8));
    }
    overwrite_bytes(path, bad);
    try {
      read_safetensors(path);
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": not an mt::Error: " << e.what();
    }
  }
  EXPECT_GT(errors, 2500);
}

// Hand-made headers, each wrong in one way, with the message that must name the problem.
TEST(Safetensors, CorruptHeadersNameTheProblem) {
  TempDir dir;
  const std::string path = (dir / "bad.safetensors");
  auto file = [&](const std::string& json, size_t data_bytes) {
    std::vector<uint8_t> b(8 + json.size() + data_bytes, 0);
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(uint64_t(json.size()) >> (8 * i));
    std::copy(json.begin(), json.end(), b.begin() + 8);
    write_bytes(path, b);
  };
  struct Case {
    std::string json;
    size_t data_bytes;
    std::string expected;
  };
  const std::string x = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<Case> cases = {
      {"{" + x + "}", 4, "truncated: header says 8 bytes of data but file has 4"},
      {"{" + x + "}", 9, "1 bytes of trailing garbage after the 8 bytes of tensor data"},
      {"{" + x, 8, "header is not valid JSON"},
      {"[1,2]", 0, "header must be a JSON object, got array"},
      {"", 0, "header is not valid JSON"},
      {R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2,
       "tensor 'x': unsupported dtype \"U8\""},
      {R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor 'x': shape [-2] has an invalid dimension -2"},
      {R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8,
       "tensor 'x': shape [1.5] has an invalid dimension 1.5"},
      {R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       "tensor 'x': shape [4294967296,4294967296] has more elements than fit in 64 bits"},
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor 'x': data_offsets [0,8] span 8 bytes but shape [3] of F32 needs 12"},
      {R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
       "tensor 'x': data_offsets [8,0] end before they begin"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
       "tensor 'x': data_offsets must be two non-negative integers, got [0]"},
      {R"({"x":{"dtype":"F32","shape":[2]}})", 8,
       "tensor 'x': needs dtype, shape and data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8,
       "tensor 'x': unexpected field 'extra'"},
      {R"({"x":[1]})", 0, "tensor 'x': expected an object"},
      {"{" + x + R"(,"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "tensor 'y' data [4, 12) overlaps tensor 'x', which ends at 8"},
      {"{" + x + R"(,"y":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16,
       "tensor 'y' data starts at 12, leaving a gap after offset 8"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
       "tensor 'x' data starts at 4, leaving a gap after offset 0"},
      {R"({"__metadata__":{"step":3}})", 0, "__metadata__ value of 'step' must be a string"},
      {R"({"__metadata__":[]})", 0, "__metadata__ must be an object"},
      {std::string("{}\0garbage", 10), 0, "header contains a NUL byte at offset 10"},
      // Deeper than a header nests: refused as met (100,000 levels used to overflow the stack
      // when the error message printed them), at the first level too many.
      {R"({"x":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8,
       "header nests deeper than a safetensors header does (objects or arrays 4 levels deep)"},
      {R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}", 0,
       "header nests deeper than a safetensors header does"},
      // A key twice in one object: the parser kept the last one silently.
      {"{" + x + "," + x + "}", 8, "header gives 'x' twice in one object"},
      {R"({"x":{"dtype":"F32","shape":[2],"dtype":"I32","data_offsets":[0,8]}})", 8,
       "header gives 'dtype' twice in one object"},
      {R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})", 0,
       "header gives '__metadata__' twice in one object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    file(c.json, c.data_bytes);
    EXPECT_ERROR(read_safetensors(path), "bad.safetensors: " + c.expected);
  }

  // Lengths that cannot be right, checked before anything is allocated.
  std::vector<uint8_t> b(16, ' ');
  b[0] = 0xff, b[1] = 0xff, b[2] = 0xff, b[3] = 0xff, b[4] = b[5] = b[6] = b[7] = 0, b[8] = '{';
  write_bytes(path, b);
  EXPECT_ERROR(read_safetensors(path),
               "truncated: header length says 4294967295 bytes but only 8 follow");
  // Another kind of file (a config named as a checkpoint): its text reads as a huge length.
  write_bytes(path, std::vector<uint8_t>({'m', 'o', 'd', 'e', 'l', ':', ' ', '{', 'k', 'i', 'n'}));
  EXPECT_ERROR(read_safetensors(path), "bad.safetensors: not a safetensors file");
  write_bytes(path, {1, 2, 3});
  EXPECT_ERROR(read_safetensors(path), "truncated: 3 bytes is too short");
  EXPECT_ERROR(read_safetensors((dir / "missing.safetensors")),
               "missing.safetensors: cannot open: No such file or directory");
  EXPECT_ERROR(read_safetensors(dir.path.string()), "not a regular file");
}

TEST(Safetensors, HeaderOverTheSizeLimitIsRejected) {
  TempDir dir;
  const std::string path = (dir / "huge.safetensors");
  const uint64_t len = 100'000'008;
  std::vector<uint8_t> head(8);
  for (int i = 0; i < 8; ++i) head[i] = uint8_t(len >> (8 * i));
  write_bytes(path, head);
  fs::resize_file(path, 8 + len);  // sparse: takes no disk space
  EXPECT_ERROR(read_safetensors(path), "header length 100000008 is over the 100 MB limit");
}

// ---- IDX ----

std::vector<uint8_t> idx_bytes(uint32_t magic, std::vector<uint32_t> dims, size_t data_bytes) {
  const std::string header = test::idx_header(magic, dims);
  std::vector<uint8_t> b(header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(uint8_t(i * 7 + 3));
  return b;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

TEST(Idx, ReadsImagesAndLabels) {
  TempDir dir;
  const std::vector<uint8_t> images = idx_bytes(0x803, {2, 3, 4}, 24);
  write_bytes((dir / "images"), images);
  const IdxArray a = read_idx((dir / "images"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.data, std::vector<uint8_t>(images.begin() + 16, images.end()));

  write_bytes((dir / "labels"), idx_bytes(0x801, {5}, 5));
  const IdxArray l = read_idx((dir / "labels"));
  EXPECT_EQ(l.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(l.data, (std::vector<uint8_t>{3, 10, 17, 24, 31}));

  write_bytes((dir / "none"), idx_bytes(0x803, {0, 28, 28}, 0));
  EXPECT_EQ(read_idx((dir / "none")).shape, (std::vector<int64_t>{0, 28, 28}));
}

TEST(Idx, ReadsGzipFiles) {
  TempDir dir;
  const std::vector<uint8_t> images = idx_bytes(0x803, {3, 28, 28}, 3 * 28 * 28);
  write_gz((dir / "images.gz"), images);
  const std::vector<uint8_t> gz = read_bytes((dir / "images.gz"));
  ASSERT_EQ(gz[0], 0x1f);
  ASSERT_EQ(gz[1], 0x8b);
  const IdxArray a = read_idx((dir / "images.gz"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 28, 28}));
  EXPECT_EQ(a.data, std::vector<uint8_t>(images.begin() + 16, images.end()));

  write_bytes((dir / "cut.gz"),
              std::vector<uint8_t>(gz.begin(), gz.begin() + long(gz.size() / 2)));
  EXPECT_ERROR(read_idx((dir / "cut.gz")), "cut.gz: corrupt or truncated gzip data");
  std::vector<uint8_t> flipped = gz;
  flipped[gz.size() - 6] ^= 0xff;  // inside the CRC-32 trailer
  write_bytes((dir / "crc.gz"), flipped);
  EXPECT_ERROR(read_idx((dir / "crc.gz")), "crc.gz: corrupt or truncated gzip data");

  // Truncation inside the decompressed data reports offsets into that data.
  write_gz((dir / "short.gz"), idx_bytes(0x801, {10}, 4));
  EXPECT_ERROR(read_idx((dir / "short.gz")),
               "short.gz: truncated at byte offset 12 (of the decompressed data): shape 10 needs "
               "10 bytes of data but the file has 4");
}

TEST(Idx, MalformedFilesNameTheOffset) {
  TempDir dir;
  const std::string path = (dir / "bad-idx");
  struct Case {
    std::vector<uint8_t> bytes;
    std::string expected;
  };
  std::vector<uint8_t> zip = {'P', 'K', 3, 4, 0, 0, 0, 0};
  const std::vector<Case> cases = {
      {zip, "bad magic 0x504b0304 at byte offset 0"},
      {idx_bytes(0xD01, {2}, 8), "element type 0x0d at byte offset 2 is not supported"},
      {idx_bytes(0x800, {}, 0), "byte offset 3: the magic says the array has no dimensions"},
      {{0, 0, 8}, "truncated at byte offset 3: the file ends inside the 4-byte magic number"},
      {{}, "truncated at byte offset 0"},
      {std::vector<uint8_t>{0, 0, 8, 3, 0, 0, 0, 2, 0, 0},
       "truncated at byte offset 10: the file ends inside dimension 2 of 3"},
      {idx_bytes(0x803, {2, 3, 4}, 20),
       "truncated at byte offset 36: shape 2x3x4 needs 24 bytes of data but the file has 20"},
      {idx_bytes(0x801, {3}, 4),
       "unexpected data at byte offset 11: shape 3 accounts for 3 bytes of data"},
      {idx_bytes(0x804, {0xffffffff, 0xffffffff, 0xffffffff, 1}, 0),
       "byte offset 8: dimension 2 (4294967295) makes the element count overflow 64 bits"},
      // After a 0 the count stays 0, but a sample's size (the later dimensions) must not overflow.
      {idx_bytes(0x803, {0, 0xffffffff, 0xffffffff}, 0),
       "byte offset 12: dimension 3 (4294967295) makes the element count overflow 64 bits"},
      {idx_bytes(0x803, {60000, 28, 28}, 10),
       "truncated at byte offset 26: shape 60000x28x28 needs 47040000 bytes of data but the "
       "file has 10"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    write_bytes(path, c.bytes);
    EXPECT_ERROR(read_idx(path), "bad-idx: " + c.expected);
  }
  EXPECT_ERROR(read_idx((dir / "missing")), "missing: cannot open: No such file or directory");
}

// A gzip'd file inflates up to a thousandfold, so the header, not the size on disk, is what
// bounds the read: its shape is checked against kMaxIdxBytes (and by the caller) before any data
// is read, and then exactly that many bytes are read and the end of the data is required.
TEST(Idx, TheHeaderBoundsTheReadBeforeAnyDataIsRead) {
  TempDir dir;
  // 2^31 images of 28x28 (1.6 TB) in a file of a few kilobytes.
  write_gz(dir / "huge.gz", idx_bytes(0x803, {1u << 31, 28, 28}, 4096));
  EXPECT_ERROR(read_idx(dir / "huge.gz"),
               "huge.gz: shape 2147483648x28x28 is 1683627180032 bytes of data, more than the "
               "4294967296 (4 GiB) an IDX file may hold");
  write_gz(dir / "over.gz", idx_bytes(0x802, {65537, 65536}, 100));
  EXPECT_ERROR(read_idx(dir / "over.gz"), "over.gz: shape 65537x65536 is 4295032832 bytes");
  // The limit itself passes the header check; this file then ends early.
  write_gz(dir / "limit.gz", idx_bytes(0x802, {65536, 65536}, 100));
  EXPECT_ERROR(read_idx(dir / "limit.gz"), "limit.gz: truncated at byte offset 112");

  // The caller sees the shape before the data: a refusal there comes first, here ahead of the
  // truncation that reading the data would find.
  write_gz(dir / "short.gz", idx_bytes(0x803, {1000, 28, 28}, 100));
  std::vector<int64_t> seen;
  EXPECT_ERROR(read_idx(dir / "short.gz",
                        [&](const std::vector<int64_t>& shape) {
                          seen = shape;
                          throw Error("refused by the caller");
                        }),
               "refused by the caller");
  EXPECT_EQ(seen, (std::vector<int64_t>{1000, 28, 28}));

  // More data than the header accounts for, gzip'd: refused after reading one byte past it.
  write_gz(dir / "long.gz", idx_bytes(0x803, {2, 28, 28}, 2 * 28 * 28 + 100));
  EXPECT_ERROR(read_idx(dir / "long.gz"),
               "long.gz: unexpected data at byte offset 1584 (of the decompressed data): shape "
               "2x28x28 accounts for 1568 bytes of data and the file has more");
}

// load_mnist reads the small labels file first, so that a header promising more images than
// there are labels is refused before the images' data is read.
TEST(Idx, MnistImagesAreCheckedAgainstTheLabelCountBeforeTheirData) {
  TempDir dir;
  std::vector<uint8_t> labels = idx_bytes(0x801, {3}, 0);
  labels.insert(labels.end(), {3, 0, 7});
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  write_gz(dir / "train-images-idx3-ubyte.gz", idx_bytes(0x803, {1000, 28, 28}, 100));
  EXPECT_ERROR(data::load_mnist(dir.path.string(), false),
               "train-images-idx3-ubyte.gz: the header says 1000 images, but " +
                   (dir / "train-labels-idx1-ubyte") + " has 3 labels");
  write_gz(dir / "train-images-idx3-ubyte.gz", idx_bytes(0x802, {3, 784}, 3 * 784));
  EXPECT_ERROR(data::load_mnist(dir.path.string(), false),
               "train-images-idx3-ubyte.gz: expected a 3-D image array, got ");
  write_gz(dir / "train-images-idx3-ubyte.gz", idx_bytes(0x803, {3, 2, 2}, 12));
  const data::Dataset d = data::load_mnist(dir.path.string(), false);
  EXPECT_EQ(d.size, 3);
  EXPECT_EQ(d.dim, 4);
  EXPECT_EQ(d.labels, (std::vector<int64_t>{3, 0, 7}));
}

// ---- CSV ----

TEST(Csv, ReadsNumbersAndLabels) {
  TempDir dir;
  const std::string path = (dir / "data.csv");
  write_text(path, "1.5, 2, 0\n3,4.25,1\r\n\n  -1e-3 ,5,2\n");
  const CsvData d = read_csv(path, -1, false);
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.cols, 2);
  EXPECT_EQ(d.features, (std::vector<float>{1.5f, 2, 3, 4.25f, -1e-3f, 5}));
  EXPECT_EQ(d.labels, (std::vector<int64_t>{0, 1, 2}));

  write_text(path, "\xEF\xBB\xBFlabel,x,y\n7,0.5,-0.5\n0,1,2\n");
  const CsvData h = read_csv(path, 0, true);
  EXPECT_EQ(h.rows, 2);
  EXPECT_EQ(h.cols, 2);
  EXPECT_EQ(h.features, (std::vector<float>{0.5f, -0.5f, 1, 2}));
  EXPECT_EQ(h.labels, (std::vector<int64_t>{7, 0}));
}

// Features only (`train predict`'s input): every cell is a feature, a single column too.
TEST(Csv, ReadsFeaturesWithoutALabelColumn) {
  TempDir dir;
  const std::string path = (dir / "x.csv");
  write_text(path, "a,b\n\n1.5,2\n-3,4e2\n");
  const CsvData d = read_csv(path, kNoLabelColumn, true);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.cols, 2);
  EXPECT_EQ(d.first_line, 3);
  EXPECT_EQ(d.features, (std::vector<float>{1.5f, 2, -3, 4e2f}));
  EXPECT_TRUE(d.labels.empty());
  write_text(path, "7\n8\n");
  EXPECT_EQ(read_csv(path, kNoLabelColumn, false).features, (std::vector<float>{7, 8}));
}

TEST(Csv, MalformedFilesNameLineAndColumn) {
  TempDir dir;
  const std::string path = (dir / "f.csv");
  struct Case {
    std::string text;
    int64_t label_column;
    bool header;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"1,2,0\n3,abc,1\n", -1, false, "f.csv:2:3: cell 2: expected a finite number, got 'abc'"},
      {"x,y,l\n1,2,0\n\n3,4\n", -1, true, "f.csv:4:4: row has 2 cells, expected 3 as on line 2"},
      {"1,2,0\n3,4,5,  6\n", -1, false, "f.csv:2:9: row has 4 cells, expected 3 as on line 1"},
      {"1,2,2.5\n", -1, false, "f.csv:1:5: the label must be a non-negative integer, got '2.5'"},
      {"1,2,0\n1,2,-1\n", -1, false,
       "f.csv:2:5: the label must be a non-negative integer, got '-1'"},
      {"1, ,0\n", -1, false, "f.csv:1:4: cell 2: expected a finite number, got ''"},
      {"nan,1,0\n", -1, false, "f.csv:1:1: cell 1: expected a finite number, got 'nan'"},
      {"1e999,1,0\n", -1, false, "f.csv:1:1: cell 1: '1e999' is out of range for a 32-bit float"},
      {"1,2,0\n", 3, false, "f.csv:1:1: label_column 3 is out of range: the row has 3 cells"},
      // Not column 0, as it was once an int on the way here.
      {"1,2,0\n", int64_t(1) << 32, false, "f.csv:1:1: label_column 4294967296 is out of range"},
      {"1,2,0\n", -3, false, "f.csv: label_column must be -1"},
      {"1,2\n3\n", kNoLabelColumn, false, "f.csv:2:2: row has 1 cells, expected 2 as on line 1"},
      {"5\n", -1, false, "f.csv:1:1: need a label and at least one feature"},
      {"", -1, false, "f.csv:1:1: no data rows (the file is empty)"},
      {"\n  \n", -1, false, "f.csv:2:1: no data rows"},
      {"a,b,label\n", -1, true, "f.csv:1:1: no data rows after the header line"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    write_text(path, c.text);
    EXPECT_ERROR(read_csv(path, c.label_column, c.header), c.expected);
  }
  EXPECT_ERROR(read_csv((dir / "missing.csv")), "missing.csv: cannot open");
}

// A CSV is read to its end, and a device or pipe may have none: /dev/zero used to grow one line
// until memory ran out, and opening a FIFO with no writer blocks. Both are refused unopened (the
// messages say so; a regression that opened the FIFO would block until ctest's per-test limit).
TEST(Csv, DevicesAndPipesAreRefusedUnread) {
  TempDir dir;
  const std::string fifo = dir / "pipe.csv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_ERROR(read_csv("/dev/zero"),
               "/dev/zero: not a regular file; a device or pipe may never end, so it is not read");
  EXPECT_ERROR(read_csv(fifo), "pipe.csv: not a regular file");
}

}  // namespace
