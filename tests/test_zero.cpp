// ZeRO-1 (train/zero.h): AdamW's state sharded over the ranks.
//
// Against one unsharded AdamW on the summed gradient (the whole-batch gradient), with several
// buckets small enough that the rank boundaries cut parameters in two: the same weights and the
// same full state (f64 within 1e-12); each rank holds total / N bytes of state give or take one
// bucket's padding; per step B reduce-scatters, 1 all-reduce (the gradient norm), B all-gathers.
// Then whole trainer runs on CPU threads: sharded against unsharded, resume with the same N
// (bitwise) and with another N (the full state in the checkpoint is re-sharded).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "app/config.h"
#include "app/config_trainer.h"
#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "parallel/communicator.h"
#include "parallel/reducer.h"
#include "tests/max_rel_diff.h"
#include "tests/ranks.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/zero.h"

using namespace mt;
using mt::test::on_threads;
using mt::test::max_rel_diff;
using mt::test::TempDir;

namespace {

// A weight matrix, a bias and a norm weight, twice: 6 parameters of 62 elements in all.
std::vector<Tensor> make_params() {
  std::vector<Tensor> ps;
  for (Shape s : {Shape{4, 5}, Shape{5}, Shape{5}, Shape{3, 5}, Shape{3}, Shape{14}})
    ps.push_back(randn(s, DType::f64).set_requires_grad());
  return ps;
}

std::vector<optim::ParamGroup> groups_of(const std::vector<Tensor>& ps) {
  std::vector<optim::ParamGroup> g(2);
  for (const Tensor& p : ps) g[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  g[0].weight_decay = 0.1;
  g[1].weight_decay = 0.0;
  return g;
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& ps) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : ps) out.push_back(p.to_vector());
  return out;
}

std::vector<std::vector<double>> state_values(const nn::StateDict& d) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : d) out.push_back(t.to(DType::f64).to_vector());
  return out;
}

constexpr optim::AdamWOptions kAdamW{1e-2, {0.9, 0.99}, 1e-8, 0.1};
constexpr size_t kBucketBytes = 200;  // 25 f64: the 62 elements take several buckets
constexpr double kClip = 0.5;         // small enough to clip

// `steps` updates of N sharded ranks (each its own copy of `init`, rank r's gradient `grads[s][r]`)
// against one unsharded AdamW on Σ_r grads[s][r]. Returns rank 0's state and the reference's.
struct ShardedRun {
  std::vector<std::vector<std::vector<double>>> params;  // per rank
  std::vector<nn::StateDict> state;                      // per rank: the full state (gathered)
  std::vector<int64_t> state_bytes, reduce_scatters, all_reduces, all_gathers;
  int buckets = 0;
};

