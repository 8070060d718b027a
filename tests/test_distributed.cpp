// Data parallelism on CPU threads: the thread communicator and the sharded loader.
//
// Each rank runs on its own std::thread; a rank's exception reaches the test's thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "dist/communicator.h"
#include "tests/expect_error.h"
#include "train/data.h"

using namespace mt;
using namespace std::chrono_literals;

namespace {

constexpr int64_t B = 13;  // over 2 ranks: shards of 7 and 6; over 3: 5, 4 and 4

using Comms = std::vector<std::shared_ptr<dist::Communicator>>;

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> v(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
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

}  // namespace

// ---- the thread communicator --------------------------------------------------------------

TEST(DistLocalGroup, AllReduceSumsEveryRanksTensor) {
  for (DType dtype : {DType::f32, DType::f64})
    for (int n = 1; n <= 4; ++n) {
      Comms comms = dist::make_local_group(n, 20s);
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
  Comms comms = dist::make_local_group(3, 20s);
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
  Comms comms = dist::make_local_group(3, 20s);
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
  Comms comms = dist::make_local_group(2, 20s);
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
  Comms comms = dist::make_local_group(1);
  dist::Communicator& c = *comms[0];
  test::expect_error([&] { c.all_reduce_sum(zeros({2, 3}).t()); }, {"all_reduce_sum", "contiguous", "strided"});
  test::expect_error([&] { c.all_reduce_sum(zeros({2}, DType::i64)); }, {"all_reduce_sum", "f32 or f64", "i64"});
  test::expect_error([&] { c.broadcast(zeros({2}), 1); }, {"broadcast", "root 1", "group of 1"});
  test::expect_error([&] { c.all_reduce_sum(Tensor()); }, {"undefined"});
  EXPECT_EQ(c.all_reduce_calls(), 0);  // rejected calls are not counted
  test::expect_error([] { dist::make_local_group(0); }, {"at least one rank"});
}

TEST(DistLocalGroup, AMissingRankMakesTheOthersTimeOut) {
  Comms comms = dist::make_local_group(3, 200ms);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)]->all_reduce_sum(ones({3}));
      } catch (const dist::DistError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 5s);
  for (const std::string& e : errors)
    for (const char* part : {"all_reduce_sum", "timed out after 200 ms", "waiting for rank(s) 2"})
      EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
}

TEST(DistLocalGroup, AbortWakesTheOthersPromptly) {
  Comms comms = dist::make_local_group(3, 60s);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)]->all_reduce_sum(ones({3}));
      } catch (const dist::DistError& e) {
        errors[size_t(r - 1)] = e.what();
      }
    });
  std::this_thread::sleep_for(50ms);
  comms[0]->abort("loss is NaN at step 7");
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (const std::string& e : errors)
    for (const char* part : {"all_reduce_sum", "rank 0 aborted", "loss is NaN at step 7"})
      EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
  // A later collective fails at once, for the same reason.
  EXPECT_THROW(comms[1]->barrier(), dist::DistError);
}

// A rank that throws (here before its first collective) must not leave the others waiting, and
// its error must reach the test's thread rather than end the process.
TEST(DistThreads, AnExceptionInOneRankReachesTheTestsThread) {
  Comms comms = dist::make_local_group(3, 60s);
  const auto start = std::chrono::steady_clock::now();
  test::expect_error(
      [&] {
        run_ranks(comms, [&](int r) {
          if (r == 1) MT_THROW("rank 1 failed on purpose");
          comms[size_t(r)]->all_reduce_sum(ones({2}));
        });
      },
      {"rank 1 failed on purpose"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
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
