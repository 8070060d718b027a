// swiglu through minitrain's op check: every CPU check, and every CUDA check per dtype where a GPU
// is present. Then three copies of swiglu, each broken the way kernel authors break ops, must
// fail the check with a message naming what is broken: this test is also the check's own test.
#include <gtest/gtest.h>

#include "check/op_check_gtest.h"
#include "swiglu.h"

using namespace mt;
using namespace mt::check;
using swiglu_example::SwiGLUBackwardFn;
using swiglu_example::SwiGLUFn;

namespace {

using Inputs = std::vector<Tensor>;

// The spec for any Function with swiglu's arguments.
template <class Fn>
OpSpec spec_for(const std::string& name) {
  OpSpec s;
  s.name = name;
  s.inputs = {{"a", Cast::Compute, true, /*batched=*/true}, {"b", Cast::Compute, true, true}};
  s.op = [](const Inputs& in) { return Inputs{Fn::apply(in[0], in[1])}; };
  s.make = [](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, 24}, 2.0), normal(g, {n, 24})};  // 24: 3 packs of 8, and odd rows
  };
  s.sizes = {1, 7, 33, 4097};
  s.gradcheck_size = 3;
  s.row_separable = true;
  s.bad_inputs = {
      {"a and b of different shapes", [] { Fn::apply(randn({2, 3}), randn({3, 2})); }},
      {"a and b of different dtypes", [] { Fn::apply(randn({2, 3}), randn({2, 3}, DType::f64)); }},
  };
  return s;
}

Options cpu_only() {
  Options o;
  o.cuda = false;  // the broken copies have CPU kernels only
  return o;
}

// The three broken copies share swiglu's forward and its CPU backward kernel.
template <class Derived>
struct BrokenBase : Function<Derived> {
  static Tensor forward(Context& ctx, const Tensor& a, const Tensor& b) {
    return SwiGLUFn::forward(ctx, a, b);
  }
  static void grads(Context& ctx, const Tensor& dy, Tensor& da, Tensor& db) {
    auto saved = ctx.saved_tensors();
    da = empty(saved[0].shape(), saved[0].dtype());
    db = empty(saved[1].shape(), saved[1].dtype());
    kernel<SwiGLUBackwardFn>("swiglu", Phase::Backward, kCPU)(saved[0], saved[1], dy, da, db);
  }
};

// "Optimized" to write a leaf's gradient straight into its .grad, with '=' where '+=' belongs.
struct StoresIntoGrad : BrokenBase<StoresIntoGrad> {
  static constexpr const char* name = "swiglu_that_stores";
  static GradList backward(Context& ctx, const GradList& dys) {
    Tensor da, db;
    grads(ctx, dys[0].contiguous(), da, db);
    Tensor sink = ctx.grad_sink(0);
    if (!sink.defined()) return {da, db};
    sink.copy_(da);  // the bug: a store drops what earlier backward passes left
    return {Tensor(), db};
  }
};

// Returns a gradient for an argument the forward does not have.
struct OneGradientTooMany : BrokenBase<OneGradientTooMany> {
  static constexpr const char* name = "swiglu_with_three_gradients";
  static GradList backward(Context& ctx, const GradList& dys) {
    Tensor da, db;
    grads(ctx, dys[0].contiguous(), da, db);
    return {da, db, Tensor()};
  }
};

// Hands the upstream gradient to the kernel as it came, without .contiguous().
struct ForgetsContiguous : BrokenBase<ForgetsContiguous> {
  static constexpr const char* name = "swiglu_without_contiguous";
  static GradList backward(Context& ctx, const GradList& dys) {
    Tensor da, db;
    grads(ctx, dys[0], da, db);  // the bug: a strided dy is read as if it were contiguous
    return {da, db};
  }
};

void expect_fails(const Report& r, const std::string& check, const std::string& words) {
  const Line* l = r.find(check);
  ASSERT_NE(l, nullptr) << r.str();
  EXPECT_EQ(l->status, Line::Fail) << r.str();
  EXPECT_NE(l->detail.find(words), std::string::npos) << r.str();
  std::printf("as expected, %s fails '%s': %s\n", r.op.c_str(), check.c_str(), l->detail.c_str());
}

}  // namespace

TEST(SwiGLU, PassesTheOpCheck) { MT_EXPECT_OP_CHECK(spec_for<SwiGLUFn>("swiglu")); }

TEST(SwiGLU, IsInTheRegistryWithEveryKernelThisBuildNeeds) {
  EXPECT_NO_THROW(verify_ops());
  EXPECT_NE(OpRegistry::instance().find("swiglu", Phase::Backward, DeviceType::CPU), nullptr);
}

TEST(BrokenSwiGLU, AStoreIntoTheGradientFailsAccumulation) {
  expect_fails(op_check(spec_for<StoresIntoGrad>("swiglu_that_stores"), cpu_only()), "accumulation",
               "stores (=) into a gradient it must add into (+=)");
}

TEST(BrokenSwiGLU, AWrongGradientCountFailsTheContract) {
  expect_fails(op_check(spec_for<OneGradientTooMany>("swiglu_with_three_gradients"), cpu_only()),
               "contract", "backward returned 3 gradient(s) but forward took 2 argument(s)");
}

TEST(BrokenSwiGLU, AForgottenContiguousFailsTheStridedCheck) {
  expect_fails(op_check(spec_for<ForgetsContiguous>("swiglu_without_contiguous"), cpu_only()),
               "strided", "the backward reads dy as if it were contiguous");
}
