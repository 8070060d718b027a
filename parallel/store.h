#pragma once
// TcpStore: the TCP rendezvous. Rank 0 serves a small key-value store; every rank (rank 0 too)
// connects to it, sets keys and waits for the keys of others. It carries what the ranks must
// exchange before a communicator exists: NCCL's 128-byte unique id (rank 0 sets it, the others
// get it), or the CPU backend's listening addresses (every rank sets its own, then gets all).
//
// Protocol, one TCP connection per rank:
//   hello:  server → 'MTS1' + 16-byte nonce;  client → u32 rank + HMAC-SHA256(secret, "minitrain
//           store" + nonce + rank), 32 bytes;  server → 'A' (accepted) or 'R' (wrong secret)
//   set:    'S' u32 key_len key u32 value_len value     (no reply)
//   get:    'G' u32 key_len key                         reply u32 value_len value, sent as soon as
//                                                       some rank has set the key
// Only a peer that knows the job's secret (MT_DIST_SECRET, parallel/launch.h) gets past the hello;
// the secret itself never crosses the wire.
//
// Anyone on the network can connect, so the server trusts nothing it has not authenticated:
//   - every length is bounded before anything is allocated (a key kMaxKeyBytes, a value
//     kMaxValueBytes, all values kMaxStoreBytes): a larger one closes that connection;
//   - a connection that has not completed its hello within kHelloSeconds (or the timeout, if
//     shorter) is closed, and at most kMaxPending connections wait for their hello at once (a new
//     one pushes out the oldest: a real rank answers within a round trip);
//   - the server is one thread that poll()s non-blocking sockets and keeps a buffer per
//     connection, so a peer that sends half a message, or nothing, holds up no one else;
//   - it listens only on the addresses MASTER_ADDR resolves to (MT_DIST_BIND overrides that).
//
// No hanging forever: connecting retries until `timeout` (rank 0 may start last) and then fails
// naming the address; a get that gets no answer within `timeout` fails naming the key; a server
// that goes away (rank 0 died) fails the get at once. Rank 0's destructor keeps the server up
// until every rank has said hello and closed again, bounded by `timeout` (and not at all when it
// runs during an exception), so a slow rank still finds the values it needs.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace mt::parallel {

class TcpStore {
 public:
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxValueBytes = size_t(1) << 20;
  static constexpr size_t kMaxStoreBytes = size_t(64) << 20;
  static constexpr int kHelloSeconds = 5;
  static constexpr size_t kMaxPending = 64;

  // Rank 0 listens on `port` at `bind_host` ("" means `host`: every address it resolves to; "*"
  // every interface), then every rank connects to host:port. `secret` is the job's (at least 16
  // characters): a peer that does not prove it knows it is turned away.
  TcpStore(const std::string& host, int port, int rank, int size, std::chrono::milliseconds timeout,
           const std::string& secret, const std::string& bind_host = "");
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // The value some rank set for `key`, once it has (DistError past the timeout).
  std::string get(const std::string& key);

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  struct Server;

 private:
  std::string host_;
  int port_, rank_, size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;  // rank 0
  int fd_ = -1;                     // this rank's connection to the server
};

}  // namespace mt::parallel
