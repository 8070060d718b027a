// Data parallelism on CPU threads: the thread communicator, the bucketed gradient reducer and the
// sharded loader.
//
// The contract, end to end through every op's backward (the model of test_microbatch.cpp):
//
//   Linear -> RMSNorm -> ScaledSiLU -> Linear -> cross_entropy
//
// k microbatches on each of N ranks, every loss divided by the GLOBAL batch size, then one
// all-reduce (a plain sum) per gradient bucket, must leave every rank with the gradient of the
// whole batch on one rank, and the ranks bitwise identical to each other.
//
// Each rank runs on its own std::thread with its own model. Models are built on the test's
// thread: random initialization draws from the shared default generator, which is not meant to
// be used from several threads at once. Everything a rank thread does after that (forward,
// backward, the hooks, the loader) touches only that rank's tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/autograd.h"
#include "core/rng.h"
#include "data/data.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "parallel/communicator.h"
#include "parallel/reducer.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/small_mlp.h"

using namespace mt;
using namespace std::chrono_literals;

namespace {

constexpr int64_t D = test::SmallMlp::D, H = test::SmallMlp::H, C = test::SmallMlp::C;
constexpr int64_t B = 13;  // over 2 ranks: shards of 7 and 6; over 3: 5, 4 and 4

using Comms = std::vector<std::shared_ptr<parallel::Communicator>>;

using Model = test::SmallMlp;

// Replicas start from the same seed, so they are identical, as after a broadcast.
std::vector<std::unique_ptr<Model>> replicas(int n, DType dtype) {
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < n; ++r) {
    manual_seed(1);
    models.push_back(std::make_unique<Model>(dtype));
  }
  return models;
}

using Grads = std::vector<std::vector<double>>;

Grads grads_of(const Model& m) {
  Grads g;
  for (const Tensor& p : m.params()) g.push_back(p.grad().to_vector());
  return g;
}

