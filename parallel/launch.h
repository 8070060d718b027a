#pragma once
// Starting a data-parallel job, and a process's place in one.
//
// One process per rank (per GPU on GPUs). A process learns its rank, the world size and its rank
// on its machine from the first launcher whose variables are set, in this order:
//
//   1. torchrun, `train --nproc`:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   2. Open MPI's mpirun:          OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                                  OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   3. Slurm's srun:               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//
// torchrun first because it may run inside an allocation of the others (its workers then also
// see their SLURM_*), and mpirun before srun for the same reason: the innermost launcher is the
// one that started this process. LOCAL_RANK (and its kin) picks the GPU: cuda:LOCAL_RANK;
// default the rank. With none of them set the process is alone (size 1).
//
// The ranks then meet (the rendezvous: NCCL's unique id, or the CPU backend's addresses) in one of
// two ways, the first that is set:
//   MT_DIST_FILE        a fresh path every rank can read (a shared filesystem across machines);
//                       `train --nproc` makes one
//   MASTER_ADDR         TCP through rank 0's store (parallel/store.h) at MASTER_ADDR, port
//                       MT_DIST_PORT, by default MASTER_PORT + 1 (MASTER_PORT defaults to 29500):
//                       under torchrun its own agent store already listens on MASTER_PORT
//                       The store admits only ranks that know the job's secret:
//   MT_DIST_SECRET      at least 16 characters, the same on every rank and known to no one else
//                       (required for the TCP rendezvous; the launcher's environment carries it
//                       to the ranks, docs/distributed.md shows how for torchrun, srun, mpirun)
//   MT_DIST_BIND        where rank 0's store listens: by default the addresses MASTER_ADDR
//                       resolves to, '*' for every interface
//   MT_DIST_TIMEOUT     seconds a rank waits for the others before it gives up (default 120)
// A world of more than one rank with neither MT_DIST_FILE nor MASTER_ADDR is an error, and so is
// one larger than the open-file limit: every rank may hold a socket to every other (the store on
// rank 0, Gloo's full mesh), so WORLD_SIZE + kReservedFiles must fit under `ulimit -n`.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace mt::parallel {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  int local_size = 0;        // ranks on this machine; 0 when the launcher does not say
  std::string launcher;      // whose variables these are: "torchrun", "Open MPI", "Slurm" or ""
  std::string id_file;       // the file rendezvous, or "" for TCP
  std::string master_addr;   // the TCP rendezvous: rank 0's host and the store's port
  int store_port = 0;
  std::string secret;        // the TCP rendezvous: the job's secret (MT_DIST_SECRET)
  std::string bind_host;     // where the store listens: "" for master_addr (MT_DIST_BIND)
  std::chrono::milliseconds timeout{120'000};
};

// Files a rank keeps open besides one socket per peer (logs, data, checkpoints, the listener).
inline constexpr int kReservedFiles = 64;

// The value of an environment variable, or null when it is unset.
using EnvLookup = std::function<const char*(const char* name)>;

// The World the environment describes. Malformed or inconsistent values (not an integer, a rank
// outside [0, size), a local rank outside [0, local size), a port outside 1..65535, more than one
// rank with no rendezvous, a TCP rendezvous without MT_DIST_SECRET, a world size over the
// open-file limit) are ConfigErrors naming the variables (train exits with code 2).
World world_from_env(const EnvLookup& env);
World world_from_env();  // this process's environment

// Runs `program` with `args` as `nproc` local worker processes. Before it starts any, `nproc` is
// checked against what the machine allows (the open-file limit, which each worker needs for a
// socket per peer, and the process limit): an mt::Error naming the limit, nothing started. Then
// worker i runs with RANK = LOCAL_RANK = i, WORLD_SIZE = LOCAL_WORLD_SIZE = nproc, a fresh
// MT_DIST_FILE (in a new folder only this user can read), and NCCL_NVLS_ENABLE=0. The
// other launchers' rank variables (OMPI_COMM_WORLD_*, SLURM_PROCID, ...) are left as they are:
// RANK comes first. Waits for them all.
// When one exits with an error or is killed, the others get SIGTERM (SIGKILL 5 s later) and the
// job ends: the return value is that worker's exit code (1 for a signal), with a message on
// stderr naming it (a worker killed by a signal is named over one that exited with an error a
// moment before: that error is usually the peer's death seen from the other side). 0 when every worker succeeded. A SIGINT, SIGTERM or SIGHUP sent to the
// launcher is passed on to the workers the same way (return value 128 + the signal).
int run_workers(int nproc, const std::string& program, const std::vector<std::string>& args);

}  // namespace mt::parallel
