// MetricsHttp: serves the process's metrics registry as Prometheus text at
// GET /metrics (and a one-line GET /healthz) on its own thread.
#pragma once

#include <memory>
#include <string>

#include "common/result.h"

namespace cistern::server {

class MetricsHttp {
 public:
  // Listens on host:port (port 0: a free one). kIOError if it cannot bind.
  static Result<std::unique_ptr<MetricsHttp>> start(const std::string& host, uint16_t port);
  ~MetricsHttp();
  uint16_t port() const;

 private:
  struct Impl;
  explicit MetricsHttp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::server
