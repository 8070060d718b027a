#include "parallel/store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/sha256.h"
#include "parallel/communicator.h"

namespace mt::parallel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[4] = {'M', 'T', 'S', '1'};
constexpr size_t kNonceBytes = 16;
constexpr size_t kHelloBytes = 4 + 32;  // the client's: rank, MAC

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

// n bytes, or false when the peer closed, an error occurred, or `deadline` passed.
bool recv_until(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd q{fd, POLLIN, 0};
    const int rc = ::poll(&q, 1, int(left.count()) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, in.data() + at, 4);
  return v;
}

// What a rank sends to prove it knows the secret: bound to this connection's nonce and its rank.
std::string hello_mac(const std::string& secret, const std::string& nonce, uint32_t rank) {
  std::string msg = "minitrain store" + nonce;
  put_u32(msg, rank);
  const Sha256Digest d = hmac_sha256(secret, msg);
  return {d.begin(), d.end()};
}

// Equal, in a time that does not depend on where the first difference is.
bool same_bytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string seconds(std::chrono::milliseconds t) { return detail::concat(double(t.count()) / 1000, " s"); }

}  // namespace

// Rank 0's server: one thread over the listening sockets and a non-blocking socket per peer.
struct TcpStore::Server {
  std::vector<int> listen_fds;
  int wake[2] = {-1, -1};  // a pipe: the destructor's "stop now"
  std::thread thread;
  std::atomic<bool> draining{false};  // the destructor waits for the ranks to leave
  Clock::time_point drain_deadline{};

  struct Conn {
    int fd = -1;
    uint64_t order = 0;  // accept order: the oldest pending one is pushed out first
    bool authed = false, closing = false, dead = false;
    std::string nonce, in, out;
    Clock::time_point hello_deadline;
  };

