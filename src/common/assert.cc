#include "common/assert.h"

#include <cstdio>
#include <cstdlib>

namespace cistern {

void assertFailed(const char* file, int line, std::string_view expr, std::string_view message) {
  // Write straight to stderr: the logger may be the thing that is broken.
  std::fprintf(stderr, "cistern: assertion failed at %s:%d: %.*s%s%.*s\n", file, line,
               static_cast<int>(expr.size()), expr.data(), message.empty() ? "" : " — ",
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cistern
