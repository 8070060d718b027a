// Starting a job: the launchers' environment (parallel/launch.h), the TCP rendezvous
// (parallel/store.h), the chunked collectives of the thread group, and the Gloo communicator
// (parallel/gloo.h) with its ranks as threads of this process over loopback.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "parallel/communicator.h"
#include "parallel/launch.h"
#include "parallel/store.h"
#include "tests/expect_error.h"
#include "tests/ranks.h"
#ifdef MT_WITH_GLOO
#include "parallel/gloo.h"
#endif

using namespace mt;
using mt::test::free_port;
using mt::test::on_threads;
using mt::test::expect_error;
using Env = std::map<std::string, std::string>;

namespace {

parallel::World world_of(const Env& env) {
  return parallel::world_from_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---- the launchers' variables -------------------------------------------------------------

TEST(WorldFromEnv, AloneWithoutALauncher) {
  const parallel::World w = world_of({{"MASTER_ADDR", "n1"}});
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.launcher, "");
}

TEST(WorldFromEnv, Torchrun) {
  const parallel::World w = world_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"},
                                      {"MASTER_PORT", "29400"}, {"MT_DIST_TIMEOUT", "9"}});
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.master_addr, "node7");
  EXPECT_EQ(w.store_port, 29401);  // beside torchrun's own store on MASTER_PORT
  EXPECT_EQ(w.id_file, "");
  EXPECT_EQ(w.timeout, std::chrono::seconds(9));
}

TEST(WorldFromEnv, OpenMpiAndSlurm) {
  const parallel::World mpi = world_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "a"}});
  EXPECT_EQ(mpi.launcher, "Open MPI");
  EXPECT_EQ(mpi.rank, 3);
  EXPECT_EQ(mpi.size, 4);
  EXPECT_EQ(mpi.local_rank, 1);
  EXPECT_EQ(mpi.local_size, 2);
  EXPECT_EQ(mpi.store_port, 29501);  // MASTER_PORT defaults to 29500
  const parallel::World slurm = world_of({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"},
                                          {"SLURM_LOCALID", "2"}, {"MASTER_ADDR", "a"},
                                          {"MT_DIST_PORT", "4000"}});
  EXPECT_EQ(slurm.launcher, "Slurm");
  EXPECT_EQ(slurm.rank, 6);
  EXPECT_EQ(slurm.size, 7);
  EXPECT_EQ(slurm.local_rank, 2);
  EXPECT_EQ(slurm.store_port, 4000);  // MT_DIST_PORT overrides MASTER_PORT + 1
}

TEST(WorldFromEnv, TheInnermostLauncherWins) {
  Env env = {{"RANK", "1"},         {"WORLD_SIZE", "2"},          {"OMPI_COMM_WORLD_RANK", "2"},
             {"OMPI_COMM_WORLD_SIZE", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"},
             {"MT_DIST_FILE", "/shared/id"}, {"MASTER_ADDR", "ignored"}};
  parallel::World w = world_of(env);
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.local_rank, 1);  // LOCAL_RANK defaults to the rank
  EXPECT_EQ(w.id_file, "/shared/id");  // the file before TCP
  EXPECT_EQ(w.master_addr, "");
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  w = world_of(env);
  EXPECT_EQ(w.launcher, "Open MPI");
  EXPECT_EQ(w.size, 3);
  env.erase("OMPI_COMM_WORLD_RANK");
  w = world_of(env);
  EXPECT_EQ(w.launcher, "Slurm");
  EXPECT_EQ(w.size, 5);
}

TEST(WorldFromEnv, BadValuesAreClearErrors) {
  expect_error([] { world_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}); }, {"RANK='x1'", "not an integer"});
  expect_error([] { world_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}); },
               {"RANK=2", "WORLD_SIZE=2", "0 <= rank < world size"});
  expect_error([] { world_of({{"OMPI_COMM_WORLD_RANK", "0"}}); },
               {"OMPI_COMM_WORLD_RANK is set", "OMPI_COMM_WORLD_SIZE is not"});
  expect_error([] {
    world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"},
              {"MASTER_ADDR", "a"}});
  }, {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
  expect_error([] { world_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}); },
               {"SLURM_NTASKS=2", "neither MASTER_ADDR nor MT_DIST_FILE"});
  expect_error([] { world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"},
                              {"MASTER_PORT", "65535"}}); },
               {"port 65536", "MASTER_PORT + 1", "1..65535"});
  expect_error([] { world_of({{"MT_DIST_TIMEOUT", "0"}}); }, {"MT_DIST_TIMEOUT=0"});
  // One rank needs no rendezvous.
  EXPECT_EQ(world_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).size, 1);
}

