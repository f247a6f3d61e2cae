#include "server/metrics_http.h"

#include <fmt/format.h>
#include <httplib.h>

#include <thread>

#include "common/metrics.h"

namespace cistern::server {

struct MetricsHttp::Impl {
  httplib::Server http;
  int port = 0;
  std::thread thread;
};

MetricsHttp::MetricsHttp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttp::~MetricsHttp() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t MetricsHttp::port() const { return static_cast<uint16_t>(impl_->port); }

Result<std::unique_ptr<MetricsHttp>> MetricsHttp::start(const std::string& host, uint16_t port) {
  auto impl = std::make_unique<Impl>();
  impl->http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  impl->http.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics::Registry::global().renderPrometheus(),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  impl->http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  if (port == 0) {
    impl->port = impl->http.bind_to_any_port(host);
  } else {
    impl->port = impl->http.bind_to_port(host, port) ? port : -1;
  }
  if (impl->port <= 0)
    return Status(ErrorCode::kIOError, fmt::format("metrics: cannot listen on {}:{}", host, port));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->http.listen_after_bind(); });
  return std::unique_ptr<MetricsHttp>(new MetricsHttp(std::move(impl)));
}

}  // namespace cistern::server
