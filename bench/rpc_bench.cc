// bench/run rpc — RPC throughput next to a raw TCP socket on loopback.
//
// Figures:
//   rpc_empty_calls_per_s    empty Echo calls/s, 64 in flight on one connection
//   rpc_1mib_gbps            GB/s of 1 MiB request payloads, 8 in flight
//   tcp_1mib_gbps            GB/s of the same bytes over one plain TCP socket
//   rpc_1mib_vs_tcp          median over 5 alternating rounds of rpc/tcp (x)
//   rpc_sync_calls_per_s     empty Echo calls/s by 8 threads each blocking in callSync()
//   tcp_pingpong_per_s       64-byte round trips/s by 8 threads on blocking sockets to
//                            one epoll thread echoing them: the floor of a blocking call
//   rpc_sync_vs_tcp_pingpong median over 5 alternating rounds of the two (x)
//   rpc_bench_peak_rss_mib   peak RSS of the process (server + client)
// Server and client each get one I/O thread, the TCP baseline one sender and
// one receiver thread: two busy threads on each side of the comparison.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/log.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "test_rpc.pb.h"

using namespace cistern;
using namespace cistern::net;

namespace {

constexpr size_t kMiB = 1 << 20;

double seconds(int argc, char** argv) { return argc > 1 ? std::atof(argv[1]) : 5.0; }

// Runs `inflight` coroutines that each call until `secs` pass; returns calls done.
uint64_t drive(RpcClient& client, const Endpoint& ep, const Method& m, int inflight, double secs,
               std::span<const uint8_t> payload) {
  asio::io_context io;
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < inflight; ++i) {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          test::EchoRequest req;
          test::EchoResponse resp;
          while (bench::secondsSince(t0) < secs) {
            Status s = co_await client.call(ep, m, req, &resp, {.request_payload = payload});
            if (!s.ok()) {
              std::fprintf(stderr, "rpc bench: call failed: %s\n", s.toString().c_str());
              failed = true;
              co_return;
            }
            done++;
          }
        },
        asio::detached);
  }
  io.run();
  if (failed) std::exit(1);
  return done.load();
}

// A socket listening on a free loopback port; `*addr` gets its address.
int listenLoopback(int backlog, sockaddr_in* addr) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr*>(addr), sizeof *addr);
  listen(lfd, backlog);
  socklen_t len = sizeof *addr;
  getsockname(lfd, reinterpret_cast<sockaddr*>(addr), &len);
  return lfd;
}

