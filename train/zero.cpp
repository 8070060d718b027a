#include "train/zero.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "core/autograd.h"
#include "optim/clip.h"

namespace mt::train {

ShardedAdamW::ShardedAdamW(std::vector<optim::ParamGroup> groups, optim::AdamWOptions options,
                           std::shared_ptr<parallel::Communicator> comm, parallel::GradReducer& reducer)
    : groups_(std::move(groups)), options_(options), comm_(std::move(comm)), reducer_(reducer) {
  MT_CHECK(comm_ != nullptr && reducer_.sharded(), "ShardedAdamW: needs a communicator and a "
           "sharded GradReducer (reduce-scattered buckets)");
  std::unordered_map<const TensorImpl*, size_t> index;  // across the groups
  std::vector<size_t> group_of;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const Tensor& p : groups_[g].params) {
      index.emplace(p.impl_ptr().get(), params_.size());
      params_.push_back(p);
      group_of.push_back(g);
    }
  const std::vector<Tensor>& reduced = reducer_.params();
  MT_CHECK(reduced.size() == params_.size(), "ShardedAdamW: the reducer has ", reduced.size(),
           " parameters, the groups ", params_.size());

  // This rank's chunk of each bucket, cut at the parameters' edges.
  const int64_t n = comm_->size(), r = comm_->rank();
  NoGradGuard no_grad;
  for (size_t b = 0; b < reducer_.buckets().size(); ++b) {
    const parallel::GradReducer::Bucket& bucket = reducer_.buckets()[b];
    const int64_t chunk = bucket.numel / n, lo = r * chunk, hi = lo + chunk;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const Tensor& p = reduced[bucket.params[j]];
      auto it = index.find(p.impl_ptr().get());
      MT_CHECK(it != index.end(), "ShardedAdamW: a parameter of the reducer is in no group");
      const int64_t off = bucket.offsets[j], begin = std::max(off, lo), end = std::min(off + p.numel(), hi);
      if (begin >= end) continue;
      Piece piece{it->second, bucket.params[j], b, begin - off, end - begin, begin, {}};
      piece.view = p.view({p.numel()}).slice_rows(piece.begin, piece.begin + piece.numel);
      piece.view.set_grad(bucket.buffer.slice_rows(begin, end));
      pieces_.push_back(std::move(piece));
    }
  }
  // The norm sums the pieces in the model's parameter order, as the unsharded norm sums the
  // parameters: with one rank, the same sum in the same order.
  std::vector<const Piece*> order;
  for (const Piece& piece : pieces_) order.push_back(&piece);
  std::stable_sort(order.begin(), order.end(), [](const Piece* a, const Piece* b) {
    return a->reduced != b->reduced ? a->reduced < b->reduced : a->begin < b->begin;
  });
  for (const Piece* piece : order) clip_order_.push_back(piece->view);
  // In the groups' parameter order, so the shard's groups follow the full ones.
  std::stable_sort(pieces_.begin(), pieces_.end(),
                   [](const Piece& a, const Piece& b) { return a.param < b.param; });
  std::vector<optim::ParamGroup> shard_groups;
  for (const optim::ParamGroup& g : groups_) shard_groups.push_back({{}, g.lr, g.weight_decay});
  for (const Piece& piece : pieces_) shard_groups[group_of[piece.param]].params.push_back(piece.view);
  shard_ = std::make_unique<optim::AdamW>(std::move(shard_groups), options_);
}

Tensor ShardedAdamW::clip_grad_norm_(double max_norm) {
  return optim::clip_grad_norm_(clip_order_, max_norm, [&](const Tensor& sum_of_squares) {
    comm_->all_reduce_sum(sum_of_squares);
    comm_->wait();
  });
}

void ShardedAdamW::step() {
  shard_->step();
  NoGradGuard no_grad;
  const auto& buckets = reducer_.buckets();
  // The gradients are spent: the buffers carry the updated parameters now.
  for (const Piece& piece : pieces_)
    buckets[piece.bucket].buffer.slice_rows(piece.offset, piece.offset + piece.numel).copy_(piece.view);
  for (const auto& bucket : buckets) comm_->all_gather(bucket.buffer);
  comm_->wait();
  const std::vector<Tensor>& reduced = reducer_.params();
  for (const auto& bucket : buckets)
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const Tensor& p = reduced[bucket.params[j]];
      p.view({p.numel()}).copy_(bucket.buffer.slice_rows(bucket.offsets[j], bucket.offsets[j] + p.numel()));
      p.bump_version();
    }
  nn::refresh_compute_copies(params_);
}

