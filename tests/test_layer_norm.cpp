// layer_norm on the CPU: gradient checks for x, weight and bias, the forward against the formula
// and the saved statistics, the += contract for weight and bias, 16-bit rounding, misuse errors;
// add_layer_norm (the residual add fused in) against add then layer_norm, its gradient checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/layer_norm/layer_norm.h"
#include "tests/expect_error.h"
#include "tests/f64_reference.h"
#include "tests/gradcheck.h"
#include "tests/poison_scope.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::expect_near_reference;
using mt::test::PoisonScope;
using mt::test::random_leaf;
using mt::test::unit_roundoff;

TEST(LayerNorm, GradientCheckForXWeightAndBias) {
  manual_seed(1);
  for (Shape shape : {Shape{3, 1}, Shape{3, 33}, Shape{2, 3, 5}}) {
    Tensor x = random_leaf(shape), w = random_leaf({shape.back()}, 0.5, 1.5),
           b = random_leaf({shape.back()});
    expect_gradcheck([](auto& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                     "layer_norm " + shape_str(shape));
  }
}

TEST(LayerNorm, ForwardMatchesTheFormula) {
  manual_seed(2);
  const double eps = 1e-3;
  Tensor x = random_leaf({4, 7}, 1, 3, false), w = random_leaf({7}, 0.5, 1.5, false),
         b = random_leaf({7}, -1, 1, false);
  const auto xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector(),
             y = layer_norm(x, w, b, eps).to_vector();
  for (size_t r = 0; r < 4; ++r) {
    double mu = 0, var = 0;
    for (size_t j = 0; j < 7; ++j) mu += xv[r * 7 + j] / 7;
    for (size_t j = 0; j < 7; ++j) var += (xv[r * 7 + j] - mu) * (xv[r * 7 + j] - mu) / 7;
    for (size_t j = 0; j < 7; ++j)
      EXPECT_NEAR(y[r * 7 + j], (xv[r * 7 + j] - mu) / std::sqrt(var + eps) * wv[j] + bv[j], 1e-14);
  }
}

// Shifting and scaling a row leaves x̂ alone: the gradient of a loss that sees only x̂ has no
// component along 1 or x̂ (the "check" of layer_norm.h).
TEST(LayerNorm, GradientIsOrthogonalToShiftAndScale) {
  manual_seed(3);
  Tensor x = random_leaf({2, 16}), w = random_leaf({16}, 0.5, 1.5), b = random_leaf({16});
  layer_norm(x, w, b, 0.0).backward(rand({2, 16}, DType::f64));
  const auto g = x.grad().to_vector(), xv = x.to_vector();
  for (size_t r = 0; r < 2; ++r) {
    double along_one = 0, along_x = 0, mu = 0;
    for (size_t j = 0; j < 16; ++j) mu += xv[r * 16 + j] / 16;
    for (size_t j = 0; j < 16; ++j) {
      along_one += g[r * 16 + j];
      along_x += g[r * 16 + j] * (xv[r * 16 + j] - mu);
    }
    EXPECT_NEAR(along_one, 0, 1e-12);
    EXPECT_NEAR(along_x, 0, 1e-12);
  }
}

TEST(LayerNormAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(4);
  Tensor x = random_leaf({3, 33}), w = random_leaf({33}, 0.5, 1.5), b = random_leaf({33});
  Tensor seed = rand({3, 33}, DType::f64);
  layer_norm(x, w, b).backward(seed);
  const auto gx = x.grad().to_vector(), gw = w.grad().to_vector(), gb = b.grad().to_vector();
  layer_norm(x, w, b).backward(seed);
  const auto gx2 = x.grad().to_vector(), gw2 = w.grad().to_vector(), gb2 = b.grad().to_vector();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_EQ(gx2[i], 2 * gx[i]);
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_EQ(gw2[i], 2 * gw[i]);
  for (size_t i = 0; i < gb.size(); ++i) EXPECT_EQ(gb2[i], 2 * gb[i]);
}

TEST(LayerNormAccumulation, MicrobatchesAddUpToTheFullBatch) {
  manual_seed(5);
  Tensor w = random_leaf({33}, 0.5, 1.5), b = random_leaf({33});
  Tensor x = random_leaf({7, 33}, -2, 2, false), seed = rand({7, 33}, DType::f64);
  layer_norm(x, w, b).backward(seed);
  const auto gw = w.grad().to_vector(), gb = b.grad().to_vector();
  w.zero_grad();
  b.zero_grad();
  layer_norm(x.slice_rows(0, 3), w, b).backward(seed.slice_rows(0, 3));
  layer_norm(x.slice_rows(3, 7), w, b).backward(seed.slice_rows(3, 7));
  const auto gw2 = w.grad().to_vector(), gb2 = b.grad().to_vector();
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw2[i], gw[i], 1e-13);
  for (size_t i = 0; i < gb.size(); ++i) EXPECT_NEAR(gb2[i], gb[i], 1e-13);
}