ShardedRun run_sharded(int n, const std::vector<Tensor>& init,
                       const std::vector<std::vector<std::vector<Tensor>>>& grads,
                       const nn::StateDict* resume_from = nullptr) {
  auto comms = parallel::make_local_group(n);
  std::vector<std::vector<Tensor>> ps(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (const Tensor& p : init) ps[size_t(r)].push_back(p.detach().clone().set_requires_grad());
  ShardedRun out;
  out.params.resize(size_t(n));
  out.state.resize(size_t(n));
  out.state_bytes.resize(size_t(n));
  out.reduce_scatters.resize(size_t(n));
  out.all_reduces.resize(size_t(n));
  out.all_gathers.resize(size_t(n));
  on_threads(n, [&](int r) {
    auto& mine = ps[size_t(r)];
    parallel::GradReducer reducer(mine, comms[size_t(r)], kBucketBytes, /*shard=*/true);
    train::ShardedAdamW opt(groups_of(mine), kAdamW, comms[size_t(r)], reducer);
    if (resume_from) opt.load_state_dict(*resume_from);
    if (r == 0) out.buckets = reducer.num_buckets();
    for (const auto& step : grads) {
      reducer.prepare_for_last_backward();
      for (size_t i = 0; i < mine.size(); ++i) add_into(mine[i].grad(), step[size_t(r)][i]);  // "backward"
      reducer.finish();
      opt.clip_grad_norm_(kClip);
      opt.step();
      opt.zero_grad();
    }
    out.params[size_t(r)] = values(mine);
    out.state[size_t(r)] = opt.state_dict();
    out.state_bytes[size_t(r)] = opt.state_bytes();
    out.reduce_scatters[size_t(r)] = comms[size_t(r)]->reduce_scatter_calls();
    out.all_reduces[size_t(r)] = comms[size_t(r)]->all_reduce_calls();
    out.all_gathers[size_t(r)] = comms[size_t(r)]->all_gather_calls();
  });
  return out;
}

// The same steps unsharded, on one rank.
nn::StateDict run_whole(std::vector<Tensor>& ps, const std::vector<std::vector<std::vector<Tensor>>>& grads,
                        const nn::StateDict* resume_from = nullptr) {
  optim::AdamW opt(groups_of(ps), kAdamW);
  if (resume_from) opt.load_state_dict(*resume_from);
  for (const auto& step : grads) {
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor g = zeros(ps[i].shape(), DType::f64);
      for (const auto& rank : step) add_into(g, rank[i]);  // rank order, as the group sums
      ps[i].set_grad(g);
    }
    optim::clip_grad_norm_(ps, kClip);
    opt.step();
  }
  nn::StateDict d = opt.state_dict();
  for (auto& [name, t] : d) t = t.clone();
  return d;
}

std::vector<std::vector<std::vector<Tensor>>> random_grads(int steps, int n, const std::vector<Tensor>& ps) {
  std::vector<std::vector<std::vector<Tensor>>> g(static_cast<size_t>(steps));
  for (auto& step : g)
    for (int r = 0; r < n; ++r) {
      step.emplace_back();
      for (const Tensor& p : ps) step.back().push_back(randn(p.shape(), DType::f64));
    }
  return g;
}

}  // namespace

TEST(Zero, ShardedAdamWMatchesUnshardedAndHoldsItsShare) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << n << " ranks");
    manual_seed(21);
    const std::vector<Tensor> init = make_params();
    const auto grads = random_grads(5, n, init);
    const ShardedRun s = run_sharded(n, init, grads);
    std::vector<Tensor> whole;
    for (const Tensor& p : init) whole.push_back(p.detach().clone().set_requires_grad());
    const nn::StateDict ref_state = run_whole(whole, grads);
    int64_t numel = 0;
    for (const Tensor& p : init) numel += p.numel();
    const int64_t total = 2 * 8 * numel;  // exp_avg and exp_avg_sq, f64
    // One bucket's padding: up to 16 · N elements of each of the two buffers.
    const int64_t slack = 2 * 8 * 16 * n;
    int64_t sum = 0;
    EXPECT_GT(s.buckets, 1);
    for (int r = 0; r < n; ++r) {
      EXPECT_LE(max_rel_diff(s.params[size_t(r)], values(whole)), 1e-12) << "rank " << r;
      EXPECT_EQ(s.params[size_t(r)], s.params[0]) << "replicas equal";
      EXPECT_LE(max_rel_diff(state_values(s.state[size_t(r)]), state_values(ref_state)), 1e-12);
      ASSERT_EQ(s.state[size_t(r)].size(), ref_state.size());
      for (size_t k = 0; k < ref_state.size(); ++k) EXPECT_EQ(s.state[size_t(r)][k].first, ref_state[k].first);
      EXPECT_NEAR(double(s.state_bytes[size_t(r)]), double(total) / n, double(slack));
      sum += s.state_bytes[size_t(r)];
      // Per step: one reduce-scatter and one all-gather per bucket, one all-reduce (the norm);
      // the gathered state: two all-gathers per bucket.
      const int64_t steps = int64_t(grads.size()), b = s.buckets;
      EXPECT_EQ(s.reduce_scatters[size_t(r)], steps * b);
      EXPECT_EQ(s.all_reduces[size_t(r)], steps);
      EXPECT_EQ(s.all_gathers[size_t(r)], steps * b + 2 * b);
    }
    EXPECT_EQ(sum, total);  // the shards partition the state
  }
}

