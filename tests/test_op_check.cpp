// Every in-tree op through the public op check (check/op_check.h): the CPU checks here and in CI,
// the CUDA ones per dtype wherever a GPU is present. Then the checker itself: a multi-output
// op passes it, and ops broken on purpose fail it naming the broken property.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>

#include "check/op_check.h"
#include "check/op_check_gtest.h"
#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/registry.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/gelu/gelu.h"
#include "ops/gelu_mlp/gelu_mlp.h"
#include "ops/layer_norm/layer_norm.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/scaled_silu.h"

using namespace mt;
using namespace mt::check;

namespace {

using Inputs = std::vector<Tensor>;

OpSpec scaled_silu_spec() {
  OpSpec s;
  s.name = "scaled_silu";
  s.inputs = {{"x", Cast::Compute, true, true}, {"w", Cast::Grad, true, false}};
  s.op = [](const Inputs& in) { return Inputs{scaled_silu(in[0], in[1])}; };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n}, 2.0), uniform(g, {1}, 0.5, 1.5)}; };
  s.sizes = {1, 7, 33, 1031, 300007};  // the last spans many blocks of the dw reduction
  s.row_separable = true;
  s.bad_inputs = {
      {"w with two elements", [] { scaled_silu(randn({4}), randn({2})); }},
      {"f64 w for f32 x", [] { scaled_silu(randn({4}), randn({1}, DType::f64)); }},
      {"inplace=true while x needs a gradient",
       [] { scaled_silu(randn({4}).set_requires_grad(), randn({1}), true); }},
  };
  return s;
}

OpSpec rms_norm_spec(int64_t d) {
  OpSpec s;
  s.name = "rms_norm (d = " + std::to_string(d) + ")";
  s.inputs = {{"x", Cast::Compute, true, true}, {"weight", Cast::Grad, true, false}};
  s.op = [](const Inputs& in) { return Inputs{rms_norm(in[0], in[1])}; };
  s.make = [d](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, d}, 1.5), uniform(g, {d}, 0.5, 1.5)};
  };
  s.sizes = {1, 3, 33, 517};
  s.gradcheck_size = 3;
  s.row_separable = true;
  // Rows that start 16-byte aligned take the vector path, which sums a row in another order
  // than the scalar path: same bits run to run, not across alignments.
  s.alignment_invariant = false;
  s.bad_inputs = {
      {"weight of the wrong length", [d] { rms_norm(randn({2, d}), randn({d + 1})); }},
      {"f64 weight for f32 x", [d] { rms_norm(randn({2, d}), randn({d}, DType::f64)); }},
  };
  return s;
}

OpSpec rms_norm_scaled_silu_spec(int64_t d) {
  OpSpec s;
  s.name = "rms_norm_scaled_silu (d = " + std::to_string(d) + ")";
  s.inputs = {{"x", Cast::Compute, true, true},
              {"weight", Cast::Grad, true, false},
              {"w", Cast::Grad, true, false}};
  s.op = [](const Inputs& in) { return Inputs{rms_norm_scaled_silu(in[0], in[1], in[2])}; };
  s.make = [d](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, d}, 1.5), uniform(g, {d}, 0.5, 1.5), uniform(g, {1}, 0.5, 1.5)};
  };
  s.sizes = {1, 3, 33, 517};
  s.gradcheck_size = 3;
  s.row_separable = true;
  s.alignment_invariant = false;  // as rms_norm: the vector and scalar paths sum in other orders
  s.bad_inputs = {
      {"weight of the wrong length",
       [d] { rms_norm_scaled_silu(randn({2, d}), randn({d + 1}), randn({1})); }},
      {"w with two elements", [d] { rms_norm_scaled_silu(randn({2, d}), randn({d}), randn({2})); }},
      {"f64 w for f32 x",
       [d] { rms_norm_scaled_silu(randn({2, d}), randn({d}), randn({1}, DType::f64)); }},
  };
  return s;
}

OpSpec linear_spec() {
  OpSpec s;
  s.name = "linear";
  s.inputs = {{"x", Cast::Compute, true, true}, {"W", Cast::Compute, true, false},
              {"b", Cast::Compute, true, false}};
  s.op = [](const Inputs& in) { return Inputs{linear(in[0], in[1], in[2])}; };
  s.make = [](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, 24}), normal(g, {17, 24}, 0.3), normal(g, {17})};
  };
  s.sizes = {1, 7, 33, 515};
  s.gradcheck_size = 3;
  s.row_separable = true;
  // cuBLAS(Lt) chooses its kernel, and so its summation order, by the pointers' alignment.
  s.alignment_invariant = false;
  s.bad_inputs = {
      {"W whose columns do not match x", [] { linear(randn({2, 24}), randn({17, 23})); }},
      {"b of the wrong length", [] { linear(randn({2, 24}), randn({17, 24}), randn({16})); }},
  };
  return s;
}

