#include "data/token_source.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "data/data.h"

namespace mt::data {

TokenSource::TokenSource(TokenStream stream, std::string tokenizer, const TokenSourceOptions& o)
    : stream_(std::move(stream)), tokenizer_(std::move(tokenizer)), o_(o) {
  MT_CHECK(o.batch_size >= 1, "data: batch_size must be at least 1, got ", o.batch_size);
  MT_CHECK(o.microbatches >= 1 && o.microbatches <= o.batch_size, "data: microbatches must be in "
           "[1, batch_size = ", o.batch_size, "], got ", o.microbatches);
  MT_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "data.val_fraction must be in [0, 1), got ",
           o.val_fraction);
  const int64_t n = int64_t(stream_.tokens.size());
  const int64_t split = validation_begin(n, o.val_fraction);
  train_ = std::make_unique<TokenWindows>(stream_, 0, split, o.block_size, "the training split");
  if (split < n)
    val_ = std::make_unique<TokenWindows>(stream_, split, n, o.block_size, "the validation split");
  shard_size_ = o.batch_size;
}

std::string TokenSource::name() const {
  const std::string& s = stream_.source;
  return s.substr(s.find_last_of('/') == std::string::npos ? 0 : s.find_last_of('/') + 1);
}

std::vector<std::string> TokenSource::describe() const {
  std::ostringstream os;
  os << stream_.tokens.size() << " tokens (" << tokenizer_ << ", vocabulary "
     << stream_.vocab_size << ") from " << stream_.source << "; windows of " << o_.block_size
     << " + 1; validation: the last " << (val_ ? val_->windows() + o_.block_size : 0) << " tokens";
  return {os.str()};
}

void TokenSource::shard(int rank, int world) {
  MT_CHECK(world >= 1 && rank >= 0 && rank < world, "data: rank ", rank, " of ", world);
  MT_CHECK(o_.batch_size / world >= o_.microbatches, "data: batch_size ", o_.batch_size,
           " over ", world, " ranks leaves fewer than microbatches = ", o_.microbatches,
           " windows per rank; need batch_size >= world * microbatches");
  const std::vector<int64_t> shards = microbatch_sizes(o_.batch_size, world);
  rank_ = rank;
  shard_begin_ = 0;
  for (int r = 0; r < rank; ++r) shard_begin_ += shards[size_t(r)];
  shard_size_ = shards[size_t(rank)];
}

int64_t TokenSource::size() const {
  return std::max<int64_t>(1, (train_->windows() + o_.block_size) / o_.block_size);
}

int64_t TokenSource::steps_per_epoch() const { return std::max<int64_t>(1, size() / o_.batch_size); }

std::vector<Batch> TokenSource::step_batches(int64_t step, Device device) const {
  last_step_ = step;
  const std::vector<int64_t> starts = step_window_starts(train_->windows(), o_.batch_size, o_.seed, step);
  std::vector<Batch> out;
  int64_t pos = shard_begin_;
  for (int64_t n : microbatch_sizes(shard_size_, o_.microbatches)) {
    auto [x, y] = train_->gather({starts.begin() + pos, starts.begin() + pos + n}, device);
    out.push_back({x, y});
    pos += n;
  }
  return out;
}

std::vector<int64_t> TokenSource::validation_starts() const {
  if (!val_) return {};
  return o_.eval_windows > 0 ? val_->evenly_spaced(o_.eval_windows) : val_->tiling();
}

int64_t TokenSource::held_out_size(HeldOut which) const {
  return which == HeldOut::validation ? int64_t(validation_starts().size()) : 0;
}

void TokenSource::for_each_held_out(HeldOut which, int64_t batch_size, Device device,
                                    const std::function<void(const Batch&)>& visit) const {
  MT_CHECK(batch_size > 0, "TokenSource: batch_size must be positive, got ", batch_size);
  if (which != HeldOut::validation) return;
  const std::vector<int64_t> starts = validation_starts();
  const int64_t n = int64_t(starts.size());
  for (int64_t b = 0; b < n; b += batch_size) {
    const int64_t e = std::min(n, b + batch_size);
    auto [x, y] = val_->gather({starts.begin() + b, starts.begin() + e}, device);
    visit({x, y});
  }
}

std::map<std::string, std::string> TokenSource::metadata() const {
  return {{"tokenizer", tokenizer_}, {"vocab_size", std::to_string(stream_.vocab_size)}};
}

double TokenSource::tokens_per_byte() const {
  return stream_.text_bytes > 0 ? double(stream_.tokens.size()) / double(stream_.text_bytes) : 0.0;
}

}  // namespace mt::data
