#include "parallel/communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>

namespace mt::parallel {

static void check_tensor(const Tensor& t, const char* call, int rank) {
  MT_CHECK(t.defined(), "rank ", rank, ": ", call, ": the tensor is undefined");
  MT_CHECK(t.is_contiguous() && (t.dtype() == DType::f32 || t.dtype() == DType::f64), "rank ",
           rank, ": ", call, ": needs a contiguous f32 or f64 tensor, got ", shape_str(t.shape()),
           " ", dtype_name(t.dtype()), t.is_contiguous() ? "" : " (strided)");
}

void Communicator::all_reduce_sum(const Tensor& t) {
  check_tensor(t, "all_reduce_sum", rank());
  ++all_reduce_calls_;
  do_all_reduce_sum(t);
}

// The chunked collectives: N equal chunks.
static void check_chunks(const Tensor& t, const char* call, int rank, int size) {
  check_tensor(t, call, rank);
  MT_CHECK(t.numel() % size == 0, "rank ", rank, ": ", call, ": ", t.numel(), " elements do not "
           "split into ", size, " equal chunks (pad the buffer to a multiple of the world size)");
}

void Communicator::reduce_scatter_sum(const Tensor& t) {
  check_chunks(t, "reduce_scatter_sum", rank(), size());
  ++reduce_scatter_calls_;
  do_reduce_scatter_sum(t);
}

void Communicator::all_gather(const Tensor& t) {
  check_chunks(t, "all_gather", rank(), size());
  ++all_gather_calls_;
  do_all_gather(t);
}

void Communicator::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast", rank());
  MT_CHECK(root >= 0 && root < size(), "rank ", rank(), ": broadcast: root ", root,
           " is not a rank of this group of ", size());
  do_broadcast(t, root);
}

// ---- the thread backend -------------------------------------------------------------------
//
// All ranks share one Group. A collective is one "generation": each rank deposits its tensor
// handle under the mutex; the last to arrive checks that every rank called the same collective
// with the same shape, computes the result straight into every rank's tensor (the others are
// blocked on the condition variable, so nothing else touches them), clears the deposits and
// bumps the generation. A waiter only needs to see the generation change: it reads nothing shared
// afterwards but the outcome, which no later collective can overwrite before it has arrived
// there itself. So a fast rank may run into the next collective at once, without a second phase.

namespace {

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce_sum";
    case Op::ReduceScatter: return "reduce_scatter_sum";
    case Op::AllGather: return "all_gather";
    case Op::Broadcast: return "broadcast";
    case Op::Barrier: return "barrier";
  }
  return "?";
}

struct Group {
  Group(int n, std::chrono::milliseconds t) : size(n), timeout(t), deposits(size_t(n)) {}

  struct Deposit {
    bool here = false;
    Op op = Op::Barrier;
    Tensor t;
    int root = 0;
  };

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;  // collectives completed so far
  int arrived = 0;
  std::vector<Deposit> deposits;
  std::string mismatch;  // why the last completed collective failed on every rank ('' if it did not)
  // Set once, by abort() or a timeout: the group is unusable from then on, and every collective
  // throws this reason instead of waiting for a rank that will not come.
  bool broken = false;
  std::string broken_why;
};

// Elements [begin, end) of every rank's tensor summed in rank order; the sum goes to every rank
// (all_reduce_sum), or only to rank `only` (reduce_scatter_sum: the others keep their values, so
// a caller that reads another chunk sees wrong numbers in the tests).
template <class T>
void sum_in_rank_order(const std::vector<Group::Deposit>& d, int64_t begin, int64_t end, int only) {
  std::vector<T*> p;
  for (const auto& dep : d) p.push_back(dep.t.template data<T>());
  for (int64_t i = begin; i < end; ++i) {
    T s = p[0][i];
    for (size_t r = 1; r < p.size(); ++r) s += p[r][i];
    if (only >= 0) p[size_t(only)][i] = s;
    else for (T* q : p) q[i] = s;  // all read before any write, so aliased tensors are fine too
  }
}