// max over parameters of max|a − b| / max|b|: the error relative to each gradient's scale.
double max_relative_error(const Grads& got, const Grads& want) {
  double worst = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want[p].size(); ++i) {
      diff = std::max(diff, std::abs(got[p][i] - want[p][i]));
      scale = std::max(scale, std::abs(want[p][i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

data::Dataset dataset() { return data::make_synthetic(64, D, C, 1.0, 11); }

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> v(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// The reference: step `step`'s whole batch in one backward on one rank, the plain mean.
Grads full_batch_grads(const data::Dataset& d, int64_t step, DType dtype) {
  manual_seed(1);
  Model m(dtype);
  data::Loader loader(d, all_rows(d.size), B, 1, true, 5);
  auto mb = loader.step_batches(step, kCPU);
  m.loss(mb[0].x, mb[0].y, 0.0).backward();
  return grads_of(m);
}

// Runs body(rank) on one thread per rank. A rank that throws aborts the group, so the others stop
// waiting for it, and the first exception thrown is rethrown here, on the test's thread.
void run_ranks(const Comms& comms, const std::function<void(int)>& body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < int(comms.size()); ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        comms[size_t(r)]->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// One optimizer step on one rank: its k microbatches, each loss divided by the global batch, the
// reducer armed just before the last backward.
void rank_step(const Model& m, const data::Loader& loader, int64_t step, parallel::GradReducer& reducer) {
  auto mbs = loader.step_batches(step, kCPU);
  for (size_t i = 0; i < mbs.size(); ++i) {
    if (i + 1 == mbs.size()) reducer.prepare_for_last_backward();
    m.loss(mbs[i].x, mbs[i].y, double(B)).backward();
  }
  reducer.finish();
}

// N ranks of one job on CPU threads: replicas of the model, the in-process group, each rank's
// shard of the data (k microbatches) and its reducer (256 bytes: several buckets, 3 in f32 and 5
// in f64).
struct Job {
  std::vector<std::unique_ptr<Model>> models;
  Comms comms;
  std::vector<std::unique_ptr<data::Loader>> loaders;
  std::vector<std::unique_ptr<parallel::GradReducer>> reducers;

  Job(const data::Dataset& d, int n, int64_t k, DType dtype)
      : models(replicas(n, dtype)), comms(parallel::make_local_group(n, 20s)) {
    for (int r = 0; r < n; ++r) {
      loaders.push_back(std::make_unique<data::Loader>(d, all_rows(d.size), B, k, true, 5, r, n));
      reducers.push_back(
          std::make_unique<parallel::GradReducer>(models[size_t(r)]->params(), comms[size_t(r)], 256));
    }
  }
};

void expect_ranks_match_full_batch(DType dtype, double tolerance) {
  const data::Dataset d = dataset();
  const Grads full[2] = {full_batch_grads(d, 0, dtype), full_batch_grads(d, 1, dtype)};
  for (int n = 1; n <= 3; ++n)
    for (int64_t k = 1; k <= 3; ++k) {
      Job job(d, n, k, dtype);
      auto& [models, comms, loaders, reducers] = job;
      std::vector<std::vector<Grads>> got(size_t(n), std::vector<Grads>(2));
      std::vector<std::vector<int64_t>> calls(size_t(n), std::vector<int64_t>(2));
      run_ranks(comms, [&](int r) {
        const Model& m = *models[size_t(r)];
        for (int64_t step = 0; step < 2; ++step) {
          for (Tensor p : m.params()) p.zero_grad(/*set_to_none=*/false);
          const int64_t before = comms[size_t(r)]->all_reduce_calls();
          rank_step(m, *loaders[size_t(r)], step, *reducers[size_t(r)]);
          calls[size_t(r)][size_t(step)] = comms[size_t(r)]->all_reduce_calls() - before;
          got[size_t(r)][size_t(step)] = grads_of(m);
        }
      });
      EXPECT_GT(reducers[0]->num_buckets(), 1);
      for (int r = 0; r < n; ++r)
        for (int step = 0; step < 2; ++step) {
          const std::string what = std::string(dtype_name(dtype)) + ", N = " + std::to_string(n) +
                                   ", k = " + std::to_string(k) + ", rank " + std::to_string(r) +
                                   ", step " + std::to_string(step);
          EXPECT_LE(max_relative_error(got[size_t(r)][size_t(step)], full[step]), tolerance) << what;
          EXPECT_EQ(got[size_t(r)][size_t(step)], got[0][size_t(step)]) << what << ": not bitwise rank 0's";
          EXPECT_EQ(calls[size_t(r)][size_t(step)], reducers[0]->num_buckets()) << what;
        }
    }
}

// A communicator that records which tensor each all_reduce_sum got, in order.
class RecordingComm final : public parallel::Communicator {
 public:
  RecordingComm() : inner_(parallel::make_local_group(1)[0]) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<const void*> reduced;

 protected:
  void do_all_reduce_sum(const Tensor& t) override {
    reduced.push_back(t.data_ptr());
    inner_->all_reduce_sum(t);
  }
  void do_reduce_scatter_sum(const Tensor& t) override { inner_->reduce_scatter_sum(t); }
  void do_all_gather(const Tensor& t) override { inner_->all_gather(t); }
  void do_broadcast(const Tensor& t, int root) override { inner_->broadcast(t, root); }
  void do_barrier() override { inner_->barrier(); }
  void do_wait() override { inner_->wait(); }
  void do_synchronize() override { inner_->synchronize(); }
  void do_abort(const std::string& why) override { inner_->abort(why); }

 private:
  std::shared_ptr<parallel::Communicator> inner_;
};

}  // namespace

// ---- the thread communicator --------------------------------------------------------------

TEST(DistLocalGroup, AllReduceSumsEveryRanksTensor) {
  for (DType dtype : {DType::f32, DType::f64})
    for (int n = 1; n <= 4; ++n) {
      Comms comms = parallel::make_local_group(n, 20s);
      std::vector<std::vector<double>> got(static_cast<size_t>(n));
      run_ranks(comms, [&](int r) {
        // Rank r holds (r + 1)·(i + 1); the sum is (i + 1)·n(n + 1)/2, exact in any order.
        std::vector<double> v;
        for (int i = 0; i < 7; ++i) v.push_back(double((r + 1) * (i + 1)));
        Tensor t = from_vector(v, {7}, dtype);
        comms[size_t(r)]->all_reduce_sum(t);
        comms[size_t(r)]->all_reduce_sum(t);  // again: the sum of the sums
        got[size_t(r)] = t.to_vector();
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(comms[size_t(r)]->all_reduce_calls(), 2);
        for (int i = 0; i < 7; ++i)
          EXPECT_EQ(got[size_t(r)][size_t(i)], double((i + 1) * n * (n + 1) / 2 * n))
              << dtype_name(dtype) << ", n = " << n << ", rank " << r << ", element " << i;
      }
    }
}

// f32 sums in f32, in rank order: (1e8 + 1) − 1e8 is 0 in f32 (1e8 + 1 rounds back to 1e8), where
// another order would give 1. Every rank gets those same bits.
TEST(DistLocalGroup, SumsInRankOrderInTheTensorsDtype) {
  const std::vector<float> values{1e8f, 1.0f, -1e8f};
  Comms comms = parallel::make_local_group(3, 20s);
  std::vector<float> got(3);
  run_ranks(comms, [&](int r) {
    Tensor t = from_vector(std::vector<float>{values[size_t(r)]}, {1}, DType::f32);
    comms[size_t(r)]->all_reduce_sum(t);
    got[size_t(r)] = t.data<float>()[0];
  });
  const float want = (values[0] + values[1]) + values[2];  // f32 arithmetic, rank order
  EXPECT_EQ(want, 0.0f);
  for (float g : got) EXPECT_EQ(g, want);
}

TEST(DistLocalGroup, BroadcastAndBarrier) {
  Comms comms = parallel::make_local_group(3, 20s);
  std::vector<std::vector<double>> got(3);
  run_ranks(comms, [&](int r) {
    Tensor t = full({2, 2}, double(r + 10), DType::f64);
    comms[size_t(r)]->barrier();
    comms[size_t(r)]->broadcast(t, 2);
    comms[size_t(r)]->barrier();
    got[size_t(r)] = t.to_vector();
  });
  for (const auto& v : got) EXPECT_EQ(v, std::vector<double>(4, 12.0));
}

TEST(DistLocalGroup, ShapeMismatchIsAClearErrorOnEveryRank) {
  Comms comms = parallel::make_local_group(2, 20s);
  std::vector<std::string> errors(2);
  std::vector<double> after(2);
  run_ranks(comms, [&](int r) {
    try {
      comms[size_t(r)]->all_reduce_sum(ones({r == 0 ? 4 : 3}));
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
    // Every rank failed the same collective, so the group is still in step.
    Tensor t = ones({1});
    comms[size_t(r)]->all_reduce_sum(t);
    after[size_t(r)] = t.item();
  });
  for (int r = 0; r < 2; ++r) {
    for (const char* part : {"all_reduce_sum", "rank 0 [4] f32", "rank 1 [3] f32", "same shape"})
      EXPECT_NE(errors[size_t(r)].find(part), std::string::npos) << errors[size_t(r)];
    EXPECT_EQ(after[size_t(r)], 2.0);
  }
}

TEST(DistLocalGroup, RejectsWhatItCannotReduce) {
  Comms comms = parallel::make_local_group(1);
  parallel::Communicator& c = *comms[0];
  test::expect_error([&] { c.all_reduce_sum(zeros({2, 3}).t()); }, {"all_reduce_sum", "contiguous", "strided"});
  test::expect_error([&] { c.all_reduce_sum(zeros({2}, DType::i64)); }, {"all_reduce_sum", "f32 or f64", "i64"});
  test::expect_error([&] { c.broadcast(zeros({2}), 1); }, {"broadcast", "root 1", "group of 1"});
  test::expect_error([&] { c.all_reduce_sum(Tensor()); }, {"undefined"});
  EXPECT_EQ(c.all_reduce_calls(), 0);  // rejected calls are not counted
  test::expect_error([] { parallel::make_local_group(0); }, {"at least one rank"});
}

TEST(DistLocalGroup, AMissingRankMakesTheOthersTimeOut) {
  Comms comms = parallel::make_local_group(3, 200ms);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)]->all_reduce_sum(ones({3}));
      } catch (const parallel::DistError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& e : errors)
    for (const char* part : {"all_reduce_sum", "timed out after 200 ms", "waiting for rank(s) 2"})
      EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
}

TEST(DistLocalGroup, AbortWakesTheOthersPromptly) {
  Comms comms = parallel::make_local_group(3, 60s);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)]->all_reduce_sum(ones({3}));
      } catch (const parallel::DistError& e) {
        errors[size_t(r - 1)] = e.what();
      }
    });
  std::this_thread::sleep_for(50ms);
  comms[0]->abort("loss is NaN at step 7");
  for (auto& t : threads) t.join();
  // The abort ended the wait, not the 60 s timeout, which says "timed out after 60000 ms".
  for (const std::string& e : errors)
    for (const char* part : {"all_reduce_sum", "rank 0 aborted", "loss is NaN at step 7"})
      EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
  // A later collective fails at once, for the same reason.
  EXPECT_THROW(comms[1]->barrier(), parallel::DistError);
}