// ---- the TCP rendezvous -------------------------------------------------------------------

TEST(TcpStore, EveryRankGetsEveryRanksValue) {
  const int port = free_port();
  constexpr int n = 3;
  std::vector<std::vector<std::string>> got(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 starts last
    parallel::TcpStore store("127.0.0.1", port, r, n, std::chrono::seconds(10));
    store.set("addr/" + std::to_string(r), std::string(size_t(100 + r), char('a' + r)));
    for (int k = 0; k < n; ++k) got[size_t(r)].push_back(store.get("addr/" + std::to_string(k)));
  });
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < n; ++k) EXPECT_EQ(got[size_t(r)][size_t(k)], std::string(size_t(100 + k), char('a' + k)));
}

TEST(TcpStore, AKeyNobodySetsTimesOutNamingIt) {
  const int port = free_port();
  parallel::TcpStore store("127.0.0.1", port, 0, 1, std::chrono::milliseconds(300));
  expect_error([&] { store.get("nccl-id"); }, {"rank 0", "waited 0.3 s", "'nccl-id'", "MT_DIST_TIMEOUT"});
}

TEST(TcpStore, NoRankZeroIsAClearErrorAfterTheTimeout) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 1, 2, std::chrono::milliseconds(300)); },
               {"rank 1", "cannot reach the TCP rendezvous (rank 0) at 127.0.0.1:" + std::to_string(port)});
  EXPECT_GE(seconds_since(t0), 0.3);  // a lower bound: a busy machine only makes it longer
}

TEST(TcpStore, ADeadRankZeroEndsTheWaitAtOnce) {
  const int port = free_port();
  std::string error;
  on_threads(2, [&](int r) {
    if (r == 0) {
      try {
        parallel::TcpStore store("127.0.0.1", port, 0, 2, std::chrono::seconds(30));
        store.set("ready", "1");
        store.get("ack");  // rank 1 is connected and waiting
        throw std::runtime_error("rank 0 fails");  // the store goes down with it
      } catch (const std::runtime_error&) {
      }
      return;
    }
    parallel::TcpStore store("127.0.0.1", port, 1, 2, std::chrono::seconds(30));
    EXPECT_EQ(store.get("ready"), "1");
    store.set("ack", "1");
    try {
      store.get("never");
    } catch (const parallel::DistError& e) {
      error = e.what();
    }
  });
  // The closed connection ended the wait, not the 30 s timeout ("waited 30 s for 'never'").
  EXPECT_NE(error.find("closed the connection while waiting for 'never'"), std::string::npos) << error;
}

TEST(TcpStore, ThePortMustBeFree) {
  const int port = free_port();
  parallel::TcpStore first("127.0.0.1", port, 0, 1, std::chrono::seconds(5));
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 0, 1, std::chrono::seconds(5)); },
               {"cannot listen on port " + std::to_string(port), "MT_DIST_PORT"});
}

// ---- the chunked collectives --------------------------------------------------------------

// reduce_scatter_sum leaves rank r's chunk r the sum; all_gather copies chunk r from rank r.
void expect_chunked_collectives(const std::vector<std::shared_ptr<parallel::Communicator>>& comms,
                                bool other_chunks_untouched) {
  const int n = int(comms.size());
  const int64_t chunk = 5;
  std::vector<Tensor> ts;
  for (int r = 0; r < n; ++r) ts.push_back(randn({chunk * n}, DType::f64));
  std::vector<std::vector<double>> before;
  for (auto& t : ts) before.push_back(t.to_vector());
  on_threads(n, [&](int r) { comms[size_t(r)]->reduce_scatter_sum(ts[size_t(r)]); });
  for (int r = 0; r < n; ++r) {
    const std::vector<double> after = ts[size_t(r)].to_vector();
    for (int64_t i = 0; i < chunk * n; ++i) {
      double sum = 0;
      for (int k = 0; k < n; ++k) sum += before[size_t(k)][size_t(i)];
      if (i / chunk == r) EXPECT_NEAR(after[size_t(i)], sum, 1e-12) << "rank " << r << " element " << i;
      else if (other_chunks_untouched) EXPECT_EQ(after[size_t(i)], before[size_t(r)][size_t(i)]);
    }
    EXPECT_EQ(comms[size_t(r)]->reduce_scatter_calls(), 1);
  }
  for (auto& t : ts) t.copy_(randn({chunk * n}, DType::f64));
  before.clear();
  for (auto& t : ts) before.push_back(t.to_vector());
  on_threads(n, [&](int r) { comms[size_t(r)]->all_gather(ts[size_t(r)]); });
  for (int r = 0; r < n; ++r) {
    const std::vector<double> after = ts[size_t(r)].to_vector();
    for (int64_t i = 0; i < chunk * n; ++i)
      EXPECT_EQ(after[size_t(i)], before[size_t(i / chunk)][size_t(i)]) << "rank " << r << " element " << i;
    EXPECT_EQ(comms[size_t(r)]->all_gather_calls(), 1);
  }
  if (n > 1)
    expect_error([&] { comms[0]->all_gather(zeros({chunk * n + 1}, DType::f32)); },
                 {"all_gather", "do not split into " + std::to_string(n) + " equal chunks"});
}

