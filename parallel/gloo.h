#pragma once
// The communicator of CPU data parallelism across processes: Gloo over TCP, one process per rank
// (parallel/communicator.h has the contract; parallel/launch.h says how a process finds its place
// and its peers). Built when CMake finds Gloo (Debian: libgloo-dev); `train --nproc N` on the CPU
// then runs N processes joined by it, as it runs N GPU processes joined by NCCL.
//
// Rendezvous: the ranks exchange their listening addresses through the World's rendezvous: files
// in the directory MT_DIST_FILE + ".gloo" (Gloo's FileStore), or rank 0's TCP store
// (parallel/store.h) at MASTER_ADDR; then every pair of ranks holds one TCP connection (a full
// mesh). Each rank listens on 127.0.0.1 when every rank is on this machine (the local world size
// is the world size, or MASTER_ADDR is a loopback address), else on the address of this machine's
// hostname; MT_GLOO_IFACE (a network interface, e.g. eth0) or MT_GLOO_HOSTNAME overrides that.
//
// Collectives are synchronous (wait() and synchronize() are no-ops): all_reduce_sum is Gloo's
// ring all-reduce, whose every element is summed once, on one rank, and sent to the others, so
// every rank gets the same bits. Gloo has no reduce-scatter among its functional collectives:
// reduce_scatter_sum is an all-reduce here (each rank then uses its chunk; the bytes on the wire
// are twice a reduce-scatter's, which the CPU path can afford). all_gather is Gloo's ring
// all-gather.
//
// No hanging forever: every collective is bounded by world.timeout; a peer that dies closes its
// sockets, and the survivors' next collective fails at once (SIGPIPE is ignored from the first
// Gloo communicator on, so a write to a closed socket is an error, not the end of the process). Either is a DistError naming the rank,
// the collective and its number. abort() marks the communicator broken: later collectives throw.
#include <memory>

#include "parallel/communicator.h"
#include "parallel/launch.h"

namespace mt::parallel {

std::shared_ptr<Communicator> make_gloo_communicator(const World& world);

}  // namespace mt::parallel
