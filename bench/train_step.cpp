// train_step: whole optimizer steps of a bf16 MLP on cuda:0, timed, beside the bare cuBLAS bf16
// GEMM rate and the device copy bandwidth measured in the same run (docs/perf.md
// reads the output).
//
// One step is what train/trainer.cpp does, minus the data loader and the logging:
//   4 microbatches of  forward → cross_entropy (sum / (4·microbatch)) → backward,
//   then the gradient norm and clip factor (max_norm 1.0), AdamW step with the factor folded in
//   (the trainer's clipping: .grad is never rescaled), zero_grad.
// The model, fp32 master weights and fp32 gradients, GEMMs in bf16 (set_compute_dtype):
//   Linear(in, h) → RMSNorm(h) → ScaledSiLU → Linear(h, h) → RMSNorm(h) → ScaledSiLU → Linear(h, C)
// (the Sequential runs each RMSNorm → ScaledSiLU pair as one fused rms_norm_scaled_silu)
//
//   train_step [--size small|large|all] [--export DIR] [--gemm-algo measured|heuristic]
//     small   in 784,  h 1024, C 10,   microbatch 128    (1.9M params: bound by launches)
//     large   in 4096, h 8192, C 4096, microbatch 8192   (134M params, ~26.4 TFLOP per step)
//     all     both (the default)
//   --gemm-algo measured (the default) times cuBLASLt's first candidates for each GEMM shape once
//     and keeps the fastest (set_gemm_autotune, core/switches.h); heuristic takes the first.
//
// The batch is fixed (the same 4·microbatch samples every step; x ~ N(0, 1), targets uniform
// over the classes), drawn from a seeded generator after the model's initialization, and handed
// to the step on the GPU in bf16, as a data loader would: its cast is not part of the step.
//
// --export DIR writes, before timing, what bench/torch_reference.py needs to check us against
// PyTorch and to compare times:
//   DIR/<size>_init.safetensors   the initial weights under the model's state_dict names
//   DIR/<size>_batch.safetensors  x (f32 [4·microbatch, in]) and y (i64 [4·microbatch])
//   DIR/<size>_losses.txt         the losses of the first 20 steps, one per line (each read back
//                                 after its step, outside any timed region)
// then reloads the initial weights and makes a fresh optimizer, so timing starts from the same
// state; and after timing it writes DIR/<size>_timing.json (this run's figures).
//
// Timing: 3 untimed steps, then N steps (small 50, large 10), each between two cudaEvents on the
// framework stream, with the host waiting for the stop event before the next step begins. So each
// time is one step started from an idle GPU, host launch overhead included; the loss is never read
// inside it. Reported: the median ms/step, samples/s, and TFLOP/s counted as 6·params·samples.
//
// Each size is timed twice from the same initial weights: eager (every op launched from the host)
// and as a CUDA graph (GraphStep below: one eager step, then the step recorded once and replayed;
// AdamW's prepare_step() runs on the host before each replay). The graph's first 20 losses are
// compared with the eager ones: the same kernels on the same data give the same bits.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/cuda/check.h"
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "core/switches.h"
#include "parallel/launch.h"
#ifdef MT_WITH_NCCL
#include "parallel/nccl.h"
#include "parallel/reducer.h"
#endif
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/modules.h"
#include "nn/serialize.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/linear/linear_cuda.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace {

using namespace mt;
using bench::EventPair, bench::median, bench::num, bench::time_each, bench::write_text;
using bench::copy_tbps, bench::cublas_bf16_tflops;

// ---- the run's settings, all here: bench/torch_reference.py repeats them and must match --------
constexpr uint64_t kSeed = 1234;      // the model's initialization, then the batch
constexpr int64_t kMicrobatches = 4;  // per optimizer step
constexpr double kLr = 1e-4;
constexpr double kBeta1 = 0.9, kBeta2 = 0.999;
constexpr double kEps = 1e-8;
constexpr double kWeightDecay = 0.1;  // Linear weights only (decay_groups: parameters of >= 2 dims)
constexpr double kClipNorm = 1.0;
constexpr int kWarmupSteps = 3;
constexpr int kLossSteps = 20;        // steps whose losses --export writes

struct Size {
  const char* name;
  int64_t in, hidden, classes, microbatch;
  int timed_steps;
};
constexpr Size kSizes[] = {{"small", 784, 1024, 10, 128, 50},
                           {"large", 4096, 8192, 4096, 8192, 10}};

// The reference GEMM: bf16 inputs and output, fp32 compute, square, median of kGemmReps.
constexpr int kGemmN = 8192;
constexpr int kGemmReps = 10;
constexpr int kCopyReps = 10;  // 1 GiB device-to-device copies

constexpr int kDevice = 0;

// ---- the model, the batch, one step ------------------------------------------------------------

