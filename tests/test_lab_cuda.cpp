// The kernel lab on the GPU: every numbered version of the scaled-SiLU and RMSNorm backward, and
// the hand-written GEMMs of the linear layer, against the CPU references of lab/check.h (and the
// GEMMs against cuBLAS too), on awkward sizes, with dx poisoned (NaN) first and dw / dweight / dW
// holding an earlier gradient (the '+=' contract). Skips without a GPU.
#ifdef MT_WITH_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "lab/attention/attention.h"
#include "lab/check.h"
#include "lab/lab.h"
#include "lab/matmul/gemm.h"

using namespace mt;
using namespace mt::lab;

namespace {

#define MT_REQUIRE_CUDA() \
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped"

// A device buffer of n elements of 2 (bf16) or 4 (fp32) bytes.
class Buffer {
 public:
  Buffer(size_t n, size_t elem) : n_(n), elem_(elem), p_(cuda::alloc(std::max<size_t>(n, 1) * elem, 0)) {}
  ~Buffer() {
    if (p_ != nullptr) cuda::free(p_, 0);
  }
  Buffer(Buffer&& o) noexcept : n_(o.n_), elem_(o.elem_), p_(o.p_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&&) = delete;
  static Buffer bf16(const std::vector<float>& v) {
    Buffer b(v.size(), 2);
    std::vector<mt::bf16> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
    cuda::copy_h2d(b.p_, h.data(), v.size() * 2, 0);
    return b;
  }
  static Buffer fp32(const std::vector<float>& v) {
    Buffer b(v.size(), 4);
    cuda::copy_h2d(b.p_, v.data(), v.size() * 4, 0);
    return b;
  }
  static Buffer poisoned(size_t n, size_t elem) {  // every byte 0xff: NaN in bf16 and fp32
    Buffer b(n, elem);
    std::vector<unsigned char> h(n * elem, 0xff);
    cuda::copy_h2d(b.p_, h.data(), h.size(), 0);
    return b;
  }
  std::vector<float> values() const {
    cuda::synchronize(0);
    std::vector<float> out(n_);
    if (elem_ == 4) {
      cuda::copy_d2h_sync(out.data(), p_, n_ * 4, 0);
    } else {
      std::vector<mt::bf16> h(n_);
      cuda::copy_d2h_sync(h.data(), p_, n_ * 2, 0);
      for (size_t i = 0; i < n_; ++i) out[i] = bf16_to_float(h[i]);
    }
    return out;
  }
  void* get() const { return p_; }
  float* f() const { return static_cast<float*>(p_); }

 private:
  size_t n_, elem_;
  void* p_;
};

cudaStream_t stream() { return cuda::stream(0); }

}  // namespace

TEST(CudaLab, EveryScaledSiluVersionMatchesTheCpuReference) {
  MT_REQUIRE_CUDA();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(4104), int64_t(1) << 20}) {
    const auto x = random_bf16_values(n, 1, -6, 6), dy = random_bf16_values(n, 2, -1, 1);
    const float w = 0.875f, dw0 = 0.75f;  // dw already holds an earlier gradient
    const SiluGrads ref = silu_backward_reference(x, w, dy);
    Buffer xd = Buffer::bf16(x), dyd = Buffer::bf16(dy), wd = Buffer::fp32({w});
    for (const auto& v : silu_versions()) {
      const std::string what = std::string(v.name) + " n=" + std::to_string(n);
      Buffer dx = Buffer::poisoned(size_t(n), 2), dw = Buffer::fp32({dw0});
      auto run = [&] { v.fn(xd.get(), wd.f(), dyd.get(), dx.get(), dw.f(), n, stream()); };
      if (v.needs_pack_aligned && n % kPack != 0) {
        EXPECT_THROW(run(), mt::Error) << what;
        continue;
      }
      run();
      const Check cdx = compare(dx.values(), ref.dx, {}, kBf16Out, what + " dx");
      EXPECT_TRUE(cdx.ok) << cdx.message;
      const Check cdw = compare(dw.values(), {dw0 + ref.dw}, {dw0 + ref.dw_scale}, kFp32Out, what + " dw");
      EXPECT_TRUE(cdw.ok) << cdw.message;
    }
  }
}

