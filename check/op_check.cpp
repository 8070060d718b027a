// The op check (check/op_check.h): each check is a function that adds one line to the report.
// A check that throws reports the exception as its failure, so one broken property never hides
// the others.
#include "check/op_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/switches.h"
#include "ops/elementwise/elementwise.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#endif

namespace mt::check {

// ---- public helpers -------------------------------------------------------------------------

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {1e-5, 1e-4};
    case DType::f16: return {2e-3, 5e-3};
    default: return {1e-2, 3e-2};  // bf16: 8 bits of mantissa, and gradients round twice
  }
}

Tensor normal(Generator& g, const Shape& shape, double stddev) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (double& x : v) x = stddev * g.normal();
  return from_vector(v, shape, DType::f64);
}

Tensor uniform(Generator& g, const Shape& shape, double lo, double hi) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (double& x : v) x = lo + (hi - lo) * g.uniform();
  return from_vector(v, shape, DType::f64);
}

Tensor labels(Generator& g, int64_t n, int64_t classes) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = int64_t(g.below(uint64_t(classes)));
  return from_vector(v, {n}, DType::i64);
}

bool Report::ok() const { return count(Line::Fail) == 0; }

int Report::count(Line::Status s) const {
  return int(std::count_if(lines.begin(), lines.end(), [&](const Line& l) { return l.status == s; }));
}

const Line* Report::find(const std::string& check) const {
  for (const Line& l : lines)
    if (l.check == check) return &l;
  return nullptr;
}

std::string Report::str() const {
  std::ostringstream os;
  os << "op_check " << op << ": " << count(Line::Pass) << " passed, " << count(Line::Fail)
     << " failed, " << count(Line::Skip) << " skipped\n";
  for (const Line& l : lines) {
    const char* tag = l.status == Line::Pass ? "PASS" : l.status == Line::Fail ? "FAIL" : "SKIP";
    char head[64];
    std::snprintf(head, sizeof head, "  %s %-24s ", tag, l.check.c_str());
    os << head << l.detail << "\n";
  }
  return os.str();
}

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

// ---- running the op ------------------------------------------------------------------------

// One forward and backward: the outputs (as the op returned them) and, per input, its .grad.
struct Run {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;
};

enum class Path {
  Leaf,     // the inputs are leaves: a backward may add into their .grad through the grad sink
  NonLeaf,  // the inputs are outputs of scale(leaf, 1): the backward must return its gradients
};

class Runner {
 public:
  explicit Runner(const OpSpec& spec) : spec_(spec) {}

  // The made inputs cast as the spec says for `dtype` and placed on `device`: fresh tensors,
  // leaves needing grad where differentiable.
  std::vector<Tensor> prepare(const std::vector<Tensor>& made, DType dtype, Device device) const {
    MT_CHECK(made.size() == spec_.inputs.size(), spec_.name, ": make() returned ", made.size(),
             " tensors for ", spec_.inputs.size(), " inputs");
    std::vector<Tensor> in;
    for (size_t i = 0; i < made.size(); ++i) {
      const Input& spec_in = spec_.inputs[i];
      DType dt = made[i].dtype();
      if (spec_in.cast == Cast::Compute) dt = dtype;
      if (spec_in.cast == Cast::Grad) dt = grad_dtype_for(dtype);
      Tensor t = made[i].to(dt).to(device);
      if (t.is_same(made[i])) t = t.clone();
      if (spec_in.differentiable) t.set_requires_grad();
      in.push_back(t);
    }
    return in;
  }

  // The f64 CPU inputs a reference run for `dtype` uses: the same values the device run sees.
  std::vector<Tensor> rounded(const std::vector<Tensor>& made, DType dtype) const {
    std::vector<Tensor> in = prepare(made, dtype, kCPU);
    for (size_t i = 0; i < in.size(); ++i) {
      if (!is_floating(in[i].dtype())) continue;
      in[i] = in[i].detach().to(DType::f64).clone();
      if (spec_.inputs[i].differentiable) in[i].set_requires_grad();
    }
    return in;
  }