// Children 0..6, so the state_dict names are 0.weight, 0.bias, 1.weight, 2.w, 3.weight, ...
nn::Sequential make_model(const Size& s) {
  return nn::Sequential{nn::Linear(s.in, s.hidden),     nn::RMSNorm(s.hidden), nn::ScaledSiLU(),
                        nn::Linear(s.hidden, s.hidden), nn::RMSNorm(s.hidden), nn::ScaledSiLU(),
                        nn::Linear(s.hidden, s.classes)};
}

using bench::Clip;

std::unique_ptr<optim::AdamW> make_optimizer(const nn::Module& model, const Clip& clip) {
  return bench::make_adamw(model, {kLr, {kBeta1, kBeta2}, kEps, kWeightDecay}, clip);
}

struct Batch {
  Tensor x, y;  // x [4·microbatch, in] (f32 on the host, bf16 on the GPU), y i64 [4·microbatch]
};

// Drawn on the CPU from the default generator (seeded before the model was built).
Batch make_batch(const Size& s) {
  const int64_t n = kMicrobatches * s.microbatch;
  Tensor x = randn({n, s.in});
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t& label : labels) label = int64_t(default_generator().below(uint64_t(s.classes)));
  return {x, from_vector(labels, {n})};
}

// Forward, loss and backward of the step's microbatches; their losses added into loss_sum. Each
// microbatch's summed loss is divided by the whole step's sample count: the k backward passes add
// up to the full batch's mean gradient.
// With data parallelism the normalizer is the global batch (all ranks' samples), and
// `before_last_backward` arms the gradient all-reduce.
void microbatch_passes(nn::Module& model, const Batch& batch, int64_t microbatch,
                       const Tensor& loss_sum, double normalizer = 0,
                       const std::function<void()>& before_last_backward = {}) {
  if (normalizer == 0) normalizer = double(kMicrobatches * microbatch);
  for (int64_t k = 0; k < kMicrobatches; ++k) {
    const int64_t begin = k * microbatch, end = begin + microbatch;
    Tensor x = batch.x.slice_rows(begin, end);  // already bf16
    Tensor loss = cross_entropy(model(x), batch.y.slice_rows(begin, end), -100, normalizer);
    if (before_last_backward && k + 1 == kMicrobatches) before_last_backward();
    loss.backward();
    add_into(loss_sum, loss.detach());
  }
}

// One eager optimizer step. Returns its loss (the mean over the batch) as a device scalar:
// nothing in here reads a value back to the host. set_to_none = false keeps .grad allocated, as
// the steps around a CUDA graph must.
Tensor train_step(nn::Module& model, optim::AdamW& optimizer, const Clip& clip,
                  const std::vector<Tensor>& params, const Batch& batch, int64_t microbatch,
                  bool set_to_none = true) {
  Tensor loss_sum = zeros({}, DType::f32, batch.x.device());
  microbatch_passes(model, batch, microbatch, loss_sum);
  clip(params);
  optimizer.step();
  optimizer.zero_grad(set_to_none);
  return loss_sum;
}

// The same step recorded in a CUDA graph (core/cuda/graph.h), after one eager step that creates
// the optimizer state and .grad. Each step() is AdamW's host half (the step's lr and bias
// corrections, to the device) and one replay; loss() is the last replayed step's loss.
class GraphStep {
 public:
  GraphStep(nn::Module& model, optim::AdamW& optimizer, const Clip& clip,
            const std::vector<Tensor>& params, const Batch& batch, int64_t microbatch)
      : optimizer_(optimizer),
        first_loss_(train_step(model, optimizer, clip, params, batch, microbatch, false)),
        loss_(zeros({}, DType::f32, batch.x.device())),
        graph_(cuda::Graph::capture(kDevice, [&] {
          loss_.fill_(0.0);
          microbatch_passes(model, batch, microbatch, loss_);
          clip(params);
          optimizer.apply_step();
          optimizer.zero_grad(/*set_to_none=*/false);
        })) {}

  const Tensor& first_loss() const { return first_loss_; }  // the eager first step's
  void step() {
    optimizer_.prepare_step();
    graph_.replay();
  }
  const Tensor& loss() const { return loss_; }
  size_t nodes() const { return graph_.num_nodes(); }
  size_t longest_chain() const { return graph_.longest_chain(); }
  const std::string& node_kinds() const { return graph_.node_kinds(); }

 private:
  optim::AdamW& optimizer_;
  Tensor first_loss_, loss_;
  cuda::Graph graph_;
};

// ---- where the time goes ------------------------------------------------------------------------

