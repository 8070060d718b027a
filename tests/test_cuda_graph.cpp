// CUDA graphs (core/cuda/graph.h): a capture records without running, a replay repeats the work
// with what the device memory holds at that moment, and a host synchronization inside a capture
// is a clear error after which the stream still works. The whole captured training step is
// checked against eager steps in tests/test_trainer.cpp (CudaTrainerGraph). Skipped without a GPU;
// the CPU side of the split it relies on (AdamW's prepare_step/apply_step) is in test_optim.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "core/accumulate.h"
#include "core/tensor.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "tests/expect_error.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#endif

using namespace mt;
using mt::test::expect_error;

#ifdef MT_WITH_CUDA

TEST(CudaGraph, CaptureRecordsWithoutRunningAndReplayRepeats) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Device dev = cuda_device(0);
  const Tensor acc = zeros({1000}, DType::f32, dev);
  const Tensor x = full({1000}, 0.5, DType::f32, dev);
  // Allocated and freed inside the capture: the graph's own scratch, reused by every replay.
  cuda::Graph g = cuda::Graph::capture(0, [&] { add_into(acc, mul(x, full({1000}, 2.0, DType::f32, dev))); });
  EXPECT_GE(g.num_nodes(), 2u);
  // The scratch is carved from the graph's own block: the graph holds only the work, no
  // allocation or free nodes.
  EXPECT_NE(g.node_kinds().find("kernel "), std::string::npos) << g.node_kinds();
  EXPECT_EQ(g.node_kinds().find("mem "), std::string::npos) << g.node_kinds();
  EXPECT_EQ(acc.to_vector(), std::vector<double>(1000, 0.0));  // nothing ran
  g.replay();
  g.replay();
  EXPECT_EQ(acc.to_vector(), std::vector<double>(1000, 2.0));
  x.fill_(-1.0);  // a replay reads the device memory as it is when it runs
  g.replay();
  EXPECT_EQ(acc.to_vector(), std::vector<double>(1000, 0.0));
}

TEST(CudaGraph, HostSynchronizationInsideACaptureIsAClearErrorAndTheStreamStillWorks) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Tensor t = full({4}, 3.0, DType::f32, cuda_device(0));
  expect_error([&] { cuda::Graph::capture(0, [&] { (void)t.item(); }); },
               {"CUDA graph capture on cuda:0 failed"});
  // A tensor made inside the capture is freed while the failure unwinds: no crash, same error.
  expect_error([&] { cuda::Graph::capture(0, [&] { (void)add(t, t).item(); }); },
               {"CUDA graph capture on cuda:0 failed"});
  expect_error([&] { cuda::Graph::capture(0, [&] { MT_THROW("the body's own error"); }); },
               {"capture", "the body's own error"});
  EXPECT_EQ(add(t, t).to_vector(), std::vector<double>(4, 6.0));
}

// A Linear's dW and db need dy and x, not dx. In a capture of at most 512 rows linear.cu puts
// them on a side branch beside dx, so the graph's longest chain is shorter than its node count;
// past 512 rows everything stays on one stream, a chain. Either way a replay gives the eager bits.
// The 4096-wide case gives dx a long reduction (cuBLASLt's split-K, with its workspace, is
// likely), run while dW uses the side stream's own workspace. A capture that fails after a branch
// leaves the side stream usable: the next capture of the same step replays the eager bits.
TEST(CudaGraph, ASmallLinearBackwardRunsDwAndDbBesideDxWithTheEagerBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Device dev = cuda_device(0);
  struct Case { int64_t rows, in, out; };
  for (const Case c : {Case{128, 96, 80}, Case{600, 96, 80}, Case{256, 512, 4096}}) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::to_string(c.rows) + " rows, " + std::to_string(c.in) + " -> " +
                   std::to_string(c.out) + ", " + dtype_name(dt));
      Tensor x = randn({c.rows, c.in}, dt, dev);
      Tensor W = scale(randn({c.out, c.in}, DType::f32, dev), 0.1);
      Tensor b = randn({c.out}, DType::f32, dev);
      for (Tensor* t : {&x, &W, &b}) t->set_requires_grad();
      const Tensor r = randn({c.rows, c.out}, dt, dev);  // dy of the Linear: random, not ones
      auto step = [&] { sum(mul(linear(x, W, b), r)).backward(); };
      step();  // eager: builds the GEMM plans and allocates each .grad
      std::vector<std::vector<double>> eager;
      for (Tensor* t : {&x, &W, &b}) {
        eager.push_back(t->grad().to_vector());
        t->zero_grad(/*set_to_none=*/false);
      }
      expect_error([&] { cuda::Graph::capture(0, [&] { step(); (void)sum(b).item(); }); },
                   {"CUDA graph capture on cuda:0 failed"});
      cuda::Graph g = cuda::Graph::capture(0, step);
      if (c.rows <= 512)
        EXPECT_LT(g.longest_chain(), g.num_nodes()) << g.node_kinds();
      else
        EXPECT_EQ(g.longest_chain(), g.num_nodes()) << g.node_kinds();
      g.replay();
      const char* names[] = {"x.grad", "W.grad", "b.grad"};
      int i = 0;
      for (Tensor* t : {&x, &W, &b}) {
        EXPECT_EQ(t->grad().to_vector(), eager[size_t(i)]) << names[i];  // 0 + g is g, bitwise
        ++i;
      }
    }
  }
}