  std::vector<Tensor> call(const std::vector<Tensor>& in, Path path) const {
    std::vector<Tensor> args = in;
    if (path == Path::NonLeaf)
      for (size_t i = 0; i < args.size(); ++i)
        if (spec_.inputs[i].differentiable) args[i] = scale(args[i], 1.0);
    std::vector<Tensor> out = spec_.op(args);
    MT_CHECK(!out.empty(), spec_.name, ": the op returned no output");
    return out;
  }

  // A random upstream gradient for each output that needs one, in that output's dtype and place.
  std::vector<Tensor> upstream(Generator& g, const std::vector<Tensor>& outs) const {
    std::vector<Tensor> r;
    for (const Tensor& o : outs)
      r.push_back(o.requires_grad() ? normal(g, o.shape()).to(o.dtype()).to(o.device()) : Tensor());
    return r;
  }

  static void backward_from(const std::vector<Tensor>& outs, const std::vector<Tensor>& up) {
    std::vector<Tensor> roots, grads;
    for (size_t k = 0; k < outs.size(); ++k)
      if (up[k].defined()) {
        roots.push_back(outs[k]);
        grads.push_back(up[k]);
      }
    MT_CHECK(!roots.empty(), "no output requires grad: the op recorded no graph node");
    mt::backward(roots, grads);
  }

  // Forward and backward on `in` with upstream `up` (made on first use when empty).
  Run run(const std::vector<Tensor>& in, std::vector<Tensor>& up, Generator& g,
          Path path = Path::Leaf) const {
    Run r;
    std::vector<Tensor> outs = call(in, path);
    if (up.empty()) up = upstream(g, outs);
    backward_from(outs, up);
    for (const Tensor& o : outs) r.outputs.push_back(o.detach());
    for (const Tensor& t : in) r.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
    return r;
  }

  const OpSpec& spec() const { return spec_; }

 private:
  const OpSpec& spec_;
};

// ---- comparisons ---------------------------------------------------------------------------

std::vector<double> values(const Tensor& t) { return t.to(kCPU).to_vector(); }

// max|x - ref| / max|ref|; infinity where x is NaN and ref is not (an element a kernel never
// wrote still holds the poison).
double normwise(const Tensor& x, const Tensor& ref) {
  MT_CHECK(x.shape() == ref.shape(), "shape ", shape_str(x.shape()), " where the reference has ",
           shape_str(ref.shape()));
  const std::vector<double> a = values(x), b = values(ref);
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && !std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? err / scale : err;
}

// Same dtype, shape and bits (the f64 image of every dtype here is exact and one-to-one).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const std::vector<double> x = values(a), y = values(b);
  return x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

std::string output_name(size_t k) { return "output " + std::to_string(k); }

// The first output or gradient whose bits differ between two runs, or "".
std::string first_difference(const OpSpec& spec, const Run& a, const Run& b) {
  for (size_t k = 0; k < a.outputs.size(); ++k)
    if (!same_bits(a.outputs[k], b.outputs[k])) return output_name(k);
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (!same_bits(a.grads[i], b.grads[i])) return spec.inputs[i].name + ".grad";
  return "";
}

Tensor copy_on(const Tensor& t) { return t.detach().clone(); }

Run snapshot(const Run& r) {
  Run s;
  for (const Tensor& o : r.outputs) s.outputs.push_back(copy_on(o));
  for (const Tensor& g : r.grads) s.grads.push_back(g.defined() ? copy_on(g) : Tensor());
  return s;
}

// A copy of t whose elements sit `gap` elements apart in a larger buffer (every stride doubled
// when gap = 2), or at `offset` elements into it: legal layouts an op must handle. Built on the
// CPU and moved whole, gaps included.
Tensor relaid(const Tensor& t, int64_t gap, int64_t offset) {
  const Shape& shape = t.shape();
  const int64_t n = t.numel();
  Tensor host = zeros({std::max<int64_t>(1, n * gap + offset)}, t.dtype(), kCPU);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = host.impl().storage;
  impl->shape = shape;
  impl->strides.assign(shape.size(), 0);
  int64_t stride = gap;
  for (size_t d = shape.size(); d-- > 0;) {
    impl->strides[d] = stride;
    stride *= std::max<int64_t>(1, shape[d]);
  }
  impl->offset = offset;
  impl->dtype = t.dtype();
  Tensor view(impl);
  view.copy_(t.detach().to(kCPU));
  if (t.device().is_cpu()) return view;
  Tensor dev_buffer = host.to(t.device());
  auto dimpl = std::make_shared<TensorImpl>(*impl);
  dimpl->storage = dev_buffer.impl().storage;
  return Tensor(dimpl);
}

