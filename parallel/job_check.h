#pragma once
// The ranks of one job must run the same thing: the same resolved config and the same model.
// Ranks that differ would train diverging replicas without a word (another learning rate or
// batch size), or fail deep inside a collective (another model: buffers of different sizes).
// check_same_job, called by every rank once its communicator exists and before the first
// collective of training, turns that into an error on every rank naming the first key that
// differs.
//
//   parallel::check_same_job(*comm, {{"optim.lr", "0.001"}, {"param.fc.weight", "[64, 784] f32"}},
//                            device);
//
// The entries are whatever the program must agree on, as (key, value) strings in a fixed order.
// Cost: one all_gather of a 64-bit digest (SHA-256 of the entries) when the ranks agree. When
// they do not, rank 0's entries are broadcast, each rank finds its first difference, and an
// all_gather of those positions lets every rank name the lowest differing rank and the key:
//
//   rank 1: the ranks of this job differ: 'optim.lr' is 0.01 here but 0.001 on rank 0 (the first
//   key that differs; every rank must run the same config and model)
//   rank 0: the ranks of this job differ: rank 1 differs from rank 0 first at 'optim.lr' (0.001
//   on rank 0) ...
//
// The tensors go over the communicator on `device` (the communicator's: NCCL's are on the GPU).
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "parallel/communicator.h"

namespace mt::parallel {

using JobEntries = std::vector<std::pair<std::string, std::string>>;

// Returns when every rank passed the same entries; otherwise throws DistError on every rank.
void check_same_job(Communicator& comm, const JobEntries& entries, Device device);

}  // namespace mt::parallel