TEST(Zero, AFullStateResumesShardedWithAnyNumberOfRanks) {
  manual_seed(22);
  const std::vector<Tensor> init = make_params();
  const auto first = random_grads(3, 3, init), second = random_grads(3, 3, init);
  // Saved by 2 sharded ranks, resumed by 3 (and by 1): the unsharded run's numbers.
  auto two = first;
  for (auto& step : two) step.pop_back();
  const ShardedRun a = run_sharded(2, init, two);
  std::vector<Tensor> mid;
  for (const auto& v : a.params[0]) mid.push_back(from_vector(v, init[mid.size()].shape(), DType::f64).set_requires_grad());
  std::vector<Tensor> whole;
  for (const Tensor& p : init) whole.push_back(p.detach().clone().set_requires_grad());
  const nn::StateDict half = run_whole(whole, two);
  EXPECT_LE(max_rel_diff(state_values(a.state[0]), state_values(half)), 1e-12);
  const nn::StateDict ref = run_whole(whole, second, &half);
  for (int n : {3, 1}) {
    auto g = second;
    if (n == 1)
      for (auto& step : g) {  // one rank gets the sum of the three
        for (size_t i = 0; i < step[0].size(); ++i) {
          add_into(step[0][i], step[1][i]);
          add_into(step[0][i], step[2][i]);
        }
        step.resize(1);
      }
    const ShardedRun b = run_sharded(n, mid, g, &a.state[0]);
    EXPECT_LE(max_rel_diff(b.params[0], values(whole)), 1e-12) << n << " ranks";
    EXPECT_LE(max_rel_diff(state_values(b.state[0]), state_values(ref)), 1e-12) << n << " ranks";
  }
  // A state that does not fit is refused, as unsharded.
  nn::StateDict bad = a.state[0];
  bad.back().second = zeros({3}, DType::f64);
  EXPECT_THROW(run_sharded(2, mid, second, &bad), Error);
}

// ---- whole runs on CPU threads ------------------------------------------------------------

namespace {

Config zero_config(const TempDir& dir, bool shard) {
  return load_config("", {"model.input=12", "model.hidden=[16]", "model.classes=4", "data.samples=600",
                          "optim.steps=20", "optim.batch_size=48", "optim.warmup_steps=4",
                          "optim.clip_norm=0.5", "eval.every=10", "logging.every=5",
                          "checkpoint.every=10", "checkpoint.keep_last=5", "checkpoint.dir=" + (dir / "ckpt"),
                          "precision.compute_dtype=f64", "device=cpu",
                          std::string("optim.shard_state=") + (shard ? "true" : "false")});
}

std::vector<std::vector<double>> params_of(train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (auto& p : t.model().parameters()) out.push_back(p.to_vector());
  return out;
}

}  // namespace

TEST(Zero, TrainerShardedRunsTrainLikeUnsharded) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << n << " ranks");
    TempDir d0, d1;
    const train::LocalRun whole = app::run_local_ranks(zero_config(d0, false), n);
    std::vector<std::shared_ptr<parallel::Communicator>> comms;
    const train::LocalRun sharded = train::run_local_ranks(n, [&](std::shared_ptr<parallel::Communicator> c) {
      comms.push_back(c);
      return std::make_unique<app::ConfigTrainer>(zero_config(d1, true), kCPU, c);
    });
    for (int r = 0; r < n; ++r) {
      train::Trainer& t = *sharded.ranks[size_t(r)];
      ASSERT_NE(t.sharded_optimizer(), nullptr);
      EXPECT_LE(max_rel_diff(params_of(t), params_of(*whole.ranks[0])), 1e-12);
      EXPECT_EQ(params_of(t), params_of(*sharded.ranks[0]));
      // One rank: the same arithmetic in the same order, so the same bits.
      if (n == 1) EXPECT_EQ(params_of(t), params_of(*whole.ranks[0]));
      // 20 steps, 1 bucket: 20 reduce-scatters; all-gathers: 20 of the parameters and 2 of the
      // state per save (steps 10 and 20); all-reduces: the norm per step, and the loss and the
      // accuracy at the 4 logged steps (which one rank does not need); and one all-gather of the
      // ranks' config digests before the first step (parallel/job_check.h).
      EXPECT_EQ(comms[size_t(r)]->reduce_scatter_calls(), 20);
      EXPECT_EQ(comms[size_t(r)]->all_gather_calls(), 20 + 2 * 2 + (n > 1 ? 1 : 0));
      EXPECT_EQ(comms[size_t(r)]->all_reduce_calls(), 20 + (n > 1 ? 2 * 4 : 0));
    }
    // The checkpoint holds the full state, as the unsharded run's does.
    const train::Checkpoint a = train::load_checkpoint(d0 / "ckpt"), b = train::load_checkpoint(d1 / "ckpt");
    ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
    for (size_t k = 0; k < a.optimizer.size(); ++k) EXPECT_EQ(a.optimizer[k].first, b.optimizer[k].first);
    EXPECT_LE(max_rel_diff(state_values(a.optimizer), state_values(b.optimizer)), 1e-12);
  }
}