std::vector<Tensor> relaid_inputs(const OpSpec& spec, const std::vector<Tensor>& in, int64_t gap,
                                  int64_t offset) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < in.size(); ++i) {
    Tensor t = relaid(in[i], gap, offset);
    if (spec.inputs[i].differentiable) t.set_requires_grad();
    out.push_back(t);
  }
  return out;
}

// ---- the checks ----------------------------------------------------------------------------

class Checker {
 public:
  Checker(const OpSpec& spec, const Options& opt) : spec_(spec), opt_(opt), run_(spec) {
    report_.op = spec.name;
  }

  Report run() {
    if (opt_.cpu) {
      check("contract", [&] { return contract(); });
      check("gradcheck f64", [&] { return gradcheck(); });
      check("accumulation", [&] { return accumulation(); });
      if (spec_.row_separable) check("microbatches", [&] { return microbatches(); });
      else skip("microbatches", "not row-separable");
      check("strided", [&] { return strided(DType::f64, kCPU); });
      check("sizes", [&] { return sizes(); });
      check("inputs intact", [&] { return intact(DType::f64, kCPU); });
      check("bad inputs", [&] { return bad_inputs(); });
    }
    if (opt_.cuda) cuda_checks();
    return report_;
  }

 private:
  struct Failure {
    std::string what;
  };

  void add(const std::string& name, Line::Status s, std::string detail) {
    report_.lines.push_back({name, s, std::move(detail)});
  }
  void skip(const std::string& name, const std::string& why) { add(name, Line::Skip, why); }
  // Runs one check: its returned string is the PASS detail; a Failure, an mt::Error or any
  // other exception is its FAIL detail.
  void check(const std::string& name, const std::function<std::string()>& body) {
    const bool poison = poison_allocations();
    const bool det = deterministic();
    try {
      add(name, Line::Pass, body());
    } catch (const Failure& f) {
      add(name, Line::Fail, f.what);
    } catch (const std::exception& e) {
      add(name, Line::Fail, std::string("threw: ") + e.what());
    }
    set_poison_allocations(poison);
    set_deterministic(det);
  }
  [[noreturn]] static void fail(const std::string& what) { throw Failure{what}; }

  Generator gen(uint64_t salt) const { return Generator(opt_.seed * 1000003 + salt); }
  int64_t size_at(size_t i) const {
    MT_CHECK(!spec_.sizes.empty(), spec_.name, ": OpSpec::sizes is empty");
    return spec_.sizes[std::min(i, spec_.sizes.size() - 1)];
  }
  std::vector<Tensor> made(uint64_t salt, int64_t n) const {
    Generator g = gen(salt);
    return spec_.make(g, n);
  }
  Tolerance tolerance(DType dt) const {
    auto it = spec_.tolerance.find(dt);
    return it == spec_.tolerance.end() ? default_tolerance(dt) : it->second;
  }
  std::vector<size_t> differentiable() const {
    std::vector<size_t> d;
    for (size_t i = 0; i < spec_.inputs.size(); ++i)
      if (spec_.inputs[i].differentiable) d.push_back(i);
    return d;
  }
  const std::string& name_of(size_t i) const { return spec_.inputs[i].name; }

