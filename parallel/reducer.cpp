#include "parallel/reducer.h"

#include <sstream>
#include <unordered_map>

#include "core/autograd.h"

namespace mt::parallel {

// Everything the hooks touch. Hooks are registered once and cannot be removed, so they hold a
// weak_ptr to this: once the reducer is gone they find nothing and do nothing.
struct GradReducer::State {
  std::vector<Tensor> params;
  std::shared_ptr<Communicator> comm;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  bool overlap = true;            // all-reduce buckets during the backward, or all in finish()
  bool shard = false;             // reduce-scatter instead (ZeRO-1)
  std::vector<Tensor> views;      // per parameter: its .grad, a slice of its bucket's buffer

  // Between prepare_for_last_backward() and finish().
  bool armed = false;
  std::vector<bool> ready;      // per parameter: its gradient for this step is final
  std::vector<size_t> pending;  // per bucket: parameters not ready yet
  size_t next = 0;              // the next bucket to all-reduce

  // Makes parameter i's .grad its view again, keeping the value it had.
  void attach(size_t i) {
    Tensor& p = params[i];
    const Tensor& v = views[i];
    const Tensor g = p.grad();
    if (g.is_same(v)) return;
    if (g.defined()) v.copy_(g);
    else v.fill_(0.0);
    p.set_grad(v);
  }

  void on_grad_ready(size_t i) {
    if (!armed) return;  // an earlier microbatch: accumulate locally only
    MT_CHECK(!ready[i], "GradReducer: parameter ", i, " (shape ", shape_str(params[i].shape()),
             ") received a second gradient after prepare_for_last_backward(); only the last "
             "microbatch's backward may run between prepare_for_last_backward() and finish()");
    ready[i] = true;
    --pending[bucket_of[i]];
    // Strictly in index order, so every rank issues the same sequence of collectives.
    while (overlap && next < buckets.size() && pending[next] == 0) reduce(buckets[next++]);
  }

  void reduce(const Bucket& b) {
    if (shard) comm->reduce_scatter_sum(b.buffer);
    else comm->all_reduce_sum(b.buffer);
  }
};

GradReducer::GradReducer(std::vector<Tensor> params, std::shared_ptr<Communicator> comm,
                         size_t bucket_bytes, bool shard)
    : state_(std::make_shared<State>()) {
  MT_CHECK(!params.empty(), "GradReducer: no parameters to reduce");
  MT_CHECK(comm != nullptr, "GradReducer: no communicator");
  MT_CHECK(bucket_bytes > 0, "GradReducer: bucket_bytes must be positive");
  std::unordered_map<const TensorImpl*, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    MT_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "GradReducer: parameter ", i,
             p.defined() ? " (shape " + shape_str(p.shape()) + ")" : std::string(),
             " is not a leaf that requires grad");
    MT_CHECK(p.device() == params[0].device() &&
                 grad_dtype_for(p.dtype()) == grad_dtype_for(params[0].dtype()),
             "GradReducer: parameter ", i, " is on ", p.device().str(), " with ",
             dtype_name(grad_dtype_for(p.dtype())), " gradients, but parameter 0 is on ",
             params[0].device().str(), " with ", dtype_name(grad_dtype_for(params[0].dtype())),
             " gradients; all parameters must share one device and gradient dtype");
    auto [it, fresh] = seen.emplace(p.impl_ptr().get(), i);
    MT_CHECK(fresh, "GradReducer: parameter ", i, " is the same tensor as parameter ", it->second);
  }

  State& s = *state_;
  s.params = std::move(params);
  s.comm = std::move(comm);
  s.shard = shard;
  const int64_t align = shard ? 16 * s.comm->size() : 16;  // the whole buffer, into equal chunks
  const DType gd = grad_dtype_for(s.params[0].dtype());
  const Device dev = s.params[0].device();
  const size_t esize = dtype_size(gd);
  auto pad = [](int64_t n) { return (n + 15) / 16 * 16; };

  // Reverse order: the last layers' gradients are ready first.
  Bucket cur;
  for (size_t i = s.params.size(); i-- > 0;) {
    const int64_t n = s.params[i].numel();
    int64_t offset = pad(cur.numel);
    if (!cur.params.empty() && size_t(offset + n) * esize > bucket_bytes) {
      s.buckets.push_back(std::move(cur));
      cur = Bucket();
      offset = 0;
    }
    cur.params.push_back(i);
    cur.offsets.push_back(offset);
    cur.numel = offset + n;
  }
  s.buckets.push_back(std::move(cur));

  s.bucket_of.resize(s.params.size());
  s.views.resize(s.params.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    Bucket& bucket = s.buckets[b];
    bucket.numel = (bucket.numel + align - 1) / align * align;
    bucket.buffer = zeros({bucket.numel}, gd, dev);
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t i = bucket.params[j];
      const int64_t off = bucket.offsets[j];
      s.bucket_of[i] = b;
      s.views[i] = bucket.buffer.slice_rows(off, off + s.params[i].numel()).view(s.params[i].shape());
      s.attach(i);  // a .grad that already holds values keeps them
    }
  }

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i)
    s.params[i].register_grad_ready_hook([weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_grad_ready(i);
    });
}