// One eager step with a CUDA event after each piece of it: each layer's forward,
// the loss, each microbatch's whole backward (the engine runs it as one pass), the gradient norm
// and clip factor, AdamW (the factor folded in) and
// zero_grad. Each piece's time is the GPU time between its events, summed over the microbatches
// and averaged over `steps` steps; host time that the GPU does not wait for is not in it. The
// backward is one row: its ops are launched by the engine, between no events of ours.
void print_breakdown(nn::Sequential& model, optim::AdamW& optimizer, const Clip& clip,
                     const std::vector<Tensor>& params, const Batch& batch, int64_t microbatch, int steps) {
  // The forward's steps as the Sequential runs them (RMSNorm → ScaledSiLU fused into one).
  std::vector<std::string> names;
  std::vector<size_t> first_child;
  {
    NoGradGuard no_grad;
    Tensor h = batch.x.slice_rows(0, 1);
    for (size_t i = 0, next = 0; i < model.size(); i = next) {
      h = model.forward_step(i, h, &next);
      std::string name = "forward " + std::to_string(i) + " " + model[i]->repr();
      for (size_t j = i + 1; j < next; ++j) name += " + " + model[j]->repr() + " (fused)";
      names.push_back(name);
      first_child.push_back(i);
    }
  }
  const size_t forward_rows = names.size();
  for (const char* n : {"cross_entropy forward", "backward (all ops)", "grad norm + clip factor", "AdamW step", "zero_grad"})
    names.emplace_back(n);
  std::vector<double> ms(names.size(), 0.0);
  cudaStream_t s = cuda::stream(kDevice);
  std::vector<cudaEvent_t> events;
  auto mark = [&] {
    cudaEvent_t e;
    MT_CUDA_CHECK(cudaEventCreate(&e));
    MT_CUDA_CHECK(cudaEventRecord(e, s));
    events.push_back(e);
  };
  const double normalizer = double(kMicrobatches * microbatch);
  train_step(model, optimizer, clip, params, batch, microbatch);  // untimed: creates the AdamW state
  for (int step = 0; step < steps; ++step) {
    cuda::synchronize(kDevice);
    std::vector<size_t> slot;  // which row each interval (event i-1 to i) belongs to
    mark();
    for (int64_t k = 0; k < kMicrobatches; ++k) {
      const int64_t begin = k * microbatch, end = begin + microbatch;
      Tensor h = batch.x.slice_rows(begin, end);
      for (size_t row = 0; row < forward_rows; ++row) {
        size_t next = 0;
        h = model.forward_step(first_child[row], h, &next);
        mark(), slot.push_back(row);
      }
      Tensor loss = cross_entropy(h, batch.y.slice_rows(begin, end), -100, normalizer);
      mark(), slot.push_back(forward_rows);
      loss.backward();
      mark(), slot.push_back(forward_rows + 1);
    }
    clip(params);
    mark(), slot.push_back(forward_rows + 2);
    optimizer.step();
    mark(), slot.push_back(forward_rows + 3);
    optimizer.zero_grad();
    mark(), slot.push_back(forward_rows + 4);
    MT_CUDA_CHECK(cudaEventSynchronize(events.back()));
    for (size_t i = 1; i < events.size(); ++i) {
      float t = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&t, events[i - 1], events[i]));
      ms[slot[i - 1]] += t / steps;
    }
    for (cudaEvent_t e : events) MT_CUDA_CHECK(cudaEventDestroy(e));
    events.clear();
  }
  double total = 0;
  for (double m : ms) total += m;
  std::printf("   where the time goes (CUDA events, GPU time per step, mean of %d eager steps):\n", steps);
  for (size_t i = 0; i < names.size(); ++i)
    std::printf("     %-44s %9.3f ms %6.1f%%\n", names[i].c_str(), ms[i], 100 * ms[i] / total);
  std::printf("     %-44s %9.3f ms\n", "total", total);
}

// ---- export ------------------------------------------------------------------------------------

// ---- the floor ---------------------------------------------------------------------------------

// What one step must do at the least; docs/perf.md derives each term.
struct Work {
  double gemm_flop;  // forward, dX (not for the input, which needs no gradient) and dW GEMMs
  double bytes;      // minimum traffic of the memory-bound ops, activations in bf16
};

Work work_of(const Size& s, double params, double weights) {
  const double B = double(kMicrobatches * s.microbatch);
  const double in = double(s.in), h = double(s.hidden), C = double(s.classes);
  const double gemm_flop = 2 * B * (2 * in * h + 3 * h * h + 3 * h * C);
  const double activations = 2 * 10 * B * h     // per hidden layer and element, RMSNorm and
                                                // ScaledSiLU fused: fwd 4 + bwd 6 bytes
                             + 6 * B * C        // cross_entropy: logits read; read again, dlogits written
                             + 2 * B * (2 * h + C);  // db: each Linear's dY read once
  // Per parameter: fresh grads zero-filled 4, norm read 4, AdamW p, g, m, v read 16 + p, m, v
  // written 12 (the clip factor is folded into it); per Linear weight (the biases are
  // negligible), its bf16 copy written 2.
  const double per_param = 36 * params + 2 * weights;
  return {gemm_flop, activations + per_param};
}