// An eager branch (SideBranch with `eager`, as the attention backward's dQ pass takes) forks
// outside a capture onto this thread's own stream, which starts after what the framework stream
// enqueued before the fork, and the framework stream's later work waits for it at join. A host
// function that sleeps and then writes a value makes each order visible: without the fork the
// side's copy would read the value before the framework stream's host function writes it,
// without the join the framework stream's copy would run while the side's host function still
// sleeps. Without `eager`, or with the framework stream captured by someone else, the branch
// stays on the framework stream.
TEST(CudaGraph, AnEagerBranchRunsAfterTheForkAndBeforeWhatFollowsTheJoin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  cuda::set_device(0);
  const cudaStream_t main = cuda::stream(0);
  int* host = nullptr;  // [0]: written by a host function, [1]: read back through the device
  int* dev = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, 2 * sizeof(int)), cudaSuccess);
  const std::unique_ptr<int, cudaError_t (*)(void*)> free_host(host, cudaFreeHost);
  ASSERT_EQ(cudaMalloc(&dev, sizeof(int)), cudaSuccess);
  const std::unique_ptr<int, cudaError_t (*)(void*)> free_dev(dev, cudaFree);
  host[0] = 0;
  auto sleep_then_write = [](void* p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *static_cast<int*>(p) += 1;
  };
  // One branch, with the sleeping write on the framework stream before the fork, or on the side
  // stream inside the branch.
  auto branch_once = [&](bool sleep_before, bool sleep_inside) {
    host[1] = -1;
    if (sleep_before) ASSERT_EQ(cudaLaunchHostFunc(main, sleep_then_write, host), cudaSuccess);
    cuda::SideBranch branch(main, /*wanted=*/true, /*eager=*/true);
    ASSERT_NE(branch.stream(), main);
    if (sleep_inside)
      ASSERT_EQ(cudaLaunchHostFunc(branch.stream(), sleep_then_write, host), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dev, host, sizeof(int), cudaMemcpyHostToDevice, branch.stream()),
              cudaSuccess);
    branch.join();
    EXPECT_EQ(branch.stream(), main);
    ASSERT_EQ(cudaMemcpyAsync(host + 1, dev, sizeof(int), cudaMemcpyDeviceToHost, main),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(main), cudaSuccess);
  };
  branch_once(/*sleep_before=*/true, /*sleep_inside=*/false);
  EXPECT_EQ(host[1], 1) << "the side stream's copy ran before the fork";
  branch_once(/*sleep_before=*/false, /*sleep_inside=*/true);
  EXPECT_EQ(host[1], 2) << "the framework stream's copy ran before the join";
  {
    cuda::SideBranch branch(main, /*wanted=*/true);
    EXPECT_EQ(branch.stream(), main) << "an eager branch without `eager`";
  }
  ASSERT_EQ(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStream_t side = nullptr;
  {
    cuda::SideBranch branch(main, /*wanted=*/true, /*eager=*/true);
    side = branch.stream();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(main, &graph), cudaSuccess);  // before any assertion can leave
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(side, main) << "a branch inside a capture that is not Graph::capture";
}

// cross_entropy's bad-target check leaves the op capturable: a replay whose targets went bad
// reports it at the next read.
TEST(CudaGraph, CrossEntropyBadTargetDuringAReplayIsReportedAtTheNextRead) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Device dev = cuda_device(0);
  const Tensor logits = full({3, 5}, 0.5, DType::f32, dev);
  const Tensor targets = from_vector(std::vector<int64_t>{0, 4, 2}, {3}).to(dev);
  EXPECT_NEAR(cross_entropy(logits, targets, -100, 3.0).item(), std::log(5.0), 1e-6);  // eager first
  const Tensor loss = zeros({}, DType::f32, dev);  // outlives the replays: made before the capture
  cuda::Graph g = cuda::Graph::capture(0, [&] { loss.copy_(cross_entropy(logits, targets, -100, 3.0)); });
  targets.copy_(from_vector(std::vector<int64_t>{0, 5, -100}, {3}));
  g.replay();
  expect_error([&] { (void)loss.item(); }, {"cross_entropy: row 1 has target 5", "C = 5"});
  targets.copy_(from_vector(std::vector<int64_t>{1, 3, -100}, {3}));
  g.replay();
  EXPECT_NEAR(loss.item(), std::log(5.0) * 2 / 3, 1e-6);
}

#endif
