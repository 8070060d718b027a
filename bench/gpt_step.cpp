// gpt_step: whole optimizer steps of GPT-2 124M on cuda:0, timed eager and as a CUDA graph, beside
// the bare cuBLAS bf16 GEMM rate and the device copy bandwidth measured in the same run; and where
// the step's GPU time goes, op by op. docs/perf.md reads the output; bench/gpt_torch.py times the
// same model in PyTorch (eager, torch.compile, max-autotune) from the same initial weights and
// tokens, and checks its first losses against ours.
//
// The model: nn::GPT with GPT-2 small's shape (12 layers, 12 heads, 768 wide, T = 1024, vocab
// 50257 padded to 50304, biases, no dropout), fp32 master weights and gradients, compute in bf16.
// One step is what the trainer does for a GPT, minus the data loader and the logging:
//   B / M microbatches of M sequences:  logits = model(x) → next-token cross-entropy over the
//   first 50257 classes, summed and divided by the step's B·T targets → backward;
//   then the gradient norm and clip factor (max_norm 1.0), AdamW with the factor folded in, and
//   zero_grad. AdamW: lr 1e-4 (constant: at 6e-4 without warmup the
//   loss on random tokens spikes, and a spike amplifies rounding differences between two
//   frameworks past any useful tolerance), betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter of
//   two or more dimensions (nanoGPT's groups).
//
//   gpt_step [--batch 16|64|all] [--microbatch M] [--export DIR] [--no-breakdown]
//            [--gemm-algo measured|heuristic]
//   gpt_step --gemms-alone [--microbatch M] [--gemm-algo ...]   only the step's GEMMs, back to
//                                             back (below): a short run to put under Nsight Compute
//     16   16 × 1024 tokens per step
//     64   64 × 1024 tokens per step
//     M    sequences per microbatch (default 64: each batch is one microbatch, as PyTorch runs
//          it): B = 64 runs as 64 / M microbatches, whose gradients add up to the full batch's
//          (docs/README.md); fewer, larger microbatches make larger GEMMs and hold more
//          activations (one of 64: 32 GiB; four of 16: under 10)
//     --gemm-algo measured (the default, as bench/train_step.cpp runs) chooses each GEMM shape's
//          cuBLASLt algorithm by timing its first 8 candidates once (precision.gemm_autotune,
//          core/switches.h); heuristic takes the first (the trainer's default). The GELU
//          epilogues of gelu_mlp are where the two differ most (docs/perf.md).
//
// Tokens are drawn uniformly from [0, 50257) by a seeded generator after the model's
// initialization: tokens [B, T + 1], inputs tokens[:, :-1], targets tokens[:, 1:]. They live on
// the GPU before the step begins, as a data loader's would.
//
// --export DIR writes, before timing, what bench/gpt_torch.py needs:
//   DIR/gpt_init.safetensors        the initial parameters under nanoGPT's state_dict names
//   DIR/gpt_b<B>_tokens.safetensors tokens (i64 [B, T + 1])
//   DIR/gpt_b<B>_losses.txt         the first 20 eager losses, one per line
//   DIR/gpt_b<B>_timing.json        this run's figures (written after timing)
//
// Timing, as bench/train_step.cpp's: warm-up steps, then each step between two cudaEvents with
// the host waiting for the stop event, so each is one step started from an idle GPU, host launch
// time included. Reported: the median ms/step, tokens/s, MFU by llm.c's count, 6·N + 6·L·C·T FLOPs
// per token (N every parameter, the tied head once), over the bare GEMM rate measured here; and
// the pool's peak bytes (torch.cuda.max_memory_allocated's counterpart) over the timed steps.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/cuda/check.h"
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "core/rng.h"
#include "core/switches.h"
#include "core/tensor.h"
#include "nn/gpt.h"
#include "nn/serialize.h"
#include "ops/linear/linear_cuda.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "train/lm_task.h"

