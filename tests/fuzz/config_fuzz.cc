// Fuzzes the TOML config loader with a binder of every field type. Any input
// is either loaded or rejected with kConfigInvalid; nothing crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config.h"

using namespace cistern;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool b = false;
  int64_t i64 = 0;
  int32_t i32 = 0;
  uint64_t u64 = 0;
  uint32_t u32 = 0;
  double d = 0;
  std::string s;
  std::vector<std::string> v;
  ConfigBinder binder;
  binder.bind("a.b", &b, "");
  binder.bind("a.i64", &i64, "");
  binder.bind("i32", &i32, "");
  binder.bind("u64", &u64, "");
  binder.bind("x.y.u32", &u32, "");
  binder.bind("d", &d, "");
  binder.bind("s", &s, "");
  binder.bind("v", &v, "");
  Status st =
      binder.loadString(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!st.ok() && st.code() != ErrorCode::kConfigInvalid) std::abort();
  return 0;
}