TEST(LayerNorm, SixteenBitIsFp32MathOnTheRoundedInputsRoundedOnce) {
  manual_seed(6);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x = randn({4, 33}).to(t), w = rand({33}), b = randn({33});
    Tensor seed = randn({4, 33}).to(t);
    x.set_requires_grad();
    w.set_requires_grad();
    b.set_requires_grad();
    Tensor y = layer_norm(x, w, b);
    y.backward(seed);
    Tensor x64 = x.detach().to(DType::f64), w64 = w.detach().to(DType::f64),
           b64 = b.detach().to(DType::f64);
    x64.set_requires_grad();
    w64.set_requires_grad();
    b64.set_requires_grad();
    layer_norm(x64, w64, b64).backward(seed.to(DType::f64));
    const std::string name = dtype_name(t);
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    expect_near_reference(y, layer_norm(x64, w64, b64), 2 * unit_roundoff(t), "y " + name);
    expect_near_reference(x.grad(), x64.grad(), 4 * unit_roundoff(t), "dx " + name);
    expect_near_reference(w.grad(), w64.grad(), 1e-5, "dw " + name);
    expect_near_reference(b.grad(), b64.grad(), 1e-5, "db " + name);
  }
}

TEST(LayerNorm, BadArgumentsAreClearErrors) {
  Tensor x = random_leaf({3, 33});
  Tensor w = random_leaf({33}), b = random_leaf({33});
  expect_error([&] { layer_norm(x, random_leaf({34}), b); },
               {"layer_norm", "weight", "[34]", "[3, 33]"});
  expect_error([&] { layer_norm(x, w, random_leaf({32})); }, {"layer_norm", "bias", "[32]"});
  expect_error([&] { layer_norm(x, w, ones({33})); }, {"layer_norm", "bias", "f64", "f32"});
  expect_error([&] { layer_norm(x, w, b, -1.0); }, {"layer_norm", "eps", "-1"});
  expect_error([&] { layer_norm(random_leaf({3, 0}), random_leaf({0}), random_leaf({0})); },
               {"layer_norm", "x", "[3, 0]"});
}

namespace {

// y and the gradients of x (when wanted), weight and bias, on `dev` from fresh leaves.
struct NormRun {
  Tensor y, dx, dw, db;
};

NormRun run_norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& up, Device dev,
                 bool want_dx = true) {
  // Fresh leaves each run: x.to(cpu) is x itself, which the CPU run would leave requiring grad.
  Tensor xl = x.to(dev).detach(), wl = w.to(dev).detach(), bl = b.to(dev).detach();
  xl.set_requires_grad(want_dx);
  wl.set_requires_grad();
  bl.set_requires_grad();
  Tensor y = layer_norm(xl, wl, bl);
  y.backward(up.to(dev));
  return {y, want_dx ? xl.grad() : Tensor(), wl.grad(), bl.grad()};
}