namespace {

using namespace mt;
using bench::median, bench::num, bench::time_each, bench::write_text;

// ---- the run's settings: bench/gpt_torch.py repeats them and must match -------------------------
constexpr uint64_t kSeed = 1234;
constexpr int64_t kT = 1024;
constexpr double kLr = 1e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;
constexpr double kClipNorm = 1.0;
constexpr int kWarmupSteps = 3, kLossSteps = 20;
constexpr int kDevice = 0;

nn::GPTConfig gpt2_small() {
  return {.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = kT, .vocab_size = 50257,
          .padded_vocab_size = 50304, .dropout = 0.0, .bias = true};
}

// ---- one step ----------------------------------------------------------------------------------

using bench::Clip;

std::unique_ptr<optim::AdamW> make_optimizer(const nn::Module& model, const Clip& clip) {
  return bench::make_adamw(model, {kLr, {kBeta1, kBeta2}, kEps, kWeightDecay}, clip);
}

// Everything one step needs, on the GPU. x and y are the microbatches' views of the tokens.
struct Step {
  nn::GPT& model;
  optim::AdamW* optimizer;
  const Clip& clip;
  std::vector<Tensor> params;
  std::vector<std::pair<Tensor, Tensor>> microbatches;  // (x [M, T], y [M, T])
  double normalizer;                                    // the step's targets: B · T

  // Forward, loss and backward of each microbatch; their losses added into loss_sum.
  void passes(const Tensor& loss_sum) const {
    for (const auto& [x, y] : microbatches) {
      Tensor loss = train::next_token_loss(model(x), y, model.config.vocab_size, normalizer);
      loss.backward();
      add_into(loss_sum, loss.detach());
    }
  }
  // One eager step; its loss (the mean over the batch) as a device scalar, never read here.
  Tensor eager(bool set_to_none = true) const {
    Tensor loss_sum = zeros({}, DType::f32, cuda_device(kDevice));
    passes(loss_sum);
    clip(params);
    optimizer->step();
    optimizer->zero_grad(set_to_none);
    return loss_sum;
  }
};

// The step recorded once in a CUDA graph after one eager step (which creates AdamW's state and
// .grad), then replayed: AdamW's host half (lr and bias corrections to the device), one replay.
class GraphStep {
 public:
  explicit GraphStep(const Step& s)
      : step_(s), first_loss_(s.eager(/*set_to_none=*/false)),
        loss_(zeros({}, DType::f32, cuda_device(kDevice))),
        graph_(cuda::Graph::capture(kDevice, [&] {
          loss_.fill_(0.0);
          s.passes(loss_);
          s.clip(s.params);
          s.optimizer->apply_step();
          s.optimizer->zero_grad(/*set_to_none=*/false);
        })) {}
  const Tensor& first_loss() const { return first_loss_; }
  void step() {
    step_.optimizer->prepare_step();
    graph_.replay();
  }
  const Tensor& loss() const { return loss_; }
  size_t nodes() const { return graph_.num_nodes(); }

