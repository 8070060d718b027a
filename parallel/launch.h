#pragma once
// Starting a data-parallel job, and a process's place in one.
//
// One process per GPU. A process learns its place from the usual environment variables:
//   RANK          this process's rank, 0..WORLD_SIZE-1
//   WORLD_SIZE    the number of processes
//   LOCAL_RANK    its rank on this machine, which picks the GPU (cuda:LOCAL_RANK); default RANK
//   MT_DIST_FILE  where rank 0 leaves NCCL's unique id for the others: a path every process
//                 can read (a shared filesystem across machines), fresh for each job
//   MT_DIST_TIMEOUT  seconds a rank waits for the others before it gives up (default 120)
// `train --nproc N` sets all of them for N local workers (run_workers below); another launcher
// (torchrun-style, a cluster scheduler) sets them itself.
#include <chrono>
#include <string>
#include <vector>

namespace mt::parallel {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string id_file;
  std::chrono::milliseconds timeout{120'000};
};

// The World the environment describes; size 1 when RANK is unset. Malformed or inconsistent
// values (RANK outside [0, WORLD_SIZE), WORLD_SIZE > 1 without MT_DIST_FILE) are mt::Errors.
World world_from_env();

// Runs `program` with `args` as `nproc` local worker processes, worker i with RANK = LOCAL_RANK
// = i, WORLD_SIZE = nproc, a fresh MT_DIST_FILE, and NCCL_NVLS_ENABLE=0. Waits for them all.
// When one exits with an error or is killed, the others get SIGTERM (SIGKILL 5 s later) and the
// job ends: the return value is that worker's exit code (1 for a signal), with a message on
// stderr naming it. 0 when every worker succeeded. A SIGINT, SIGTERM or SIGHUP sent to the
// launcher is passed on to the workers the same way (return value 128 + the signal).
int run_workers(int nproc, const std::string& program, const std::vector<std::string>& args);

}  // namespace mt::parallel