  // contract: outputs recorded, and every differentiable input receives a gradient that fits it.
  std::string contract() {
    Generator g = gen(1);
    std::vector<Tensor> in = run_.prepare(made(1, size_at(1)), DType::f64, kCPU);
    std::vector<Tensor> up;
    Run r = run_.run(in, up, g);
    std::string got;
    for (size_t i : differentiable()) {
      const Tensor& gr = r.grads[i];
      if (!gr.defined())
        fail("input '" + name_of(i) + "' is differentiable but received no gradient: its backward "
             "slot was {} (or nothing reached it)");
      if (gr.shape() != in[i].shape() || gr.dtype() != grad_dtype_for(in[i].dtype()))
        fail("input '" + name_of(i) + "': .grad is " + shape_str(gr.shape()) + " " +
             dtype_name(gr.dtype()) + ", expected " + shape_str(in[i].shape()) + " " +
             dtype_name(grad_dtype_for(in[i].dtype())));
      got += (got.empty() ? "" : ", ") + name_of(i);
    }
    std::string partial;
    if (r.outputs.size() > 1) {
      // Several outputs: a backward that reaches only some of them (the others' gradients
      // undefined) must work, and the parts must add up to the whole.
      std::vector<Tensor> sums(in.size());
      for (size_t k = 0; k < r.outputs.size(); ++k) {
        if (!up[k].defined()) continue;
        std::vector<Tensor> only_k(up.size());
        only_k[k] = up[k];
        std::vector<Tensor> fresh = run_.prepare(made(1, size_at(1)), DType::f64, kCPU);
        Run part = run_.run(fresh, only_k, g);
        for (size_t i : differentiable())
          if (part.grads[i].defined())
            sums[i] = sums[i].defined() ? mt::add(sums[i], part.grads[i]) : part.grads[i].clone();
      }
      for (size_t i : differentiable())
        if (!sums[i].defined() || normwise(sums[i], r.grads[i]) > 1e-12)
          fail("input '" + name_of(i) + "': the gradients from one output at a time do not add up "
               "to the gradient from all outputs at once");
      partial = "; each output alone works and the parts add up";
    }
    return std::to_string(spec_.inputs.size()) + " inputs, " + std::to_string(r.outputs.size()) +
           " output(s); gradients for " + (got.empty() ? "none" : got) + partial;
  }

  // gradcheck: analytic gradient of <outputs, R> against central differences, in f64.
  std::string gradcheck() {
    const double h = 1e-6, atol = 1e-5, rtol = 1e-3;  // torch.autograd.gradcheck's defaults
    Generator g = gen(2);
    std::vector<Tensor> in = run_.prepare(made(2, spec_.gradcheck_size), DType::f64, kCPU);
    std::vector<Tensor> up;
    Run r = run_.run(in, up, g);
    NoGradGuard no_grad;
    auto projection = [&] {
      std::vector<Tensor> outs = spec_.op(in);
      double s = 0;
      for (size_t k = 0; k < outs.size(); ++k) {
        if (!up[k].defined()) continue;
        const std::vector<double> o = values(outs[k]), u = values(up[k]);
        for (size_t j = 0; j < o.size(); ++j) s += o[j] * u[j];
      }
      return s;
    };
    double worst = 0;
    int64_t elements = 0;
    for (size_t i : differentiable()) {
      const std::vector<double> analytic = values(r.grads[i]);
      double* p = in[i].data<double>();
      for (int64_t j = 0; j < in[i].numel(); ++j, ++elements) {
        const double orig = p[j];
        p[j] = orig + h;
        const double fp = projection();
        p[j] = orig - h;
        const double fm = projection();
        p[j] = orig;
        const double numeric = (fp - fm) / (2 * h);
        const double err = std::abs(analytic[size_t(j)] - numeric);
        worst = std::max(worst, err / (atol + rtol * std::abs(numeric)));
        if (err > atol + rtol * std::abs(numeric))
          fail(name_of(i) + "[" + std::to_string(j) + "]: analytic " + num(analytic[size_t(j)]) +
               " but finite differences give " + num(numeric) + " (difference " + num(err) +
               "): the backward's math is wrong");
      }
    }
    return std::to_string(elements) + " elements, worst error " + num(worst) + " of its tolerance";
  }