TEST(CudaLab, EveryRmsNormVersionMatchesTheCpuReference) {
  MT_REQUIRE_CUDA();
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 100}, {17, 1000}, {130, 768},
                                                {64, 4096}, {9, kRmsSharedMaxD}};
  for (auto [rows, d] : shapes) {
    const auto x = random_bf16_values(rows * d, 3, -3, 3), dy = random_bf16_values(rows * d, 4, -1, 1);
    const auto weight = random_bf16_values(d, 5, 0.5f, 1.5f), dw0 = random_bf16_values(d, 6, -1, 1);
    const auto rstd = rms_rstd_reference(x, rows, d, 1e-5f);
    const RmsGrads ref = rms_backward_reference(x, weight, rstd, dy, rows, d);
    std::vector<double> want_dw(static_cast<size_t>(d)), scale_dw(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      want_dw[j] = dw0[j] + ref.dweight[j];
      scale_dw[j] = std::abs(dw0[j]) + ref.dweight_scale[j];
    }
    Buffer xd = Buffer::bf16(x), dyd = Buffer::bf16(dy), wd = Buffer::fp32(weight),
           rd = Buffer::fp32(rstd);
    for (const auto& v : rms_versions()) {
      const std::string what =
          std::string(v.name) + " [" + std::to_string(rows) + ", " + std::to_string(d) + "]";
      Buffer dx = Buffer::poisoned(size_t(rows * d), 2), dw = Buffer::fp32(dw0);
      auto run = [&] {
        v.fn(xd.get(), wd.f(), rd.f(), dyd.get(), dx.get(), dw.f(), rows, d, stream());
      };
      if (v.needs_pack_aligned && d % kPack != 0) {
        EXPECT_THROW(run(), mt::Error) << what;
        continue;
      }
      run();
      const Check cdx = compare(dx.values(), ref.dx, ref.dx_scale, kBf16Out, what + " dx");
      EXPECT_TRUE(cdx.ok) << cdx.message;
      const Check cdw = compare(dw.values(), want_dw, scale_dw, kFp32Out, what + " dweight");
      EXPECT_TRUE(cdw.ok) << cdw.message;
    }
  }
}

