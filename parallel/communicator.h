#pragma once
// Communicator: the collectives data-parallel training needs, behind one interface, and an
// in-process implementation on CPU threads that the tests (and CI, which has no GPU) run.
//
// A group has `size` ranks, numbered 0..size-1, each a separate replica of the model. Every rank
// must call the collectives in the same order with the same shapes and dtypes; that is what lets
// a backend match rank r's k-th call with every other rank's k-th call without any negotiation.
//
//   all_reduce_sum(t)   t ← t₀ + t₁ + ... + t_{N−1} on every rank, in place. A plain SUM, never a
//                       mean: each rank's loss is already divided by the GLOBAL batch size (the
//                       cross_entropy normalizer), so the sum of the ranks' gradients is the
//                       full-batch gradient, exactly as with gradient-accumulation microbatches.
//   reduce_scatter_sum(t)  t is N equal chunks (numel divisible by N): afterwards rank r's chunk r
//                       holds t₀ + ... + t_{N−1} of that chunk, as all_reduce_sum would; the
//                       other chunks are unspecified. ZeRO-1 (parallel/zero.h): each rank needs
//                       only the gradient of the parameters it updates.
//   all_gather(t)       t is N equal chunks: chunk r ← rank r's chunk r, on every rank, in
//                       place (the updated parameter shards of ZeRO-1).
//   broadcast(t, root)  t ← t_root on every rank (initial weights, so replicas start identical).
//   barrier()           returns once every rank has entered it.
//   wait()              asynchronous backends (NCCL on its own stream) return from a collective
//                       once it is enqueued; wait() makes later work on the compute side wait
//                       for every collective enqueued so far. The thread backend is synchronous:
//                       a no-op there.
//   synchronize()       the host waits until everything this rank has enqueued (its device work
//                       and its collectives) is done. An asynchronous backend bounds the wait by
//                       its timeout and then aborts and throws DistError, so a dead peer ends the
//                       run with a message instead of a hang in the next read of a device value.
//                       A no-op for the thread backend.
//   abort(why)          gives up on the group: every other rank's pending and future collectives
//                       throw DistError naming this rank and `why`, instead of waiting forever
//                       for a rank that will never come.
//
// The thread backend (make_local_group) sums in rank order 0 + 1 + ... + N−1 in the tensor's own
// dtype (f32 sums in f32, as NCCL does), so the result is deterministic and bitwise identical on
// every rank. A rank that waits longer than the group's timeout throws DistError naming the
// ranks that did not arrive, and breaks the group so the others stop waiting too.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt::parallel {

// A collective that cannot complete: a timeout, or another rank aborted the group.
struct DistError : Error {
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place; `t` must be contiguous f32 or f64.
  void all_reduce_sum(const Tensor& t);
  void reduce_scatter_sum(const Tensor& t);
  void all_gather(const Tensor& t);
  void broadcast(const Tensor& t, int root);
  void barrier() { do_barrier(); }
  void wait() { do_wait(); }
  void synchronize() { do_synchronize(); }
  void abort(const std::string& why) { do_abort(why); }

  // all_reduce_sum calls made through this rank so far: data parallelism promises one per
  // gradient bucket per optimizer step, and the tests hold it to that.
  int64_t all_reduce_calls() const { return all_reduce_calls_; }
  // Likewise for ZeRO-1: one reduce-scatter and one all-gather per bucket per step.
  int64_t reduce_scatter_calls() const { return reduce_scatter_calls_; }
  int64_t all_gather_calls() const { return all_gather_calls_; }

 protected:
  // The wrappers above have checked the tensor (defined, contiguous, f32/f64) and the root.
  virtual void do_all_reduce_sum(const Tensor& t) = 0;
  virtual void do_reduce_scatter_sum(const Tensor& t) = 0;
  virtual void do_all_gather(const Tensor& t) = 0;
  virtual void do_broadcast(const Tensor& t, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_wait() = 0;
  virtual void do_synchronize() = 0;
  virtual void do_abort(const std::string& why) = 0;

 private:
  int64_t all_reduce_calls_ = 0, reduce_scatter_calls_ = 0, all_gather_calls_ = 0;
};

// A group of `size` ranks in this process; element i is rank i, to be used from its own thread.
// CPU tensors only. `timeout` bounds how long one rank waits for the others in one collective.
std::vector<std::shared_ptr<Communicator>> make_local_group(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace mt::parallel