  // accumulation: backward twice adds twice, through the sink and through returned gradients,
  // and both paths give the same gradient.
  std::string accumulation() {
    const int64_t n = size_at(1);
    const std::vector<Tensor> m = made(3, n);
    std::vector<Tensor> up;
    Run once[2];
    const Path paths[2] = {Path::Leaf, Path::NonLeaf};
    const char* path_names[2] = {"through the grad sink (leaf inputs)",
                                 "through returned gradients (non-leaf inputs)"};
    for (int p = 0; p < 2; ++p) {
      Generator g = gen(3);
      std::vector<Tensor> in = run_.prepare(m, DType::f64, kCPU);
      once[p] = snapshot(run_.run(in, up, g, paths[p]));
      Run twice = run_.run(in, up, g, paths[p]);
      for (size_t i : differentiable()) {
        const Tensor expected = scale(once[p].grads[i], 2.0);
        if (normwise(twice.grads[i], expected) > 1e-12) {
          const std::vector<double> a = values(once[p].grads[i]), b = values(twice.grads[i]);
          double ab = 0, aa = 0;
          for (size_t j = 0; j < a.size(); ++j) {
            ab += a[j] * b[j];
            aa += a[j] * a[j];
          }
          const double ratio = aa > 0 ? ab / aa : 0;
          fail(name_of(i) + ".grad after two backward passes " + path_names[p] + " is " +
               num(ratio) + "x the first pass, not 2x" +
               (std::abs(ratio - 1) < 1e-6 ? ": the backward stores (=) into a gradient it must "
                                              "add into (+=)" : ""));
        }
      }
    }
    for (size_t i : differentiable())
      if (normwise(once[1].grads[i], once[0].grads[i]) > 1e-12)
        fail(name_of(i) + ".grad differs between the grad-sink path and the returned-gradient "
             "path (error " + num(normwise(once[1].grads[i], once[0].grads[i])) + ")");
    return "twice = 2x, sink and returned paths agree, for " +
           std::to_string(differentiable().size()) + " input(s)";
  }

  // microbatches: uneven row chunks, each forward and backward on its own, add up to the batch.
  std::string microbatches() {
    const int64_t n = size_at(2);
    MT_CHECK(n >= 3, spec_.name, ": the microbatch check needs sizes[2] >= 3 rows");
    const std::vector<Tensor> m = made(4, n);
    Generator g = gen(4);
    std::vector<Tensor> full_in = run_.prepare(m, DType::f64, kCPU);
    std::vector<Tensor> up;
    Run full = run_.run(full_in, up, g);
    std::vector<Tensor> in = run_.prepare(m, DType::f64, kCPU);
    const int64_t cuts[4] = {0, n / 3, n / 3 + 1, n};  // uneven, one of a single row
    for (int c = 0; c < 3; ++c) {
      std::vector<Tensor> args = in;
      for (size_t i = 0; i < in.size(); ++i)
        if (spec_.inputs[i].batched) args[i] = in[i].slice_rows(cuts[c], cuts[c + 1]);
      std::vector<Tensor> outs = spec_.op(args), chunk_up;
      for (size_t k = 0; k < outs.size(); ++k) {
        const bool rows = up[k].defined() && up[k].dim() > 0 && up[k].size(0) == n;
        chunk_up.push_back(rows ? up[k].slice_rows(cuts[c], cuts[c + 1]).contiguous() : up[k]);
      }
      Runner::backward_from(outs, chunk_up);
    }
    double worst = 0;
    for (size_t i : differentiable()) {
      const double err = normwise(in[i].grad(), full.grads[i]);
      worst = std::max(worst, err);
      if (err > 1e-12)
        fail(name_of(i) + ".grad summed over 3 microbatches differs from the full batch's (error " +
             num(err) + "): an accumulation overwrites, or a normalizer depends on the chunk");
    }
    return "3 uneven chunks of " + std::to_string(n) + " rows = full batch (error " + num(worst) + ")";
  }