// Every attention version, forward and backward, against the f64 reference, with o, L, dq, dk, dv
// poisoned first; each backward without float atomics, run twice, must give the same bits.
TEST(CudaLab, EveryAttentionVersionMatchesTheCpuReference) {
  MT_REQUIRE_CUDA();
  struct Case { int64_t heads, T, d; float range; };
  // T = 1 (one key), T not a multiple of any tile, and |S| up to about 30 (inputs within ±5).
  const Case cases[] = {{3, 1, 64, 1}, {2, 7, 32, 1}, {2, 100, 64, 1}, {1, 257, 128, 1},
                        {2, 70, 64, 5}};
  for (const Case& c : cases) {
    const int64_t n = c.heads * c.T * c.d, rows = c.heads * c.T;
    const AttnShape shape{c.heads, c.T, c.d};
    const auto q = random_bf16_values(n, 21, -c.range, c.range), k = random_bf16_values(n, 22, -c.range, c.range),
               v = random_bf16_values(n, 23, -1, 1), dO = random_bf16_values(n, 24, -1, 1);
    const AttnForward ref = attention_forward_reference(q, k, v, c.heads, c.T, c.d);
    std::vector<float> saved_o(ref.o.begin(), ref.o.end()), saved_L(ref.L.begin(), ref.L.end());
    for (float& x : saved_o) x = bf16_to_float(float_to_bf16(x));  // as a kernel saves it
    const AttnGrads grads = attention_backward_reference(q, k, v, saved_o, ref.L, dO, c.heads, c.T, c.d);
    Buffer qd = Buffer::bf16(q), kd = Buffer::bf16(k), vd = Buffer::bf16(v), gd = Buffer::bf16(dO),
           od_saved = Buffer::bf16(saved_o), Ld_saved = Buffer::fp32(saved_L);
    Buffer P = Buffer::poisoned(size_t(c.heads * c.T * c.T), 4);
    Buffer work = Buffer::poisoned(size_t(c.heads * c.T * (c.T + 1)), 4);
    const std::string at = " [" + std::to_string(c.heads) + ", " + std::to_string(c.T) + ", " +
                           std::to_string(c.d) + "]";
    for (const auto& ver : attention_forward_versions()) {
      Buffer o = Buffer::poisoned(size_t(n), 2), L = Buffer::poisoned(size_t(rows), 4);
      ver.fn(qd.get(), kd.get(), vd.get(), o.get(), L.f(), ver.uses_P ? P.f() : nullptr, shape, stream());
      const Check co = compare(o.values(), ref.o, ref.o_scale, kAttnTol, std::string(ver.name) + at + " o");
      EXPECT_TRUE(co.ok) << co.message;
      const Check cl = compare(L.values(), ref.L, {}, Tolerance{1e-5, 1e-4}, std::string(ver.name) + at + " L");
      EXPECT_TRUE(cl.ok) << cl.message;
    }
    // P for the version that reads it: v1's forward wrote it last in the loop above if it ran;
    // run it again so the buffer is the forward's whatever the order of the list.
    {
      Buffer o = Buffer::poisoned(size_t(n), 2), L = Buffer::poisoned(size_t(rows), 4);
      attn_v1::forward(qd.get(), kd.get(), vd.get(), o.get(), L.f(), P.f(), shape, stream());
    }
    for (const auto& ver : attention_backward_versions()) {
      std::vector<float> first[3];
      for (int run = 0; run < 2; ++run) {
        Buffer dq = Buffer::poisoned(size_t(n), 2), dk = Buffer::poisoned(size_t(n), 2),
               dv = Buffer::poisoned(size_t(n), 2);
        ver.fn(qd.get(), kd.get(), vd.get(), od_saved.get(), Ld_saved.f(), ver.uses_P ? P.f() : nullptr,
               gd.get(), dq.get(), dk.get(), dv.get(), work.f(), shape, stream());
        const std::vector<float> got[3] = {dq.values(), dk.values(), dv.values()};
        if (run == 1) {
          for (int t = 0; t < 3 && !ver.atomic; ++t)
            EXPECT_EQ(0, std::memcmp(got[t].data(), first[t].data(), got[t].size() * sizeof(float)))
                << ver.name << at << ": two runs differ (" << "qkv"[t] << ")";
          break;
        }
        const Check cq = compare(got[0], grads.dq, grads.dq_scale, kAttnTol, std::string(ver.name) + at + " dq");
        const Check ck = compare(got[1], grads.dk, grads.dk_scale, kAttnTol, std::string(ver.name) + at + " dk");
        const Check cv = compare(got[2], grads.dv, grads.dv_scale, kAttnTol, std::string(ver.name) + at + " dv");
        EXPECT_TRUE(cq.ok) << cq.message;
        EXPECT_TRUE(ck.ok) << ck.message;
        EXPECT_TRUE(cv.ok) << cv.message;
        for (int t = 0; t < 3; ++t) first[t] = got[t];
      }
    }
  }
}

TEST(CudaLab, RmsNormSharedMemoryVersionsRefuseLongRows) {
  MT_REQUIRE_CUDA();
  const int64_t d = kRmsSharedMaxD + 8;
  Buffer x(size_t(d), 2), w(size_t(d), 4), r(1, 4), dx(size_t(d), 2), dw(size_t(d), 4);
  for (int i = 1; i <= 3; ++i)
    EXPECT_THROW(rms_versions()[i].fn(x.get(), w.f(), r.f(), x.get(), dx.get(), dw.f(), 1, d, stream()),
                 mt::Error)
        << rms_versions()[i].name;
}

