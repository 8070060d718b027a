#pragma once
// The op registry: one place that says, for every op, what it computes, the signature of its
// forward and backward kernels, and which kernels each backend provides.
//
// An op is defined once, next to its Function, with the Tensor-level kernel signatures from its
// header (a forward-only op, whose Function differentiates through other ops, passes void):
//
//   MT_DEFINE_OP(scaled_silu, "y = w*x*sigmoid(x)", ScaledSiLUForwardFn, ScaledSiLUBackwardFn);
//   MT_REGISTER_KERNEL(scaled_silu, Forward, CPU, forward_cpu);    // scaled_silu.cpp
//   MT_REGISTER_KERNEL(scaled_silu, Forward, CUDA, forward_cuda);  // scaled_silu.cu
//
// and the Function looks its kernel up by the input's device and calls it the same way anywhere:
//
//   kernel<ScaledSiLUForwardFn>("scaled_silu", Phase::Forward, x.device())(x, w, y);
//
// Registration is static (namespace scope of a .cpp or .cu; MT_*_IN_HEADER for an op that lives
// in one header), so adding a backend means adding a file, not editing a switch.
//
// An op has kernels for every backend of the build unless it declares fewer: an op written for
// the CPU only says so, and a CUDA build then neither requires its CUDA kernels nor accepts any;
// calling it on a GPU is an mt::Error naming the op and the device.
//
//   MT_OP_BACKENDS(my_op, CPU);   // or (my_op, CPU, CUDA): every backend, the default
//
// verify_ops() checks the whole table when a program starts (the trainer and `train` call it;
// so does `train --list-ops`): a kernel missing for a backend this build has and the op declares,
// a kernel whose signature differs from the op's definition, or kernels for an op never defined,
// are one mt::Error naming each op, instead of a failure at the op's first call.
#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace mt {

enum class Phase : uint8_t { Forward, Backward };

class OpRegistry {
 public:
  static OpRegistry& instance();

  // A kernel signature: its type.
  struct Signature {
    const std::type_info* type = nullptr;  // null: the op has no kernel for this phase
    bool defined() const { return type != nullptr; }
  };

  void define(const std::string& op, const std::string& math, Signature forward, Signature backward);
  void add(const std::string& op, Phase phase, DeviceType device, std::any fn);
  // Declares the only backends `op` has kernels for (MT_OP_BACKENDS); without it, all of them.
  void set_backends(const std::string& op, const std::vector<DeviceType>& backends);
  // Whether `op` is declared for `device` (true for an op not in the table: nothing says no).
  bool declares(const std::string& op, DeviceType device) const;
  const std::any* find(const std::string& op, Phase phase, DeviceType device) const;
  // Why find() found nothing, for kernel()'s error: the op is not declared for that device, the
  // build lacks the backend, or the kernel was never registered.
  std::string missing(const std::string& op, Phase phase, DeviceType device) const;
  std::vector<std::string> ops() const;
  // Everything wrong with the table for a build with these backends, one line per problem.
  std::vector<std::string> problems(const std::vector<DeviceType>& backends) const;
  // The table `train --list-ops` prints: op, math, and which kernels exist ("MISSING": one this
  // build needs and lacks; "n/a": a backend the op is not declared for), in aligned columns.
  std::string table() const;

 private:
  struct Entry {
    bool defined = false;
    std::string math;
    Signature signature[2];
    std::map<std::pair<Phase, DeviceType>, std::any> kernels;
    std::vector<DeviceType> backends;  // empty: every backend (no MT_OP_BACKENDS)
    bool declares(DeviceType d) const;
  };
  std::map<std::string, Entry> entries_;
  std::vector<std::string> duplicates_;  // registered twice: reported by problems()
};

// The backends this build has: the CPU, and CUDA when it was built with it.
std::vector<DeviceType> built_backends();
// Throws one mt::Error listing every problem of the registry for this build's backends.
void verify_ops();