// Hidden width h: a multiple of 8 runs cuBLASLt's GELU epilogues on CUDA, another width the
// GEMMs with gelu's kernels between them (ops/gelu_mlp/gelu_mlp.h).
OpSpec gelu_mlp_spec(int64_t h) {
  OpSpec s;
  s.name = "gelu_mlp (h = " + std::to_string(h) + ")";
  s.inputs = {{"x", Cast::Compute, true, true}, {"W1", Cast::Compute, true, false},
              {"b1", Cast::Compute, true, false}, {"W2", Cast::Compute, true, false},
              {"b2", Cast::Compute, true, false}};
  s.op = [](const Inputs& in) { return Inputs{gelu_mlp(in[0], in[1], in[2], in[3], in[4])}; };
  s.make = [h](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, 16}), normal(g, {h, 16}, 0.4), normal(g, {h}, 0.5),
                  normal(g, {12, h}, 0.3), normal(g, {12})};
  };
  s.sizes = {1, 7, 33, 515};
  s.gradcheck_size = 3;
  s.row_separable = true;
  s.alignment_invariant = false;  // cuBLAS(Lt) picks its kernel by the pointers' alignment
  s.bad_inputs = {
      {"W1 whose columns do not match x",
       [h] { gelu_mlp(randn({2, 16}), randn({h, 15}), randn({h}), randn({12, h}), randn({12})); }},
      {"W2 whose columns do not match the hidden width",
       [h] { gelu_mlp(randn({2, 16}), randn({h, 16}), randn({h}), randn({12, h + 1}), randn({12})); }},
      {"b2 of the wrong length",
       [h] { gelu_mlp(randn({2, 16}), randn({h, 16}), randn({h}), randn({12, h}), randn({11})); }},
      {"W2 in a dtype the hidden activation cannot use (f64 under an f32 x)",
       [h] {
         gelu_mlp(randn({2, 16}), randn({h, 16}), randn({h}), randn({12, h}, DType::f64), randn({12}));
       }},
  };
  return s;
}

OpSpec cross_entropy_spec() {
  OpSpec s;
  s.name = "cross_entropy";
  s.inputs = {{"logits", Cast::Compute, true, true}, {"targets", Cast::Keep, false, true}};
  // A fixed normalizer (as the trainer's microbatches use) makes the loss a sum over rows.
  s.op = [](const Inputs& in) { return Inputs{cross_entropy(in[0], in[1], -100, 50.0)}; };
  s.make = [](Generator& g, int64_t n) {
    Tensor t = labels(g, n, 11);
    int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < n; i += 5) p[i] = -100;  // some ignored rows
    return Inputs{normal(g, {n, 11}, 2.0), t};
  };
  s.sizes = {1, 7, 33, 1031};
  s.gradcheck_size = 4;
  s.row_separable = true;
  s.bad_inputs = {
      {"a target outside [0, classes)",
       [] { cross_entropy(randn({2, 3}), from_vector(std::vector<int64_t>{0, 3}, {2}, DType::i64)); }},
      {"1-D logits", [] { cross_entropy(randn({3}), from_vector(std::vector<int64_t>{0}, {1}, DType::i64)); }},
  };
  return s;
}

// A padded vocabulary: `valid` of C columns are classes; the padding holds large logits that
// would dominate the loss if they counted, and must get exactly zero gradient.
OpSpec cross_entropy_padded_spec(int64_t C, int64_t valid) {
  OpSpec s = cross_entropy_spec();
  s.name = "cross_entropy (" + std::to_string(valid) + " of " + std::to_string(C) +
           " classes valid)";
  // C a multiple of 8 makes whole 16-byte packs: the aligned run takes the vector path, the
  // misaligned one the scalar path, and their max/sum merge trees differ (as for rms_norm).
  s.alignment_invariant = false;
  s.op = [valid](const Inputs& in) {
    return Inputs{cross_entropy(in[0], in[1], -100, 50.0, valid)};
  };
  s.make = [C, valid](Generator& g, int64_t n) {
    Tensor t = labels(g, n, valid);
    int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < n; i += 5) p[i] = -100;
    Tensor logits = normal(g, {n, C}, 2.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = valid; c < C; ++c) logits.data<double>()[r * C + c] = 30.0;
    return Inputs{logits, t};
  };
  s.bad_inputs = {
      {"a target in the padding",
       [C, valid] {
         cross_entropy(randn({2, C}), from_vector(std::vector<int64_t>{0, valid}, {2}, DType::i64),
                       -100, 0, valid);
       }},
      {"more valid classes than columns",
       [C] {
         cross_entropy(randn({2, C}), from_vector(std::vector<int64_t>{0, 1}, {2}, DType::i64),
                       -100, 0, C + 1);
       }},
  };
  return s;
}

// Rows of at least 1024 columns take the forward's and backward's 256-thread blocks (the narrower
// specs run one warp a row, which never reaches the block merge). 1040 columns are 260 f32 packs
// (four threads load two) and 130 packs of 8 in 16 bits (half the threads idle); the padding
// begins mid-pack, and in 16 bits the last pack is all padding, alone in its thread (a running
// max of -inf to merge).
OpSpec cross_entropy_wide_spec() {
  OpSpec s = cross_entropy_padded_spec(1040, 1029);
  s.sizes = {1, 7, 33, 300};
  s.gradcheck_size = 2;  // two forwards per logit: one ignored row and one kept
  return s;
}