// A rank that throws (here before its first collective) must not leave the others waiting, and
// its error must reach the test's thread rather than end the process.
TEST(DistThreads, AnExceptionInOneRankReachesTheTestsThread) {
  Comms comms = parallel::make_local_group(3, 60s);
  std::vector<std::string> others(3);  // what ranks 0 and 2 saw
  test::expect_error(
      [&] {
        run_ranks(comms, [&](int r) {
          if (r == 1) MT_THROW("rank 1 failed on purpose");
          try {
            comms[size_t(r)]->all_reduce_sum(ones({2}));
          } catch (const parallel::DistError& e) {
            others[size_t(r)] = e.what();
            throw;
          }
        });
      },
      {"rank 1 failed on purpose"});
  // Rank 1's abort ended their wait, not the 60 s timeout ("timed out after 60000 ms").
  for (int r : {0, 2})
    EXPECT_NE(others[size_t(r)].find("rank 1 aborted the group: rank 1 failed on purpose"), std::string::npos) << others[size_t(r)];
}

// ---- the gradient reducer -----------------------------------------------------------------

TEST(DistReducer, BucketsFollowReverseParameterOrderAndGradsViewThem) {
  manual_seed(1);
  Model m(DType::f32);
  m.W1.set_grad(full({H, D}, 3.0));  // a gradient already there keeps its value
  Comms comms = parallel::make_local_group(1);
  // 256 bytes = 64 f32: b2 + W2 (16 + 45 padded), then w + g + b1, then W1 (54).
  parallel::GradReducer reducer(m.params(), comms[0], 256);
  ASSERT_EQ(reducer.num_buckets(), 3);
  const auto& buckets = reducer.buckets();
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{5, 4}));
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(buckets[2].params, (std::vector<size_t>{0}));
  const auto params = m.params();
  for (const auto& b : buckets) {
    EXPECT_EQ(b.numel % 16, 0);
    EXPECT_EQ(b.buffer.numel(), b.numel);
    for (size_t j = 0; j < b.params.size(); ++j) {
      EXPECT_EQ(b.offsets[j] % 16, 0);
      const Tensor g = params[b.params[j]].grad();
      EXPECT_EQ(g.data_ptr(), b.buffer.data<float>() + b.offsets[j]);
      EXPECT_EQ(g.shape(), params[b.params[j]].shape());
      const double want = b.params[j] == 0 ? 3.0 : 0.0;
      for (double v : g.to_vector()) EXPECT_EQ(v, want);
    }
  }
  EXPECT_NE(reducer.layout_str().find("bucket 2: 64 elements (256 bytes), parameters 0"),
            std::string::npos) << reducer.layout_str();
  // A parameter larger than a bucket gets one of its own.
  parallel::GradReducer tiny(m.params(), comms[0], 1);
  EXPECT_EQ(tiny.num_buckets(), 6);
}