// The kernel `op` registered for `phase` on `device`'s type, or an mt::Error saying which is
// missing (a CUDA kernel in a build without CUDA, say).
template <class Fn>
Fn* kernel(const std::string& op, Phase phase, Device device) {
  const std::any* a = OpRegistry::instance().find(op, phase, device.type);
  MT_CHECK(a, OpRegistry::instance().missing(op, phase, device.type));
  Fn* const* fn = std::any_cast<Fn*>(a);
  MT_CHECK(fn, op, ": registered kernel has a different signature than the caller expects");
  return *fn;
}

template <class Fn> OpRegistry::Signature signature_of() {
  if constexpr (std::is_void_v<Fn>) return {};
  else return {&typeid(Fn*)};
}

struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(const char* op, Phase phase, DeviceType device, Fn* fn) {
    OpRegistry::instance().add(op, phase, device, std::any(fn));
  }
};
struct OpDefinition {
  OpDefinition(const char* op, const char* math, OpRegistry::Signature forward,
               OpRegistry::Signature backward) {
    OpRegistry::instance().define(op, math, forward, backward);
  }
};
struct OpBackends {
  OpBackends(const char* op, const std::vector<DeviceType>& backends) {
    OpRegistry::instance().set_backends(op, backends);
  }
};

#define MT_CONCAT_INNER(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_INNER(a, b)
// At namespace scope of the op's .cpp or .cu: each use registers once per program, so a kernel
// registered twice (two files, one op) is reported by verify_ops().
//
// MT_DEFINE_OP(scaled_silu, "y = w*x*sigmoid(x)", ScaledSiLUForwardFn, ScaledSiLUBackwardFn);
#define MT_DEFINE_OP(op, math, ForwardFn, BackwardFn)                                       \
  static const ::mt::OpDefinition MT_CONCAT(mt_op_definition_, __COUNTER__)(               \
      #op, math, ::mt::signature_of<ForwardFn>(), ::mt::signature_of<BackwardFn>())
// MT_REGISTER_KERNEL(scaled_silu, Forward, CPU, forward_cpu);
#define MT_REGISTER_KERNEL(op, phase, device, fn)                                           \
  static const ::mt::KernelRegistrar MT_CONCAT(mt_registrar_, __COUNTER__)(                \
      #op, ::mt::Phase::phase, ::mt::DeviceType::device, fn)
// MT_OP_BACKENDS(my_op, CPU);  the backends (CPU, CUDA) my_op has kernels for, when not all
#define MT_OP_BACKENDS(op, ...)                                                             \
  static const ::mt::OpBackends MT_CONCAT(mt_op_backends_, __COUNTER__)(                   \
      #op, [] { using enum ::mt::DeviceType; return std::vector<::mt::DeviceType>{__VA_ARGS__}; }())

// The same for an op that lives in one header, included by several files: an inline variable
// named after the op (and phase and device) exists once in the program, so the header registers
// once however many files include it. The kernels it names must have external linkage (inline
// functions, not static ones), and a second registration of the same name elsewhere is merged
// by the linker, not reported: use these only in that header.
#define MT_DEFINE_OP_IN_HEADER(op, math, ForwardFn, BackwardFn)                             \
  inline const ::mt::OpDefinition mt_op_definition_##op(                                   \
      #op, math, ::mt::signature_of<ForwardFn>(), ::mt::signature_of<BackwardFn>())
#define MT_REGISTER_KERNEL_IN_HEADER(op, phase, device, fn)                                 \
  inline const ::mt::KernelRegistrar mt_kernel_##op##_##phase##_##device(                  \
      #op, ::mt::Phase::phase, ::mt::DeviceType::device, fn)
#define MT_OP_BACKENDS_IN_HEADER(op, ...)                                                   \
  inline const ::mt::OpBackends mt_op_backends_##op(                                       \
      #op, [] { using enum ::mt::DeviceType; return std::vector<::mt::DeviceType>{__VA_ARGS__}; }())

}  // namespace mt