OpSpec binary_spec(const std::string& name, Tensor (*f)(const Tensor&, const Tensor&)) {
  OpSpec s;
  s.name = name;
  s.inputs = {{"a", Cast::Compute, true, true}, {"b", Cast::Compute, true, true}};
  s.op = [f](const Inputs& in) { return Inputs{f(in[0], in[1])}; };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 3}), normal(g, {n, 3})}; };
  s.row_separable = true;
  s.bad_inputs = {{"shapes that differ", [f] { f(randn({2, 3}), randn({3, 2})); }}};
  return s;
}

OpSpec unary_spec(const std::string& name, std::function<Tensor(const Tensor&)> f, bool rows) {
  OpSpec s;
  s.name = name;
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [f](const Inputs& in) { return Inputs{f(in[0])}; };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 5})}; };
  s.row_separable = rows;
  return s;
}

Tensor add1(const Tensor& a, const Tensor& b) { return add(a, b); }

// The views of core/views.cpp, each followed by clone(): a view shares its input's memory by
// design, and the check's "outputs own their memory" is a rule for ops that compute. clone() adds
// one copy node whose backward hands the gradient on unchanged, so the view's backward is what
// every check sees. Views along dims past 0 keep rows separate.
OpSpec view_spec(const std::string& name, std::function<Inputs(const Tensor&)> f, Shape row) {
  OpSpec s;
  s.name = name;
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [f](const Inputs& in) {
    Inputs out = f(in[0]);
    for (Tensor& t : out) t = t.clone();
    return out;
  };
  s.make = [row](Generator& g, int64_t n) {
    Shape shape{n};
    shape.insert(shape.end(), row.begin(), row.end());
    return Inputs{normal(g, shape)};
  };
  s.gradcheck_size = 3;
  s.row_separable = true;
  return s;
}

OpSpec layer_norm_spec(int64_t d) {
  OpSpec s;
  s.name = "layer_norm (d = " + std::to_string(d) + ")";
  s.inputs = {{"x", Cast::Compute, true, true},
              {"weight", Cast::Grad, true, false},
              {"bias", Cast::Grad, true, false}};
  s.op = [](const Inputs& in) { return Inputs{layer_norm(in[0], in[1], in[2])}; };
  s.make = [d](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, d}, 1.5), uniform(g, {d}, 0.5, 1.5), normal(g, {d})};
  };
  s.sizes = {1, 3, 33, 517};
  s.gradcheck_size = 3;
  s.row_separable = true;
  // Rows whose packs are 16-byte aligned take the warp path, which sums in another order than
  // the block path: same bits run to run, not across alignments.
  s.alignment_invariant = false;
  s.bad_inputs = {
      {"weight of the wrong length",
       [d] { layer_norm(randn({2, d}), randn({d + 1}), randn({d})); }},
      {"f64 bias for f32 x", [d] { layer_norm(randn({2, d}), randn({d}), randn({d}, DType::f64)); }},
  };
  return s;
}

// Two outputs {x + r, layer_norm(x + r)}: the contract check also runs each alone (then the
// backward sees one of ds, dy undefined).
OpSpec add_layer_norm_spec(int64_t d) {
  OpSpec s = layer_norm_spec(d);
  s.name = "add_layer_norm (d = " + std::to_string(d) + ")";
  s.inputs.insert(s.inputs.begin() + 1, Input{"r", Cast::Compute, true, true});
  s.op = [](const Inputs& in) { return add_layer_norm(in[0], in[1], in[2], in[3]); };
  s.make = [d](Generator& g, int64_t n) {
    return Inputs{normal(g, {n, d}, 1.5), normal(g, {n, d}), uniform(g, {d}, 0.5, 1.5),
                  normal(g, {d})};
  };
  s.bad_inputs = {
      {"r of another shape",
       [d] { add_layer_norm(randn({2, d}), randn({3, d}), randn({d}), randn({d})); }},
      {"r of another dtype",
       [d] { add_layer_norm(randn({2, d}), randn({2, d}, DType::f64), randn({d}), randn({d})); }},
      {"weight of the wrong length",
       [d] { add_layer_norm(randn({2, d}), randn({2, d}), randn({d + 1}), randn({d})); }},
  };
  return s;
}

OpSpec gelu_spec(GeluApprox a) {
  OpSpec s = unary_spec(a == GeluApprox::Tanh ? "gelu (tanh)" : "gelu (erf)",
                        [a](const Tensor& x) { return gelu(x, a); }, true);
  s.sizes = {1, 7, 33, 1031, 4099};  // odd: a scalar tail after the packs
  s.bad_inputs = {{"integer x", [a] { gelu(ones({3}, DType::i64), a); }}};
  return s;
}

// The mask depends on an element's position in the call, so row chunks draw other masks: not
// row-separable.
OpSpec dropout_spec() {
  OpSpec s = unary_spec("dropout", [](const Tensor& x) { return dropout(x, 0.25, 77, 5); }, false);
  s.sizes = {1, 7, 33, 1031, 4099};
  s.bad_inputs = {{"p = 1", [] { dropout(randn({4}), 1.0, 1, 1); }},
                  {"p < 0", [] { dropout(randn({4}), -0.5, 1, 1); }}};
  return s;
}

