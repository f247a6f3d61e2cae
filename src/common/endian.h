// Little-endian fixed-width integers inside byte strings (on-disk records).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cistern {

// Writes `v` at `out[off, off + sizeof(T))`; the caller sized `out`.
template <typename T>
void putLE(std::string& out, size_t off, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[off + i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}

// Appends `v` to `out`.
template <typename T>
void appendLE(std::string& out, T v) {
  size_t off = out.size();
  out.resize(off + sizeof(T));
  putLE<T>(out, off, v);
}

// Reads a T at `in[off, off + sizeof(T))`; the caller checked the size.
template <typename T>
T getLE(std::string_view in, size_t off) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[off + i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace cistern
