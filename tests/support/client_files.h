// Test support: files written and read through libcistern with
// deterministic contents (byte i of a file with `seed` depends on both).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cistern/client.h"
#include "common/crc32c.h"

namespace cistern::testing {

// The contents of bytes [offset, offset + n) of a file with `seed`. Every
// bit of the seed changes them (seeds 1, 2 and 3 used to give the same
// bytes: the seed only reached bits that the shifts drop).
inline void fill(uint8_t* p, size_t n, uint64_t offset, uint64_t seed) {
  const uint64_t base = seed * 0xD6E8FEB86659FD93ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = (offset + i + base) * 0x9E3779B97F4A7C15ull;
    p[i] = static_cast<uint8_t>((x >> 29) ^ (x >> 47));
  }
}

// `n` bytes of (seed) contents.
inline std::vector<uint8_t> bytesOf(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  fill(v.data(), n, 0, seed);
  return v;
}

// Writes `size` bytes of (seed) contents in `block` writes; returns their CRC.
inline uint32_t writeFile(Client& c, const std::string& path, uint64_t size, uint64_t seed,
                          size_t block = 4 << 20) {
  std::unique_ptr<File> f;
  Error e = c.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
  EXPECT_FALSE(e) << e.message;
  if (e) return 0;
  std::vector<uint8_t> buf(block);
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size; off += block) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(block, size - off)), done = 0;
    fill(buf.data(), n, off, seed);
    crc = crc32cExtend(crc, buf.data(), n);
    e = f->pwrite(buf.data(), n, off, &done);
    EXPECT_FALSE(e) << e.message;
    EXPECT_EQ(done, n);
  }
  e = f->close();
  EXPECT_FALSE(e) << e.message;
  return crc;
}

// Reads the whole file in `block` reads; returns its CRC and size.
inline std::pair<uint32_t, uint64_t> readFile(Client& c, const std::string& path,
                                              size_t block = 4 << 20) {
  std::unique_ptr<File> f;
  Error e = c.open(path, O_RDONLY, 0, &f);
  EXPECT_FALSE(e) << e.message;
  if (e) return {0, 0};
  std::vector<uint8_t> buf(block);
  uint32_t crc = 0;
  uint64_t off = 0;
  for (;;) {
    size_t got = 0;
    e = f->pread(buf.data(), block, off, &got);
    EXPECT_FALSE(e) << e.message;
    if (e || got == 0) break;
    crc = crc32cExtend(crc, buf.data(), got);
    off += got;
  }
  EXPECT_FALSE(f->close());
  return {crc, off};
}

// The file's bytes (its length from stat), read in `step`-byte reads from
// the start (0: one read).
inline std::vector<uint8_t> readAll(Client& c, const std::string& path, size_t step = 0) {
  FileInfo info;
  EXPECT_FALSE(c.stat(path, &info));
  std::vector<uint8_t> out(info.size);
  std::unique_ptr<File> f;
  EXPECT_FALSE(c.open(path, O_RDONLY, 0, &f));
  if (!f) return {};
  if (step == 0) step = std::max<size_t>(out.size(), 1);
  for (size_t off = 0; off < out.size(); off += step) {
    size_t n = std::min(step, out.size() - off), got = 0;
    Error e = f->pread(out.data() + off, n, off, &got);
    EXPECT_FALSE(e) << e.message;
    EXPECT_EQ(got, n);
  }
  EXPECT_FALSE(f->close());
  return out;
}

// Writes `buf` at 0, its size, twice its size, ... `writes` times or until a
// write fails, then fsyncs if none did; returns the first error (none: all
// of it was taken).
inline Error firstWriteError(File& f, const std::vector<uint8_t>& buf, int writes) {
  Error failed;
  size_t done = 0;
  for (int i = 0; i < writes && !failed; ++i)
    failed = f.pwrite(buf.data(), buf.size(), static_cast<uint64_t>(i) * buf.size(), &done);
  if (!failed) failed = f.fsync();
  return failed;
}

}  // namespace cistern::testing
