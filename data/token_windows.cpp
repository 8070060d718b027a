#include "data/token_windows.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/input_file.h"
#include "core/rng.h"
#include "data/token_shards.h"

namespace mt::data {

TokenStream tokenize_text_file(const std::string& path, const Tokenizer& tokenizer,
                               Special special) {
  // A regular file only: a directory would read as no text, a FIFO wait for a writer.
  const std::string text = read_regular_file(path);
  TokenStream s;
  s.vocab_size = tokenizer.vocab_size();
  s.text_bytes = int64_t(text.size());
  s.source = path;
  try {
    s.tokens = tokenizer.encode(text, special);
  } catch (const Error& e) {
    MT_THROW(path, ": the ", tokenizer.name(), " tokenizer refused it: ", e.what());
  }
  return s;
}

TokenStream read_token_shards(const std::vector<std::string>& paths, int64_t vocab_size) {
  MT_CHECK(!paths.empty(), "read_token_shards: no shard files given");
  TokenStream s;
  s.vocab_size = vocab_size;
  int64_t total = 0;
  for (const std::string& path : paths) total += read_token_shard_header(path);
  s.tokens.reserve(size_t(total));  // the headers first: one allocation, not a doubling vector's
  for (const std::string& path : paths) {
    std::vector<uint16_t> t = read_token_shard(path);
    check_token_ids(t, vocab_size, path);
    s.tokens.insert(s.tokens.end(), t.begin(), t.end());
  }
  s.source = paths.size() == 1 ? paths[0]
                               : paths.front() + " … " + paths.back() + " (" +
                                     std::to_string(paths.size()) + " shards)";
  return s;
}

TokenWindows::TokenWindows(const TokenStream& stream, int64_t begin, int64_t end, int64_t T,
                           const std::string& what)
    : stream_(stream), begin_(begin), end_(end), T_(T) {
  MT_CHECK(T >= 1, what, ": block size T must be at least 1, got ", T);
  MT_CHECK(begin >= 0 && end <= int64_t(stream.tokens.size()) && begin <= end, what,
           ": positions [", begin, ", ", end, ") are not inside the ", stream.tokens.size(),
           " tokens of ", stream.source);
  MT_CHECK(end - begin >= T + 1, what, " of ", stream.source, " holds ", end - begin,
           " tokens, fewer than T + 1 = ", T + 1, " (one window of ", T,
           " inputs and the next token); use more text, a smaller block_size or a different "
           "val_fraction");
}

std::pair<Tensor, Tensor> TokenWindows::gather(const std::vector<int64_t>& starts,
                                               Device device) const {
  const int64_t n = int64_t(starts.size());
  Tensor x = empty({n, T_}, DType::i64), y = empty({n, T_}, DType::i64);
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t s = starts[size_t(r)];
    MT_CHECK(s >= 0 && s < windows(), "TokenWindows: start ", s, " outside [0, ", windows(), ")");
    const int32_t* t = stream_.tokens.data() + begin_ + s;
    for (int64_t j = 0; j < T_; ++j) {
      px[r * T_ + j] = t[j];
      py[r * T_ + j] = t[j + 1];
    }
  }
  return {x.to(device), y.to(device)};
}

std::vector<int64_t> TokenWindows::evenly_spaced(int64_t count) const {
  const int64_t n = windows();
  std::vector<int64_t> starts;
  if (count >= n) {
    for (int64_t s = 0; s < n; ++s) starts.push_back(s);
    return starts;
  }
  // count points from 0 to n − 1, both ends included (count ≥ 2); a single one at 0.
  for (int64_t i = 0; i < count; ++i)
    starts.push_back(count == 1 ? 0 : i * (n - 1) / (count - 1));
  return starts;
}

std::vector<int64_t> TokenWindows::tiling() const {
  std::vector<int64_t> starts;
  for (int64_t s = 0; s < windows(); s += T_) starts.push_back(s);
  return starts;
}

std::vector<int64_t> step_window_starts(int64_t windows, int64_t batch, uint64_t seed,
                                        int64_t step) {
  MT_CHECK(windows >= 1 && batch >= 1, "step_window_starts: ", windows, " windows, batch ", batch);
  // One generator per (seed, step), seeded through splitmix64 (core/rng.h), so neighbouring
  // steps draw unrelated windows.
  Generator g(seed * 0x9e3779b97f4a7c15ull ^ (uint64_t(step) + 0x632be59bd9b4e019ull));
  std::vector<int64_t> starts(static_cast<size_t>(batch));
  for (int64_t& s : starts) s = int64_t(g.below(uint64_t(windows)));
  return starts;
}

int64_t validation_begin(int64_t size, double val_fraction) {
  return size - int64_t(std::llround(val_fraction * double(size)));
}

}  // namespace mt::data
