// Fuzzes the RPC frame decoder: arbitrary bytes as a header, and a decoded
// header's message bytes as a protobuf request. Must never crash, read out of
// bounds or accept lengths over the limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/crc32c.h"
#include "net/frame.h"
#include "test_rpc.pb.h"

using namespace cistern;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  net::FrameLimits limits{.message_bytes_max = 1 << 16, .payload_bytes_max = 1 << 20};
  if (size < net::kHeaderSize) {
    auto h = net::decodeHeader(std::span<const uint8_t>(data, size), limits);
    if (h.ok()) std::abort();  // a short header can never decode
    return 0;
  }
  // Fix up magic, version and header CRC half the time so the fuzzer reaches
  // the field checks behind them, not just the checksum.
  uint8_t hdr[net::kHeaderSize];
  std::memcpy(hdr, data, net::kHeaderSize);
  if (data[0] & 1) {
    uint32_t magic = net::kFrameMagic;
    std::memcpy(hdr, &magic, 4);
    hdr[4] = net::kFrameVersion;
    uint32_t crc = crc32c(hdr, 48);
    std::memcpy(hdr + 48, &crc, 4);
  }
  auto h = net::decodeHeader(hdr, limits);
  if (!h.ok()) return 0;
  if (h->message_len > limits.message_bytes_max || h->payload_len > limits.payload_bytes_max)
    std::abort();
  // Re-encoding a decoded header gives back the same bytes.
  uint8_t again[net::kHeaderSize];
  net::encodeHeader(*h, again);
  if (std::memcmp(again, hdr, net::kHeaderSize) != 0) std::abort();
  const uint8_t* body = data + net::kHeaderSize;
  size_t body_len = size - net::kHeaderSize;
  size_t msg_len = std::min<size_t>(h->message_len, body_len);
  test::EchoRequest req;
  (void)req.ParseFromArray(body, static_cast<int>(msg_len));
  return 0;
}
