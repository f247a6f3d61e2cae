// The RPC frame: a fixed 52-byte little-endian header, a protobuf message and
// an optional raw payload (docs/rpc_frame.md).
//
//   off size field
//    0   4  magic          0x4E545343 ("CSTN")
//    4   1  version        1
//    5   1  flags          bit0 response, bit1 payload covered by body_crc
//    6   2  status         ErrorCode of a response (0 for requests)
//    8   8  request_id     chosen by the client, echoed by the server
//   16   4  method         (service_id << 16) | method index + 1
//   20   4  deadline_ms    time the caller still waits; 0 = none
//   24   8  tenant_token   opaque tenant credential handle; 0 = none
//   32   4  message_len    bytes of the protobuf message (or error text)
//   36   4  payload_len    bytes of raw payload after the message
//   40   4  body_crc       CRC32C of message (+ payload when flag bit1)
//   44   1  priority       QoS class
//   45   2  credential_len bytes of the caller's credential that open the
//                          message section (requests only; 0 = none)
//   47   1  reserved       zero
//   48   4  header_crc     CRC32C of bytes 0..47
//
// A request's message section is its credential (a token or capability,
// docs/security.md) followed by the protobuf message; message_len counts both
// and body_crc covers both.
// decodeHeader() is total: any input of kHeaderSize bytes yields a header or
// kBadFrame with the reason; lengths are checked against the limits before
// anything is allocated. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/result.h"

namespace cistern::net {

inline constexpr uint32_t kFrameMagic = 0x4E545343;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kHeaderSize = 52;

inline constexpr uint8_t kFlagResponse = 1 << 0;
inline constexpr uint8_t kFlagPayloadCrc = 1 << 1;
inline constexpr uint8_t kKnownFlags = kFlagResponse | kFlagPayloadCrc;
// Longest credential a frame may carry (a token's text is at most 512).
inline constexpr uint16_t kCredentialBytesMax = 1024;

struct FrameHeader {
  uint8_t flags = 0;
  uint16_t status = 0;
  uint64_t request_id = 0;
  uint32_t method = 0;
  uint32_t deadline_ms = 0;
  uint64_t tenant_token = 0;
  uint32_t message_len = 0;
  uint32_t payload_len = 0;
  uint32_t body_crc = 0;
  uint8_t priority = 0;
  uint16_t credential_len = 0;

  bool isResponse() const { return flags & kFlagResponse; }
  bool payloadChecksummed() const { return flags & kFlagPayloadCrc; }
};

struct FrameLimits {
  // Largest protobuf message accepted. Default: 4 MiB.
  uint32_t message_bytes_max = 4u << 20;
  // Largest raw payload accepted. Default: 65 MiB (a 64 MiB chunk plus slack).
  uint32_t payload_bytes_max = 65u << 20;
};

void encodeHeader(const FrameHeader& h, uint8_t out[kHeaderSize]);
Result<FrameHeader> decodeHeader(std::span<const uint8_t> bytes, const FrameLimits& limits);

}  // namespace cistern::net