// ids repeat (a 40-row table for up to 1031 positions, and id 3 at every 4th position), so
// every check also covers the scatter-add's many contributions to one row.
OpSpec embedding_spec(int64_t C) {
  OpSpec s;
  s.name = "embedding (C = " + std::to_string(C) + ")";
  s.inputs = {{"ids", Cast::Keep, false, true}, {"W", Cast::Compute, true, false}};
  s.op = [](const Inputs& in) { return Inputs{embedding(in[0], in[1])}; };
  s.make = [C](Generator& g, int64_t n) {
    Tensor ids = labels(g, n, 40);
    for (int64_t i = 0; i < n; i += 4) ids.data<int64_t>()[i] = 3;
    return Inputs{ids, normal(g, {40, C})};
  };
  s.row_separable = true;
  s.bad_inputs = {
      {"an id outside [0, rows)",
       [] { embedding(from_vector(std::vector<int64_t>{0, 40}, {2}, DType::i64), randn({40, 3})); }},
      {"f32 ids", [] { embedding(zeros({2}), randn({40, 3})); }},
  };
  return s;
}

}  // namespace

TEST(OpCheck, ScaledSiLU) { MT_EXPECT_OP_CHECK(scaled_silu_spec()); }
TEST(OpCheck, RMSNormOddWidth) { MT_EXPECT_OP_CHECK(rms_norm_spec(37)); }
TEST(OpCheck, RMSNormVectorWidth) { MT_EXPECT_OP_CHECK(rms_norm_spec(256)); }
TEST(OpCheck, RMSNormScaledSiLUOddWidth) { MT_EXPECT_OP_CHECK(rms_norm_scaled_silu_spec(37)); }
TEST(OpCheck, RMSNormScaledSiLUVectorWidth) { MT_EXPECT_OP_CHECK(rms_norm_scaled_silu_spec(256)); }
TEST(OpCheck, Linear) { MT_EXPECT_OP_CHECK(linear_spec()); }
TEST(OpCheck, GeluMlpEpilogueWidth) { MT_EXPECT_OP_CHECK(gelu_mlp_spec(24)); }
TEST(OpCheck, GeluMlpOddWidth) { MT_EXPECT_OP_CHECK(gelu_mlp_spec(13)); }
TEST(OpCheck, CrossEntropy) { MT_EXPECT_OP_CHECK(cross_entropy_spec()); }
TEST(OpCheck, CrossEntropyPaddedVocabulary) {
  MT_EXPECT_OP_CHECK(cross_entropy_padded_spec(16, 11));
}
TEST(OpCheck, CrossEntropyWideRows) { MT_EXPECT_OP_CHECK(cross_entropy_wide_spec()); }
TEST(OpCheck, LayerNormOddWidth) { MT_EXPECT_OP_CHECK(layer_norm_spec(37)); }
TEST(OpCheck, LayerNormVectorWidth) { MT_EXPECT_OP_CHECK(layer_norm_spec(256)); }
TEST(OpCheck, AddLayerNormOddWidth) { MT_EXPECT_OP_CHECK(add_layer_norm_spec(37)); }
TEST(OpCheck, AddLayerNormVectorWidth) { MT_EXPECT_OP_CHECK(add_layer_norm_spec(256)); }
TEST(OpCheck, GeluTanh) { MT_EXPECT_OP_CHECK(gelu_spec(GeluApprox::Tanh)); }
TEST(OpCheck, GeluErf) { MT_EXPECT_OP_CHECK(gelu_spec(GeluApprox::Erf)); }
TEST(OpCheck, Dropout) { MT_EXPECT_OP_CHECK(dropout_spec()); }
TEST(OpCheck, EmbeddingOddWidth) { MT_EXPECT_OP_CHECK(embedding_spec(5)); }
TEST(OpCheck, EmbeddingVectorWidth) { MT_EXPECT_OP_CHECK(embedding_spec(64)); }
TEST(OpCheck, Add) { MT_EXPECT_OP_CHECK(binary_spec("add", add1)); }
TEST(OpCheck, Mul) { MT_EXPECT_OP_CHECK(binary_spec("mul", mul)); }
TEST(OpCheck, Relu) { MT_EXPECT_OP_CHECK(unary_spec("relu", relu, true)); }
TEST(OpCheck, Scale) {
  MT_EXPECT_OP_CHECK(unary_spec("scale", [](const Tensor& x) { return scale(x, -1.75); }, true));
}
// sum's output is one number: a sum over row chunks is still the sum over the batch. Its blocks
// are cut by the element count and the alignment (vector or scalar loads), so its bits are the
// same run to run but not across alignments.
TEST(OpCheck, Sum) {
  OpSpec s = unary_spec("sum", sum, true);
  s.alignment_invariant = false;
  MT_EXPECT_OP_CHECK(s);
}
// mean divides by its own count, so chunks do not add up: not row-separable; and the mean of
// nothing is refused.
TEST(OpCheck, Mean) {
  OpSpec s = unary_spec("mean", mean, false);
  s.allows_empty = false;
  MT_EXPECT_OP_CHECK(s);
}