  // The thread has been joined.
  ~Server() {
    for (int fd : listen_fds) ::close(fd);
    for (int fd : {wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
  void stop_now() {
    if (wake[1] >= 0) ::close(wake[1]);
    wake[1] = -1;
  }

  void loop(int size, std::string secret, std::chrono::milliseconds hello_window) {
    std::map<std::string, std::string> values;
    size_t stored = 0;                                  // bytes of keys and values
    std::vector<std::pair<int, std::string>> waiting;  // (socket, key) of unanswered gets
    std::vector<Conn> conns;
    std::vector<bool> said_hello(size_t(size), false);
    uint64_t accepted = 0;
    std::random_device random;
    auto all_ranks_came = [&] { return std::all_of(said_hello.begin(), said_hello.end(), [](bool b) { return b; }); };

    // The messages of one authenticated rank in c.in; false on a malformed or oversized one.
    auto serve = [&](Conn& c) {
      for (;;) {
        if (c.in.size() < 5) return true;
        const char op = c.in[0];
        const size_t key_len = get_u32(c.in, 1);
        if ((op != 'S' && op != 'G') || key_len > kMaxKeyBytes) return false;
        if (op == 'G') {
          if (c.in.size() < 5 + key_len) return true;
          waiting.emplace_back(c.fd, c.in.substr(5, key_len));
          c.in.erase(0, 5 + key_len);
          continue;
        }
        if (c.in.size() < 9 + key_len) return true;
        const size_t value_len = get_u32(c.in, 5 + key_len);
        if (value_len > kMaxValueBytes) return false;
        if (c.in.size() < 9 + key_len + value_len) return true;
        std::string key = c.in.substr(5, key_len), value = c.in.substr(9 + key_len, value_len);
        c.in.erase(0, 9 + key_len + value_len);
        auto it = values.find(key);
        const size_t before = it == values.end() ? 0 : it->first.size() + it->second.size();
        if (stored - before + key.size() + value.size() > kMaxStoreBytes) return false;
        stored = stored - before + key.size() + value.size();
        values[std::move(key)] = std::move(value);
      }
    };
    // The client's hello in c.in: accepted ('A') or turned away ('R', then closed).
    auto check_hello = [&](Conn& c) {
      if (c.in.size() < kHelloBytes) return;
      const uint32_t rank = get_u32(c.in, 0);
      const bool ok = rank < uint32_t(size) && same_bytes(c.in.substr(4, 32), hello_mac(secret, c.nonce, rank));
      c.in.erase(0, kHelloBytes);
      c.out += ok ? 'A' : 'R';
      if (!ok) {
        c.closing = true;
        c.in.clear();
        return;
      }
      c.authed = true;
      said_hello[rank] = true;
      if (!serve(c)) c.dead = true;
    };

    for (;;) {
      const bool any_authed = std::any_of(conns.begin(), conns.end(), [](const Conn& c) { return c.authed; });
      if (draining && all_ranks_came() && !any_authed) break;
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}};
      for (int l : listen_fds) fds.push_back({l, POLLIN, 0});
      for (const Conn& c : conns) fds.push_back({c.fd, short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) break;
      if (fds[0].revents != 0) break;  // stop now
      const auto now = Clock::now();
      if (draining && now > drain_deadline) break;
      const size_t first_conn = 1 + listen_fds.size();
      for (size_t i = 0; i < conns.size(); ++i) {  // before accepting: fds[] is in this order
        Conn& c = conns[i];
        const short ev = fds[first_conn + i].revents;
        if (ev & (POLLIN | POLLHUP | POLLERR)) {
          char buf[65536];
          const ssize_t k = ::recv(c.fd, buf, sizeof buf, 0);
          if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
            c.dead = true;  // closed (done, or died)
          } else if (k > 0 && !c.closing) {
            c.in.append(buf, size_t(k));
            if (!c.authed) check_hello(c);
            else if (!serve(c)) c.dead = true;
          }
        }
        if (!c.dead && !c.out.empty() && (ev & POLLOUT)) {
          const ssize_t k = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (k > 0) c.out.erase(0, size_t(k));
          else if (k < 0 && errno != EAGAIN && errno != EINTR) c.dead = true;
        }
        if (c.closing && c.out.empty()) c.dead = true;
        if (!c.authed && now > c.hello_deadline) c.dead = true;
      }
      for (size_t l = 0; l < listen_fds.size(); ++l) {
        if (!(fds[1 + l].revents & POLLIN)) continue;
        for (;;) {
          const int fd = ::accept4(listen_fds[l], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          size_t pending = 0;
          Conn* oldest = nullptr;
          for (Conn& c : conns)
            if (!c.authed && !c.dead) {
              ++pending;
              if (oldest == nullptr || c.order < oldest->order) oldest = &c;
            }
          if (pending >= kMaxPending) oldest->dead = true;
          Conn c;
          c.fd = fd;
          c.order = accepted++;
          for (size_t i = 0; i < kNonceBytes; ++i) c.nonce += char(random() & 0xff);
          c.out.assign(kMagic, 4);
          c.out += c.nonce;
          c.hello_deadline = now + hello_window;
          conns.push_back(std::move(c));
        }
      }
      // Answer the gets whose key is there now.
      std::erase_if(waiting, [&](const auto& w) {
        auto it = values.find(w.second);
        if (it == values.end()) return false;
        for (Conn& c : conns)
          if (c.fd == w.first) {
            put_u32(c.out, uint32_t(it->second.size()));
            c.out += it->second;
          }
        return true;
      });
      for (const Conn& c : conns)
        if (c.dead) {
          ::close(c.fd);
          std::erase_if(waiting, [&](const auto& w) { return w.first == c.fd; });
        }
      std::erase_if(conns, [](const Conn& c) { return c.dead; });
    }
    for (const Conn& c : conns) ::close(c.fd);
  }
};

namespace {

// Listening sockets on every address `bind_host` resolves to ("*": every interface), or a
// DistError naming the port and why.
std::vector<int> listen_on(const std::string& bind_host, int port, int backlog) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const bool any = bind_host == "*";
  const int rc = ::getaddrinfo(any ? nullptr : bind_host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    throw DistError(detail::concat("rank 0: the TCP rendezvous cannot listen at '", bind_host,
                                   "': ", ::gai_strerror(rc), " (MASTER_ADDR, or MT_DIST_BIND, must "
                                   "name an address of rank 0's machine)"));
  std::vector<int> fds;
  std::string why;
  bool in_use = false;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // Each family its own socket: "::" must not take IPv4's port too.
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, backlog) == 0 &&
        ::fcntl(fd, F_SETFL, O_NONBLOCK) == 0) {
      fds.push_back(fd);
      continue;
    }
    in_use = in_use || errno == EADDRINUSE;
    if (why.empty() || errno == EADDRINUSE) why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (fds.empty() || in_use) {
    for (int fd : fds) ::close(fd);
    throw DistError(detail::concat("rank 0: the TCP rendezvous cannot listen on port ", port,
                                   any ? "" : " at " + bind_host, ": ", why,
                                   in_use ? " (set MT_DIST_PORT to a free port, the same on every rank)"
                                          : " (MASTER_ADDR must be an address of rank 0's machine; "
                                            "MT_DIST_BIND sets another, '*' for every interface)"));
  }
  return fds;
}

// A connected socket to one of `host`'s addresses, or -1 with `why` set. Bounded by `deadline`.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = ::gai_strerror(rc);
    return -1;
  }
  int out = -1;
  for (addrinfo* ai = res; ai != nullptr && out < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {  // a remote host may not answer at all: wait no longer than the deadline
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd q{fd, POLLOUT, 0};
      socklen_t len = sizeof err;
      if (::poll(&q, 1, std::max(1, int(left.count()))) == 1) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      else err = ETIMEDOUT;
    }
    if (err == 0 && ::fcntl(fd, F_SETFL, 0) == 0) {
      out = fd;
    } else {
      why = std::strerror(err);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, int rank, int size,
                   std::chrono::milliseconds timeout, const std::string& secret,
                   const std::string& bind_host)
    : host_(host), port_(port), rank_(rank), size_(size), timeout_(timeout) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "TcpStore: rank ", rank, " of ", size);
  MT_CHECK(port >= 1 && port <= 65535, "TcpStore: port ", port, " is not in 1..65535");
  MT_CHECK(secret.size() >= 16, "TcpStore: the job's secret has ", secret.size(),
           " characters; it needs at least 16 (MT_DIST_SECRET)");
  const auto deadline = Clock::now() + timeout;
  const auto hello_window = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(kHelloSeconds));
  if (rank == 0) {
    server_ = std::make_unique<Server>();
    Server& s = *server_;
    s.listen_fds = listen_on(bind_host.empty() ? host : bind_host, port, SOMAXCONN);
    MT_CHECK(::pipe2(s.wake, O_CLOEXEC) == 0, "TcpStore: pipe: ", std::strerror(errno));
    s.thread = std::thread([&s, size, secret, hello_window] { s.loop(size, secret, hello_window); });
  }
  auto fail = [&](const std::string& message) {
    if (server_) {
      server_->stop_now();
      server_->thread.join();
    }
    throw DistError(message);
  };
  // Connect and say hello, retrying: rank 0 may not be listening yet, and a crowd of strangers
  // may push this connection out before its hello.
  std::string why;
  for (;;) {
    const int fd = connect_once(host, port, deadline, why);
    if (fd >= 0) {
      const auto hello_deadline = std::min(deadline, Clock::now() + hello_window);
      char greeting[4 + kNonceBytes], answer = 0;
      if (!recv_until(fd, greeting, sizeof greeting, hello_deadline)) {
        why = "the connection closed before the rendezvous said hello";
      } else if (std::memcmp(greeting, kMagic, 4) != 0) {
        why = "something else listens there (not minitrain's rendezvous)";
      } else {
        std::string hello;
        put_u32(hello, uint32_t(rank));
        hello += hello_mac(secret, std::string(greeting + 4, kNonceBytes), uint32_t(rank));
        if (send_all(fd, hello.data(), hello.size()) && recv_until(fd, &answer, 1, hello_deadline)) {
          if (answer == 'A') {
            fd_ = fd;
            break;
          }
          ::close(fd);
          fail(detail::concat("rank ", rank, ": the TCP rendezvous at ", address(), " turned this "
                              "rank away: its MT_DIST_SECRET is not rank 0's (every rank of a job "
                              "needs the same secret)"));
        }
        why = "the rendezvous did not answer this rank's hello";
      }
      ::close(fd);
    }
    if (Clock::now() > deadline)
      fail(detail::concat("rank ", rank, ": cannot reach the TCP rendezvous (rank 0) at ", address(),
                          " within ", seconds(timeout), ": ", why,
                          " (is rank 0 running, with the same MASTER_ADDR and port?)"));
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
  MT_CHECK(key.size() <= kMaxKeyBytes && value.size() <= kMaxValueBytes, "TcpStore::set('", key.substr(0, 64),
           "'): a key is at most ", kMaxKeyBytes, " bytes and a value ", kMaxValueBytes, ", got ",
           key.size(), " and ", value.size());
  std::string msg(1, 'S');
  put_u32(msg, uint32_t(key.size()));
  msg += key;
  put_u32(msg, uint32_t(value.size()));
  msg += value;
  if (!send_all(fd_, msg.data(), msg.size()))
    throw DistError(detail::concat("rank ", rank_, ": the TCP rendezvous at ", address(),
                                   " closed the connection while setting '", key,
                                   "' (rank 0 has probably died)"));
}

