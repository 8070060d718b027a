#include "app/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "app/registry.h"
#include "data/data.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#endif

namespace mt::app {

double state_bytes(const Config& c, double params, double copied, int world) {
  const DType compute = c.precision.compute_dtype;
  const double master = compute == DType::f64 ? 8 : 4;
  // AdamW's two moments, this rank's share of them under optim.shard_state (ZeRO-1).
  const double moments = c.optim.name == "adamw" ? (c.optim.shard_state ? 2.0 / world : 2)
                         : c.optim.momentum > 0  ? 1 : 0;
  const bool low_precision = compute == DType::bf16 || compute == DType::f16;
  return params * master * (2 + moments) + (low_precision ? copied * 2 : 0);
}

int64_t largest_microbatch(const Config& c, int world) {
  // The microbatch_sizes rule twice (data/data.h): the first shard, then its first microbatch.
  const int64_t shard = (c.optim.batch_size + world - 1) / world;
  return (shard + c.optim.microbatches - 1) / c.optim.microbatches;
}

MemoryEstimate estimate_memory(const Config& c, int world) {
  const ModelConfig& m = c.model;
  std::vector<double> widths{double(m.input)};
  widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
  widths.push_back(double(m.classes));

  // In doubles: the sizes are bounded (config.h), but their products are not meant to be formed
  // exactly here, only compared with what the machine has.
  double weights = 0, params = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    weights += widths[i] * widths[i + 1];
    params += widths[i] * widths[i + 1] + (m.bias ? widths[i + 1] : 0);
    if (i + 2 < widths.size() && m.norm == "rms_norm") params += widths[i + 1];
  }
  MemoryEstimate e;
  e.state = state_bytes(c, params, weights, world);
  const double elem = double(dtype_size(c.precision.compute_dtype));
  const int64_t micro = largest_microbatch(c, world);
  double sum_widths = 0, max_width = 0;
  for (double w : widths) sum_widths += w, max_width = std::max(max_width, w);
  // An evaluation batch holds at most the held-out set: eval.batch_size 2^31 over 4,000 test
  // samples is a batch of 4,000. Only synthetic data's sets are known before they are read.
  double eval_batch = 0;
  if (c.data.kind == "synthetic")
    eval_batch = double(std::min({c.eval.batch_size,
                                  std::max(synthetic_test_samples(c.data.samples),
                                           data::validation_samples(c.data.samples, c.data.val_fraction))}));
  e.activations = std::max(double(micro) * sum_widths, eval_batch * max_width) * elem;
  if (c.data.kind == "synthetic") {
    const double samples = double(c.data.samples + synthetic_test_samples(c.data.samples));
    e.data = samples * (double(m.input) * sizeof(float) + sizeof(int64_t));
  }
  return e;
}

double physical_memory_bytes() {
  return double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
}

double address_space_limit_bytes() {
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return INFINITY;
  return double(as.rlim_cur);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t u = 0;
  while (bytes >= 1024 && u + 1 < std::size(units)) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

namespace {

[[noreturn]] void refuse(double need, const std::string& where, const std::string& parts,
                         double have, const char* what, const std::string& advice) {
  throw ConfigError("the run needs at least " + format_bytes(need) + " on " + where + " (" +
                    parts + "), but " + where + " has " + format_bytes(have) + " of " + what +
                    "; " + advice);
}

}  // namespace

void check_memory(const Config& c, Device device, int world) {
  check_estimate(estimate_memory(c, world), c.optim.name, device, world,
                 "make model.hidden, model.input, optim.batch_size or data.samples smaller");
}

void check_estimate(const MemoryEstimate& e, const std::string& optimizer, Device device,
                    int world, const std::string& advice) {
  // What the host can give this process: its physical memory, or less under `ulimit -v`, where an
  // allocation past the limit fails however much memory is free.
  const double physical = physical_memory_bytes(), limit = address_space_limit_bytes();
  const double host = std::min(physical, limit);
  const char* host_what = limit < physical ? "address space (ulimit -v)" : "physical memory";
  const std::string model = "parameters, gradients and " + optimizer + " state " +
                            format_bytes(e.state) + ", activations " + format_bytes(e.activations);
  const std::string data = "synthetic data " + format_bytes(e.data);
  if (device.is_cpu()) {
    const double need = double(world) * (e.state + e.activations + e.data);
    const std::string ranks = world > 1 ? ", for each of " + std::to_string(world) + " ranks" : "";
    if (need > host)
      refuse(need, "cpu", model + (e.data > 0 ? ", " + data : "") + ranks, host, host_what,
             advice);
    return;
  }
#ifdef MT_WITH_CUDA
  size_t free = 0, total = 0;
  cuda::set_device(device.index);
  MT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const double need = e.state + e.activations;
  if (need > double(free))
    refuse(need, device.str(), model, double(free), "free memory", advice);
#endif
  if (e.data > host) refuse(e.data, "the host", data, host, host_what, advice);
}

void check_job_fits(const Config& c, Device device, int world) {
  if (c.optim.batch_size < int64_t(world) * c.optim.microbatches)
    throw ConfigError(detail::concat("--nproc ", world, ": optim.batch_size ", c.optim.batch_size,
                                     " samples cannot give ", world, " ranks ", c.optim.microbatches,
                                     " microbatches each"));
  // GPU workers each check their own GPU: the launcher creates no CUDA context it would keep. The
  // model kind's own estimate (an MLP's widths say nothing of a GPT).
  const ModelKind* kind = find_model_kind(c.model.kind);
  if (device.is_cpu() && kind && kind->check_memory) kind->check_memory(c, device, world);
}

}  // namespace mt::app