  // strided: inputs and upstream gradients with doubled strides give the contiguous run's bits.
  std::string strided(DType dt, Device dev) {
    const int64_t n = size_at(2);
    const std::vector<Tensor> m = made(5, n);
    Generator g = gen(5);
    std::vector<Tensor> up;
    Run base = snapshot(run_.run(run_.prepare(m, dt, dev), up, g));
    std::vector<Tensor> strided_in = relaid_inputs(spec_, run_.prepare(m, dt, dev), 2, 0);
    std::vector<Tensor> up_copy = up;
    std::string d = first_difference(spec_, base, run_.run(strided_in, up_copy, g));
    if (!d.empty())
      fail(d + " differs when the inputs are strided views: a kernel reads a strided input as if "
           "it were contiguous (call .contiguous() on it)");
    std::vector<Tensor> strided_up;
    for (const Tensor& u : up) strided_up.push_back(u.defined() ? relaid(u, 2, 0) : Tensor());
    d = first_difference(spec_, base, run_.run(run_.prepare(m, dt, dev), strided_up, g));
    if (!d.empty())
      fail(d + " differs when the upstream gradient is a strided view: the backward reads dy as "
           "if it were contiguous (call .contiguous() on it)");
    return "strided inputs and strided upstream gradients: same bits";
  }

  // sizes: every awkward size runs, and an empty input works or is refused cleanly.
  std::string sizes() {
    std::string ran;
    for (int64_t n : spec_.sizes) {
      Generator g = gen(6);
      std::vector<Tensor> in = run_.prepare(made(6, n), DType::f64, kCPU), up;
      Run r = run_.run(in, up, g);
      for (size_t i : differentiable())
        if (!r.grads[i].defined() || r.grads[i].shape() != in[i].shape())
          fail("size " + std::to_string(n) + ": input '" + name_of(i) + "' got no gradient of its shape");
      ran += (ran.empty() ? "" : ", ") + std::to_string(n);
    }
    Generator g = gen(6);
    std::vector<Tensor> empty_in, up;
    if (spec_.allows_empty) {
      empty_in = run_.prepare(made(6, 0), DType::f64, kCPU);
      run_.run(empty_in, up, g);
      return ran + " and 0 (empty)";
    }
    empty_in = run_.prepare(made(6, 0), DType::f64, kCPU);
    try {
      spec_.op(empty_in);  // the op itself must refuse, not the checker's backward after it
    } catch (const Error&) {
      return ran + "; 0 (empty) is refused with an mt::Error, as declared";
    }
    fail("an empty input was accepted, but the spec says the op refuses it (allows_empty = false)");
  }

  // inputs intact: forward and backward leave the inputs' bits alone; outputs own their memory.
  std::string intact(DType dt, Device dev) {
    Generator g = gen(7);
    std::vector<Tensor> in = run_.prepare(made(7, size_at(2)), dt, dev), up;
    std::vector<Tensor> before;
    for (const Tensor& t : in) before.push_back(copy_on(t));
    Run r = run_.run(in, up, g);
    for (size_t i = 0; i < in.size(); ++i)
      if (!same_bits(in[i].detach(), before[i]))
        fail("input '" + name_of(i) + "' was modified by the op (forward or backward)");
    for (size_t k = 0; k < r.outputs.size(); ++k)
      for (size_t i = 0; i < in.size(); ++i)
        if (r.outputs[k].impl().storage == in[i].impl().storage)
          fail(output_name(k) + " shares memory with input '" + name_of(i) + "'");
    return "inputs unchanged, outputs own their memory";
  }

  std::string bad_inputs() {
    if (spec_.bad_inputs.empty()) return "none declared";
    for (const auto& [what, call] : spec_.bad_inputs) {
      bool refused = false;
      try {
        call();
      } catch (const Error&) {
        refused = true;
      } catch (const std::exception& e) {
        fail(what + ": threw " + e.what() + ", which is not an mt::Error");
      }
      if (!refused) fail(what + ": accepted, expected an mt::Error");
    }
    return std::to_string(spec_.bad_inputs.size()) + " refused with an mt::Error";
  }

  // ---- CUDA ----

