#include "common/crc32c.h"

#include <isa-l/crc.h>

#include <climits>

namespace cistern {

uint32_t crc32cExtend(uint32_t crc, const void* data, size_t n) {
  // crc32_iscsi keeps the register un-inverted; the standard CRC32C pre- and
  // post-inverts, which we do here so values match every other implementation.
  uint32_t reg = ~crc;
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    int len = n > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(n);
    reg = crc32_iscsi(const_cast<unsigned char*>(p), len, reg);
    p += len;
    n -= static_cast<size_t>(len);
  }
  return ~reg;
}

}  // namespace cistern
