#pragma once
// optim::Optimizer: parameter groups, per-parameter state, and its checkpoint form.
//
// An optimizer holds the parameters' handles (the same TensorImpl the module holds), so
// Module::to(...), which changes parameters in place, never leaves it pointing at stale tensors.
//
// The update rule lives in step() of each subclass. Every step() runs under NoGradGuard, skips
// parameters whose .grad is undefined (as PyTorch does: they did not take part in the loss), and
// leaves each parameter's compute copy (Tensor::compute_copy) equal to its new value.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace mt::optim {

// A set of parameters sharing hyper-parameters. An unset lr or weight_decay takes the
// optimizer's option, as a missing key of a PyTorch param group does; the optimizer fills them in
// at construction, so param_groups() always has both set.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

// Whether a named parameter gets weight decay (see Optimizer::decay_groups).
using DecayPredicate = std::function<bool(const std::string& name, const Tensor& param)>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual void step() = 0;

  // The two halves of step(), for a step recorded in a CUDA graph (core/cuda/graph.h):
  // prepare_step() is the host's part (step counts, this step's learning rate and bias
  // corrections, handed to the device); apply_step() only launches the update, which reads them
  // there. A graph records apply_step() once; before every replay, prepare_step() runs alone.
  // step() == prepare_step() + apply_step(). Only an optimizer that is capturable() has them.
  virtual bool capturable() const { return false; }
  virtual void prepare_step();
  virtual void apply_step();
  // Folded gradient clipping: every update then uses .grad · factor, `factor` a 0-dim tensor the
  // caller owns and rewrites before each step (optim/clip.h: grad_norm_and_clip_factor), .grad
  // itself left unscaled; an undefined tensor turns it off. Returns whether this optimizer folds
  // (AdamW does); one that does not changes nothing and returns false.
  virtual bool set_grad_scale(Tensor factor) {
    (void)factor;
    return false;
  }

  // Every parameter's .grad set to none (the default) or filled with zeros.
  void zero_grad(bool set_to_none = true);
  // Sets the learning rate of every group (what an LR schedule calls before each step).
  void set_lr(double lr);

  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Number of step() calls so far.
  int64_t steps_taken() const { return steps_; }

  // Checkpoint form, keyed by a parameter's index across all groups in order:
  //   "step"                     number of step() calls (i64, 0-dim)
  //   "state.<i>.step"           updates parameter i has received (i64, 0-dim)
  //   "state.<i>.<buffer>"       e.g. exp_avg / exp_avg_sq (AdamW), momentum_buffer (SGD)
  // Parameters that have not been updated yet have no state entries. The tensors share storage
  // with the optimizer's state. Hyper-parameters are not included: they come from the config,
  // and the learning rate from the schedule at the restored step.
  nn::StateDict state_dict() const;
  // Replaces the state with copies of `dict`'s tensors, moved to each parameter's device. Strict:
  // a key that is not of the forms above or appears twice, an index out of range, a buffer whose
  // shape or dtype does not fit its parameter, a missing buffer of an updated parameter, or a step
  // count that is not one i64 in [0, "step"] (per parameter: [1, "step"]) is an mt::Error naming
  // the key; nothing changes unless all are valid.
  void load_state_dict(const nn::StateDict& dict);

  // Two groups for the usual AdamW recipe: group 0 = parameters `decays` accepts, with
  // `weight_decay`; group 1 = the rest, with 0. The default predicate decays weights of 2 or more
  // dimensions (Linear weights) and spares biases, norm weights and scalar gates.
  static std::vector<ParamGroup> decay_groups(const nn::Module& module, double weight_decay,
                                              const DecayPredicate& decays = {});

 protected:
  struct ParamState {
    int64_t step = 0;                      // updates this parameter has received
    std::map<std::string, Tensor> buffers;  // named per optimizer, same shape as the parameter
  };

  // Fills each group's unset lr / weight_decay; `buffer_names` are the state buffers the
  // subclass keeps for every updated parameter (what load_state_dict accepts and requires).
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay,
            std::vector<std::string> buffer_names);

  // The state of parameter `index` (counted across groups).
  ParamState& state(size_t index) { return state_[index]; }
  // Buffer `name` of parameter `index`: created as zeros (dtype `dtype`, on p's device) on first
  // use, or converted to p's device and `dtype` if the parameter moved since.
  Tensor& buffer(size_t index, const std::string& name, const Tensor& p, DType dtype);

  std::vector<ParamGroup> groups_;
  int64_t steps_ = 0;

 private:
  std::vector<ParamState> state_;  // one per parameter, in group order
  std::vector<std::string> buffer_names_;
};

}  // namespace mt::optim