  void cuda_checks() {
    if (!OpRegistry::instance().declares(spec_.name, DeviceType::CUDA)) {
      skip("cuda", spec_.name + " is declared without cuda kernels (MT_OP_BACKENDS)");
      return;
    }
#ifdef MT_WITH_CUDA
    if (!cuda_available()) {
      skip("cuda", "no CUDA device visible");
      return;
    }
    const Device dev = cuda_device(0);
    for (DType dt : opt_.dtypes) {
      const std::string tag = std::string(" ") + dtype_name(dt);
      check("cuda parity" + tag, [&] { return parity(dt, dev); });
      check("cuda strided" + tag, [&] { return strided(dt, dev); });
      check("cuda deterministic" + tag, [&] { return determinism(dt, dev); });
      check("cuda graph" + tag, [&] { return graph(dt, dev); });
      check("cuda inputs intact" + tag, [&] { return intact(dt, dev); });
    }
#else
    skip("cuda", "this build has no CUDA backend");
#endif
  }

#ifdef MT_WITH_CUDA
  // parity: every size against the f64 reference on the same rounded inputs, allocations poisoned.
  std::string parity(DType dt, Device dev) {
    const Tolerance tol = tolerance(dt);
    std::vector<double> out_err, grad_err(spec_.inputs.size(), 0);
    for (int64_t n : spec_.sizes) {
      const std::vector<Tensor> m = made(8, n);
      Generator g = gen(8);
      std::vector<Tensor> up;
      set_poison_allocations(true);  // NaN in every new buffer: an unwritten element shows
      Run d = run_.run(run_.prepare(m, dt, dev), up, g);
      set_poison_allocations(false);
      std::vector<Tensor> ref_up;
      for (const Tensor& u : up) ref_up.push_back(u.defined() ? u.to(kCPU).to(DType::f64) : Tensor());
      Run ref = run_.run(run_.rounded(m, dt), ref_up, g);
      out_err.resize(d.outputs.size(), 0);
      for (size_t k = 0; k < d.outputs.size(); ++k) {
        const double e = normwise(d.outputs[k], ref.outputs[k]);
        out_err[k] = std::max(out_err[k], e);
        if (!(e <= tol.output))
          fail(output_name(k) + " at size " + std::to_string(n) + ": error " + num(e) + " > " +
               num(tol.output) + (std::isinf(e) ? " (NaN: an element the kernel never wrote)" : ""));
      }
      for (size_t i : differentiable()) {
        const double e = normwise(d.grads[i], ref.grads[i]);
        grad_err[i] = std::max(grad_err[i], e);
        if (!(e <= tol.grad))
          fail(name_of(i) + ".grad at size " + std::to_string(n) + ": error " + num(e) + " > " +
               num(tol.grad) + (std::isinf(e) ? " (NaN: an element the kernel never wrote)" : ""));
      }
    }
    std::string detail;
    for (size_t k = 0; k < out_err.size(); ++k) detail += output_name(k) + " " + num(out_err[k]) + ", ";
    for (size_t i : differentiable()) detail += name_of(i) + ".grad " + num(grad_err[i]) + ", ";
    return detail + "tolerance " + num(tol.output) + " / " + num(tol.grad) + ", " +
           std::to_string(spec_.sizes.size()) + " sizes";
  }

