#pragma once
// The kernel lab: the scaled-SiLU and RMSNorm backward kernels rebuilt in numbered steps, from the
// direct translation of the math (v1) to the production kernel (v5, which calls ops/). Each
// version is one short file, lab/<op>/vN_*.cu, whose header says what changed and why; all take
// the same arguments, so the lab's test checks every one against lab/check.h and `lab_bench`
// times every one against the same run's copy bandwidth (docs/lab.md).
//
// Buffers are bf16 (x, dy, dx) and fp32 (w, weight, rstd, dw, dweight), contiguous, on the
// current device. dx is written with '='; dw / dweight are ADDED into ('+=', the .grad sink).
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

namespace mt::lab {

// dx = dy·w·(s + x·s·(1 − s)),  dw += Σ dy·x·s,  s = σ(x).  w and dw: one fp32 on the device.
using SiluBackwardFn = void(const void* x, const float* w, const void* dy, void* dx, float* dw,
                            int64_t n, cudaStream_t s);
// x̂ = x·rstd, g = dy·weight:  dx = rstd·(g − x̂·mean_j(g·x̂)),  dweight += Σ_rows dy·x̂.
using RmsBackwardFn = void(const void* x, const float* weight, const float* rstd, const void* dy,
                           void* dx, float* dweight, int64_t rows, int64_t d, cudaStream_t s);

inline constexpr int kPack = 8;  // bf16 elements in one 16-byte pack

template <class Fn>
struct Version {
  const char* name;    // "v3 16-byte vectors"
  const char* change;  // what it adds to the version before, in a line
  Fn* fn;
  bool needs_pack_aligned = false;  // refuses (mt::Error) n or d not a multiple of 8
};

const std::vector<Version<SiluBackwardFn>>& silu_versions();
const std::vector<Version<RmsBackwardFn>>& rms_versions();

namespace silu_v1 { SiluBackwardFn backward; }
namespace silu_v2 { SiluBackwardFn backward; }
namespace silu_v3 { SiluBackwardFn backward; }
namespace silu_v4 { SiluBackwardFn backward; }
namespace silu_v5 { SiluBackwardFn backward; }
namespace rms_v1 { RmsBackwardFn backward; }
namespace rms_v2 { RmsBackwardFn backward; }
namespace rms_v3 { RmsBackwardFn backward; }
namespace rms_v4 { RmsBackwardFn backward; }
namespace rms_v5 { RmsBackwardFn backward; }

// The largest d of the versions that keep a block's dweight sums in shared memory (v2-v4): d
// floats, within the 48 KB a kernel gets without an opt-in.
inline constexpr int64_t kRmsSharedMaxD = 8 * 1024;

}  // namespace mt::lab
