// The file types of meta::FileType and the S_IF* type bits of st_mode, in
// one place for everyone who turns one into the other (the client's stat,
// the FUSE mount, the CLI's listing).
#pragma once

#include <sys/stat.h>

#include <cstdint>

#include "meta.pb.h"

namespace cistern::meta {

// The largest size a file may have: chunk indexes are 32 bits and the
// smallest chunk is 64 KiB, so every layout reaches 2^48 bytes (256 TiB).
// A truncate or write past it fails with EFBIG (ext4 with 4 KiB blocks
// stops at 16 TiB).
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 48;

// The S_IF* bits of `t`; 0 for FILE_TYPE_UNSPECIFIED or an unknown value.
inline uint32_t typeBits(FileType t) {
  switch (t) {
    case REGULAR:
      return S_IFREG;
    case DIRECTORY:
      return S_IFDIR;
    case SYMLINK:
      return S_IFLNK;
    case FIFO:
      return S_IFIFO;
    case SOCKET:
      return S_IFSOCK;
    case CHAR_DEVICE:
      return S_IFCHR;
    case BLOCK_DEVICE:
      return S_IFBLK;
    default:
      return 0;
  }
}

// The type of a mode's S_IF* bits; FILE_TYPE_UNSPECIFIED when they name none.
inline FileType typeOfMode(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return REGULAR;
    case S_IFDIR:
      return DIRECTORY;
    case S_IFLNK:
      return SYMLINK;
    case S_IFIFO:
      return FIFO;
    case S_IFSOCK:
      return SOCKET;
    case S_IFCHR:
      return CHAR_DEVICE;
    case S_IFBLK:
      return BLOCK_DEVICE;
    default:
      return FILE_TYPE_UNSPECIFIED;
  }
}

// FIFOs, sockets and devices: nodes whose data the kernel moves, not cistern.
inline bool isSpecial(FileType t) {
  return t == FIFO || t == SOCKET || t == CHAR_DEVICE || t == BLOCK_DEVICE;
}

}  // namespace cistern::meta