// max |got − ref| <= rel · max |ref|; an element that is not finite (the NaN poison) fails it.
void expect_normwise(const Tensor& got, const Tensor& ref, double rel, const std::string& what) {
  const auto g = got.to_vector(), r = ref.to_vector();
  ASSERT_EQ(g.size(), r.size()) << what;
  double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(g[i] - r[i]);
    err = std::isfinite(e) ? std::max(err, e) : INFINITY;
    scale = std::max(scale, std::abs(r[i]));
  }
  EXPECT_LE(err, rel * scale) << what;
}

// The GPU's run on dt inputs against the f64 op on the same rounded inputs. y and dx element by
// element: fp32 math rounded once to dt, so two unit roundoffs in 16 bits, and in f32 1e-5 (about
// 170 fp32 roundoffs: mean, rstd and the row sums of the backward each carry a few). dweight and
// dbias are fp32 in every dtype, sums over the rows: 1e-5 of their largest, for 16-bit x too.
void expect_matches_f64(const NormRun& got, const NormRun& ref, DType dt) {
  const double rel = dt == DType::f32 ? 1e-5 : 2 * unit_roundoff(dt);
  expect_near_reference(got.y, ref.y, rel, "y");
  if (ref.dx.defined()) expect_near_reference(got.dx, ref.dx, rel, "dx");
  expect_normwise(got.dw, ref.dw, 1e-5, "dweight");
  expect_normwise(got.db, ref.db, 1e-5, "dbias");
}

}  // namespace

// Many rows per warp (the backward's persistent grid strides over 20000 rows) at GPT-2's width,
// and a width off the pack (the block layout and its row-chunk partials): CUDA against the f64
// op on the same rounded inputs, allocations poisoned, and bitwise equal run to run.
TEST(CudaLayerNorm, ManyRowsBothLayoutsMatchTheCpuAndRepeatBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const PoisonScope poison;
  const Device gpu = cuda_device(0);
  for (int64_t d : {int64_t(768), int64_t(770)})
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " " + dtype_name(dt));
      manual_seed(7);
      const int64_t rows = 20000;
      Tensor x = randn({rows, d}).to(dt), up = randn({rows, d}).to(dt);
      Tensor w = rand({d}), b = randn({d});
      const NormRun g1 = run_norm(x, w, b, up, gpu), g2 = run_norm(x, w, b, up, gpu);
      const NormRun ref = run_norm(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64),
                                   up.to(DType::f64), kCPU);
      const Tensor NormRun::*fields[] = {&NormRun::y, &NormRun::dx, &NormRun::dw, &NormRun::db};
      for (auto field : fields)
        EXPECT_EQ((g1.*field).to_vector(), (g2.*field).to_vector()) << "not bitwise repeatable";
      expect_matches_f64(g1, ref, dt);
    }
}

// Every warp-row build (1, 2, 3, 4 packs a lane, and 6, 8 for f32; full and partial last packs),
// with fewer rows than a block has warps and with rows left over after whole strides of the grid,
// and a backward that wants only dweight and dbias (x does not require grad): CUDA against the
// f64 op, allocations poisoned, and bitwise equal run to run.
TEST(CudaLayerNorm, EveryWarpRowWidthMatchesTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const PoisonScope poison;
  const Device gpu = cuda_device(0);
  for (int64_t d : {int64_t(8), int64_t(40), int64_t(264), int64_t(520), int64_t(1000), int64_t(1024)})
    for (int64_t rows : {int64_t(3), int64_t(1001)})
      for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (bool want_dx : {true, false}) {
          SCOPED_TRACE("d=" + std::to_string(d) + " rows=" + std::to_string(rows) + " " +
                       dtype_name(dt) + (want_dx ? "" : " without dx"));
          manual_seed(8);
          Tensor x = randn({rows, d}).to(dt), up = randn({rows, d}).to(dt);
          Tensor w = rand({d}), b = randn({d});
          const NormRun g1 = run_norm(x, w, b, up, gpu, want_dx),
                        g2 = run_norm(x, w, b, up, gpu, want_dx);
          const NormRun ref = run_norm(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64),
                                       up.to(DType::f64), kCPU, want_dx);
          EXPECT_EQ(g1.y.to_vector(), g2.y.to_vector()) << "y: not bitwise repeatable";
          EXPECT_EQ(g1.dw.to_vector(), g2.dw.to_vector()) << "dweight: not bitwise repeatable";
          EXPECT_EQ(g1.db.to_vector(), g2.db.to_vector()) << "dbias: not bitwise repeatable";
          if (want_dx) {
            EXPECT_EQ(g1.dx.to_vector(), g2.dx.to_vector()) << "dx: not bitwise repeatable";
          }
          expect_matches_f64(g1, ref, dt);
        }
}

