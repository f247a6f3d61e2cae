#include "net/frame.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/crc32c.h"
#include "net/endpoint.h"

namespace cistern::net {
namespace {

FrameHeader sample() {
  FrameHeader h;
  h.flags = kFlagResponse | kFlagPayloadCrc;
  h.status = static_cast<uint16_t>(ErrorCode::kNotFound);
  h.request_id = 0x0102030405060708ull;
  h.method = 0xFF010001;
  h.deadline_ms = 1234;
  h.tenant_token = 99;
  h.message_len = 10;
  h.payload_len = 4096;
  h.body_crc = 0xdeadbeef;
  h.priority = 3;
  return h;
}

TEST(Frame, HeaderRoundTripsAndIsLittleEndian) {
  uint8_t buf[kHeaderSize];
  encodeHeader(sample(), buf);
  EXPECT_EQ(buf[0], 'C');
  EXPECT_EQ(buf[3], 'N');
  EXPECT_EQ(buf[8], 0x08);  // request id, least significant byte first
  auto h = decodeHeader(buf, {});
  ASSERT_TRUE(h.ok()) << h.status().toString();
  EXPECT_EQ(h->request_id, sample().request_id);
  EXPECT_EQ(h->method, sample().method);
  EXPECT_EQ(h->status, sample().status);
  EXPECT_EQ(h->payload_len, 4096u);
  EXPECT_EQ(h->body_crc, 0xdeadbeefu);
  EXPECT_EQ(h->priority, 3);
  EXPECT_TRUE(h->isResponse());
  EXPECT_TRUE(h->payloadChecksummed());

  FrameHeader req = sample();
  req.flags = 0;
  req.status = 0;
  req.credential_len = 300;
  req.message_len = 310;
  encodeHeader(req, buf);
  EXPECT_EQ(buf[45], 300 & 0xFF);
  EXPECT_EQ(buf[46], 300 >> 8);
  auto r = decodeHeader(buf, {});
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->credential_len, 300);
}

// Re-seals a modified header so that only the field under test is wrong.
void reseal(uint8_t* buf) {
  uint32_t crc = crc32c(buf, 48);
  std::memcpy(buf + 48, &crc, 4);
}

void expectRejected(uint8_t* buf, const char* why, FrameLimits limits = {}) {
  auto h = decodeHeader(std::span<const uint8_t>(buf, kHeaderSize), limits);
  ASSERT_FALSE(h.ok()) << why;
  EXPECT_EQ(h.code(), ErrorCode::kBadFrame);
  EXPECT_NE(h.status().message().find(why), std::string::npos) << h.status().toString();
}

TEST(Frame, RejectsEveryMalformedHeader) {
  uint8_t buf[kHeaderSize];
  encodeHeader(sample(), buf);
  buf[0] ^= 1;
  expectRejected(buf, "bad magic");

  encodeHeader(sample(), buf);
  buf[4] = 2;
  reseal(buf);
  expectRejected(buf, "unsupported frame version");

  encodeHeader(sample(), buf);
  buf[20] ^= 1;  // any flipped bit is caught by the header checksum
  expectRejected(buf, "header checksum mismatch");

  encodeHeader(sample(), buf);
  buf[47] = 1;
  reseal(buf);
  expectRejected(buf, "reserved");

  encodeHeader(sample(), buf);
  buf[5] = 0x80;
  reseal(buf);
  expectRejected(buf, "unknown flags");

  FrameHeader h = sample();
  h.status = 9999;
  encodeHeader(h, buf);
  expectRejected(buf, "unknown status");

  h = sample();
  h.flags = 0;
  encodeHeader(h, buf);
  expectRejected(buf, "status set on a request");

  h = sample();
  h.message_len = 0xFFFFFFFF;
  encodeHeader(h, buf);
  expectRejected(buf, "message of 4294967295 bytes exceeds");

  h = sample();
  h.payload_len = 2000;
  encodeHeader(h, buf);
  expectRejected(buf, "payload of 2000 bytes exceeds", FrameLimits{.payload_bytes_max = 1000});

  h = sample();
  h.credential_len = 5;  // a response carries none
  encodeHeader(h, buf);
  expectRejected(buf, "credential on a response");

  h = sample();
  h.flags = 0;
  h.status = 0;
  h.message_len = 4000;
  h.credential_len = kCredentialBytesMax + 1;
  encodeHeader(h, buf);
  expectRejected(buf, "credential of 1025 bytes exceeds 1024");

  h.credential_len = 11;  // more than the message section
  h.message_len = 10;
  encodeHeader(h, buf);
  expectRejected(buf, "credential of 11 bytes in a message section of 10");

  auto shortHeader = decodeHeader(std::span<const uint8_t>(buf, 10), {});
  EXPECT_EQ(shortHeader.code(), ErrorCode::kBadFrame);
}

TEST(Endpoint, ParsesAndRejects) {
  auto e = Endpoint::parse("127.0.0.1:9000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 9000);
  EXPECT_EQ(e->toString(), "127.0.0.1:9000");
  auto v6 = Endpoint::parse("[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->toString(), "[::1]:80");
  for (const char* bad : {"nohost", ":80", "h:", "h:x1", "h:70000", "h:-1"}) {
    auto r = Endpoint::parse(bad);
    EXPECT_EQ(r.code(), ErrorCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace cistern::net
