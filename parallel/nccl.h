#pragma once
// The communicator of GPU data parallelism: NCCL, one process per GPU (parallel/communicator.h has
// the contract; parallel/launch.h starts the processes).
//
// Rendezvous. NCCL's ranks find each other through a 128-byte unique id that rank 0 creates and
// every other rank must read before they all call ncclCommInitRank. World (parallel/launch.h)
// says how: with an `id_file` (a fresh temporary file made by `train --nproc`, or MT_DIST_FILE on
// a shared filesystem) rank 0 writes it there through a temporary name and a rename, so a reader
// never sees half an id, and removes it once the communicator exists; otherwise rank 0 sets it in
// its TCP store (parallel/store.h) at MASTER_ADDR and the others get it there.
//
// Streams. Collectives run on a stream of their own, after an event recorded on the framework
// stream, so the gradient all-reduce of one bucket overlaps the rest of the backward. wait()
// makes the framework stream wait for the last collective enqueued.
//
// No hanging forever. The communicator is non-blocking (ncclConfig_t::blocking = 0): the host
// never waits inside NCCL. Where the host must wait (the rendezvous, synchronize(), and wait(),
// which lets the host run at most one optimizer step ahead of the collectives) it polls, and past
// `timeout` it aborts the communicator (ncclCommAbort ends the kernels that wait for a peer) and
// throws DistError naming the rank and what it waited for. The trainer calls synchronize() before
// it reads any value back, so a dead peer ends every other rank within the timeout; `train
// --nproc` stops the others sooner, as soon as a worker fails or is killed.
//
// NVLink SHARP multicast (NVLS) is turned off: NCCL_NVLS_ENABLE=0 is set before the communicator
// is created (docs/distributed.md says why).
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/launch.h"

namespace mt::parallel {

// Rank world.rank of world.size on cuda:`device`; world.timeout bounds every wait.
std::shared_ptr<Communicator> make_nccl_communicator(const World& world, int device);

}  // namespace mt::parallel