// eps inside the square root, on the GPU: rows scaled by 1e-3 have a variance of about 1e-6,
// against eps = 1e-5, so 1 / sqrt(var + eps) (~302) is far from 1 / (sqrt(var) + eps) (~990)
// and from 1 / sqrt(var) (~1000); at unit variance the three differ by 5e-6 relative, the size
// of f32's bound. Both layouts (768: warp rows, 770: block rows), every dtype, against f64.
TEST(CudaLayerNorm, EpsSitsInsideTheSquareRootAtSmallVariance) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const PoisonScope poison;
  const Device gpu = cuda_device(0);
  for (int64_t d : {int64_t(768), int64_t(770)})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " " + dtype_name(dt));
      manual_seed(9);
      Tensor x = scale(randn({64, d}), 1e-3).to(dt), up = randn({64, d}).to(dt);
      Tensor w = rand({d}), b = randn({d});
      const NormRun g = run_norm(x, w, b, up, gpu);
      const NormRun ref = run_norm(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64),
                                   up.to(DType::f64), kCPU);
      expect_matches_f64(g, ref, dt);
    }
}

// ---- add_layer_norm: the residual add fused in --------------------------------------------

namespace {

struct AddNormRun {
  std::vector<double> s, y, dx, dr, dw, db;
};

// {s, y} and every gradient for upstream gradients ds, dy, fused or as add then layer_norm.
AddNormRun run_add_norm(bool fused, const Tensor& x0, const Tensor& r0, const Tensor& w0,
                        const Tensor& b0, const Tensor& ds, const Tensor& dy) {
  Tensor x = x0.detach(), r = r0.detach(), w = w0.detach(), b = b0.detach();
  for (Tensor* t : {&x, &r, &w, &b}) t->set_requires_grad();
  Tensor s, y;
  if (fused) {
    const std::vector<Tensor> out = add_layer_norm(x, r, w, b);
    s = out[0], y = out[1];
  } else {
    s = add(x, r);
    y = layer_norm(s, w, b);
  }
  // Both outputs' gradients in one backward: s's from its later use, y's through the norm.
  backward({s, y}, {ds, dy});
  return {s.to_vector(),           y.to_vector(),           x.grad().to_vector(),
          r.grad().to_vector(),    w.grad().to_vector(),    b.grad().to_vector()};
}

}  // namespace

// In f64 and f32 the CPU kernels compute the LayerNorm's dx in the dtype itself, so adding ds
// inside the kernel rounds exactly as the engine's separate sum does: every result bitwise equal.
// In bf16 the forward is still bitwise equal; the fused dx rounds once where the chain rounds
// twice, so it is at least as close to the f64 chain.
TEST(AddLayerNorm, EqualsAddThenLayerNorm) {
  manual_seed(9);
  for (int64_t d : {int64_t(1), int64_t(33), int64_t(64)}) {
    const Shape shape{5, d};
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      const DType g = grad_dtype_for(dt);
      Tensor x = randn(shape).to(dt), r = randn(shape).to(dt), w = rand({d}).to(g),
             b = randn({d}).to(g), ds = randn(shape).to(dt), dy = randn(shape).to(dt);
      const AddNormRun f = run_add_norm(true, x, r, w, b, ds, dy),
                       c = run_add_norm(false, x, r, w, b, ds, dy);
      EXPECT_EQ(f.s, c.s);
      EXPECT_EQ(f.y, c.y);
      EXPECT_EQ(f.dw, c.dw);
      EXPECT_EQ(f.db, c.db);
      EXPECT_EQ(f.dx, f.dr) << "s = x + r: one gradient for both";
      if (dt != DType::bf16) {
        EXPECT_EQ(f.dx, c.dx);
        EXPECT_EQ(f.dr, c.dr);
      } else {
        const AddNormRun e = run_add_norm(false, x.to(DType::f64), r.to(DType::f64),
                                          w.to(DType::f64), b.to(DType::f64), ds.to(DType::f64),
                                          dy.to(DType::f64));
        double err_f = 0, err_c = 0, scale = 0;
        for (size_t i = 0; i < e.dx.size(); ++i) {
          err_f = std::max(err_f, std::abs(f.dx[i] - e.dx[i]));
          err_c = std::max(err_c, std::abs(c.dx[i] - e.dx[i]));
          scale = std::max(scale, std::abs(e.dx[i]));
        }
        EXPECT_LE(err_f, 2 * unit_roundoff(dt) * scale);
        EXPECT_LE(err_f, err_c + 1e-12 * scale);
      }
    }
  }
}