TEST(DistReducer, GradientsEqualFullBatchF64) { expect_ranks_match_full_batch(DType::f64, 1e-12); }

TEST(DistReducer, GradientsEqualFullBatchF32) { expect_ranks_match_full_batch(DType::f32, 1e-5); }

// One all-reduce per bucket per optimizer step, all of them launched during the LAST backward:
// none while the earlier microbatches accumulate, none left for finish().
TEST(DistReducer, OneAllReducePerBucketPerStep) {
  const data::Dataset d = dataset();
  constexpr int n = 2;
  constexpr int64_t k = 3;
  Job job(d, n, k, DType::f32);
  auto& [models, comms, loaders, reducers] = job;
  // Per rank and step: calls after the first k − 1 backwards, after the last, after finish().
  std::vector<std::vector<std::vector<int64_t>>> calls(n);
  run_ranks(comms, [&](int r) {
    const Model& m = *models[size_t(r)];
    parallel::Communicator& comm = *comms[size_t(r)];
    parallel::GradReducer& reducer = *reducers[size_t(r)];
    for (int64_t step = 0; step < 2; ++step) {
      for (Tensor p : m.params()) p.zero_grad(/*set_to_none=*/false);
      const int64_t before = comm.all_reduce_calls();
      auto mbs = loaders[size_t(r)]->step_batches(step, kCPU);
      for (size_t i = 0; i + 1 < mbs.size(); ++i) m.loss(mbs[i].x, mbs[i].y, double(B)).backward();
      std::vector<int64_t> c{comm.all_reduce_calls() - before};
      reducer.prepare_for_last_backward();
      m.loss(mbs.back().x, mbs.back().y, double(B)).backward();
      c.push_back(comm.all_reduce_calls() - before);
      reducer.finish();
      c.push_back(comm.all_reduce_calls() - before);
      calls[size_t(r)].push_back(c);
    }
  });
  const int64_t nb = reducers[0]->num_buckets();
  ASSERT_EQ(nb, 3);
  for (int r = 0; r < n; ++r)
    for (const auto& c : calls[size_t(r)]) EXPECT_EQ(c, (std::vector<int64_t>{0, nb, nb})) << "rank " << r;
}

