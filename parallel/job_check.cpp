#include "parallel/job_check.h"

#include <cstdint>
#include <cstring>

#include "core/sha256.h"

namespace mt::parallel {
namespace {

// Key and value, each NUL-terminated: no two lists of entries share a serialization.
std::string serialize(const JobEntries& entries) {
  std::string s;
  for (const auto& [key, value] : entries) (s += key) += '\0', (s += value) += '\0';
  return s;
}

JobEntries deserialize(const std::string& s) {
  JobEntries out;
  size_t at = 0;
  auto next = [&] {
    const size_t end = s.find('\0', at);
    std::string field = s.substr(at, end - at);
    at = end + 1;
    return field;
  };
  while (at < s.size()) {
    std::string key = next();
    out.emplace_back(std::move(key), next());
  }
  return out;
}

// A collective's result, read on the host. An asynchronous backend (NCCL on its own stream) has
// only enqueued it: wait() makes the copy to the host wait for it.
std::vector<double> host_values(Communicator& comm, const Tensor& t) {
  comm.wait();
  return t.to(kCPU).to_vector();
}

// Every rank's `mine` (exact small integers), gathered: element r is rank r's.
std::vector<double> gather(Communicator& comm, double mine, Device device) {
  std::vector<double> all(size_t(comm.size()), 0.0);
  all[size_t(comm.rank())] = mine;
  Tensor t = from_vector(all, {int64_t(all.size())}, DType::f64, device);
  comm.all_gather(t);
  return host_values(comm, t);
}

std::string quoted(const std::string& s) { return s.size() > 200 ? s.substr(0, 200) + "..." : s; }

}  // namespace

void check_same_job(Communicator& comm, const JobEntries& entries, Device device) {
  const int rank = comm.rank(), size = comm.size();
  if (size == 1) return;
  const std::string mine = serialize(entries);
  // The digest's first 64 bits as four 16-bit integers: exact in f64, whatever the backend does.
  const Sha256Digest d = sha256(mine);
  std::vector<double> digest(size_t(4 * size), 0.0);
  for (int i = 0; i < 4; ++i) digest[size_t(4 * rank + i)] = double(d[size_t(2 * i)] << 8 | d[size_t(2 * i + 1)]);
  Tensor t = from_vector(digest, {int64_t(digest.size())}, DType::f64, device);
  comm.all_gather(t);
  const std::vector<double> all = host_values(comm, t);
  bool same = true;
  for (int r = 1; r < size; ++r)
    for (int i = 0; i < 4; ++i) same = same && all[size_t(4 * r + i)] == all[size_t(i)];
  if (same) return;

  // Rank 0's entries, to every rank: their length, then their bytes, one per element.
  Tensor length = from_vector(std::vector<double>{double(mine.size())}, {1}, DType::f64, device);
  comm.broadcast(length, 0);
  const size_t n = size_t(host_values(comm, length)[0]);
  std::vector<double> bytes(n, 0.0);
  if (rank == 0)
    for (size_t i = 0; i < n; ++i) bytes[i] = double(static_cast<unsigned char>(mine[i]));
  Tensor b = from_vector(bytes, {int64_t(n)}, DType::f64, device);
  if (n > 0) comm.broadcast(b, 0);
  std::string text(n, '\0');
  const std::vector<double> got = host_values(comm, b);
  for (size_t i = 0; i < n; ++i) text[i] = char(static_cast<unsigned char>(got[i]));
  const JobEntries theirs = deserialize(text);

  // This rank's first difference from rank 0 (-1: none), then everyone's.
  size_t first = 0;
  while (first < entries.size() && first < theirs.size() && entries[first] == theirs[first]) ++first;
  const bool differs = first < entries.size() || first < theirs.size();
  const std::vector<double> where = gather(comm, differs ? double(first) : -1.0, device);
  int culprit = -1;
  for (int r = 1; r < size && culprit < 0; ++r)
    if (where[size_t(r)] >= 0) culprit = r;
  const std::string advice = " (the first key that differs; every rank must run the same config and model)";
  if (culprit < 0)  // the digests differ but not the entries: cannot happen short of a broken backend
    throw DistError(detail::concat("rank ", rank, ": the ranks of this job differ, but no entry does"));
  if (rank == culprit) {
    if (first >= theirs.size())
      throw DistError(detail::concat("rank ", rank, ": the ranks of this job differ: '", entries[first].first,
                                     "' is here but not on rank 0", advice));
    if (first >= entries.size())
      throw DistError(detail::concat("rank ", rank, ": the ranks of this job differ: '", theirs[first].first,
                                     "' is on rank 0 but not here", advice));
    if (entries[first].first != theirs[first].first)
      throw DistError(detail::concat("rank ", rank, ": the ranks of this job differ: '", entries[first].first,
                                     "' is here where rank 0 has '", theirs[first].first, "'", advice));
    throw DistError(detail::concat("rank ", rank, ": the ranks of this job differ: '", entries[first].first,
                                   "' is ", quoted(entries[first].second), " here but ",
                                   quoted(theirs[first].second), " on rank 0", advice));
  }
  const size_t at = size_t(where[size_t(culprit)]);
  throw DistError(detail::concat(
      "rank ", rank, ": the ranks of this job differ: rank ", culprit, " differs from rank 0 first at ",
      at < theirs.size() ? detail::concat("'", theirs[at].first, "' (", quoted(theirs[at].second), " on rank 0)")
                         : detail::concat("an entry rank 0 does not have, after its last, '",
                                          theirs.empty() ? "" : theirs.back().first, "'"),
      advice));
}

}  // namespace mt::parallel