// The step's GEMMs alone: for each microbatch, the three Linear forwards (the bf16 bias copy in
// the epilogue, as the Linears run them),
// then their backwards in reverse (dX = dY·W except for the first layer, whose input needs no
// gradient; dW += dYᵀ·X in fp32 with beta = 1, as into the .grad sink), through the launchers the
// linear op calls, on the same shapes and dtypes, back to back on the framework stream with
// nothing else between them. The set is recorded once in a CUDA graph and replayed, so the host's
// launch time is not in it (eager, the small size's 32 GEMMs would time the host). Median ms of
// `reps` replays after 3 untimed ones: the floor the whole step is held against (everything else
// in the step is what remains to remove).
double gemm_floor_ms(const Size& s, int reps) {
  struct Layer {
    int64_t in, out;
    bool needs_dx;
  };
  const Layer layers[] = {{s.in, s.hidden, false}, {s.hidden, s.hidden, true},
                          {s.hidden, s.classes, true}};
  const Device dev = cuda_device(kDevice);
  const int64_t M = s.microbatch;
  struct Buffers {
    Tensor x, W, b, y, dy, dx, dW;
  };
  std::vector<Buffers> buf;
  // N(0, 1) values: the power a GEMM draws, and so the clock it gets at the card's power limit,
  // depends on how many bits toggle; constant or all-positive data would make the floor too fast.
  for (const Layer& l : layers)
    buf.push_back({mt::randn({M, l.in}, DType::bf16, dev), mt::randn({l.out, l.in}, DType::bf16, dev),
                   mt::randn({l.out}, DType::bf16, dev), mt::empty({M, l.out}, DType::bf16, dev),
                   mt::randn({M, l.out}, DType::bf16, dev), mt::empty({M, l.in}, DType::bf16, dev),
                   zeros({l.out, l.in}, DType::f32, dev)});
  cudaStream_t st = cuda::stream(kDevice);
  const auto gemm_set = [&] {
    for (int64_t k = 0; k < kMicrobatches; ++k) {
      for (size_t i = 0; i < buf.size(); ++i) {
        const Buffers& t = buf[i];
        cuda::linear_forward_dt_bias(t.x.data_ptr(), t.W.data_ptr(), t.b.data_ptr(),
                                     t.y.data_ptr(), M, layers[i].out, layers[i].in,
                                     DType::bf16, st);
      }
      for (size_t i = buf.size(); i-- > 0;) {
        const Buffers& t = buf[i];
        cuda::linear_backward(t.x.data_ptr(), t.W.data_ptr(), t.dy.data_ptr(),
                              layers[i].needs_dx ? t.dx.data_ptr() : nullptr,
                              static_cast<float*>(t.dW.data_ptr()), 1.0f, nullptr, M,
                              layers[i].out, layers[i].in, DType::bf16, st);
      }
    }
  };
  gemm_set();  // eager first: a shape the step did not plan is planned (and timed) outside capture
  cuda::Graph gemms = cuda::Graph::capture(kDevice, gemm_set);
  return median(time_each(kDevice, 3, reps, [&] { gemms.replay(); }));
}

// ---- one size ----------------------------------------------------------------------------------

std::string layers_str(const Size& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "Linear(%lld, %lld) > RMSNorm > ScaledSiLU > Linear(%lld, %lld) > RMSNorm > "
                "ScaledSiLU > Linear(%lld, %lld)",
                (long long)s.in, (long long)s.hidden, (long long)s.hidden, (long long)s.hidden,
                (long long)s.hidden, (long long)s.classes);
  return buf;
}

