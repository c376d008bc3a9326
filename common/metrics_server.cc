#include "common/metrics_server.h"

#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "common/http_listener.h"

namespace lazykv {
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    std::shared_ptr<prometheus::Registry> registry,
                                                                    const ServerSecurityOptions& security,
                                                                    const CallAuthorizer* authorizer) {
  if (address.empty()) return nullptr;
  auto listener = HttpListener::Create("--metrics-listen", address, security);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<MetricsServer> metrics(new MetricsServer());
  metrics->listener_ = *std::move(listener);
  httplib::Server& server = metrics->listener_->server();
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_keep_alive_timeout(5);
  server.set_payload_max_length(4096);
  server.Get("/metrics", [registry, authorizer](const httplib::Request& request, httplib::Response& response) {
    if (authorizer != nullptr && authorizer->enabled()) {
      const absl::StatusOr<Principal> caller =
          authorizer->AuthorizeHttpHeader(request.get_header_value("Authorization"), Role::kAdmin);
      if (!caller.ok()) {
        const bool denied = caller.status().code() == absl::StatusCode::kPermissionDenied;
        response.status = denied ? 403 : 401;
        if (!denied) response.set_header("WWW-Authenticate", "Bearer realm=\"lazykv\"");
        response.set_content(absl::StrCat(caller.status().message(), "\n"), "text/plain");
        return;
      }
    }
    response.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  if (absl::Status started = metrics->listener_->Start(); !started.ok()) return started;
  return metrics;
}

int MetricsServer::port() const { return listener_->port(); }

MetricsServer::~MetricsServer() = default;

}  // namespace lazykv