TEST(OpCheck, Narrow) {
  OpSpec s = view_spec("narrow", [](const Tensor& x) { return Inputs{x.narrow(2, 1, 3)}; }, {4, 5});
  s.bad_inputs = {{"a range past the end", [] { randn({2, 4, 5}).narrow(2, 3, 3); }}};
  MT_EXPECT_OP_CHECK(s);
}
TEST(OpCheck, Permute) {
  OpSpec s = view_spec("permute", [](const Tensor& x) { return Inputs{x.permute({0, 2, 3, 1})}; },
                       {4, 3, 2});
  s.bad_inputs = {{"a dim given twice", [] { randn({2, 3, 4}).permute({0, 1, 1}); }}};
  MT_EXPECT_OP_CHECK(s);
}
// Three outputs of uneven sizes (one empty): the contract check also runs each part alone, so
// split's backward fills the slices of the parts without a gradient with zeros.
TEST(OpCheck, Split) {
  OpSpec s = view_spec("split", [](const Tensor& x) { return x.split({2, 0, 5}, 1); }, {7, 2});
  s.bad_inputs = {{"sizes that do not add up", [] { randn({2, 7}).split({2, 4}, 1); }}};
  MT_EXPECT_OP_CHECK(s);
}

// Every in-tree op is defined once with its signatures, and has every kernel this build needs.
TEST(OpRegistry, EveryOpHasItsKernelsWithTheDeclaredSignatures) {
  EXPECT_NO_THROW(verify_ops());
  for (const std::string& op : {"scaled_silu", "rms_norm", "rms_norm_scaled_silu", "linear",
                                "cross_entropy", "relu", "sum", "layer_norm", "gelu", "dropout",
                                "embedding", "attention", "split_heads", "merge_heads"})
    EXPECT_NE(OpRegistry::instance().find(op, Phase::Backward, DeviceType::CPU), nullptr) << op;
}

// ---- the registry's startup check, on a registry of its own --------------------------------

namespace {
using GoodFn = void(const Tensor&, const Tensor&);
using OtherFn = void(const Tensor&);
void good_kernel(const Tensor&, const Tensor&) {}
void other_kernel(const Tensor&) {}
}  // namespace