 private:
  const Step& step_;
  Tensor first_loss_, loss_;
  cuda::Graph graph_;
};

// ---- where the time goes -----------------------------------------------------------------------

// GPU time per op and phase: a pair of CUDA events around each outermost op the autograd layer
// reports (core/autograd.h, OpObserver), forward and backward; an op run inside another op's
// forward counts as the outer op's.
class OpTimes : public OpObserver {
 public:
  void begin(const char* op, bool backward) override {
    if (depth_++ > 0) return;
    open_ = {std::string(backward ? "backward " : "forward ") + op, record()};
  }
  void end(const char*, bool) override {
    if (--depth_ > 0) return;
    marks_.push_back({open_.first, open_.second, record()});
  }
  // Adds each mark's time into `ms` (per name), scaled by `weight`; forgets the marks.
  void collect(std::map<std::string, double>& ms, double weight) {
    MT_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(kDevice)));
    for (const Mark& m : marks_) {
      float t = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&t, m.start, m.stop));
      ms[m.name] += weight * t;
    }
    marks_.clear();
  }
  void new_step() { used_ = 0; }  // after collect(): the events may be recorded again
  ~OpTimes() override {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }

 private:
  struct Mark {
    std::string name;
    cudaEvent_t start, stop;
  };
  cudaEvent_t record() {  // events are reused across steps: one per begin or end of a step
    if (used_ == events_.size()) {
      cudaEvent_t e;
      MT_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    cudaEvent_t e = events_[used_++];
    MT_CUDA_CHECK(cudaEventRecord(e, cuda::stream(kDevice)));
    return e;
  }
  int depth_ = 0;
  std::pair<std::string, cudaEvent_t> open_;
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

// The family an op belongs to, for the breakdown's totals.
std::string family_of(const std::string& name) {
  const std::string op = name.substr(name.find(' ') + 1);
  if (op == "linear" || op == "gelu_mlp") return "GEMMs (linear, gelu_mlp, the head)";
  if (op == "attention" || op == "attention_packed") return "attention";
  if (op == "layer_norm" || op == "add_layer_norm" || op == "gelu" || op == "add" ||
      op == "dropout")
    return "LayerNorm, GELU, residual adds";
  if (op == "cross_entropy") return "classifier loss (cross-entropy)";
  if (op == "embedding") return "embedding";
  if (op == "AccumulateGrad") return "gradient accumulation into .grad";
  return "copies, casts and views";
}

// The step's GEMMs alone, back to back: each Linear of the model and the tied head, forward and
// backward, through the calls the linear and gelu_mlp ops make (the bias in the epilogue, GELU in
// c_fc's forward and mlp.c_proj's dx epilogues, dW added into an existing fp32 .grad, the bias's
// column sums), on tensors of their own, once per microbatch of M sequences, timed as one stream
// of work (median of 5). This is the GEMM family's floor at the
// step's own shapes: what cuBLASLt takes for them with nothing in between. The bare 8192³ rate
// is a lower floor than these shapes reach (K = 768 for all but one).
double gemms_alone_ms(const nn::GPTConfig& cfg, int64_t M, int64_t microbatches) {
  const Device dev = cuda_device(kDevice);
  const int64_t C = cfg.n_embd, rows = M * kT;
  // gelu: GELU_AUX_BIAS forward into y and aux (c_fc); dgelu: the DGELU dx GEMM reading aux
  // (mlp.c_proj).
  enum class Epi { None, Gelu, DGelu };
  struct Gemm {
    Tensor x, W, b, y, dy, dx, dW, db, aux;
    int64_t N, K, count;  // count: how many of the model's Linears have this shape
    Epi epi;
  };
  std::vector<Gemm> gemms;
  const auto add = [&](int64_t N, int64_t K, bool bias, int64_t count, Epi epi) {
    const int64_t aux_cols = epi == Epi::Gelu ? N : K;
    gemms.push_back({.x = randn({rows, K}, DType::bf16, dev), .W = randn({N, K}, DType::bf16, dev),
                     .b = bias ? randn({N}, DType::bf16, dev) : Tensor(),
                     .y = empty({rows, N}, DType::bf16, dev), .dy = randn({rows, N}, DType::bf16, dev),
                     .dx = empty({rows, K}, DType::bf16, dev), .dW = zeros({N, K}, DType::f32, dev),
                     .db = bias ? zeros({N}, DType::f32, dev) : Tensor(),
                     .aux = epi == Epi::None ? Tensor() : randn({rows, aux_cols}, DType::bf16, dev),
                     .N = N, .K = K, .count = count, .epi = epi});
  };
  add(3 * C, C, true, cfg.n_layer, Epi::None);       // attn.c_attn
  add(C, C, true, cfg.n_layer, Epi::None);           // attn.c_proj
  add(4 * C, C, true, cfg.n_layer, Epi::Gelu);       // mlp.c_fc
  add(C, 4 * C, true, cfg.n_layer, Epi::DGelu);      // mlp.c_proj
  add(cfg.padded_vocab(), C, false, 1, Epi::None);   // the tied head
  cudaStream_t st = cuda::stream(kDevice);
  const auto all = [&] {
    for (int64_t m = 0; m < microbatches; ++m)
      for (const Gemm& g : gemms)
        for (int64_t i = 0; i < g.count; ++i) {
          const void* b = g.b.defined() ? g.b.data_ptr() : nullptr;
          float* db = g.db.defined() ? static_cast<float*>(g.db.data_ptr()) : nullptr;
          if (g.epi == Epi::Gelu)
            cuda::linear_gelu_forward(g.x.data_ptr(), g.W.data_ptr(), b, g.y.data_ptr(),
                                      g.aux.data_ptr(), rows, g.N, g.K, DType::bf16, st);
          else
            cuda::linear_forward_dt_bias(g.x.data_ptr(), g.W.data_ptr(), b, g.y.data_ptr(), rows,
                                         g.N, g.K, DType::bf16, st);
          if (g.epi == Epi::DGelu) {
            cuda::linear_dgelu_backward(g.W.data_ptr(), g.dy.data_ptr(), g.aux.data_ptr(),
                                        g.dx.data_ptr(), rows, g.N, g.K, DType::bf16, st);
            cuda::linear_backward(g.x.data_ptr(), g.W.data_ptr(), g.dy.data_ptr(), nullptr,
                                  static_cast<float*>(g.dW.data_ptr()), 1.0f, db, rows, g.N, g.K,
                                  DType::bf16, st);
          } else {
            cuda::linear_backward(g.x.data_ptr(), g.W.data_ptr(), g.dy.data_ptr(), g.dx.data_ptr(),
                                  static_cast<float*>(g.dW.data_ptr()), 1.0f, db, rows, g.N, g.K,
                                  DType::bf16, st);
          }
        }
  };
  return median(time_each(kDevice, 1, 5, all));
}

// `steps` eager steps with every op timed (OpTimes) and events around the clip, AdamW and
// zero_grad; prints per-op rows, per-family totals, and each family's floor beside it.
// gemm_flop and attention_flop: the step's GEMM and attention work; floors at the bare GEMM rate.
void print_breakdown(const Step& s, int steps, double gemm_tflops, double gemm_flop,
                     double attention_flop, double gemms_alone) {
  OpTimes times;
  std::map<std::string, double> ms;
  s.eager();  // untimed: AdamW's state exists from here on
  bench::EventPair step_events, optimizer_events;
  double step_ms = 0, optimizer_ms = 0;
  set_op_observer(&times);
  for (int i = 0; i < steps; ++i) {
    cuda::synchronize(kDevice);
    times.new_step();
    Tensor loss_sum = zeros({}, DType::f32, cuda_device(kDevice));
    step_ms += step_events.time_ms(cuda::stream(kDevice), [&] {
      s.passes(loss_sum);
      times.collect(ms, 1.0 / steps);  // synchronizes: the optimizer below starts from idle
      optimizer_ms += optimizer_events.time_ms(cuda::stream(kDevice), [&] {
        s.clip(s.params);
        s.optimizer->step();
        s.optimizer->zero_grad();
      }) / steps;
    }) / steps;
  }
  set_op_observer(nullptr);
  std::map<std::string, double> family;
  double ops_ms = 0;
  for (const auto& [name, t] : ms) family[family_of(name)] += t, ops_ms += t;
  family["clip + AdamW + zero_grad"] = optimizer_ms;
  std::printf("   where the time goes (CUDA events around each op, GPU ms per step, mean of %d "
              "eager steps; the step itself took %.2f ms with the events):\n", steps, step_ms);
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [name, t] : ms) rows.push_back({t, name});
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [t, name] : rows)
    std::printf("     %-40s %8.3f ms %5.1f%%\n", name.c_str(), t, 100 * t / step_ms);
  std::printf("   by family, with its floor (GEMM work at the bare GEMM rate; '-': not computed):\n");
  for (const auto& [name, t] : family) {
    double floor = -1;
    if (name.starts_with("GEMMs")) floor = gemm_flop / (gemm_tflops * 1e12) * 1e3;
    if (name == "attention") floor = attention_flop / (gemm_tflops * 1e12) * 1e3;
    std::printf("gpt_step breakdown %-44s %8.3f ms %5.1f%%  floor %s%s\n", name.c_str(), t,
                100 * t / step_ms, floor < 0 ? "-" : num("%.3f ms", floor).c_str(),
                name.starts_with("GEMMs")
                    ? num("; the same GEMMs alone, back to back: %.3f ms", gemms_alone).c_str()
                    : "");
  }
  std::printf("gpt_step breakdown %-44s %8.3f ms %5.1f%%\n", "the rest (between ops: host gaps)",
              step_ms - ops_ms - optimizer_ms, 100 * (step_ms - ops_ms - optimizer_ms) / step_ms);
}

