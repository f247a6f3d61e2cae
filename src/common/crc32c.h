// CRC32C (Castagnoli), the checksum of frames, chunks and pack indexes.
// Backed by ISA-L's crc32_iscsi, which uses the SSE4.2 crc32 instruction.
// crc32c("123456789") == 0xE3069283. Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace cistern {

// Extends `crc` (the value returned for the preceding bytes; 0 to start) with
// `n` more bytes, so crc32c(a+b) == crc32cExtend(crc32c(a), b).
uint32_t crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32cExtend(0, data, n); }
inline uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }
inline uint32_t crc32c(std::span<const uint8_t> s) { return crc32c(s.data(), s.size()); }

}  // namespace cistern