TEST(OpRegistry, MissingKernelsWrongSignaturesAndUndefinedOpsAreNamed) {
  OpRegistry r;
  r.define("complete", "y = x", signature_of<GoodFn>(), signature_of<GoodFn>());
  r.add("complete", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.add("complete", Phase::Backward, DeviceType::CPU, std::any(&good_kernel));
  EXPECT_TRUE(r.problems({DeviceType::CPU}).empty());

  r.define("no_cuda", "y = x", signature_of<GoodFn>(), signature_of<void>());
  r.add("no_cuda", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.define("wrong_sig", "y = x", signature_of<GoodFn>(), signature_of<void>());
  r.add("wrong_sig", Phase::Forward, DeviceType::CPU, std::any(&other_kernel));
  r.add("undefined", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.add("no_cuda", Phase::Backward, DeviceType::CPU, std::any(&good_kernel));  // declared void
  r.add("complete", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));  // twice

  const std::vector<std::string> p = r.problems({DeviceType::CPU, DeviceType::CUDA});
  std::string all;
  for (const std::string& line : p) all += line + "\n";
  EXPECT_NE(all.find("no_cuda: no cuda forward kernel, and this build has cuda"), std::string::npos) << all;
  EXPECT_NE(all.find("complete: no cuda forward kernel"), std::string::npos) << all;
  EXPECT_NE(all.find("wrong_sig: the cpu forward kernel has the signature"), std::string::npos) << all;
  EXPECT_NE(all.find("undefined: kernels are registered but the op is never defined"), std::string::npos) << all;
  EXPECT_NE(all.find("no_cuda: a cpu backward kernel is registered, but the op's definition declares no backward"),
            std::string::npos) << all;
  EXPECT_NE(all.find("complete: the cpu forward kernel is registered twice"), std::string::npos) << all;
  // The duplicate, complete's two CUDA kernels, no_cuda's CUDA forward and stray backward,
  // wrong_sig's CUDA forward and signature, and the undefined op: each named once.
  EXPECT_EQ(p.size(), 8u) << all;
}

// An op may declare fewer backends than the build has (MT_OP_BACKENDS): a CPU-only op in a CUDA
// build is complete, a CUDA kernel registered for it is a problem, and so are declarations that
// name nothing or come twice.
TEST(OpRegistry, AnOpDeclaredForTheCpuOnlyNeedsNoCudaKernels) {
  OpRegistry r;
  r.define("cpu_only", "y = x", signature_of<GoodFn>(), signature_of<GoodFn>());
  r.set_backends("cpu_only", {DeviceType::CPU});
  r.add("cpu_only", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.add("cpu_only", Phase::Backward, DeviceType::CPU, std::any(&good_kernel));
  EXPECT_TRUE(r.problems({DeviceType::CPU, DeviceType::CUDA}).empty());
  EXPECT_TRUE(r.declares("cpu_only", DeviceType::CPU));
  EXPECT_FALSE(r.declares("cpu_only", DeviceType::CUDA));
  EXPECT_TRUE(r.declares("not_in_the_table", DeviceType::CUDA));
  EXPECT_EQ(r.missing("cpu_only", Phase::Forward, DeviceType::CUDA),
            "cpu_only: has no cuda kernels: the op is declared for cpu only (MT_OP_BACKENDS); give "
            "it cpu tensors");

  r.add("cpu_only", Phase::Forward, DeviceType::CUDA, std::any(&good_kernel));
  r.define("twice", "y = x", signature_of<GoodFn>(), signature_of<void>());
  r.set_backends("twice", {DeviceType::CPU});
  r.set_backends("twice", {DeviceType::CPU, DeviceType::CUDA});
  r.add("twice", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.define("none", "y = x", signature_of<GoodFn>(), signature_of<void>());
  r.set_backends("none", {});
  r.add("none", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.add("none", Phase::Forward, DeviceType::CUDA, std::any(&good_kernel));
  r.set_backends("undefined", {DeviceType::CPU});
  const std::vector<std::string> p = r.problems({DeviceType::CPU, DeviceType::CUDA});
  std::string all;
  for (const std::string& line : p) all += line + "\n";
  EXPECT_NE(all.find("cpu_only: a cuda forward kernel is registered, but the op is declared for cpu "
                     "only (MT_OP_BACKENDS)"), std::string::npos) << all;
  EXPECT_NE(all.find("twice: its backends are declared twice"), std::string::npos) << all;
  EXPECT_NE(all.find("none: MT_OP_BACKENDS names no backend"), std::string::npos) << all;
  EXPECT_NE(all.find("undefined: MT_OP_BACKENDS names it but the op is never defined"),
            std::string::npos) << all;
  // twice keeps its first declaration, so its cuda forward is not missing.
  EXPECT_EQ(p.size(), 4u) << all;
}

// `train --list-ops`: the columns line up whatever the longest name (rms_norm_scaled_silu was
// wider than the op column), and a backend an op is not declared for reads n/a.
TEST(OpRegistry, TheTableLinesUpItsColumns) {
  OpRegistry r;
  r.define("a_rather_long_op_name_indeed", "y = x", signature_of<GoodFn>(), signature_of<void>());
  r.add("a_rather_long_op_name_indeed", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.define("short", "y = 2x", signature_of<GoodFn>(), signature_of<GoodFn>());
  r.set_backends("short", {DeviceType::CPU});
  r.add("short", Phase::Forward, DeviceType::CPU, std::any(&good_kernel));
  r.add("short", Phase::Backward, DeviceType::CPU, std::any(&good_kernel));
  std::istringstream table(r.table());
  std::vector<std::string> lines;
  for (std::string line; std::getline(table, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << r.table();
  const size_t math = lines[0].find("math");
  ASSERT_NE(math, std::string::npos);
  EXPECT_EQ(lines[1].substr(math), "y = x") << r.table();
  EXPECT_EQ(lines[2].substr(math), "y = 2x") << r.table();
  EXPECT_EQ(lines[0].find("cpu fwd"), lines[1].find("yes")) << r.table();
  EXPECT_EQ(lines[2].find("n/a"), lines[0].find("cuda fwd")) << r.table();
}

// A CPU-only op in the program's own registry: verify_ops accepts it (OpRegistry.EveryOp... above,
// in a CUDA build too), a CUDA call is an error naming the op and the device, and the op check
// runs its CPU checks and skips the CUDA ones, saying why.
namespace {
using TwiceForwardFn = void(const Tensor& x, const Tensor& y);
using TwiceBackwardFn = void(const Tensor& dy, const Tensor& dx);
// y = 2x ('=' into y); dx = 2 dy ('=' into dx). f64 only: it is a test's op.
void twice_forward_cpu(const Tensor& x, const Tensor& y) {
  for (int64_t i = 0; i < x.numel(); ++i) y.data<double>()[i] = 2 * x.data<double>()[i];
}
void twice_backward_cpu(const Tensor& dy, const Tensor& dx) {
  for (int64_t i = 0; i < dy.numel(); ++i) dx.data<double>()[i] = 2 * dy.data<double>()[i];
}
struct TwiceFn : Function<TwiceFn> {
  static constexpr const char* name = "test_twice_cpu_only";
  static Tensor forward(Context&, const Tensor& x) {
    MT_CHECK(x.dtype() == DType::f64, name, ": x must be f64, got ", dtype_name(x.dtype()));
    Tensor xc = x.contiguous(), y = empty(x.shape(), x.dtype(), x.device());
    kernel<TwiceForwardFn>(name, Phase::Forward, x.device())(xc, y);
    return y;
  }
  static GradList backward(Context&, const GradList& dys) {
    Tensor dy = dys[0].contiguous(), dx = empty(dy.shape(), dy.dtype(), dy.device());
    kernel<TwiceBackwardFn>(name, Phase::Backward, dy.device())(dy, dx);
    return {dx};
  }
};
}  // namespace
MT_DEFINE_OP(test_twice_cpu_only, "y = 2x (a test's CPU-only op)", TwiceForwardFn, TwiceBackwardFn);
MT_OP_BACKENDS(test_twice_cpu_only, CPU);
MT_REGISTER_KERNEL(test_twice_cpu_only, Forward, CPU, twice_forward_cpu);
MT_REGISTER_KERNEL(test_twice_cpu_only, Backward, CPU, twice_backward_cpu);

TEST(OpRegistry, ACpuOnlyOpIsCheckedOnTheCpuAndRefusedOnAGpu) {
  EXPECT_NO_THROW(verify_ops());
  EXPECT_FALSE(OpRegistry::instance().declares("test_twice_cpu_only", DeviceType::CUDA));
  try {
    kernel<TwiceForwardFn>("test_twice_cpu_only", Phase::Forward, Device{DeviceType::CUDA, 0});
    ADD_FAILURE() << "expected an mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_twice_cpu_only: has no cuda kernels: the op is "
                                         "declared for cpu only"), std::string::npos) << e.what();
  }

  OpSpec s;
  s.name = "test_twice_cpu_only";
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [](const Inputs& in) { return Inputs{TwiceFn::apply(in[0])}; };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 3})}; };
  s.row_separable = true;
  s.bad_inputs = {{"f32 x", [] { TwiceFn::apply(randn({2})); }}};
  const Report r = op_check(s);
  EXPECT_TRUE(r.ok()) << r.str();
  const Line* cuda = r.find("cuda");
  ASSERT_NE(cuda, nullptr) << r.str();
  EXPECT_EQ(cuda->status, Line::Skip);
  EXPECT_EQ(cuda->detail, "test_twice_cpu_only is declared without cuda kernels (MT_OP_BACKENDS)");
}

// ---- a multi-output op through the check ---------------------------------------------------

namespace {
// (sin x, cos x), both saved for backward: saving outputs must not keep the graph alive.
struct SinCos : Function<SinCos> {
  static constexpr const char* name = "sincos";
  static std::vector<Tensor> forward(Context& ctx, const Tensor& x) {
    Tensor xc = x.contiguous().to(DType::f64);
    Tensor s = empty(x.shape(), DType::f64), c = empty(x.shape(), DType::f64);
    for (int64_t i = 0; i < x.numel(); ++i) {
      s.data<double>()[i] = std::sin(xc.data<double>()[i]);
      c.data<double>()[i] = std::cos(xc.data<double>()[i]);
    }
    ctx.save_for_backward({s, c});
    return {s, c};
  }
  // d/dx: ds · cos x − dc · sin x; an output that got no gradient contributes nothing.
  static GradList backward(Context& ctx, const GradList& grads) {
    auto saved = ctx.saved_tensors();
    Tensor dx = zeros(saved[0].shape(), DType::f64);
    for (int k = 0; k < 2; ++k) {
      if (!grads[k].defined()) continue;
      Tensor g = grads[k].contiguous();
      for (int64_t i = 0; i < dx.numel(); ++i)
        dx.data<double>()[i] += k == 0 ? g.data<double>()[i] * saved[1].data<double>()[i]
                                       : -g.data<double>()[i] * saved[0].data<double>()[i];
    }
    return {dx};
  }
};
}  // namespace

TEST(MultiOutput, BothOutputsOneOutputAndTheCheck) {
  OpSpec s;
  s.name = "sincos";
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [](const Inputs& in) { return SinCos::apply(in[0]); };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 2})}; };
  s.row_separable = true;
  Options cpu_only;
  cpu_only.cuda = false;  // the op has no CUDA kernel
  MT_EXPECT_OP_CHECK(s, cpu_only);

  // Only the second output used: the backward sees an undefined gradient for the first.
  Tensor x = from_vector(std::vector<double>{0.3, -1.2}, {2}, DType::f64).set_requires_grad();
  std::vector<Tensor> sc = SinCos::apply(x);
  EXPECT_EQ(sc[1].impl().output_nr, 1u);
  sum(sc[1]).backward();
  EXPECT_NEAR(x.grad().to_vector()[0], -std::sin(0.3), 1e-15);
  EXPECT_NEAR(x.grad().to_vector()[1], -std::sin(-1.2), 1e-15);
}