// Runs one size; false if its loss is not finite.
bool run_size(const Size& s, const std::string& export_dir, double gemm_tflops, double copy_tb_s) {
  const Device dev = cuda_device(kDevice);
  manual_seed(kSeed);
  nn::Sequential model = make_model(s);
  const Batch host_batch = make_batch(s);
  model.to(dev);
  model.set_compute_dtype(DType::bf16);
  const Batch batch{host_batch.x.to(dev).to(DType::bf16), host_batch.y.to(dev)};
  const std::vector<Tensor> params = model.parameters();
  double n_params = 0, n_weights = 0;
  for (const Tensor& p : params) {
    n_params += double(p.numel());
    if (p.dim() >= 2) n_weights += double(p.numel());
  }
  const int64_t samples = kMicrobatches * s.microbatch;
  const Clip clip(dev, kClipNorm);
  auto optimizer = make_optimizer(model, clip);

  std::printf("\n== train_step %s: %s\n", s.name, layers_str(s).c_str());
  std::printf("   bf16 GEMMs, fp32 master weights and grads; %lld microbatches x %lld = %lld samples "
              "per step; %.0f params\n",
              (long long)kMicrobatches, (long long)s.microbatch, (long long)samples, n_params);
  std::fflush(stdout);

  // The first kLossSteps eager losses, from a host snapshot of the initial weights (clone()
  // first: the state dict shares storage with the model, and to(kCPU) of a host tensor would not
  // copy). Every timed run below starts again from the snapshot and a fresh optimizer.
  nn::StateDict init;
  for (const auto& [name, t] : model.state_dict()) init.emplace_back(name, t.clone().to(kCPU));
  std::vector<double> eager_losses;
  for (int i = 0; i < kLossSteps; ++i)
    eager_losses.push_back(train_step(model, *optimizer, clip, params, batch, s.microbatch).item());
  const auto restart = [&] {
    model.load_state_dict(init);
    for (Tensor p : params) p.zero_grad();
    optimizer = make_optimizer(model, clip);
  };
  if (!export_dir.empty()) {
    const std::string base = (std::filesystem::path(export_dir) / s.name).string();
    const nn::Metadata format = {{"format", "minitrain-train-step-1"}};
    nn::save_tensors(base + "_init.safetensors", init, format);
    nn::save_tensors(base + "_batch.safetensors", {{"x", host_batch.x}, {"y", host_batch.y}}, format);
    std::string text;
    for (double l : eager_losses) text += num("%.9g", l) + "\n";
    write_text(base + "_losses.txt", text);
    std::printf("   exported %s_{init,batch}.safetensors and the first %d losses (%.6f ... %.6f)\n",
                base.c_str(), kLossSteps, eager_losses.front(), eager_losses.back());
  }

  // Eager: every step launched op by op from the host.
  restart();
  print_breakdown(model, *optimizer, clip, params, batch, s.microbatch, 3);
  restart();
  Tensor last_loss;
  const std::vector<double> times = time_each(kDevice, kWarmupSteps, s.timed_steps, [&] {
    last_loss = train_step(model, *optimizer, clip, params, batch, s.microbatch);
  });
  const double loss = last_loss.item();  // after the timed region

  // CUDA graph: the first kLossSteps steps (one eager, then replays) are checked against the eager
  // losses above, bit for bit, and serve as the warm-up; then the timed replays.
  restart();
  GraphStep graph(model, *optimizer, clip, params, batch, s.microbatch);
  std::vector<double> graph_losses{graph.first_loss().item()};
  while (graph_losses.size() < eager_losses.size()) {
    graph.step();
    graph_losses.push_back(graph.loss().item());
  }
  int same = 0;
  double worst = 0;
  for (size_t i = 0; i < eager_losses.size(); ++i) {
    same += graph_losses[i] == eager_losses[i];
    worst = std::max(worst, std::abs(graph_losses[i] - eager_losses[i]) / std::abs(eager_losses[i]));
  }
  const std::vector<double> graph_times = time_each(kDevice, 0, s.timed_steps, [&] { graph.step(); });
  const double graph_loss = graph.loss().item();

  const double ms = median(times), graph_ms = median(graph_times);
  const double flop_6ps = 6 * n_params * double(samples);
  const Work w = work_of(s, n_params, n_weights);
  const double gemm_ms = w.gemm_flop / (gemm_tflops * 1e12) * 1e3;
  const double bytes_ms = w.bytes / (copy_tb_s * 1e12) * 1e3;
  const double floor_ms = gemm_ms + bytes_ms;

  std::printf("   per step: GEMMs %.4g GFLOP (6*params*samples %.4g GFLOP), memory-bound ops %.4g GB\n",
              w.gemm_flop / 1e9, flop_6ps / 1e9, w.bytes / 1e9);
  std::printf("   CUDA graph: %zu nodes (%s); its first %d losses vs eager: %d bitwise equal, "
              "max rel diff %.2g\n",
              graph.nodes(), graph.node_kinds().c_str(), kLossSteps, same, worst);
  std::printf("   %-34s %10s %12s %10s %10s %15s\n", "", "ms/step", "samples/s", "TFLOP/s",
              "of cuBLAS", "min / max");
  const auto row = [&](const char* name, const std::vector<double>& t) {
    const double m = median(t), tflops = flop_6ps / (m * 1e-3) / 1e12;
    std::printf("   %-34s %10.3f %12.0f %10.1f %9.1f%% %7.3f / %.3f\n",
                num(name, double(s.timed_steps)).c_str(), m, double(samples) / (m * 1e-3), tflops,
                100 * tflops / gemm_tflops, *std::min_element(t.begin(), t.end()),
                *std::max_element(t.begin(), t.end()));
  };
  row("ours eager, median of %.0f steps", times);
  row("ours CUDA graph, median of %.0f", graph_times);
  std::printf("   %-34s %10.3f   = GEMMs %.3f + memory-bound %.3f\n", "floor", floor_ms, gemm_ms,
              bytes_ms);
  for (const auto& [mode, m, l] : {std::tuple{"eager", ms, loss}, std::tuple{"graph", graph_ms, graph_loss}}) {
    const double tflops = flop_6ps / (m * 1e-3) / 1e12;
    std::printf("train_step %s %s: %.3f ms/step, %.0f samples/s, %.1f TFLOP/s (6PS) = %.1f%% of "
                "cuBLAS bf16 %.0f TFLOP/s; floor %.3f ms, ours %.2fx the floor; loss %.6f\n",
                s.name, mode, m, double(samples) / (m * 1e-3), tflops, 100 * tflops / gemm_tflops,
                gemm_tflops, floor_ms, m / floor_ms, l);
  }
  std::printf("train_step %s graph check: %d of %d losses bitwise equal to eager, max rel diff %.2g\n",
              s.name, same, kLossSteps, worst);
  const cuda::GemmPlanStats plans = cuda::gemm_plan_stats();
  std::printf("train_step %s GEMM algorithms: %s; %d plans so far in this run, %d chosen by timing, "
              "%d of them not the heuristic's first\n",
              s.name, gemm_autotune() ? "measured" : "heuristic", plans.plans, plans.measured,
              plans.not_first);
  // The GEMM floor, measured now (the card's clocks as in the step), and the goals.
  const double gemm_only_ms = gemm_floor_ms(s, s.timed_steps);
  const double best_ms = std::min(ms, graph_ms);
  std::printf("train_step %s GEMM floor: %.3f ms (the step's GEMMs alone, back to back in a "
              "CUDA graph) = %.1f TFLOP/s, %.1f%% of the bare 8192^3 rate; eager step %.3fx, "
              "graph step %.3fx the GEMM floor\n",
              s.name, gemm_only_ms, w.gemm_flop / (gemm_only_ms * 1e-3) / 1e12,
              100 * w.gemm_flop / (gemm_only_ms * 1e-3) / 1e12 / gemm_tflops, ms / gemm_only_ms,
              graph_ms / gemm_only_ms);
  const auto goal = [&](const char* what, double figure, const char* op, double target) {
    const bool ok = op[0] == '<' ? figure <= target : figure >= target;
    std::printf("train_step goal %s %s: %.3f (target %s %.3f): %s\n", s.name, what, figure, op,
                target, ok ? "PASS" : "MISS");
  };
  if (std::string(s.name) == "large") {
    goal("best step / GEMM floor", best_ms / gemm_only_ms, "<=", 1.04);
  } else {
    goal("CUDA graph ms/step", graph_ms, "<=", 0.20);
    goal("CUDA graph nodes", double(graph.nodes()), "<=", 200);
    std::printf("train_step small graph nodes by kind: %s; longest chain of dependencies %zu "
                "nodes\n", graph.node_kinds().c_str(), graph.longest_chain());
    goal("eager ms/step", ms, "<=", 0.8);
  }
  std::fflush(stdout);

  if (!export_dir.empty()) {
    const nlohmann::json timing = {
        {"size", s.name},           {"ms_per_step", ms},           {"ms_per_step_graph", graph_ms},
        {"timed_steps", s.timed_steps}, {"samples_per_step", samples}, {"params", n_params},
        {"tflops_6ps", flop_6ps / (ms * 1e-3) / 1e12}, {"cublas_bf16_tflops", gemm_tflops},
        {"copy_tb_per_s", copy_tb_s}, {"floor_ms", floor_ms}, {"gemm_floor_ms", gemm_only_ms},
        {"graph_nodes", graph.nodes()}, {"graph_longest_chain", graph.longest_chain()}};
    write_text((std::filesystem::path(export_dir) / s.name).string() + "_timing.json",
               timing.dump(2) + "\n");
  }

  if (!std::isfinite(loss) || !std::isfinite(graph_loss)) {
    std::fprintf(stderr, "train_step %s: the loss after the timed steps is %f (eager), %f (graph)\n",
                 s.name, loss, graph_loss);
    return false;
  }
  return true;
}