  // deterministic: the same bits on a second run and with the inputs elsewhere in memory.
  std::string determinism(DType dt, Device dev) {
    set_deterministic(true);
    const int64_t n = spec_.sizes.back();
    const std::vector<Tensor> m = made(9, n);
    Generator g = gen(9);
    std::vector<Tensor> up;
    Run first = snapshot(run_.run(run_.prepare(m, dt, dev), up, g));
    std::string d = first_difference(spec_, first, run_.run(run_.prepare(m, dt, dev), up, g));
    if (!d.empty()) fail(d + " differs between two identical runs in deterministic mode");
    // 256 bytes further: the same alignment for any vector width, another address.
    const int64_t shift = 256 / int64_t(dtype_size(dt));
    d = first_difference(spec_, first, run_.run(relaid_inputs(spec_, run_.prepare(m, dt, dev), 1, shift), up, g));
    if (!d.empty()) fail(d + " differs when the inputs sit 256 bytes further in memory");
    Run moved = run_.run(relaid_inputs(spec_, run_.prepare(m, dt, dev), 1, 1), up, g);
    d = first_difference(spec_, first, moved);
    if (d.empty()) return "same bits on a second run, 256 bytes further, and one element off alignment";
    if (spec_.alignment_invariant)
      fail(d + " differs when the inputs are misaligned by one element: the reduction order "
           "depends on the alignment (set alignment_invariant = false only if that is intended)");
    const Tolerance tol = tolerance(dt);
    for (size_t k = 0; k < first.outputs.size(); ++k)
      if (!(normwise(moved.outputs[k], first.outputs[k]) <= tol.output))
        fail(output_name(k) + " is wrong when the inputs are misaligned by one element");
    for (size_t i : differentiable())
      if (!(normwise(moved.grads[i], first.grads[i]) <= tol.grad))
        fail(name_of(i) + ".grad is wrong when the inputs are misaligned by one element");
    return "same bits on a second run and 256 bytes further; misaligned by one element within "
           "tolerance (bits depend on alignment, as declared)";
  }

  // cuda graph: forward + backward captured once and replayed twice = the eager run, bitwise.
  std::string graph(DType dt, Device dev) {
    const std::vector<Tensor> m = made(10, size_at(2));
    Generator g = gen(10);
    std::vector<Tensor> in = run_.prepare(m, dt, dev), up;
    for (size_t i : differentiable())  // a graph adds into .grad buffers that exist before it
      in[i].set_grad(zeros(in[i].shape(), grad_dtype_for(in[i].dtype()), dev));
    Run eager = snapshot(run_.run(in, up, g));
    auto reset = [&] {
      for (size_t i : differentiable()) in[i].grad().fill_(0.0);
    };
    std::vector<Tensor> buffers;
    for (const Tensor& o : eager.outputs) buffers.push_back(zeros(o.shape(), o.dtype(), dev));
    reset();
    cuda::Graph graph = cuda::Graph::capture(dev.index, [&] {
      std::vector<Tensor> outs = run_.call(in, Path::Leaf);
      Runner::backward_from(outs, up);
      for (size_t k = 0; k < outs.size(); ++k) buffers[k].copy_(outs[k].detach());
    });
    // Replay 1 on the captured inputs; replay 2 after new values were copied into them, against
    // an eager run on those values: a replay must read the memory as it is when it runs.
    const std::vector<Tensor> m2 = made(11, size_at(2));
    for (int replay = 1; replay <= 2; ++replay) {
      Run expected = eager;
      if (replay == 2) {
        std::vector<Tensor> fresh = run_.prepare(m2, dt, dev), up2 = up;
        for (size_t i : differentiable())
          fresh[i].set_grad(zeros(fresh[i].shape(), grad_dtype_for(fresh[i].dtype()), dev));
        expected = snapshot(run_.run(fresh, up2, g));
        for (size_t i = 0; i < in.size(); ++i) in[i].detach().copy_(fresh[i].detach());
      }
      reset();
      for (const Tensor& b : buffers) b.fill_(0.0);
      graph.replay();
      Run replayed;
      replayed.outputs = buffers;
      for (const Tensor& t : in) replayed.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
      const std::string d = first_difference(spec_, expected, replayed);
      if (!d.empty())
        fail(d + " differs between replay " + std::to_string(replay) + " and the eager run" +
             (replay == 2 ? " on the new inputs" : "") + ": the op reads something at capture "
             "time that changes, or syncs with the host");
    }
    return std::to_string(graph.num_nodes()) + " graph nodes; replays = eager, bitwise, also "
           "after new inputs were copied in";
  }
#endif

  const OpSpec& spec_;
  const Options& opt_;
  Runner run_;
  Report report_;
};

}  // namespace

Report op_check(const OpSpec& spec, const Options& options) {
  MT_CHECK(spec.op && spec.make, "op_check ", spec.name, ": OpSpec needs op and make");
  MT_CHECK(!spec.inputs.empty(), "op_check ", spec.name, ": OpSpec has no inputs");
  return Checker(spec, options).run();
}

}  // namespace mt::check
