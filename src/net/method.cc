#include "net/method.h"

#include <google/protobuf/descriptor.h>

#include "common/assert.h"
#include "rpc_options.pb.h"

namespace cistern::net {

Method Method::of(std::string_view full_name) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const auto* m = pool->FindMethodByName(std::string(full_name));
  CISTERN_CHECK(m != nullptr, full_name);
  const auto* svc = m->service();
  uint32_t service_id = svc->options().GetExtension(cistern::service_id);
  CISTERN_CHECK(service_id != 0 && service_id <= 0xFFFF, "service without (cistern.service_id)");
  Method out;
  out.id = (service_id << 16) | static_cast<uint32_t>(m->index() + 1);
  out.name = std::string(full_name);
  out.input = m->input_type();
  out.output = m->output_type();
  return out;
}

}  // namespace cistern::net
