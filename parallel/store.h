#pragma once
// TcpStore: the TCP rendezvous. Rank 0 serves a small key-value store; every rank (rank 0 too)
// connects to it, sets keys and waits for the keys of others. It carries what the ranks must
// exchange before a communicator exists: NCCL's 128-byte unique id (rank 0 sets it, the others
// get it), or the CPU backend's listening addresses (every rank sets its own, then gets all).
//
// Protocol, one TCP connection per rank, each message whole:
//   set:  'S' u32 key_len key u32 value_len value     (no reply)
//   get:  'G' u32 key_len key                          reply u32 value_len value, sent as soon as
//                                                      some rank has set the key
// The server is a thread of rank 0 that poll()s its sockets; a get waits on the server, not in a
// loop of retries.
//
// No hanging forever: connecting retries until `timeout` (rank 0 may start last) and then fails
// naming the address; a get that gets no answer within `timeout` fails naming the key; a server
// that goes away (rank 0 died) fails the get at once. Rank 0's destructor keeps the server up
// until every rank has connected and closed again, bounded by `timeout` (and not at all when it
// runs during an exception), so a slow rank still finds the values it needs.
#include <chrono>
#include <memory>
#include <string>

namespace mt::parallel {

class TcpStore {
 public:
  // Rank 0 listens on `port` on every interface, then every rank connects to host:port.
  TcpStore(const std::string& host, int port, int rank, int size, std::chrono::milliseconds timeout);
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
