#pragma once
// What a run needs in memory, worked out from its config before anything is allocated and set
// against what the device has, so that a model too large for the machine is a ConfigError that
// names the sizes rather than an allocation failure, or an out-of-memory kill, after start-up.
//
// The estimate is a lower bound: parameters, gradients and optimizer state in the parameters'
// dtype (plus the compute-dtype copy of the weights under bf16 / f16), every layer's output for
// one microbatch (all are kept for the backward pass) or one evaluation batch (at most the
// held-out set, where that is known before loading), whichever is larger, and the generated data
// of data.kind synthetic (data files are bounded by their readers and counted by no one here).
// A run refused by it could not have run; one it lets through may still need more (the
// allocator's slack, temporaries of the backward pass).
#include <cstdint>
#include <string>

#include "core/device.h"
#include "app/config.h"

namespace mt::app {

struct MemoryEstimate {
  double state = 0;        // bytes: parameters, gradients, optimizer state, compute-dtype weights
  double activations = 0;  // bytes: the larger of a microbatch's layer outputs and an eval batch's
  double data = 0;         // bytes: the synthetic training and test sets, on the host
};

// For one rank of a job of `world` ranks (each holds the whole model and the whole data).
MemoryEstimate estimate_memory(const Config& c, int world = 1);
// model.kind gpt's: a lower bound, its state and a microbatch's activations (app/models/gpt.cpp).
MemoryEstimate estimate_gpt_memory(const Config& c, int world = 1);

// What every kind's estimate shares. The state of `params` parameters: value and gradient in the
// parameters' dtype, the optimizer's moments (this rank's share under optim.shard_state), and
// the compute-dtype copies of `copied` of them under bf16 / f16. And the samples of the largest
// microbatch a rank of `world` gets.
double state_bytes(const Config& c, double params, double copied, int world);
int64_t largest_microbatch(const Config& c, int world);

// The host's physical memory: sysconf(_SC_PHYS_PAGES) pages of sysconf(_SC_PAGESIZE) bytes.
double physical_memory_bytes();
// This process's address-space limit (ulimit -v, RLIMIT_AS), or infinity when there is none.
double address_space_limit_bytes();

// Throws ConfigError saying what the run needs and what `device` has when it cannot fit: on the
// CPU the state, activations and data of all `world` ranks (threads of one process) against the
// physical memory or the address-space limit, whichever is smaller; on a GPU the state and
// activations against its free memory (cudaMemGetInfo), and the data against the host's.
void check_memory(const Config& c, Device device, int world = 1);

// The same check of any model kind's estimate: `optimizer` names the state in the message, and
// `advice` ends it ("make model.n_layer or optim.batch_size smaller").
void check_estimate(const MemoryEstimate& e, const std::string& optimizer, Device device,
                    int world, const std::string& advice);

// What a job of `world` ranks on this machine must pass before its workers are started (train
// --nproc), so that a job that cannot run starts nothing: the global batch gives every rank its
// microbatches, and on the CPU check_memory for `world` ranks (GPU workers check their own GPU).
// Throws ConfigError.
void check_job_fits(const Config& c, Device device, int world);

// "1.5 GiB": a byte count for messages.
std::string format_bytes(double bytes);

}  // namespace mt::app