TEST(MultiOutput, SavingEveryOutputDoesNotKeepTheGraphAlive) {
  std::weak_ptr<Node> node;
  {
    Tensor x = randn({5}, DType::f64).set_requires_grad();
    std::vector<Tensor> sc = SinCos::apply(x);
    node = sc[0].grad_fn();
    ASSERT_FALSE(node.expired());
  }  // no backward ran: the outputs, and with them the node, must be freed
  EXPECT_TRUE(node.expired());
}

TEST(MultiOutput, BackwardFromSeveralRootsSumsWhatReachesEachNode) {
  Tensor x = from_vector(std::vector<double>{0.5, 2.0}, {2}, DType::f64).set_requires_grad();
  Tensor y = mul(x, x);
  Tensor z = scale(y, 3.0);  // z depends on y: y's node must wait for z's gradient
  backward({y, z}, {ones({2}, DType::f64), ones({2}, DType::f64)});
  // d(y + z)/dx = 2x + 6x = 8x
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{4.0, 16.0}));
}

// ---- the checker catches broken ops --------------------------------------------------------

namespace {
// Doubles x; its backward gives the right gradient but stores it into x's .grad (the sink).
struct StoresIntoSink : Function<StoresIntoSink> {
  static constexpr const char* name = "double_that_stores";
  static Tensor forward(Context&, const Tensor& x) { return scale(x, 2.0); }
  static GradList backward(Context& ctx, const GradList& dy) {
    Tensor sink = ctx.grad_sink(0);
    Tensor g = scale(dy[0], 2.0);
    if (!sink.defined()) return {g};
    sink.copy_(g);  // '=' where '+=' belongs
    return {Tensor()};
  }
};
// Doubles x; its backward adds a wrong gradient (3 dy) into the sink, the right one (2 dy) when it
// returns it: each path accumulates (twice = 2x), only comparing the two paths shows it.
struct SinkPathDiffers : Function<SinkPathDiffers> {
  static constexpr const char* name = "double_whose_sink_path_differs";
  static Tensor forward(Context&, const Tensor& x) { return scale(x, 2.0); }
  static GradList backward(Context& ctx, const GradList& dy) {
    Tensor sink = ctx.grad_sink(0);
    if (!sink.defined()) return {scale(dy[0], 2.0)};
    add_into(sink, scale(dy[0], 3.0));
    return {Tensor()};
  }
};
// Doubles x; its backward reads dy's memory as if it were contiguous.
struct IgnoresStrides : Function<IgnoresStrides> {
  static constexpr const char* name = "double_that_ignores_strides";
  static Tensor forward(Context&, const Tensor& x) { return scale(x, 2.0); }
  static GradList backward(Context&, const GradList& dy) {
    Tensor g = empty(dy[0].shape(), dy[0].dtype());
    const double* src = static_cast<const double*>(dy[0].data_ptr());  // no .contiguous()
    for (int64_t i = 0; i < g.numel(); ++i) g.data<double>()[i] = 2 * src[i];
    return {g};
  }
};
// Doubles x, and returns a gradient for a second, non-tensor argument that has none.
struct OneTooMany : Function<OneTooMany> {
  static constexpr const char* name = "double_with_one_too_many";
  static Tensor forward(Context&, const Tensor& x) { return scale(x, 2.0); }
  static GradList backward(Context&, const GradList& dy) { return {scale(dy[0], 2.0), Tensor()}; }
};

template <class Fn>
Report check_broken() {
  OpSpec s;
  s.name = Fn::name;
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [](const Inputs& in) { return Inputs{Fn::apply(in[0])}; };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 3})}; };
  s.row_separable = true;
  Options cpu_only;
  cpu_only.cuda = false;
  return op_check(s, cpu_only);
}