// ---- one batch size ----------------------------------------------------------------------------

bool run_batch(int64_t B, int64_t microbatch, const std::string& export_dir, bool breakdown,
               double gemm_tflops, double copy_tb_s) {
  const Device dev = cuda_device(kDevice);
  const nn::GPTConfig cfg = gpt2_small();
  manual_seed(kSeed);
  nn::GPT model(cfg);
  std::vector<int64_t> ids(size_t(B * (kT + 1)));
  for (int64_t& id : ids) id = int64_t(default_generator().below(uint64_t(cfg.vocab_size)));
  const Tensor host_tokens = from_vector(ids, {B, kT + 1});
  const Tensor tokens = host_tokens.to(dev);
  nn::StateDict init;
  for (const auto& [name, t] : model.state_dict()) init.emplace_back(name, t.clone());
  model.to(dev);
  model.set_compute_dtype(DType::bf16);

  const Clip clip(dev, kClipNorm);
  auto optimizer = make_optimizer(model, clip);
  Step s{model, optimizer.get(), clip, model.parameters(), {}, double(B * kT)};
  const Tensor x_all = tokens.narrow(1, 0, kT).contiguous(), y_all = tokens.narrow(1, 1, kT).contiguous();
  for (int64_t b = 0; b < B; b += microbatch)
    s.microbatches.emplace_back(x_all.slice_rows(b, b + microbatch), y_all.slice_rows(b, b + microbatch));
  double n_params = 0;
  for (const Tensor& p : s.params) n_params += double(p.numel());
  const double L = double(cfg.n_layer), C = double(cfg.n_embd), T = double(kT);
  const double flop_per_token = 6 * n_params + 6 * L * C * T;  // llm.c's count
  // The GEMMs' share: 6 FLOPs per token per weight of the Linears and the head (wpe and the
  // LayerNorms do no GEMM); attention's: 4·T·C per token and layer forward (QKᵀ and PV, causal
  // half counted as llm.c does, in full), ×3 with the backward.
  const double head = double(cfg.padded_vocab()) * C;
  const double linear_weights = L * (12 * C * C);
  const double gemm_flop = 6 * (linear_weights + head) * double(B) * T;
  const double attention_flop = 6 * L * C * T * double(B) * T;

  std::printf("\n== gpt_step B=%lld: GPT-2 124M (%s), %.0f params, %lld microbatch(es) of %lld x %lld "
              "tokens, bf16 compute, fp32 master weights\n",
              (long long)B, model.repr().c_str(), n_params, (long long)s.microbatches.size(),
              (long long)microbatch, (long long)kT);
  std::fflush(stdout);

  std::vector<double> eager_losses;
  for (int i = 0; i < kLossSteps; ++i) eager_losses.push_back(s.eager().item());
  const auto restart = [&] {
    model.load_state_dict(init);
    for (Tensor p : s.params) p.zero_grad();
    optimizer = make_optimizer(model, clip);
    s.optimizer = optimizer.get();
  };
  const std::string base = export_dir.empty() ? "" :
      (std::filesystem::path(export_dir) / ("gpt_b" + std::to_string(B))).string();
  if (!export_dir.empty()) {
    const nn::Metadata format = {{"format", "minitrain-gpt-step-1"}};
    nn::save_tensors((std::filesystem::path(export_dir) / "gpt_init.safetensors").string(), init, format);
    nn::save_tensors(base + "_tokens.safetensors", {{"tokens", host_tokens}}, format);
    std::string text;
    for (double l : eager_losses) text += num("%.9g", l) + "\n";
    write_text(base + "_losses.txt", text);
  }
  std::printf("   first losses: %.6f %.6f ... %.6f (ln 50257 = %.6f)\n", eager_losses[0],
              eager_losses[1], eager_losses.back(), std::log(50257.0));

  if (breakdown) {
    restart();
    print_breakdown(s, 3, gemm_tflops, gemm_flop, attention_flop,
                    gemms_alone_ms(cfg, microbatch, int64_t(s.microbatches.size())));
  }

  const int timed = B >= 64 ? 10 : 20;
  restart();
  cuda::synchronize(kDevice);
  cuda::reset_pool_peak(kDevice);
  Tensor last;
  const std::vector<double> times = time_each(kDevice, kWarmupSteps, timed, [&] { last = s.eager(); });
  const double eager_peak = double(cuda::pool_peak_bytes(kDevice));
  const double loss = last.item();

  restart();
  cuda::synchronize(kDevice);
  cuda::reset_pool_peak(kDevice);
  GraphStep graph(s);
  std::vector<double> graph_losses{graph.first_loss().item()};
  while (graph_losses.size() < eager_losses.size()) {
    graph.step();
    graph_losses.push_back(graph.loss().item());
  }
  int same = 0;
  for (size_t i = 0; i < eager_losses.size(); ++i) same += graph_losses[i] == eager_losses[i];
  const std::vector<double> graph_times = time_each(kDevice, 0, timed, [&] { graph.step(); });
  const double graph_peak = double(cuda::pool_peak_bytes(kDevice));
  const double graph_loss = graph.loss().item();

  const double tokens_per_step = double(B) * T;
  const auto row = [&](const char* mode, const std::vector<double>& t, double peak) {
    const double ms = median(t), tok_s = tokens_per_step / (ms * 1e-3);
    const double tflops = flop_per_token * tok_s / 1e12;
    std::printf("gpt_step B=%lld %s: %.2f ms/step (min %.2f, max %.2f, %d steps), %.0f tok/s, "
                "%.1f TFLOP/s = MFU %.1f%% of the bare bf16 GEMM's %.0f TFLOP/s; peak memory %.2f GiB\n",
                (long long)B, mode, ms, *std::min_element(t.begin(), t.end()),
                *std::max_element(t.begin(), t.end()), timed, tok_s, tflops,
                100 * tflops / gemm_tflops, gemm_tflops, peak / double(1 << 30));
  };
  row("eager", times, eager_peak);
  row("graph", graph_times, graph_peak);
  std::printf("gpt_step B=%lld graph check: %d of %d losses bitwise equal to eager (%zu graph nodes)\n",
              (long long)B, same, kLossSteps, graph.nodes());
  std::printf("gpt_step B=%lld floors: GEMMs %.2f ms + attention %.2f ms at the bare GEMM rate; copy "
              "bandwidth %.2f TB/s\n", (long long)B, gemm_flop / (gemm_tflops * 1e9),
              attention_flop / (gemm_tflops * 1e9), copy_tb_s);
  std::fflush(stdout);

  if (!export_dir.empty()) {
    const nlohmann::json timing = {
        {"batch", B}, {"microbatch", microbatch}, {"T", kT}, {"ms_per_step", median(times)},
        {"ms_per_step_graph", median(graph_times)}, {"tokens_per_step", tokens_per_step},
        {"params", n_params}, {"flop_per_token", flop_per_token},
        {"cublas_bf16_tflops", gemm_tflops}, {"copy_tb_per_s", copy_tb_s},
        {"peak_bytes_eager", eager_peak}, {"peak_bytes_graph", graph_peak},
        {"graph_losses_equal", same}, {"loss_steps", kLossSteps}};
    write_text(base + "_timing.json", timing.dump(2) + "\n");
  }
  if (!std::isfinite(loss) || !std::isfinite(graph_loss) || same != kLossSteps) {
    std::fprintf(stderr, "gpt_step B=%lld: final loss %f (eager), %f (graph); %d of %d graph "
                 "losses equal to eager\n", (long long)B, loss, graph_loss, same, kLossSteps);
    return false;
  }
  return true;
}

