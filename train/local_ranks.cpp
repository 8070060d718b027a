// run_local_ranks: a data-parallel job as threads of one process, on the CPU (train/trainer.h).
#include <exception>
#include <thread>

#include "core/error.h"
#include "parallel/communicator.h"
#include "train/trainer.h"

namespace mt::train {

LocalRun run_local_ranks(int nproc, const MakeRank& make_rank, std::chrono::milliseconds timeout) {
  auto group = parallel::make_local_group(nproc, timeout);
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < nproc; ++r) trainers.push_back(make_rank(group[size_t(r)]));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(nproc));
  RunSummary summary;
  std::vector<std::thread> threads;
  threads.reserve(size_t(nproc));
  for (int r = 0; r < nproc; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          RunSummary s = trainers[size_t(r)]->run();
          if (r == 0) summary = s;
        } catch (const std::exception& e) {
          errors[size_t(r)] = std::current_exception();
          group[size_t(r)]->abort(e.what());
        }
      });
    } catch (const std::exception& e) {
      // No thread for rank r (the process's thread limit, memory): the started ranks would wait
      // for it at their first collective, and a joinable std::thread destroyed by this exception
      // would terminate the process. Stop them, then say why.
      const std::string why = detail::concat("rank ", r, " of ", nproc, ": cannot start its thread: ", e.what());
      group[size_t(r)]->abort(why);
      for (std::thread& t : threads) t.join();
      throw Error(why);
    }
  }
  for (std::thread& t : threads) t.join();
  // The rank that failed first threw its own error; the others, DistErrors about it.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const parallel::DistError&) {
      if (!first) first = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
  return {std::move(trainers), summary};
}

}  // namespace mt::train