// The linear layer's three GEMMs: forward and dX into bf16 ('='), dW into fp32 with beta = 1
// ('+=' onto an earlier gradient). Sizes off every tile multiple; out = 10 makes dY's rows 20
// bytes, so the tensor-core kernel's unaligned copies run too.
TEST(CudaLab, MatmulBackwardByHandMatchesCpuAndCublas) {
  MT_REQUIRE_CUDA();
  struct Layer { int64_t rows, in, out; };
  for (Layer l : {Layer{130, 72, 200}, Layer{64, 784, 10}, Layer{257, 136, 384}}) {
    const auto x = random_bf16_values(l.rows * l.in, 7, -1, 1), W = random_bf16_values(l.out * l.in, 8, -1, 1);
    const auto dy = random_bf16_values(l.rows * l.out, 9, -1, 1);
    const auto dw0 = random_bf16_values(l.out * l.in, 10, -1, 1);
    Buffer xd = Buffer::bf16(x), Wd = Buffer::bf16(W), dyd = Buffer::bf16(dy);
    for (GemmKind kind : {GemmKind::Forward, GemmKind::DX, GemmKind::DW}) {
      const GemmShape sh = linear_gemm(kind, l.rows, l.in, l.out);
      const bool dw = kind == GemmKind::DW;
      const Buffer& a = kind == GemmKind::Forward ? xd : dyd;
      const Buffer& b = dw ? xd : Wd;
      const GemmResult ref = gemm_reference(sh, kind == GemmKind::Forward ? x : dy, dw ? x : W,
                                            dw ? dw0 : std::vector<float>{}, dw ? 1.f : 0.f);
      const Tolerance tol = dw ? kFp32Out : kBf16Out;
      auto run = [&](const std::function<void(const GemmArgs&, cudaStream_t)>& gemm) {
        Buffer c = dw ? Buffer::fp32(dw0) : Buffer::poisoned(size_t(sh.M * sh.N), 2);
        gemm(GemmArgs{sh, a.get(), b.get(), c.get(), dw, dw ? 1.f : 0.f}, stream());
        return c.values();
      };
      const std::string what = std::string(gemm_kind_name(kind)) + " " + sh.str();
      const auto cublas = run(gemm_cublas);
      const Check cb = compare(cublas, ref.c, ref.scale, tol, what + " cuBLAS vs CPU");
      EXPECT_TRUE(cb.ok) << cb.message;
      const std::vector<double> cublas_d(cublas.begin(), cublas.end());
      for (auto [name, gemm] : {std::pair{"tiled", &gemm_tiled}, std::pair{"tensor core", &gemm_tensor_core}}) {
        const auto got = run(gemm);
        const Check cpu = compare(got, ref.c, ref.scale, tol, what + " " + name + " vs CPU");
        EXPECT_TRUE(cpu.ok) << cpu.message;
        // Against cuBLAS both results are rounded: allow the two roundings.
        const Check cub = compare(got, cublas_d, ref.scale, {2 * tol.rel, 2 * tol.acc}, what + " " + name + " vs cuBLAS");
        EXPECT_TRUE(cub.ok) << cub.message;
      }
    }
  }
}

TEST(CudaLab, GemmBadArgumentsAreClearErrors) {
  MT_REQUIRE_CUDA();
  Buffer a(64, 2), b(64, 2), c(64, 2);
  const GemmShape sh{8, 8, 8, false, true};
  for (auto gemm : {&gemm_tiled, &gemm_tensor_core, &gemm_cublas}) {
    EXPECT_THROW(gemm(GemmArgs{sh, a.get(), b.get(), c.get(), false, 1.f}, stream()), mt::Error);
    EXPECT_THROW(gemm(GemmArgs{{0, 8, 8, false, true}, a.get(), b.get(), c.get()}, stream()), mt::Error);
    EXPECT_THROW(gemm(GemmArgs{sh, nullptr, b.get(), c.get()}, stream()), mt::Error);
  }
  for (auto gemm : {&gemm_tensor_core, &gemm_cublas})
    EXPECT_THROW(gemm(GemmArgs{{8, 8, 8, true, true}, a.get(), b.get(), c.get()}, stream()), mt::Error);
}

#endif  // MT_WITH_CUDA