// zero_grad(set_to_none=true) frees the bucket views; the reducer puts them back before the last
// backward, carrying over what the earlier microbatches accumulated.
TEST(DistReducer, SetToNoneIsReattached) {
  const data::Dataset d = dataset();
  const Grads full = full_batch_grads(d, 1, DType::f64);
  constexpr int n = 2;
  for (int64_t k : {1, 2}) {
    Job job(d, n, k, DType::f64);
    auto& [models, comms, loaders, reducers] = job;
    std::vector<Grads> got(n);
    std::vector<int64_t> calls(n);
    run_ranks(comms, [&](int r) {
      const Model& m = *models[size_t(r)];
      rank_step(m, *loaders[size_t(r)], 0, *reducers[size_t(r)]);
      for (Tensor p : m.params()) p.zero_grad(/*set_to_none=*/true);
      const int64_t before = comms[size_t(r)]->all_reduce_calls();
      rank_step(m, *loaders[size_t(r)], 1, *reducers[size_t(r)]);
      calls[size_t(r)] = comms[size_t(r)]->all_reduce_calls() - before;
      got[size_t(r)] = grads_of(m);
      // The views are back: the next step reduces in place again.
      for (size_t b = 0; b < reducers[size_t(r)]->buckets().size(); ++b) {
        const auto& bucket = reducers[size_t(r)]->buckets()[b];
        for (size_t j = 0; j < bucket.params.size(); ++j)
          EXPECT_EQ(m.params()[bucket.params[j]].grad().data_ptr(),
                    bucket.buffer.data<double>() + bucket.offsets[j]);
      }
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_LE(max_relative_error(got[size_t(r)], full), 1e-12) << "k = " << k << ", rank " << r;
      EXPECT_EQ(got[size_t(r)], got[0]) << "k = " << k << ", rank " << r;
      EXPECT_EQ(calls[size_t(r)], reducers[0]->num_buckets());
    }
  }
}

// Buckets go out strictly in index order, and as soon as they can: here the parameters are listed
// so that the buckets of the last layer (4 and 5) complete first; they wait for 0..3.
TEST(DistReducer, BucketsAreReducedInIndexOrderDuringTheBackward) {
  manual_seed(1);
  Model m(DType::f64);
  auto comm = std::make_shared<RecordingComm>();
  // Reversed for bucketing: w, g, b1, W1, b2, W2, one bucket each.
  parallel::GradReducer reducer({m.W2, m.b2, m.W1, m.b1, m.g, m.w}, comm, 1);
  ASSERT_EQ(reducer.num_buckets(), 6);
  const data::Dataset d = dataset();
  data::Loader loader(d, all_rows(d.size), B, 1, true, 5);
  auto mb = loader.step_batches(0, kCPU);
  reducer.prepare_for_last_backward();
  m.loss(mb[0].x, mb[0].y, double(B)).backward();
  std::vector<const void*> want;
  for (const auto& b : reducer.buckets()) want.push_back(b.buffer.data_ptr());
  EXPECT_EQ(comm->reduced, want);  // all six, in order, before finish()
  reducer.finish();
  EXPECT_EQ(comm->reduced.size(), 6u);

  // In forward order bucket 0 is b2 alone: it goes out the moment b2's gradient is final, long
  // before W1's exists.
  manual_seed(1);
  Model m2(DType::f64);
  auto comm2 = std::make_shared<RecordingComm>();
  parallel::GradReducer forward(m2.params(), comm2, 1);
  size_t reduced_when_b2_ready = 0;
  bool w1_had_grad = true;
  m2.b2.register_grad_ready_hook([&](const Tensor&) {  // runs after the reducer's own hook
    reduced_when_b2_ready = comm2->reduced.size();
    w1_had_grad = m2.W1.grad().to_vector() != std::vector<double>(size_t(H * D), 0.0);
  });
  forward.prepare_for_last_backward();
  m2.loss(mb[0].x, mb[0].y, double(B)).backward();
  forward.finish();
  // Bucket 1 (W2) may go out with it, if W2's gradient was final first.
  EXPECT_GE(reduced_when_b2_ready, 1u);
  EXPECT_LE(reduced_when_b2_ready, 2u);
  EXPECT_FALSE(w1_had_grad);
}

TEST(DistReducer, MisuseIsAClearError) {
  manual_seed(1);
  Model m(DType::f32);
  Comms comms = parallel::make_local_group(1);
  test::expect_error([&] { parallel::GradReducer({}, comms[0]); }, {"no parameters"});
  test::expect_error([&] { parallel::GradReducer(m.params(), nullptr); }, {"no communicator"});
  Tensor f64 = zeros({2}, DType::f64).set_requires_grad();
  test::expect_error([&] { parallel::GradReducer({m.W1, f64}, comms[0]); },
                     {"parameter 1", "f64", "parameter 0", "f32", "one device and gradient dtype"});
  test::expect_error([&] { parallel::GradReducer({m.W1, m.b1, m.W1}, comms[0]); },
                     {"parameter 2 is the same tensor as parameter 0"});
  test::expect_error([&] { parallel::GradReducer({m.W1, zeros({3})}, comms[0]); },
                     {"parameter 1", "[3]", "not a leaf that requires grad"});

  {
    manual_seed(1);
    Model moved(DType::f32);
    parallel::GradReducer early(moved.params(), comms[0], 256);
    moved.W2.set_data(moved.W2.to(DType::f64));  // what Module::to does to each parameter
    test::expect_error([&] { early.prepare_for_last_backward(); },
                       {"parameter 4 is now on cpu with f64", "built on cpu for f32",
                        "after moving the model"});
  }

  parallel::GradReducer reducer(m.params(), comms[0], 256);
  test::expect_error([&] { reducer.finish(); }, {"finish", "prepare_for_last_backward() was not called"});
  reducer.prepare_for_last_backward();
  test::expect_error([&] { reducer.prepare_for_last_backward(); }, {"called again before finish()"});
  // Two backward passes while armed: the first already reduced the buckets.
  Tensor x = ones({2, D}), y = zeros({2}, DType::i64);
  m.loss(x, y, 2.0).backward();
  test::expect_error([&] { m.loss(x, y, 2.0).backward(); },
                     {"received a second gradient after prepare_for_last_backward()"});
}

// Hooks cannot be unregistered; those of a destroyed reducer must do nothing, and a new reducer
// over the same parameters takes over.
TEST(DistReducer, DestroyedReducersHooksAreHarmless) {
  manual_seed(1);
  Model m(DType::f64);
  Comms comms = parallel::make_local_group(1);
  Tensor x = ones({2, D}, DType::f64), y = zeros({2}, DType::i64);
  {
    parallel::GradReducer old(m.params(), comms[0], 256);
    old.prepare_for_last_backward();
  }  // destroyed while armed
  m.loss(x, y, 2.0).backward();
  EXPECT_EQ(comms[0]->all_reduce_calls(), 0);
  const Grads once = grads_of(m);
  parallel::GradReducer reducer(m.params(), comms[0], 256);
  EXPECT_EQ(grads_of(m), once);  // the values move into the new buckets
  reducer.prepare_for_last_backward();
  m.loss(x, y, 2.0).backward();
  reducer.finish();
  EXPECT_EQ(comms[0]->all_reduce_calls(), reducer.num_buckets());
  const Grads twice = grads_of(m);
  for (size_t p = 0; p < once.size(); ++p)
    for (size_t i = 0; i < once[p].size(); ++i) EXPECT_DOUBLE_EQ(twice[p][i], 2 * once[p][i]);
}

// ---- the sharded loader -------------------------------------------------------------------

namespace {
// Row i's single feature is i, so a batch's x names its rows.
data::Dataset numbered(int64_t n) {
  data::Dataset d;
  d.size = n;
  d.dim = 1;
  d.classes = 2;
  for (int64_t i = 0; i < n; ++i) {
    d.features.push_back(float(i));
    d.labels.push_back(i % 2);
  }
  return d;
}
}  // namespace

TEST(LoaderShard, ShardsTileTheGlobalBatchInOrder) {
  const data::Dataset d = numbered(40);  // 3 steps of 13 per epoch: step 3 is a new epoch
  data::Loader single(d, all_rows(d.size), B, 1, true, 9);
  for (int world = 1; world <= 3; ++world)
    for (int64_t k : {1, 2}) {
      std::vector<std::unique_ptr<data::Loader>> ranks;
      int64_t total = 0, smallest = B, largest = 0;
      for (int r = 0; r < world; ++r) {
        ranks.push_back(std::make_unique<data::Loader>(d, all_rows(d.size), B, k, true, 9, r, world));
        total += ranks.back()->shard_size();
        smallest = std::min(smallest, ranks.back()->shard_size());
        largest = std::max(largest, ranks.back()->shard_size());
      }
      EXPECT_EQ(total, B);
      EXPECT_LE(largest - smallest, 1);
      for (int64_t step = 0; step < 5; ++step) {
        const std::vector<double> want = single.step_batches(step, kCPU)[0].x.to_vector();
        std::vector<double> got;
        for (const auto& rank : ranks) {
          int64_t rows = 0;
          for (const auto& mb : rank->step_batches(step, kCPU)) {
            const std::vector<double> v = mb.x.to_vector();
            got.insert(got.end(), v.begin(), v.end());
            rows += mb.x.size(0);
          }
          EXPECT_EQ(rows, rank->shard_size());
        }
        // Equal and in the same order: the shards are disjoint and cover the batch.
        EXPECT_EQ(got, want) << "world " << world << ", k = " << k << ", step " << step;
      }
    }
}

TEST(LoaderShard, BadRankOrWorldIsAClearError) {
  const data::Dataset d = numbered(40);
  auto make = [&](int64_t batch, int64_t k, int rank, int world) {
    data::Loader l(d, all_rows(d.size), batch, k, true, 9, rank, world);
  };
  test::expect_error([&] { make(13, 1, 0, 0); }, {"rank 0", "world of 0"});
  test::expect_error([&] { make(13, 1, 3, 3); }, {"rank 3", "world of 3"});
  test::expect_error([&] { make(13, 1, -1, 2); }, {"rank -1"});
  test::expect_error([&] { make(13, 5, 0, 3); },
                     {"batch_size 13", "world 3", "shards of 4 or 5", "5 microbatches"});
  test::expect_error([&] { make(2, 1, 0, 3); }, {"batch_size 2", "world 3", "shards of 0"});
  test::expect_error([&] { make(13, 0, 0, 1); }, {"microbatches must be at least 1"});
  make(12, 4, 2, 3);  // shards of exactly k samples are fine
}