TEST(DistLocalGroup, ReduceScatterAndAllGather) {
  manual_seed(11);
  for (int n : {1, 2, 3}) expect_chunked_collectives(parallel::make_local_group(n), true);
}

// ---- Gloo, its ranks as threads over loopback ---------------------------------------------

#ifdef MT_WITH_GLOO
std::vector<std::shared_ptr<parallel::Communicator>> gloo_group(int n, std::chrono::milliseconds timeout) {
  const int port = free_port();
  std::vector<std::shared_ptr<parallel::Communicator>> comms(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    parallel::World w;
    w.rank = r, w.size = n, w.local_rank = r, w.local_size = n;
    w.master_addr = "127.0.0.1", w.store_port = port, w.timeout = timeout;
    comms[size_t(r)] = parallel::make_gloo_communicator(w);
  });
  return comms;
}
#endif

TEST(DistGloo, CollectivesOverTcp) {
#ifndef MT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#else
  manual_seed(12);
  for (int n : {1, 2, 3}) {
    auto comms = gloo_group(n, std::chrono::seconds(20));
    std::vector<Tensor> ts;
    for (int r = 0; r < n; ++r) ts.push_back(randn({37}, r % 2 ? DType::f32 : DType::f64).to(DType::f64));
    std::vector<std::vector<double>> before;
    for (auto& t : ts) before.push_back(t.to_vector());
    on_threads(n, [&](int r) { comms[size_t(r)]->all_reduce_sum(ts[size_t(r)]); });
    const std::vector<double> first = ts[0].to_vector();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ts[size_t(r)].to_vector(), first) << "rank " << r << ": every rank gets the same bits";
      for (size_t i = 0; i < first.size(); ++i) {
        double sum = 0;
        for (int k = 0; k < n; ++k) sum += before[size_t(k)][i];
        EXPECT_NEAR(first[i], sum, 1e-12);
      }
    }
    std::vector<Tensor> fs;
    for (int r = 0; r < n; ++r) fs.push_back(randn({9}, DType::f32));
    const std::vector<double> root = fs[size_t(n - 1)].to_vector();
    on_threads(n, [&](int r) {
      comms[size_t(r)]->broadcast(fs[size_t(r)], n - 1);
      comms[size_t(r)]->barrier();
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(fs[size_t(r)].to_vector(), root);
    expect_chunked_collectives(comms, false);
  }
#endif
}

TEST(DistGloo, ADeadPeerFailsTheOthersPromptly) {
#ifndef MT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#else
  auto comms = gloo_group(3, std::chrono::seconds(30));
  comms[2].reset();  // rank 2 goes away: its sockets close
  std::vector<std::string> errors(2);
  on_threads(2, [&](int r) {
    try {
      comms[size_t(r)]->all_reduce_sum(ones({1000}, DType::f32));
    } catch (const parallel::DistError& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[size_t(r)].find("rank " + std::to_string(r) + " of 3: Gloo all_reduce_sum"),
              std::string::npos) << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("a peer rank has probably died"), std::string::npos);
    // The closed sockets ended the wait, not the 30 s timeout (Gloo's "Read timeout", say).
    EXPECT_EQ(errors[size_t(r)].find("timeout"), std::string::npos) << errors[size_t(r)];
  }
  // Broken from then on.
  expect_error([&] { comms[0]->barrier(); }, {"rank 0 of 3", "barrier", "broken communicator"});
#endif
}
