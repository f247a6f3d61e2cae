// Fuzzes the token parser (auth/token.h): any text either verifies under
// the fixed key (only if it is that key's signature) or is refused with one
// of the token codes; any body either decodes and encodes back to the same
// bytes or is kTokenInvalid. Nothing crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "auth/token.h"

using namespace cistern;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auth::Keyring keys =
      *auth::Keyring::parse("7 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto t = keys.verify(in, 1'000'000);
  if (!t.ok()) {
    const ErrorCode c = t.status().code();
    if (c != ErrorCode::kTokenMissing && c != ErrorCode::kTokenInvalid &&
        c != ErrorCode::kTokenExpired && c != ErrorCode::kTokenRevoked)
      std::abort();
  }
  auto body = auth::decodeBody(in);
  if (body.ok()) {
    if (auth::encodeBody(*body) != in) std::abort();
  } else if (body.status().code() != ErrorCode::kTokenInvalid) {
    std::abort();
  }
  return 0;
}