std::string TcpStore::get(const std::string& key) {
  MT_CHECK(key.size() <= kMaxKeyBytes, "TcpStore::get: a key is at most ", kMaxKeyBytes, " bytes, got ", key.size());
  auto lost = [&] {
    return DistError(detail::concat("rank ", rank_, ": the TCP rendezvous at ", address(),
                                    " closed the connection while waiting for '", key,
                                    "' (rank 0 has probably died)"));
  };
  std::string msg(1, 'G');
  put_u32(msg, uint32_t(key.size()));
  msg += key;
  if (!send_all(fd_, msg.data(), msg.size())) throw lost();
  pollfd p{fd_, POLLIN, 0};
  int rc = 0;
  do rc = ::poll(&p, 1, int(timeout_.count()));
  while (rc < 0 && errno == EINTR);
  if (rc == 0)
    throw DistError(detail::concat("rank ", rank_, ": waited ", seconds(timeout_), " at the TCP "
                                   "rendezvous ", address(), " for '", key, "': a rank has "
                                   "probably died or not started (MT_DIST_TIMEOUT sets the wait)"));
  // The value follows at once: the server sends each reply whole.
  const auto deadline = Clock::now() + timeout_;
  uint32_t n = 0;
  if (rc < 0 || !recv_until(fd_, &n, 4, deadline) || n > kMaxValueBytes) throw lost();
  std::string value(n, '\0');
  if (!recv_until(fd_, value.data(), n, deadline)) throw lost();
  return value;
}

}  // namespace mt::parallel