TEST(AddLayerNorm, GradientCheckForXResidualWeightAndBias) {
  manual_seed(10);
  for (Shape shape : {Shape{3, 1}, Shape{3, 17}, Shape{2, 3, 5}}) {
    Tensor x = random_leaf(shape), r = random_leaf(shape),
           w = random_leaf({shape.back()}, 0.5, 1.5), b = random_leaf({shape.back()});
    expect_gradcheck([](auto& in) { return add_layer_norm(in[0], in[1], in[2], in[3])[1]; },
                     {x, r, w, b}, "add_layer_norm y " + shape_str(shape));
    // s and y together, as the residual stream uses them: <s, 1> + <y, y> reaches x through both.
    expect_gradcheck(
        [](auto& in) {
          const std::vector<Tensor> out = add_layer_norm(in[0], in[1], in[2], in[3]);
          return add(sum(out[0]), sum(mul(out[1], out[1])));
        },
        {x, r, w, b}, "add_layer_norm s and y " + shape_str(shape));
  }
}

// Frozen inputs (x and r need no gradient: a fine-tuned model's frozen blocks before a trainable
// one) while weight and bias do, and both outputs get a gradient: the backward must not ask the
// kernels to add ds into a dx nobody wants.
TEST(AddLayerNorm, OnlyTheParametersNeedGradients) {
  manual_seed(12);
  Tensor x = randn({4, 24}), r = randn({4, 24}), ds = randn({4, 24}), dy = randn({4, 24});
  auto grads = [&](bool fused) {
    Tensor w = rand({24}).set_requires_grad(), b = randn({24}).set_requires_grad();
    if (fused) {
      const std::vector<Tensor> out = add_layer_norm(x, r, w, b);
      backward({add(out[0], out[0]), out[1]}, {ds, dy});  // s's gradient reaches the node too
    } else {
      layer_norm(add(x, r), w, b).backward(dy);  // s = x + r alone has no graph here
    }
    return std::vector<std::vector<double>>{w.grad().to_vector(), b.grad().to_vector()};
  };
  EXPECT_EQ(grads(true), grads(false));
}

TEST(AddLayerNorm, BadArgumentsAreClearErrors) {
  expect_error([] { add_layer_norm(randn({3, 4}), randn({3, 5}), randn({4}), randn({4})); },
               {"add_layer_norm", "residual", "[3, 5]", "[3, 4]"});
  expect_error([] { add_layer_norm(randn({3, 4}), randn({3, 4}, DType::f64), randn({4}), randn({4})); },
               {"add_layer_norm", "residual", "f64"});
  expect_error([] { add_layer_norm(randn({3, 4}), randn({3, 4}), randn({5}), randn({4})); },
               {"layer_norm", "weight", "[5]"});
}

