#include "core/switches.h"

namespace mt {

static bool g_deterministic = true;
bool deterministic() { return g_deterministic; }
void set_deterministic(bool on) { g_deterministic = on; }

static bool g_gemm_autotune = false;
bool gemm_autotune() { return g_gemm_autotune; }
void set_gemm_autotune(bool on) { g_gemm_autotune = on; }

}  // namespace mt
