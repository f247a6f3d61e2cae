// Chunk identity, size classes and the chunk metadata record (docs/chunk_format.md).
//
// A chunk is (inode, index). Its bytes live in one fixed-size slot of a group
// file of its size class; its metadata record says where, how long, which
// versions, and the CRC32C of the last partial block (the full blocks' CRCs
// are in the slot's CRC area). Records are stored in the target's
// RocksDB under the chunk id; decodeChunkMeta() is total and fuzzed
// (tests/fuzz/chunk_meta_fuzz.cc). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace cistern::storage {

// Size classes: 64 KiB << c for c in [0, kClassCount).
inline constexpr uint32_t kClassCount = 11;
inline constexpr uint64_t kMinChunkBytes = 64 * 1024;
inline constexpr uint64_t kMaxChunkBytes = kMinChunkBytes << (kClassCount - 1);  // 64 MiB

inline constexpr uint64_t classBytes(uint32_t c) { return kMinChunkBytes << c; }

// Every full 4 KiB block of a chunk has a CRC32C in the CRC area that follows
// the data in its slot; a slot is the class size plus that area, rounded up to
// whole blocks, so every slot and every block starts 4 KiB-aligned.
inline constexpr uint64_t kBlockBytes = 4096;
inline constexpr uint64_t crcAreaBytes(uint32_t c) {
  return (classBytes(c) / kBlockBytes * 4 + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
}
inline constexpr uint64_t slotStride(uint32_t c) { return classBytes(c) + crcAreaBytes(c); }
// The smallest class holding `length` bytes; kInvalidArgument past 64 MiB.
Result<uint32_t> classFor(uint64_t length);

struct ChunkId {
  uint64_t inode = 0;
  uint32_t index = 0;
  bool operator==(const ChunkId&) const = default;
  auto operator<=>(const ChunkId&) const = default;
};

// 12 bytes, big-endian, so RocksDB orders chunks by (inode, index).
std::string encodeChunkKey(const ChunkId& id);
Result<ChunkId> decodeChunkKey(std::string_view key);

struct SlotAddr {
  uint32_t group = 0;
  uint32_t slot = 0;
  bool operator==(const SlotAddr&) const = default;
};

struct ChunkMeta {
  uint32_t size_class = 0;
  SlotAddr addr;
  uint32_t length = 0;         // bytes of data, <= classBytes(size_class)
  uint64_t chunk_version = 0;  // bumped by every committed write
  uint64_t chain_version = 0;  // routing version the write was accepted under
  uint32_t tail_crc = 0;       // of the bytes past the last full 4 KiB block (0 if none)
  uint8_t flags = 0;           // reserved; 0 now
  // The chain the chunk was last written under (0: none, a record of
  // version 3 or older). A target is in several chains; a resync copies
  // one chain's chunks (docs/chain_protocol.md, "Resync").
  uint32_t chain = 0;
  // CRC32C of the slot's CRC-area entries of the full blocks, as on disk:
  // pins the record to this content, so that a slot whose new bytes and CRCs
  // never reached the disk cannot pass for it with what it held before.
  // nullopt for a version 2 record (written before it existed).
  std::optional<uint32_t> crcs_crc;
  bool operator==(const ChunkMeta&) const = default;
};

inline constexpr uint16_t kChunkMetaVersion = 4;
inline constexpr size_t kChunkMetaBytes = 48;
// Still read: no chain.
inline constexpr uint16_t kChunkMetaVersion3 = 3;
inline constexpr size_t kChunkMetaBytes3 = 44;
// Still read (no crcs_crc), and written back as they are by a change that
// cannot compute crcs_crc without reading the whole CRC area (an append).
inline constexpr uint16_t kChunkMetaVersion2 = 2;
inline constexpr size_t kChunkMetaBytes2 = 40;

std::string encodeChunkMeta(const ChunkMeta& m);
// kCorruption naming the problem for a wrong size, version, checksum, class,
// or a length larger than the class.
Result<ChunkMeta> decodeChunkMeta(std::string_view bytes);

// A write whose bytes travel in the target's metadata log record (writes into
// chunks of the smallest class, ChunkEngineOptions::log_small_writes): the
// whole blocks written into the slot and the CRC-area entries written with
// them, put back into the slot when the record is replayed after a crash.
struct LoggedWrite {
  uint32_t size_class = 0;
  SlotAddr addr;
  uint32_t data_offset = 0;  // in the slot; a multiple of kBlockBytes
  std::string_view data;     // whole blocks
  uint32_t crc_offset = 0;   // in the slot's CRC area; a multiple of 4
  std::string_view crcs;     // little-endian CRC32Cs
};
inline constexpr uint16_t kLoggedWriteVersion = 1;
inline constexpr size_t kLoggedWriteHeaderBytes = 28;
std::string encodeLoggedWrite(const LoggedWrite& w);
// The views point into `bytes`. kCorruption naming the problem for a wrong
// version, class, lengths that do not add up, or a range outside the slot or
// its CRC area. (The log record around it carries the checksum.)
Result<LoggedWrite> decodeLoggedWrite(std::string_view bytes);

}  // namespace cistern::storage