// On the GPU at GPT-2's width (the warp rows, 20000 rows so every warp strides several times)
// and off the pack (the block rows), bf16 and f32: the forward bitwise equal to add then
// layer_norm; dweight and dbias too (the same kernels sum them); dx = dr, equal to the chain's in
// f32 and within one bf16 rounding of it in bf16 (the chain rounds the LayerNorm's dx before the
// engine adds ds); every result against the CPU's fused op (dweight and dbias, fp32 sums in every
// dtype, within 1e-5); bitwise repeatable; allocations poisoned.
TEST(CudaAddLayerNorm, EqualsAddThenLayerNormInBothLayouts) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const PoisonScope poison;
  const Device gpu = cuda_device(0);
  for (int64_t d : {int64_t(768), int64_t(770)})
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d));
      manual_seed(11);
      const Shape shape{20000, d};
      Tensor x = randn(shape).to(dt), r = randn(shape).to(dt), w = rand({d}), b = randn({d}),
             ds = randn(shape).to(dt), dy = randn(shape).to(dt);
      auto on = [&](Device dev, bool fused) {
        return run_add_norm(fused, x.to(dev), r.to(dev), w.to(dev), b.to(dev), ds.to(dev),
                            dy.to(dev));
      };
      const AddNormRun f = on(gpu, true), f2 = on(gpu, true), c = on(gpu, false),
                       cpu = on(kCPU, true);
      EXPECT_EQ(f.s, c.s);
      EXPECT_EQ(f.y, c.y);
      EXPECT_EQ(f.dw, c.dw);
      EXPECT_EQ(f.db, c.db);
      EXPECT_EQ(f.dx, f.dr);
      const double u = dt == DType::f32 ? 0.0 : unit_roundoff(dt);
      double err = 0, scale = 0;
      for (size_t i = 0; i < f.dx.size(); ++i) {
        err = std::max(err, std::abs(f.dx[i] - c.dx[i]));
        scale = std::max(scale, std::abs(c.dx[i]));
      }
      EXPECT_LE(err, 4 * u * scale) << "dx against the chain";
      const std::vector<double> AddNormRun::*fields[] = {&AddNormRun::s, &AddNormRun::y,
                                                          &AddNormRun::dx, &AddNormRun::dw,
                                                          &AddNormRun::db};
      for (auto field : fields) {
        EXPECT_EQ(f.*field, f2.*field) << "not bitwise repeatable";
        double e = 0, sc = 0;
        for (size_t i = 0; i < (cpu.*field).size(); ++i) {
          const double di = std::abs((f.*field)[i] - (cpu.*field)[i]);
          e = std::isfinite(di) ? std::max(e, di) : INFINITY;  // NaN: an element never written
          sc = std::max(sc, std::abs((cpu.*field)[i]));
        }
        const bool fp32_sum = field == &AddNormRun::dw || field == &AddNormRun::db;
        EXPECT_LE(e, (fp32_sum ? 1e-5 : dt == DType::f32 ? 1e-4 : 2e-2) * sc) << "against the CPU";
      }
    }
}

// OnlyTheParametersNeedGradients on the GPU, where the launcher refuses a residual gradient
// without a dx: weight and bias as the chain gives them (to rounding: the column sums are the
// same kernels, fed the same dy and s).
TEST(CudaAddLayerNorm, OnlyTheParametersNeedGradients) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Device gpu = cuda_device(0);
  manual_seed(13);
  Tensor x = randn({64, 768}).to(DType::bf16).to(gpu), r = randn({64, 768}).to(DType::bf16).to(gpu);
  Tensor ds = randn({64, 768}).to(DType::bf16).to(gpu), dy = randn({64, 768}).to(DType::bf16).to(gpu);
  auto grads = [&](bool fused) {
    Tensor w = rand({768}).to(gpu).detach(), b = randn({768}).to(gpu).detach();
    w.set_requires_grad();
    b.set_requires_grad();
    if (fused) {
      const std::vector<Tensor> out = add_layer_norm(x, r, w, b);
      backward({add(out[0], out[0]), out[1]}, {ds, dy});
    } else {
      layer_norm(add(x, r), w, b).backward(dy);
    }
    return std::vector<std::vector<double>>{w.grad().to_vector(), b.grad().to_vector()};
  };
  EXPECT_EQ(grads(true), grads(false));
}