// ---- data parallel -------------------------------------------------------------------------------

#ifdef MT_WITH_NCCL
// `train_step --size large --nproc N`: the step above on each of N GPUs, one process each, joined
// by NCCL (parallel/nccl.h). Per GPU and step the work is the one-GPU step's: 4 microbatches of the
// size's microbatch, so N GPUs process N times the samples. Each rank draws its own batch.
// Timed, 3 warm-up and N steps each, every step started together (a barrier) from idle GPUs:
//   local          the step without the all-reduce, on every GPU at once: the one-GPU time
//   data parallel  the step with parallel::GradReducer (buckets all-reduced during the last backward)
// scaling efficiency = local / data parallel (same per-GPU work). Also timed: one bare NCCL
// all-reduce of all the gradients as one buffer, and its bus bandwidth 2(N-1)/N · bytes / time.
bool run_data_parallel(const Size& s, const parallel::World& world) {
  const Device dev = cuda_device(world.local_rank);
  cuda::set_device(dev.index);
  std::shared_ptr<parallel::Communicator> comm;
  if (world.size > 1)
    comm = parallel::make_nccl_communicator(world, dev.index);
  manual_seed(kSeed);
  nn::Sequential model = make_model(s);
  manual_seed(kSeed + 1 + uint64_t(world.rank));  // this rank's share of the global batch
  const Batch host_batch = make_batch(s);
  model.to(dev);
  model.set_compute_dtype(DType::bf16);
  const Batch batch{host_batch.x.to(dev).to(DType::bf16), host_batch.y.to(dev)};
  const std::vector<Tensor> params = model.parameters();
  std::unique_ptr<parallel::GradReducer> reducer;
  if (comm) reducer = std::make_unique<parallel::GradReducer>(params, comm);
  const Clip clip(dev, kClipNorm);
  auto optimizer = make_optimizer(model, clip);
  double n_params = 0;
  for (const Tensor& p : params) n_params += double(p.numel());
  const int64_t samples = kMicrobatches * s.microbatch;  // per GPU
  const double normalizer = double(world.size * samples);

  cudaStream_t stream = cuda::stream(dev.index);
  EventPair events;
  Tensor loss_sum = zeros({}, DType::f32, dev);
  auto step = [&](bool reduce) {
    microbatch_passes(model, batch, s.microbatch, loss_sum, normalizer, [&] {
      if (reduce) reducer->prepare_for_last_backward();
    });
    if (reduce) reducer->finish();
    clip(params);
    optimizer->step();
    optimizer->zero_grad(/*set_to_none=*/false);
  };
  auto time_steps = [&](bool reduce) {
    std::vector<double> t;
    for (int i = 0; i < kWarmupSteps + s.timed_steps; ++i) {
      if (comm) comm->barrier();
      cuda::synchronize(dev.index);
      const double ms = events.time_ms(stream, [&] { step(reduce); });
      if (i >= kWarmupSteps) t.push_back(ms);
    }
    return median(t);
  };
  // Steady state: timed_steps steps back to back between two events, the host free to run ahead
  // as in training (by at most one step under data parallelism); ms per step.
  auto time_run = [&](bool reduce) {
    if (comm) comm->barrier();
    cuda::synchronize(dev.index);
    return events.time_ms(stream, [&] {
             for (int i = 0; i < s.timed_steps; ++i) step(reduce);
           }) / s.timed_steps;
  };
  // The one-GPU time is the slowest GPU's: a data-parallel step waits for it.
  const auto slowest = [&](double mine, std::vector<double>* all) {
    const Tensor t = zeros({world.size}, DType::f64, dev);
    t.slice_rows(world.rank, world.rank + 1).fill_(mine);
    if (comm) comm->all_reduce_sum(t), comm->synchronize();
    *all = t.to_vector();
    return *std::max_element(all->begin(), all->end());
  };
  std::vector<double> local_per_rank, steady_per_rank;
  const double local_ms = slowest(time_steps(false), &local_per_rank);
  const double steady_local_ms = slowest(time_run(false), &steady_per_rank);
  // The local steps let the replicas drift apart (each its own batch, no all-reduce): start the
  // data-parallel steps from rank 0's weights and a fresh optimizer.
  if (comm) {
    for (const Tensor& p : params) comm->broadcast(p, 0);
    comm->synchronize();
    nn::refresh_compute_copies(params);
    optimizer = make_optimizer(model, clip);
  }
  const int64_t calls_before = comm ? comm->all_reduce_calls() : 0;
  double dp_ms = local_ms, dp_late_ms = 0, steady_dp_ms = steady_local_ms, steady_late_ms = 0;
  const double calls_per_step = [&] {
    if (!comm) return 0.0;
    dp_ms = time_steps(true);
    return double(comm->all_reduce_calls() - calls_before) / (kWarmupSteps + s.timed_steps);
  }();
  if (comm) {
    steady_dp_ms = time_run(true);
    reducer->set_overlap(false);
    dp_late_ms = time_steps(true);
    steady_late_ms = time_run(true);
    reducer->set_overlap(true);
  }
  double allreduce_ms = 0;
  if (comm) {
    const Tensor flat = zeros({int64_t(n_params)}, DType::f32, dev);
    std::vector<double> t;
    for (int i = 0; i < 13; ++i) {
      comm->barrier();
      const double ms = events.time_ms(stream, [&] {
        comm->all_reduce_sum(flat);
        comm->wait();
      });
      if (i >= 3) t.push_back(ms);
    }
    allreduce_ms = median(t);
  }
  // Every rank has the same weights after the data-parallel steps (the replicas stayed equal).
  double checksum = 0;
  for (const Tensor& p : params)
    for (double v : p.to_vector()) checksum += v;
  // Rank 0's checksum to every rank, compared bit for bit there; the mismatches summed.
  const Tensor theirs = full({1}, checksum, DType::f64, dev);
  if (comm) comm->broadcast(theirs, 0), comm->synchronize();
  const Tensor mismatches = full({1}, theirs.item() == checksum ? 0.0 : 1.0, DType::f64, dev);
  if (comm) comm->all_reduce_sum(mismatches), comm->synchronize();
  const bool replicas_equal = mismatches.item() == 0;
  if (world.rank == 0) {
    const double bytes = 4 * n_params;
    std::string per_rank;
    for (double ms : local_per_rank) per_rank += (per_rank.empty() ? "" : ", ") + num("%.3f", ms);
    std::printf("train_step dp %s: %d GPU(s), %lld samples per GPU per step; local step %.3f ms "
                "(the slowest GPU; per rank %s), data-parallel step %.3f ms: scaling efficiency "
                "%.1f%%; %.0f samples/s in all; gradient all-reduces per step %.0f (buckets %d)",
                s.name, world.size, (long long)samples, local_ms, per_rank.c_str(), dp_ms,
                100 * local_ms / dp_ms,
                world.size * samples / (dp_ms * 1e-3), calls_per_step,
                reducer ? reducer->num_buckets() : 0);
    if (comm)
      std::printf("; all-reduced after the backward instead of during it: %.3f ms, %.1f%%; NCCL "
                  "all-reduce of %.0f MB: %.3f ms, bus bandwidth %.0f GB/s",
                  dp_late_ms, 100 * local_ms / dp_late_ms, bytes / 1e6, allreduce_ms,
                  2.0 * (world.size - 1) / world.size * bytes / (allreduce_ms * 1e-3) / 1e9);
    std::printf("; replicas equal: %s\n", replicas_equal ? "yes" : "NO");
    std::printf("train_step dp %s steady state (%d steps back to back): local step %.3f ms (the "
                "slowest GPU), data-parallel step %.3f ms: scaling efficiency %.1f%%, %.0f samples/s "
                "in all; all-reduced after the backward: %.3f ms, %.1f%%\n",
                s.name, s.timed_steps, steady_local_ms, steady_dp_ms,
                100 * steady_local_ms / steady_dp_ms, world.size * samples / (steady_dp_ms * 1e-3),
                steady_late_ms, comm ? 100 * steady_local_ms / steady_late_ms : 100.0);
    std::fflush(stdout);
  }
  return std::isfinite(loss_sum.item()) && replicas_equal;
}
#endif

