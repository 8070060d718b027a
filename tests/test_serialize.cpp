// nn::save / nn::load (nn/serialize.h): a module's state round-trips bit for bit through a file,
// loading is as strict as load_state_dict and names the file, and damage is never loaded.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "core/safetensors.h"
#include "nn/modules.h"
#include "nn/serialize.h"
#include "tests/expect_error.h"
#include "tests/bit_flip.h"
#include "tests/temp_dir.h"

namespace mt {
namespace {

using mt::test::flip_bit;

using test::TempDir;

// An MLP with a buffer too, so both kinds of state are covered. State dict order: the buffer
// "stats" (the module's own state comes first), then "mlp.layers.0.weight", ...
struct Net : nn::Module {
  explicit Net(int64_t hidden = 7, bool with_stats = true) {
    if (with_stats) stats = register_buffer("stats", randn({hidden}));
    mlp = register_module("mlp", nn::MLP({5, hidden, 3}));
  }
  Tensor forward(const Tensor& x) override { return mlp->forward(x); }
  std::shared_ptr<nn::MLP> mlp;
  Tensor stats;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void expect_same_state(const nn::Module& a, const nn::Module& b) {
  const nn::StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(same_bytes(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

TEST(Serialize, RoundTripsBitExactlyInF32AndF64) {
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    TempDir dir;
    const std::string path = dir / "net.safetensors";
    manual_seed(1);
    Net saved;
    saved.to(dtype);
    nn::save(saved, path);
    manual_seed(2);  // different weights, so the load has to change every one
    Net loaded;
    loaded.to(dtype);
    EXPECT_FALSE(same_bytes(saved.state_dict()[1].second, loaded.state_dict()[1].second));
    nn::load(loaded, path);
    expect_same_state(saved, loaded);

    // The file holds exactly the state_dict, under its names, in its order and dtypes.
    const StFile f = read_safetensors(path);
    const nn::StateDict state = saved.state_dict();
    ASSERT_EQ(f.entries.size(), state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(f.entries[i].name, state[i].first);
      EXPECT_EQ(f.entries[i].dtype, dtype);
    }
    EXPECT_EQ(state.front().first, "stats");
  }
}

// A bf16 compute copy is derived state: only the fp32 parameters are saved, and loading rebuilds
// the copies, so the loaded model computes exactly what the saved one did.
TEST(Serialize, Bf16ComputeCopiesAreNotSavedAndAreRebuiltOnLoad) {
  TempDir dir;
  const std::string path = dir / "net.safetensors";
  manual_seed(3);
  Net saved;
  saved.set_compute_dtype(DType::bf16);
  nn::save(saved, path);
  for (const StEntry& e : read_safetensors(path).entries) EXPECT_EQ(e.dtype, DType::f32) << e.name;

  manual_seed(4);
  Net loaded;
  loaded.set_compute_dtype(DType::bf16);
  nn::load(loaded, path);
  expect_same_state(saved, loaded);
  const Tensor x = randn({4, 5}).to(DType::bf16);
  EXPECT_TRUE(same_bytes(saved(x), loaded(x)));
}

TEST(Serialize, MetadataRoundTripsAndChecksumKeysAreReserved) {
  TempDir dir;
  const std::string path = dir / "net.safetensors";
  Net net;
  const nn::Metadata meta = {{"config", "model:\n  input: 5\n"}, {"note", "épreuve"}};
  nn::save(net, path, meta);
  EXPECT_EQ(nn::load(net, path), meta);  // without the checksums
  EXPECT_TRUE(read_safetensors(path).metadata.contains("crc32.mlp.layers.0.weight"));
  test::expect_error([&] { nn::save(net, dir / "x.safetensors", {{"crc32.mine", "1"}}); },
                     {"metadata key 'crc32.mine' is reserved"});
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
}

TEST(Serialize, StrictLoadNamesTheKeyAndBothSides) {
  TempDir dir;
  const std::string path = dir / "net.safetensors";
  Net saved(7);
  nn::save(saved, path);

  Net wider(9);  // every hidden-width tensor differs in shape
  const nn::StateDict before = wider.state_dict();
  test::expect_error([&] { nn::load(wider, path); },
                     {path, "'stats' has shape [7] in the state dict but [9] in the module"});
  EXPECT_TRUE(same_bytes(before[0].second, wider.state_dict()[0].second));  // nothing copied

  Net f64;
  f64.to(DType::f64);
  test::expect_error([&] { nn::load(f64, path); },
                     {path, "'stats' has dtype f32 in the state dict but f64 in the module"});

  Net bare(7, /*with_stats=*/false);  // the file has a key the module lacks
  test::expect_error([&] { nn::load(bare, path); }, {path, "unexpected keys", "'stats'"});
  nn::save(bare, dir / "bare.safetensors");
  Net more;  // the other way round
  test::expect_error([&] { nn::load(more, dir / "bare.safetensors"); },
                     {"bare.safetensors", "missing keys", "'stats'"});

  // strict = false takes what both have, as PyTorch does.
  nn::load(bare, path, /*strict=*/false);
  expect_same_state(*bare.mlp, *saved.mlp);
}

// A bit flipped anywhere in a tensor's bytes fails its checksum; the module keeps its values.
TEST(Serialize, AFlippedBitIsRejected) {
  TempDir dir;
  const std::string path = dir / "net.safetensors";
  Net saved;
  nn::save(saved, path);
  const auto size = std::filesystem::file_size(path);
  flip_bit(path, (size - 3) * 8 + 5);  // in the last tensor
  Net other;
  const Tensor before = other.mlp->state_dict().back().second.clone();
  test::expect_error([&] { nn::load(other, path); },
                     {path, "damaged: tensor 'mlp.layers.3.bias' fails its checksum"});
  EXPECT_TRUE(same_bytes(before, other.mlp->state_dict().back().second));
}

// A file without checksums (written by another tool) is refused by load_tensors; the plain reader
// and tensors_of still open it.
TEST(Serialize, AFileWithoutChecksumsIsRefused) {
  TempDir dir;
  const std::string path = dir / "plain.safetensors";
  const Tensor w = randn({2, 3});
  StEntry e{"w", DType::f32, {2, 3}, {}};
  const auto* p = static_cast<const uint8_t*>(w.data_ptr());
  e.data.assign(p, p + w.nbytes());
  write_safetensors(path, {e}, {{"format", "pt"}});
  test::expect_error([&] { nn::load_tensors(path); }, {path, "metadata has no 'crc32.__metadata__'"});
  const nn::StateDict t = nn::tensors_of(read_safetensors(path));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(same_bytes(t[0].second, w));
}

// A save that fails leaves the file it would have replaced as it was.
TEST(Serialize, AFailedSaveLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir / "t.safetensors";
  nn::save_tensors(path, {{"a", randn({3})}});
  const auto before = read_safetensors(path).entries[0].data;
  test::expect_error([&] { nn::save_tensors(path, {{"a", randn({3})}, {"a", randn({3})}}); },
                     {"duplicate tensor name 'a'"});
  test::expect_error([&] { nn::save_tensors(path, {{"b", Tensor()}}); }, {"tensor 'b'", "undefined"});
  EXPECT_EQ(nn::load_tensors(path).tensors.size(), 1u);
  EXPECT_EQ(read_safetensors(path).entries[0].data, before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), {}), 1);  // no temp file
}

}  // namespace
}  // namespace mt