void ShardedAdamW::zero_grad() {
  for (const auto& bucket : reducer_.buckets()) bucket.buffer.fill_(0.0);
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : shard_->state_dict())
    if (name.ends_with(".exp_avg") || name.ends_with(".exp_avg_sq")) bytes += int64_t(t.nbytes());
  return bytes;
}

nn::StateDict ShardedAdamW::state_dict() {
  const nn::StateDict shard = shard_->state_dict();
  std::map<std::string, Tensor> mine(shard.begin(), shard.end());
  nn::StateDict out;
  out.emplace_back("step", mine.at("step"));
  if (shard_->steps_taken() == 0) {  // no state yet, as unsharded: every count is 0
    for (size_t i = 0; i < params_.size(); ++i)
      out.emplace_back("state." + std::to_string(i) + ".step", from_vector(std::vector<int64_t>{0}, {}));
    return out;
  }
  NoGradGuard no_grad;
  const auto& buckets = reducer_.buckets();
  const std::vector<Tensor>& reduced = reducer_.params();
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].impl_ptr().get(), i);
  std::vector<std::map<std::string, Tensor>> full(params_.size());
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    // Each rank's pieces into its chunk of a bucket-shaped buffer, then one all-gather per bucket.
    std::vector<Tensor> gathered;
    for (const auto& bucket : buckets) gathered.push_back(zeros({bucket.numel}, bucket.buffer.dtype(), bucket.buffer.device()));
    for (size_t k = 0; k < pieces_.size(); ++k) {
      const Piece& piece = pieces_[k];
      gathered[piece.bucket].slice_rows(piece.offset, piece.offset + piece.numel)
          .copy_(mine.at("state." + std::to_string(k) + "." + name));
    }
    for (const Tensor& g : gathered) comm_->all_gather(g);
    comm_->wait();
    for (size_t b = 0; b < buckets.size(); ++b)
      for (size_t j = 0; j < buckets[b].params.size(); ++j) {
        const Tensor& p = reduced[buckets[b].params[j]];
        const int64_t off = buckets[b].offsets[j];
        full[index.at(p.impl_ptr().get())][name] =
            gathered[b].slice_rows(off, off + p.numel()).view(p.shape()).clone();
      }
  }
  // Every piece of every parameter takes every step (its .grad, a bucket view, is always set).
  const Tensor steps = from_vector(std::vector<int64_t>{shard_->steps_taken()}, {});
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    out.emplace_back(prefix + "step", steps);
    for (const auto& [name, t] : full[i]) out.emplace_back(prefix + name, t);
  }
  return out;
}

void ShardedAdamW::load_state_dict(const nn::StateDict& full_state) {
  // The unsharded AdamW's checks, on an optimizer that is only a reader of the full state.
  optim::AdamW whole(groups_, options_);
  whole.load_state_dict(full_state);
  const nn::StateDict checked = whole.state_dict();
  std::map<std::string, Tensor> full(checked.begin(), checked.end());
  nn::StateDict shard;
  shard.emplace_back("step", full.at("step"));
  NoGradGuard no_grad;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    const std::string from = "state." + std::to_string(piece.param) + ".";
    const std::string to = "state." + std::to_string(k) + ".";
    const Tensor& updates = full.at(from + "step");
    shard.emplace_back(to + "step", updates);
    if (updates.to_vector()[0] == 0) continue;  // not updated yet
    for (const char* name : {"exp_avg", "exp_avg_sq"}) {
      const Tensor& t = full.at(from + name);
      shard.emplace_back(to + name, t.view({t.numel()}).slice_rows(piece.begin, piece.begin + piece.numel).clone());
    }
  }
  shard_->load_state_dict(shard);
}

}  // namespace mt::train
