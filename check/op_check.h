#pragma once
// The op check: the conformance test every differentiable op must pass, for minitrain's own ops
// and for yours. PyTorch splits this between torch.autograd.gradcheck and torch.library.opcheck;
// this one also checks what a kernel author gets wrong: accumulation, grids, dtypes, determinism.
//
//   mt::check::OpSpec spec;
//   spec.name = "swiglu";
//   spec.inputs = {{"a", Cast::Compute, true, /*batched=*/true}, {"b", Cast::Compute, true, true}};
//   spec.op = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{swiglu(in[0], in[1])}; };
//   spec.make = [](Generator& g, int64_t n) { return std::vector<Tensor>{randn(n, 5), randn(n, 5)}; };
//   mt::check::Report r = mt::check::op_check(spec);
//   std::fputs(r.str().c_str(), stdout);   // one line per check, PASS / FAIL / SKIP
//   return r.ok() ? 0 : 1;
//
// From GoogleTest, check/op_check_gtest.h has MT_EXPECT_OP_CHECK(spec). The checks, in order
// (docs/op_check.md says which trap each one catches):
//
//   CPU, in f64
//     contract        backward returns one gradient per forward argument, each the argument's
//                     shape and dtype ({} for a non-differentiable one): the engine's errors;
//                     with several outputs, each output alone works and the parts add up
//     gradcheck       analytic gradients = central finite differences of <outputs, R>
//     accumulation    backward twice = twice every .grad, through the grad sink (leaf inputs)
//                     and through returned gradients (inputs that are outputs of another op)
//     microbatches    for row-separable ops: k uneven row chunks = the full batch
//     strided         strided inputs and strided upstream gradients give the same bits
//     sizes           every size in `sizes` (1, odd, not a multiple of a vector) and empty inputs
//     inputs intact   inputs are not modified, and outputs do not alias them
//     bad inputs      each of `bad_inputs` is an mt::Error, not a crash or a wrong answer
//   CUDA, per dtype (f32, bf16, f16), when a GPU is present and the op has CUDA kernels (an op
//   declared for the CPU only, MT_OP_BACKENDS in core/registry.h, skips them)
//     parity          outputs and gradients against the f64 CPU reference on the same rounded
//                     inputs, every size, with every new allocation poisoned (NaN) first
//     strided         strided inputs and upstream gradients give the contiguous run's bits
//     deterministic   two runs, and inputs at another address, give the same bits; inputs
//                     misaligned by one element too, unless the op says its bits depend on it
//     cuda graph      captured and replayed = eager, bitwise; again after new inputs are copied in
//     inputs intact   as on the CPU
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace mt::check {

// How an input's dtype follows the dtype under test.
enum class Cast {
  Compute,  // the dtype under test (activations, weights a GEMM reads)
  Grad,     // that dtype's gradient dtype, f32 (f64 in f64): a scalar parameter like scaled_silu's w
  Keep,     // as made: integer targets, say
};

struct Input {
  std::string name;
  Cast cast = Cast::Compute;
  bool differentiable = true;
  bool batched = false;  // split by rows (dim 0) in the microbatch check; others are shared
};

// Allowed error against the f64 reference, normwise: max|x - ref| <= tol * max|ref|.
struct Tolerance {
  double output = 0;
  double grad = 0;
};

struct OpSpec {
  std::string name;  // the op's name in the registry (MT_DEFINE_OP), where it has one
  std::vector<Input> inputs;
  // The op on its tensor arguments, in the order of `inputs`; every output, in order.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> op;
  // Random inputs for size n (what n counts is the op's choice: rows, elements), on the CPU,
  // f64 for Compute and Grad inputs. Never all zeros.
  std::function<std::vector<Tensor>(Generator&, int64_t n)> make;
  // The awkward sizes: 1, odd, not a multiple of a 16-byte vector, and one spanning many blocks.
  std::vector<int64_t> sizes = {1, 7, 33, 1031};
  int64_t gradcheck_size = 7;  // finite differences cost two forwards per input element
  bool allows_empty = true;    // size 0 works (false: it must be an mt::Error)
  // Each output row depends only on the same row of the batched inputs, so microbatches summed
  // must equal the full batch (a loss that divides by its own row count is not; give it a
  // fixed normalizer, as the trainer does).
  bool row_separable = false;
  // Deterministic results do not depend on the inputs' alignment. false for an op whose library
  // (cuBLAS) picks its algorithm by alignment; say why beside it.
  bool alignment_invariant = true;
  std::map<DType, Tolerance> tolerance;  // overrides of default_tolerance(dtype)
  // Calls that must be refused with an mt::Error, each with what is wrong with it.
  std::vector<std::pair<std::string, std::function<void()>>> bad_inputs;
};

Tolerance default_tolerance(DType dtype);

// Random f64 CPU tensors from a generator, for OpSpec::make.
Tensor normal(Generator& g, const Shape& shape, double stddev = 1.0);
Tensor uniform(Generator& g, const Shape& shape, double lo, double hi);
Tensor labels(Generator& g, int64_t n, int64_t classes);  // int64 in [0, classes)

struct Options {
  bool cpu = true;
  bool cuda = true;  // runs only in a CUDA build with a GPU present; skipped lines otherwise
  std::vector<DType> dtypes = {DType::f32, DType::bf16, DType::f16};
  uint64_t seed = 0x5eed;
};

struct Line {
  enum Status { Pass, Fail, Skip };
  std::string check;
  Status status = Pass;
  std::string detail;
};

struct Report {
  std::string op;
  std::vector<Line> lines;
  bool ok() const;  // no check failed
  int count(Line::Status s) const;
  // "op_check swiglu: 12 passed, 1 failed, 5 skipped" and one line per check.
  std::string str() const;
  // The report of one check, by name (empty when there is none), for tests of the checker.
  const Line* find(const std::string& check) const;
};

Report op_check(const OpSpec& spec, const Options& options = {});

}  // namespace mt::check