// Rank 0's weights are broadcast at the start, but not its optimizer state or data position:
// ranks resumed from different checkpoints would train apart, so the job check compares the step
// each resumed from, and every rank stops naming it.
TEST(Zero, RanksResumedFromDifferentStepsAreRefused) {
  TempDir d, d2;
  Config cfg = zero_config(d, false);
  app::run_local_ranks(cfg, 2);
  Config again = cfg;
  again.checkpoint.dir = d2 / "ckpt";
  again.optim.steps = 30;  // neither rank has finished
  try {
    train::run_local_ranks(2, [&](std::shared_ptr<parallel::Communicator> comm) {
      const int rank = comm->rank();
      auto t = std::make_unique<app::ConfigTrainer>(again, kCPU, std::move(comm));
      t->resume(d / (rank == 0 ? "ckpt/step-000020.safetensors" : "ckpt/step-000010.safetensors"));
      return t;
    });
    ADD_FAILURE() << "ranks resumed at steps 20 and 10 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 differs from rank 0 first at 'resumed at step' "
                                         "(20 on rank 0)"), std::string::npos) << e.what();
  }
}

TEST(Zero, TrainerResumesBitwiseWithTheSameNAndReshardsWithAnother) {
  TempDir d;
  Config cfg = zero_config(d, true);
  const train::LocalRun straight = app::run_local_ranks(cfg, 2);
  const std::string ten = d / "ckpt/step-000010.safetensors";
  // Same N: bitwise, weights and the gathered state.
  TempDir d2;
  Config again = cfg;
  again.checkpoint.dir = d2 / "ckpt";
  const train::LocalRun resumed = app::run_local_ranks(again, 2, ten);
  EXPECT_EQ(params_of(*resumed.ranks[0]), params_of(*straight.ranks[0]));
  EXPECT_EQ(state_values(train::load_checkpoint(d2 / "ckpt").optimizer),
            state_values(train::load_checkpoint(d / "ckpt").optimizer));
  // Another N (3, sharded; 1, unsharded): the full state is re-sharded; the gradients differ from
  // the 2-rank run's only in the order of their sums.
  for (int n : {3, 1}) {
    TempDir d3;
    Config other = cfg;
    other.checkpoint.dir = d3 / "ckpt";
    other.optim.shard_state = n > 1;
    const train::LocalRun moved = app::run_local_ranks(other, n, ten);
    EXPECT_EQ(moved.ranks[0]->step(), 20);
    EXPECT_LE(max_rel_diff(params_of(*moved.ranks[0]), params_of(*straight.ranks[0])), 1e-12) << n;
  }
}

TEST(Zero, F16LossScalingIsRefused) {
  TempDir d;
  Config cfg = zero_config(d, true);
  cfg.precision.compute_dtype = DType::f16;
  try {
    app::run_local_ranks(cfg, 2);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.shard_state: not with f16 loss scaling"), std::string::npos) << e.what();
  }
}
