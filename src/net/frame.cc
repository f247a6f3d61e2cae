#include "net/frame.h"

#include <fmt/format.h>

#include <cstring>

#include "common/crc32c.h"

namespace cistern::net {
namespace {

template <typename T>
void put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <typename T>
T get(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

Status bad(std::string_view why) { return Status(ErrorCode::kBadFrame, why); }

}  // namespace

void encodeHeader(const FrameHeader& h, uint8_t out[kHeaderSize]) {
  put<uint32_t>(out + 0, kFrameMagic);
  put<uint8_t>(out + 4, kFrameVersion);
  put<uint8_t>(out + 5, h.flags);
  put<uint16_t>(out + 6, h.status);
  put<uint64_t>(out + 8, h.request_id);
  put<uint32_t>(out + 16, h.method);
  put<uint32_t>(out + 20, h.deadline_ms);
  put<uint64_t>(out + 24, h.tenant_token);
  put<uint32_t>(out + 32, h.message_len);
  put<uint32_t>(out + 36, h.payload_len);
  put<uint32_t>(out + 40, h.body_crc);
  put<uint8_t>(out + 44, h.priority);
  put<uint16_t>(out + 45, h.credential_len);
  out[47] = 0;
  put<uint32_t>(out + 48, crc32c(out, 48));
}

Result<FrameHeader> decodeHeader(std::span<const uint8_t> bytes, const FrameLimits& limits) {
  if (bytes.size() != kHeaderSize) return bad("short header");
  const uint8_t* p = bytes.data();
  if (get<uint32_t>(p) != kFrameMagic) return bad("bad magic");
  if (p[4] != kFrameVersion) return bad(fmt::format("unsupported frame version {}", p[4]));
  if (get<uint32_t>(p + 48) != crc32c(p, 48)) return bad("header checksum mismatch");
  if (p[47] != 0) return bad("reserved byte is not zero");
  FrameHeader h;
  h.flags = p[5];
  if (h.flags & ~kKnownFlags) return bad(fmt::format("unknown flags {:#x}", h.flags));
  h.status = get<uint16_t>(p + 6);
  if (!isKnownErrorCode(h.status)) return bad(fmt::format("unknown status code {}", h.status));
  if (h.status != 0 && !h.isResponse()) return bad("status set on a request");
  h.request_id = get<uint64_t>(p + 8);
  h.method = get<uint32_t>(p + 16);
  h.deadline_ms = get<uint32_t>(p + 20);
  h.tenant_token = get<uint64_t>(p + 24);
  h.message_len = get<uint32_t>(p + 32);
  h.payload_len = get<uint32_t>(p + 36);
  h.body_crc = get<uint32_t>(p + 40);
  h.priority = p[44];
  h.credential_len = get<uint16_t>(p + 45);
  if (h.credential_len > 0) {
    if (h.isResponse()) return bad("credential on a response");
    if (h.credential_len > kCredentialBytesMax) {
      return bad(
          fmt::format("credential of {} bytes exceeds {}", h.credential_len, kCredentialBytesMax));
    }
    if (h.credential_len > h.message_len) {
      return bad(fmt::format("credential of {} bytes in a message section of {}", h.credential_len,
                             h.message_len));
    }
  }
  if (h.message_len > limits.message_bytes_max) {
    return bad(
        fmt::format("message of {} bytes exceeds {}", h.message_len, limits.message_bytes_max));
  }
  if (h.payload_len > limits.payload_bytes_max) {
    return bad(
        fmt::format("payload of {} bytes exceeds {}", h.payload_len, limits.payload_bytes_max));
  }
  return h;
}

}  // namespace cistern::net