// The last rank to arrive runs this, holding the mutex. Returns why the collective is invalid,
// or '' after computing it.
std::string complete(Group& g, uint64_t number) {
  const auto& d = g.deposits;
  std::ostringstream why;
  why << "collective #" << number << ": ";
  for (const auto& dep : d)
    if (dep.op != d[0].op) {
      why << "the ranks called different collectives:";
      for (int r = 0; r < g.size; ++r) why << (r ? "," : "") << " rank " << r << " " << op_name(d[r].op);
      why << "; every rank must call the same collectives in the same order";
      return why.str();
    }
  why << op_name(d[0].op) << ": ";
  if (d[0].op == Op::Barrier) return "";
  for (const auto& dep : d)
    if (dep.t.shape() != d[0].t.shape() || dep.t.dtype() != d[0].t.dtype()) {
      why << "the ranks passed different tensors:";
      for (int r = 0; r < g.size; ++r)
        why << (r ? "," : "") << " rank " << r << " " << shape_str(d[r].t.shape()) << " "
            << dtype_name(d[r].t.dtype());
      why << "; every rank must pass the same shape and dtype";
      return why.str();
    }
  if (d[0].op == Op::Broadcast) {
    for (const auto& dep : d)
      if (dep.root != d[0].root) {
        why << "the ranks passed different roots:";
        for (int r = 0; r < g.size; ++r) why << (r ? "," : "") << " rank " << r << " root " << d[r].root;
        return why.str();
      }
    const Tensor& src = d[size_t(d[0].root)].t;
    for (const auto& dep : d)
      if (dep.t.data_ptr() != src.data_ptr()) std::memcpy(dep.t.data_ptr(), src.data_ptr(), src.nbytes());
  } else if (d[0].op == Op::AllGather) {
    const int64_t chunk = d[0].t.numel() / g.size;
    const size_t bytes = size_t(chunk) * dtype_size(d[0].t.dtype());
    for (int r = 0; r < g.size; ++r) {
      const char* src = static_cast<const char*>(d[size_t(r)].t.data_ptr()) + size_t(r) * bytes;
      for (const auto& dep : d)
        if (dep.t.data_ptr() != d[size_t(r)].t.data_ptr())
          std::memcpy(static_cast<char*>(dep.t.data_ptr()) + size_t(r) * bytes, src, bytes);
    }
  } else {
    auto sum = d[0].t.dtype() == DType::f64 ? sum_in_rank_order<double> : sum_in_rank_order<float>;
    const int64_t n = d[0].t.numel();
    if (d[0].op == Op::AllReduce) sum(d, 0, n, -1);
    else for (int r = 0; r < g.size; ++r) sum(d, r * (n / g.size), (r + 1) * (n / g.size), r);
  }
  for (const auto& dep : d) dep.t.bump_version();
  return "";
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

 protected:
  void do_all_reduce_sum(const Tensor& t) override { run(Op::AllReduce, t, 0); }
  void do_reduce_scatter_sum(const Tensor& t) override { run(Op::ReduceScatter, t, 0); }
  void do_all_gather(const Tensor& t) override { run(Op::AllGather, t, 0); }
  void do_broadcast(const Tensor& t, int root) override { run(Op::Broadcast, t, root); }
  void do_barrier() override { run(Op::Barrier, Tensor(), 0); }
  void do_wait() override {}  // every collective has finished when it returns
  void do_synchronize() override {}
  void do_abort(const std::string& why) override {
    std::lock_guard lock(g_->mu);
    if (!g_->broken) {
      g_->broken = true;
      g_->broken_why = "rank " + std::to_string(rank_) + " aborted the group: " + why;
    }
    g_->cv.notify_all();
  }

 private:
  void run(Op op, const Tensor& t, int root) {
    if (t.defined())
      MT_CHECK(t.device().is_cpu(), "rank ", rank_, ": ", op_name(op), ": the thread backend "
               "(make_local_group) works on CPU tensors only, got one on ", t.device().str());
    Group& g = *g_;
    std::unique_lock lock(g.mu);
    const uint64_t gen = g.generation, number = gen + 1;
    auto where = [&] {
      return "rank " + std::to_string(rank_) + ": " + op_name(op) + " (collective #" +
             std::to_string(number) + ")";
    };
    if (g.broken) throw DistError(where() + " failed: " + g.broken_why);
    g.deposits[size_t(rank_)] = {true, op, t, root};
    if (++g.arrived == g.size) {
      g.mismatch = complete(g, number);
      for (auto& d : g.deposits) d = {};
      g.arrived = 0;
      ++g.generation;
      g.cv.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + g.timeout;
      g.cv.wait_until(lock, deadline, [&] { return g.generation != gen || g.broken; });
      if (g.generation == gen) {
        if (g.broken) throw DistError(where() + " failed: " + g.broken_why);
        std::string missing;
        for (int r = 0; r < g.size; ++r)
          if (!g.deposits[size_t(r)].here) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        std::ostringstream msg;
        msg << where() << " timed out after " << g.timeout.count() << " ms waiting for rank(s) "
            << missing << " (a rank died or stopped calling collectives)";
        // Our tensor stays deposited, and a late rank would complete the collective with it:
        // break the group instead, so every rank fails with this reason.
        g.broken = true;
        g.broken_why = msg.str();
        g.cv.notify_all();
        throw DistError(msg.str());
      }
    }
    if (!g.mismatch.empty()) MT_THROW("rank ", rank_, ": ", g.mismatch);
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_local_group(int size,
                                                            std::chrono::milliseconds timeout) {
  MT_CHECK(size >= 1, "make_local_group: a group needs at least one rank, got size ", size);
  MT_CHECK(timeout.count() > 0, "make_local_group: the timeout must be positive, got ",
           timeout.count(), " ms");
  auto g = std::make_shared<Group>(size, timeout);
  std::vector<std::shared_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_shared<LocalCommunicator>(g, r));
  return ranks;
}

}  // namespace mt::parallel
