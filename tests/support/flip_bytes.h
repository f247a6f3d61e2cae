// Bit rot for tests: flips a byte every 4 KiB of a stopped storage target's
// data files, so that every chunk it holds fails verification.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace cistern::testing {

// Returns the bytes flipped (0 when the target has no data files).
inline int flipBytesEvery4K(const std::string& target_dir) {
  int flipped = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(target_dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".dat") continue;
    const int fd = ::open(e.path().c_str(), O_RDWR);
    EXPECT_GE(fd, 0) << e.path();
    if (fd < 0) continue;
    for (off_t at = 100; at < static_cast<off_t>(e.file_size()); at += 4096) {
      uint8_t b = 0;
      if (::pread(fd, &b, 1, at) != 1) break;
      b ^= 0x5a;
      EXPECT_EQ(::pwrite(fd, &b, 1, at), 1) << e.path();
      ++flipped;
    }
    ::close(fd);
  }
  return flipped;
}

}  // namespace cistern::testing
