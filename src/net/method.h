// An RPC method, named by its protobuf full name ("cistern.test.EchoService.Echo").
//
// Services are declared in src/proto/*.proto with `option (cistern.service_id)`;
// a method's wire id is (service_id << 16) | (index + 1). Method::of() looks
// the name up in the generated descriptor pool once; keep the result in a
// static. Request and response types are checked when a handler is
// registered or a call is made, so a mismatch is caught at the first use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace google::protobuf {
class Descriptor;
}

namespace cistern::net {

struct Method {
  uint32_t id = 0;
  std::string name;  // full name, for logs and metrics
  const google::protobuf::Descriptor* input = nullptr;
  const google::protobuf::Descriptor* output = nullptr;

  // Aborts when the method or its service_id option is missing (a programming error).
  static Method of(std::string_view full_name);
};

}  // namespace cistern::net
