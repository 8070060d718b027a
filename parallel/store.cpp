#include "parallel/store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <thread>
#include <vector>

#include "parallel/communicator.h"

namespace mt::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Whole buffers over a blocking socket; false when the peer closed it or an error occurred.
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

bool send_string(int fd, const std::string& s) {
  const uint32_t n = uint32_t(s.size());
  return send_all(fd, &n, sizeof n) && send_all(fd, s.data(), s.size());
}

bool recv_string(int fd, std::string& s) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, sizeof n)) return false;
  s.resize(n);
  return recv_all(fd, s.data(), n);
}

std::string seconds(std::chrono::milliseconds t) { return detail::concat(double(t.count()) / 1000, " s"); }

}  // namespace

// Rank 0's server: a thread over the listening socket and one socket per rank.
struct TcpStore::Server {
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe: the destructor's "stop now"
  std::thread thread;
  std::atomic<bool> draining{false};  // the destructor waits for the ranks to leave
  Clock::time_point drain_deadline{};

  // The thread has been joined.
  ~Server() {
    for (int fd : {listen_fd, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
  void stop_now() {
    if (wake[1] >= 0) ::close(wake[1]);
    wake[1] = -1;
  }

  void loop(int size) {
    std::map<std::string, std::string> values;
    std::vector<std::pair<int, std::string>> waiting;  // (socket, key) of unanswered gets
    std::vector<int> clients;
    int connected = 0;
    for (;;) {
      if (draining && connected == size && clients.empty()) break;
      std::vector<pollfd> fds{{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (int c : clients) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) break;
      if (fds[1].revents != 0) break;  // stop now
      if (draining && Clock::now() > drain_deadline) break;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept(listen_fd, nullptr, nullptr);
        if (c >= 0) {
          clients.push_back(c);
          ++connected;
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const int c = fds[i].fd;
        char op = 0;
        std::string key, value;
        bool ok = recv_all(c, &op, 1) && recv_string(c, key);
        if (ok && op == 'S') {
          ok = recv_string(c, value);
          if (ok) values[key] = value;
        } else if (ok && op == 'G') {
          waiting.emplace_back(c, key);
        } else {
          ok = false;
        }
        if (!ok) {  // closed (done, or died) or garbage: forget it
          ::close(c);
          std::erase(clients, c);
          std::erase_if(waiting, [c](const auto& w) { return w.first == c; });
        }
      }
      // Answer the gets whose key is there now. A send that fails: that rank is gone, and its
      // socket reports the close at the next poll.
      std::erase_if(waiting, [&](const auto& w) {
        auto it = values.find(w.second);
        if (it == values.end()) return false;
        send_string(w.first, it->second);
        return true;
      });
    }
    for (int c : clients) ::close(c);
  }
};

TcpStore::TcpStore(const std::string& host, int port, int rank, int size,
                   std::chrono::milliseconds timeout)
    : host_(host), port_(port), rank_(rank), size_(size), timeout_(timeout) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "TcpStore: rank ", rank, " of ", size);
  MT_CHECK(port >= 1 && port <= 65535, "TcpStore: port ", port, " is not in 1..65535");
  const auto deadline = Clock::now() + timeout;
  if (rank == 0) {
    server_ = std::make_unique<Server>();
    Server& s = *server_;
    // IPv6 on every interface takes IPv4 too (dual stack); a kernel without IPv6 gets IPv4 only.
    sockaddr_in6 a6{};
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons(uint16_t(port));
    sockaddr_in a4{};
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons(uint16_t(port));
    s.listen_fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    const bool v6 = s.listen_fd >= 0;
    if (!v6) s.listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1, zero = 0;
    ::setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) ::setsockopt(s.listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    const sockaddr* addr = v6 ? reinterpret_cast<const sockaddr*>(&a6) : reinterpret_cast<const sockaddr*>(&a4);
    const socklen_t addr_len = v6 ? sizeof a6 : sizeof a4;
    if (s.listen_fd < 0 || ::bind(s.listen_fd, addr, addr_len) != 0 ||
        ::listen(s.listen_fd, size + 16) != 0) {
      const std::string why = std::strerror(errno);
      throw DistError(detail::concat("rank 0: the TCP rendezvous cannot listen on port ", port, ": ",
                                     why, " (set MT_DIST_PORT to a free port, the same on every rank)"));
    }
    MT_CHECK(::pipe(s.wake) == 0, "TcpStore: pipe: ", std::strerror(errno));
    s.thread = std::thread([&s, size] { s.loop(size); });
  }
  // Connect, retrying: rank 0 may not be listening yet.
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string why;
  for (;;) {
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc == 0) {
      for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) fd_ = fd;
        else why = std::strerror(errno), ::close(fd);
      }
      ::freeaddrinfo(res);
    } else {
      why = ::gai_strerror(rc);
    }
    if (fd_ >= 0) break;
    if (Clock::now() > deadline) {
      if (server_) {
        server_->stop_now();
        server_->thread.join();
      }
      throw DistError(detail::concat("rank ", rank, ": cannot reach the TCP rendezvous (rank 0) at ",
                                     address(), " within ", seconds(timeout), ": ", why,
                                     " (is rank 0 running, with the same MASTER_ADDR and port?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  if (!server_) return;
  Server& s = *server_;
  s.drain_deadline = Clock::now() + timeout_;
  s.draining = true;
  if (std::uncaught_exceptions() > 0) s.stop_now();  // failing: nobody should wait for us
  s.thread.join();
}

void TcpStore::set(const std::string& key, const std::string& value) {
  const char op = 'S';
  if (!(send_all(fd_, &op, 1) && send_string(fd_, key) && send_string(fd_, value)))
    throw DistError(detail::concat("rank ", rank_, ": the TCP rendezvous at ", address(),
                                   " closed the connection while setting '", key,
                                   "' (rank 0 has probably died)"));
}

std::string TcpStore::get(const std::string& key) {
  const char op = 'G';
  auto lost = [&] {
    return DistError(detail::concat("rank ", rank_, ": the TCP rendezvous at ", address(),
                                    " closed the connection while waiting for '", key,
                                    "' (rank 0 has probably died)"));
  };
  if (!(send_all(fd_, &op, 1) && send_string(fd_, key))) throw lost();
  pollfd p{fd_, POLLIN, 0};
  int rc = 0;
  do rc = ::poll(&p, 1, int(timeout_.count()));
  while (rc < 0 && errno == EINTR);
  if (rc == 0)
    throw DistError(detail::concat("rank ", rank_, ": waited ", seconds(timeout_), " at the TCP "
                                   "rendezvous ", address(), " for '", key, "': a rank has "
                                   "probably died or not started (MT_DIST_TIMEOUT sets the wait)"));
  std::string value;
  if (rc < 0 || !recv_string(fd_, value)) throw lost();
  return value;
}

}  // namespace mt::parallel