void expect_fails(const Report& r, const std::string& check, const std::string& words) {
  const Line* l = r.find(check);
  ASSERT_NE(l, nullptr) << r.str();
  EXPECT_EQ(l->status, Line::Fail) << r.str();
  EXPECT_NE(l->detail.find(words), std::string::npos) << r.str();
  EXPECT_FALSE(r.ok());
}
}  // namespace

TEST(OpCheckCatches, AStoreIntoTheGradSink) {
  Report r = check_broken<StoresIntoSink>();
  expect_fails(r, "accumulation", "stores (=) into a gradient it must add into (+=)");
}

TEST(OpCheckCatches, ASinkPathThatDiffersFromTheReturnedPath) {
  expect_fails(check_broken<SinkPathDiffers>(), "accumulation",
               "differs between the grad-sink path and the returned-gradient path");
}

TEST(OpCheckCatches, AnUpstreamGradientReadAsContiguous) {
  expect_fails(check_broken<IgnoresStrides>(), "strided", "upstream gradient is a strided view");
}

TEST(OpCheckCatches, AWrongGradientCount) {
  expect_fails(check_broken<OneTooMany>(), "contract", "returned 2 gradient(s) but forward took 1");
}

namespace {
// sincos whose backward assumes both outputs received a gradient.
struct SinCosNeedsBoth : Function<SinCosNeedsBoth> {
  static constexpr const char* name = "sincos_that_needs_both";
  static std::vector<Tensor> forward(Context& ctx, const Tensor& x) { return SinCos::forward(ctx, x); }
  static GradList backward(Context& ctx, const GradList& grads) {
    (void)grads[1].contiguous();  // throws when only the first output was used
    return SinCos::backward(ctx, grads);
  }
};
// (x · 2, the index of each row's largest element): a value and an integer output.
struct WithIndex : Function<WithIndex> {
  static constexpr const char* name = "with_index";
  static std::vector<Tensor> forward(Context&, const Tensor& x) {
    return {scale(x, 2.0), zeros({x.size(0)}, DType::i64)};
  }
  static GradList backward(Context&, const GradList& grads) {
    EXPECT_FALSE(grads[1].defined());  // the index output never receives a gradient
    return {scale(grads[0], 2.0)};
  }
};
}  // namespace

TEST(OpCheckCatches, ABackwardThatNeedsEveryOutputsGradient) {
  OpSpec s;
  s.name = "sincos_that_needs_both";
  s.inputs = {{"x", Cast::Compute, true, true}};
  s.op = [](const Inputs& in) { return SinCosNeedsBoth::apply(in[0]); };
  s.make = [](Generator& g, int64_t n) { return Inputs{normal(g, {n, 2})}; };
  Options cpu_only;
  cpu_only.cuda = false;
  expect_fails(op_check(s, cpu_only), "contract", "threw");
}

TEST(MultiOutput, AnIntegerOutputHasNoHistory) {
  Tensor x = randn({3, 2}, DType::f64).set_requires_grad();
  std::vector<Tensor> out = WithIndex::apply(x);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_EQ(out[1].grad_fn(), nullptr);
  sum(out[0]).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(6, 2.0));
}
