// Short-circuit reads (docs/client.md, "Short-circuit reads"): a client on
// its storage servers' host reads chunk bytes from their group files itself.
//
// The server's Locate says where a chunk range lies (the group file by path,
// st_dev and st_ino, the chunk's offset in it) and the CRC32C of each 4 KiB
// block the range touches, as of that call. This reader opens the file
// (O_DIRECT where it can), reads the blocks and verifies each against those
// CRCs: a slot the server handed out again after the Locate holds other
// bytes, which fail the check, and the caller then reads through the
// server. The server copies nothing and the bytes cross no socket and no
// shared memory: with the caller's window in 2 MiB pages they go from the
// disk straight to it.
//
// Only a client that can open the server's files (the server's user, or
// root) in the same mount namespace gets this: a file it cannot open, or
// one that is not the file the server named, makes the caller stop asking
// that server (refuse()).
//
// Bounds: at most `files_max` descriptors are kept open (least recently
// used closed first); a thread that reads unaligned ranges keeps one buffer
// of 1 MiB and a block. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "net/endpoint.h"

namespace cistern::storage {
class LocatedRange;
}

namespace cistern::client {

class ShortCircuit {
 public:
  explicit ShortCircuit(size_t files_max = 64);
  ~ShortCircuit();
  ShortCircuit(const ShortCircuit&) = delete;
  ShortCircuit& operator=(const ShortCircuit&) = delete;

  // Whether `server` refused (another host, off) or its files cannot be
  // read from here.
  bool refused(const net::Endpoint& server) const;
  void refuse(const net::Endpoint& server);
  // Whether any server refused.
  bool anyRefused() const;

  // Reads chunk bytes [offset, offset + n) that `loc` (a Locate's answer
  // for that range) describes into `out`; `*got` is the count (short at
  // the chunk's end). kNotSupported: the file cannot be used from here
  // (cannot be opened, or is another file than the server's): refuse the
  // server. kCorruption: a block disagrees with its CRC (the slot changed
  // since the Locate, or the disk is bad: ask the server, which tells).
  Status read(const storage::LocatedRange& loc, uint64_t offset, uint32_t n, uint8_t* out,
              size_t* got);

 private:
  struct Fd;
  std::shared_ptr<Fd> open(const storage::LocatedRange& loc, Status* s);

  const size_t files_max_;
  mutable std::mutex mu_;
  std::set<std::string> refused_;  // endpoints, as text
  std::list<std::string> lru_;     // paths, most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<Fd>, std::list<std::string>::iterator>>
      files_;
};

}  // namespace cistern::client