double tcpBaselineGBps(double secs) {
  sockaddr_in addr;
  int lfd = listenLoopback(1, &addr);
  std::atomic<uint64_t> received{0};
  std::thread receiver([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::vector<uint8_t> buf(kMiB);
    while (true) {
      ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      received += static_cast<uint64_t>(n);
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> block(kMiB, 0x5a);
  auto t0 = std::chrono::steady_clock::now();
  while (bench::secondsSince(t0) < secs) {
    size_t off = 0;
    while (off < block.size()) {
      ssize_t n = send(fd, block.data() + off, block.size() - off, 0);
      if (n <= 0) std::exit(1);
      off += static_cast<size_t>(n);
    }
  }
  shutdown(fd, SHUT_WR);
  receiver.join();
  double took = bench::secondsSince(t0);
  close(fd);
  close(lfd);
  return static_cast<double>(received.load()) / took / 1e9;
}

constexpr int kSyncThreads = 8;

// Calls/s of `kSyncThreads` threads each calling callSync() in a loop.
double syncCallsPerS(RpcClient& client, const Endpoint& ep, const Method& m, double secs) {
  std::atomic<uint64_t> done{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kSyncThreads; ++t) {
    threads.emplace_back([&] {
      test::EchoRequest req;
      test::EchoResponse resp;
      uint64_t n = 0;
      while (bench::secondsSince(t0) < secs) {
        Status s = client.callSync(ep, m, req, &resp);
        if (!s.ok()) {
          std::fprintf(stderr, "rpc bench: sync call failed: %s\n", s.toString().c_str());
          std::exit(1);
        }
        ++n;
      }
      done += n;
    });
  }
  for (auto& t : threads) t.join();
  return static_cast<double>(done.load()) / bench::secondsSince(t0);
}

// The same shape on bare sockets: `kSyncThreads` threads send 64 bytes and
// block in recv for the echo, which one epoll thread sends back.
double tcpPingPongPerS(double secs) {
  sockaddr_in addr;
  int lfd = listenLoopback(kSyncThreads, &addr);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    std::vector<int> fds;
    for (int i = 0; i < kSyncThreads; ++i) {
      int fd = accept(lfd, nullptr, nullptr);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.fd = fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
      fds.push_back(fd);
    }
    epoll_event ready[kSyncThreads];
    char buf[64];
    while (!stop) {
      int n = epoll_wait(ep, ready, kSyncThreads, 50);
      for (int i = 0; i < n; ++i) {
        ssize_t got = recv(ready[i].data.fd, buf, sizeof buf, 0);
        if (got > 0) send(ready[i].data.fd, buf, static_cast<size_t>(got), MSG_NOSIGNAL);
      }
    }
    for (int fd : fds) close(fd);
    close(ep);
  });
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> clients;
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kSyncThreads; ++t) {
    clients.emplace_back([&] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char buf[64] = {};
      uint64_t n = 0;
      while (bench::secondsSince(t0) < secs) {
        if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) != sizeof buf) std::exit(1);
        for (size_t got = 0; got < sizeof buf;) {
          ssize_t k = recv(fd, buf + got, sizeof buf - got, 0);
          if (k <= 0) std::exit(1);
          got += static_cast<size_t>(k);
        }
        ++n;
      }
      done += n;
      close(fd);
    });
  }
  for (auto& c : clients) c.join();
  double rate = static_cast<double>(done.load()) / bench::secondsSince(t0);
  stop = true;
  server.join();
  close(lfd);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  double secs = seconds(argc, argv);
  Method echo = Method::of("cistern.test.EchoService.Echo");
  RpcServer server(ServerOptions{.threads = 1});
  server.handle<test::EchoRequest, test::EchoResponse>(
      echo,
      [](CallContext&, const test::EchoRequest&, test::EchoResponse&) -> asio::awaitable<Status> {
        co_return Status::OK();
      });
  if (Status s = server.start(); !s.ok()) {
    std::fprintf(stderr, "rpc bench: %s\n", s.toString().c_str());
    return 1;
  }
  RpcClient client(ClientOptions{.threads = 1, .payload_crc = getenv("NOCRC") == nullptr});
  Endpoint ep = server.endpoint();

  drive(client, ep, echo, 16, 0.3, {});  // warm up
  auto t0 = std::chrono::steady_clock::now();
  uint64_t calls = drive(client, ep, echo, 64, secs, {});
  double calls_per_s = static_cast<double>(calls) / bench::secondsSince(t0);

  // RPC and raw TCP run in alternating rounds, so that load from other tenants
  // of the machine hits both alike; the figure is the median round ratio.
  std::vector<uint8_t> payload(kMiB, 0xa5);
  drive(client, ep, echo, 8, 0.3, payload);
  constexpr int kRounds = 5;
  std::vector<double> ratios;
  double rpc_total = 0, tcp_total = 0;
  for (int round = 0; round < kRounds; ++round) {
    t0 = std::chrono::steady_clock::now();
    uint64_t big = drive(client, ep, echo, 8, secs / kRounds, payload);
    double rpc = static_cast<double>(big * kMiB) / bench::secondsSince(t0) / 1e9;
    double tcp = tcpBaselineGBps(secs / kRounds);
    std::printf("round %d: rpc %.2f GB/s, tcp %.2f GB/s, ratio %.3f\n", round, rpc, tcp, rpc / tcp);
    ratios.push_back(rpc / tcp);
    rpc_total += rpc;
    tcp_total += tcp;
  }
  bench::rounds("rpc_1mib_vs_tcp", ratios);
  std::sort(ratios.begin(), ratios.end());

  // Blocking round trips: what a FUSE thread or a metadata caller pays.
  std::vector<double> sync_ratios;
  double sync_total = 0, pingpong_total = 0;
  syncCallsPerS(client, ep, echo, 0.3);  // warm up
  for (int round = 0; round < kRounds; ++round) {
    double sync = syncCallsPerS(client, ep, echo, secs / kRounds);
    double pingpong = tcpPingPongPerS(secs / kRounds);
    std::printf("round %d: sync calls %.0f/s, tcp ping-pong %.0f/s, ratio %.3f\n", round, sync,
                pingpong, sync / pingpong);
    sync_ratios.push_back(sync / pingpong);
    sync_total += sync;
    pingpong_total += pingpong;
  }
  bench::rounds("rpc_sync_vs_tcp_pingpong", sync_ratios);
  std::sort(sync_ratios.begin(), sync_ratios.end());
  double rpc_gbps = rpc_total / kRounds, tcp_gbps = tcp_total / kRounds;
  double ratio = ratios[kRounds / 2];

  std::printf("rpc: %.0f empty calls/s; 1 MiB payloads %.2f GB/s; raw TCP %.2f GB/s\n", calls_per_s,
              rpc_gbps, tcp_gbps);
  bench::figure("rpc_empty_calls_per_s", calls_per_s, "calls/s");
  bench::figure("rpc_1mib_gbps", rpc_gbps, "GB/s");
  bench::figure("tcp_1mib_gbps", tcp_gbps, "GB/s");
  bench::figure("rpc_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  bench::figure("rpc_1mib_vs_tcp", ratio, "x");
  bench::figure("rpc_sync_calls_per_s", sync_total / kRounds, "calls/s");
  bench::figure("tcp_pingpong_per_s", pingpong_total / kRounds, "round trips/s");
  bench::figure("rpc_sync_vs_tcp_pingpong", sync_ratios[kRounds / 2], "x");
  return 0;
}