int usage(const char* message) {
  std::fprintf(stderr, "train_step: %s\nusage: train_step [--size small|large|all] [--export DIR] "
               "[--nproc N] [--gemm-algo measured|heuristic]\n", message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string size = "all", export_dir, gemm_algo = "measured";
  int nproc = 0;  // 0: the one-GPU benchmark; N: the data-parallel one over N GPUs
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("usage: train_step [--size small|large|all] [--export DIR] [--nproc N] "
                  "[--gemm-algo measured|heuristic]\n");
      return 0;
    }
    if ((arg == "--size" || arg == "--export" || arg == "--nproc" || arg == "--gemm-algo") &&
        i + 1 >= argc)
      return usage((arg + " needs a value").c_str());
    if (arg == "--size") size = argv[++i];
    else if (arg == "--export") export_dir = argv[++i];
    else if (arg == "--nproc") nproc = std::atoi(argv[++i]);
    else if (arg == "--gemm-algo") gemm_algo = argv[++i];
    else return usage(("unknown argument '" + arg + "'").c_str());
  }
  if (size != "small" && size != "large" && size != "all")
    return usage(("--size must be small, large or all, got '" + size + "'").c_str());
  if (gemm_algo != "measured" && gemm_algo != "heuristic")
    return usage(("--gemm-algo must be measured or heuristic, got '" + gemm_algo + "'").c_str());
  set_gemm_autotune(gemm_algo == "measured");

  try {
    const parallel::World world = parallel::world_from_env();
    if (nproc > 0 || world.size > 1) {
#ifdef MT_WITH_NCCL
      if (size == "all") size = "large";
      if (world.size == 1 && nproc > 1)
        return parallel::run_workers(nproc, "/proc/self/exe",
                                     {"--size", size, "--gemm-algo", gemm_algo});
      bool ok = true;
      for (const Size& s : kSizes)
        if (size == s.name) ok = run_data_parallel(s, world);
      return ok ? 0 : 1;
#else
      std::fprintf(stderr, "train_step: --nproc needs a build with NCCL\n");
      return 1;
#endif
    }
    if (!cuda_available()) {
      std::fprintf(stderr, "train_step: no CUDA device\n");
      return 1;
    }
    if (!export_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(export_dir, ec);
      MT_CHECK(!ec, "train_step: cannot create '", export_dir, "': ", ec.message());
    }
    cuda::set_device(kDevice);
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, kDevice));
    const double gemm_tflops = cublas_bf16_tflops(kDevice, kGemmN, kGemmReps);
    const double copy_tb_s = copy_tbps(kDevice, kCopyReps);
    std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    std::printf("cuBLAS bf16 GEMM %dx%dx%d (fp32 compute), median of %d: %.1f TFLOP/s\n", kGemmN,
                kGemmN, kGemmN, kGemmReps, gemm_tflops);
    std::printf("device-to-device copy, median of %d: %.3f TB/s (read + write)\n", kCopyReps, copy_tb_s);
    bool ok = true;
    for (const Size& s : kSizes)
      if (size == "all" || size == s.name) ok = run_size(s, export_dir, gemm_tflops, copy_tb_s) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
}