int usage(const char* message) {
  std::fprintf(stderr, "gpt_step: %s\nusage: gpt_step [--batch 16|64|all] [--microbatch M] "
               "[--export DIR] [--no-breakdown] [--gemm-algo measured|heuristic] | --gemms-alone "
               "[--microbatch M] [--gemm-algo measured|heuristic]\n", message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches = {16, 64};
  std::string export_dir;
  int64_t microbatch = 64;
  bool breakdown = true, gemms_alone = false;
  set_gemm_autotune(true);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v == "16" || v == "64") batches = {std::stoll(v)};
      else if (v != "all") return usage(("--batch must be 16, 64 or all, got '" + v + "'").c_str());
    } else if (a == "--microbatch" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "16" && v != "32" && v != "64")
        return usage(("--microbatch must be 16, 32 or 64, got '" + v + "'").c_str());
      microbatch = std::stoll(v);
    } else if (a == "--export" && i + 1 < argc) {
      export_dir = argv[++i];
    } else if (a == "--no-breakdown") {
      breakdown = false;
    } else if (a == "--gemms-alone") {
      gemms_alone = true;
    } else if (a == "--gemm-algo" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "measured" && v != "heuristic")
        return usage(("--gemm-algo must be measured or heuristic, got '" + v + "'").c_str());
      set_gemm_autotune(v == "measured");
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (!cuda::available()) {
    std::printf("gpt_step: no GPU, nothing to time\n");
    return 0;
  }
  try {
    if (gemms_alone) {
      std::printf("gpt_step GEMMs alone, one microbatch of %lld x %lld tokens: %.3f ms\n",
                  (long long)microbatch, (long long)kT, gemms_alone_ms(gpt2_small(), microbatch, 1));
      return 0;
    }
    if (!export_dir.empty()) std::filesystem::create_directories(export_dir);
    const double gemm_tflops = bench::cublas_bf16_tflops(kDevice);
    const double copy_tb_s = bench::copy_tbps(kDevice);
    std::printf("cuBLAS bf16 GEMM 8192^3 (fp32 compute): %.1f TFLOP/s; device copy %.3f TB/s; "
                "GEMM algorithms: %s\n", gemm_tflops, copy_tb_s,
                gemm_autotune() ? "measured (each shape's first 8 candidates timed)"
                                : "cuBLASLt's first heuristic pick (--gemm-algo heuristic)");
    bool ok = true;
    for (int64_t B : batches)
      ok = run_batch(B, std::min(B, microbatch), export_dir, breakdown, gemm_tflops, copy_tb_s) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
}
