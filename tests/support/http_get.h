// Test support: a plain HTTP/1.0 GET on 127.0.0.1 (for /metrics and /healthz).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace cistern::testing {

// GET path from 127.0.0.1:port; returns the body ("" when unreachable).
inline std::string httpGet(int port, const std::string& path) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(s, req.data(), req.size());
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = read(s, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(s);
  size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace cistern::testing