GradReducer::~GradReducer() = default;

void GradReducer::prepare_for_last_backward() {
  State& s = *state_;
  MT_CHECK(!s.armed, "GradReducer::prepare_for_last_backward: called again before finish(); call "
           "it once per optimizer step, just before the last microbatch's backward");
  const Tensor& buffer = s.buckets[0].buffer;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Tensor& p = s.params[i];
    MT_CHECK(p.device() == buffer.device() && grad_dtype_for(p.dtype()) == buffer.dtype(),
             "GradReducer: parameter ", i, " is now on ", p.device().str(), " with ",
             dtype_name(grad_dtype_for(p.dtype())), " gradients, but its buckets were built on ",
             buffer.device().str(), " for ", dtype_name(buffer.dtype()), "; build the reducer "
             "after moving the model (Module::to)");
    s.attach(i);
  }
  s.ready.assign(s.params.size(), false);
  s.pending.clear();
  for (const Bucket& b : s.buckets) s.pending.push_back(b.params.size());
  s.next = 0;
  s.armed = true;
}

void GradReducer::finish() {
  State& s = *state_;
  MT_CHECK(s.armed, "GradReducer::finish: prepare_for_last_backward() was not called for this "
           "step; call it just before the last microbatch's backward");
  for (size_t i = 0; i < s.params.size(); ++i)
    MT_CHECK(s.params[i].grad().is_same(s.views[i]), "GradReducer::finish: parameter ", i,
             "'s .grad (shape ", shape_str(s.params[i].shape()), ") was replaced during the last "
             "backward, so the all-reduce would miss it; leave .grad alone between "
             "prepare_for_last_backward() and finish()");
  // Buckets whose parameters got no gradient this step (unused layers) still hold this rank's
  // share of the step, possibly zeros, and every rank must reduce them to stay in step.
  while (s.next < s.buckets.size()) s.reduce(s.buckets[s.next++]);
  s.comm->wait();
  s.armed = false;
}

void GradReducer::set_overlap(bool overlap) {
  MT_CHECK(!state_->armed, "GradReducer::set_overlap: not between prepare_for_last_backward() and finish()");
  state_->overlap = overlap;
}

bool GradReducer::sharded() const { return state_->shard; }

const std::vector<Tensor>& GradReducer::params() const { return state_->params; }

int GradReducer::num_buckets() const { return int(state_->buckets.size()); }

const std::vector<GradReducer::Bucket>& GradReducer::buckets() const { return state_->buckets; }

std::string GradReducer::layout_str() const {
  std::ostringstream os;
  for (size_t b = 0; b < state_->buckets.size(); ++b) {
    const Bucket& bucket = state_->buckets[b];
    os << "bucket " << b << ": " << bucket.numel << " elements ("
       << bucket.buffer.nbytes() << " bytes), parameters";
    for (size_t i : bucket.params) os << " " << i;
    os << "\n";
  }
  return os.str();
}

}  // namespace mt::parallel
