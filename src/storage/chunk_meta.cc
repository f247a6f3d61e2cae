#include "storage/chunk_meta.h"

#include <fmt/format.h>

#include "common/crc32c.h"
#include "common/endian.h"

namespace cistern::storage {
namespace {

Status corrupt(std::string_view why) {
  return Status(ErrorCode::kCorruption, fmt::format("chunk meta: {}", why));
}

}  // namespace

Result<uint32_t> classFor(uint64_t length) {
  for (uint32_t c = 0; c < kClassCount; ++c) {
    if (length <= classBytes(c)) return c;
  }
  return Status(ErrorCode::kInvalidArgument,
                fmt::format("chunk of {} bytes exceeds {}", length, kMaxChunkBytes));
}

std::string encodeChunkKey(const ChunkId& id) {
  std::string out(12, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((id.inode >> (56 - 8 * i)) & 0xff);
  for (int i = 0; i < 4; ++i)
    out[static_cast<size_t>(8 + i)] = static_cast<char>((id.index >> (24 - 8 * i)) & 0xff);
  return out;
}

Result<ChunkId> decodeChunkKey(std::string_view key) {
  if (key.size() != 12) return corrupt(fmt::format("chunk key of {} bytes", key.size()));
  ChunkId id;
  for (int i = 0; i < 8; ++i)
    id.inode = (id.inode << 8) | static_cast<uint8_t>(key[static_cast<size_t>(i)]);
  for (int i = 0; i < 4; ++i)
    id.index = (id.index << 8) | static_cast<uint8_t>(key[static_cast<size_t>(8 + i)]);
  return id;
}

// Layout (little-endian): 0 u16 version | 2 u8 class | 3 u8 flags | 4 u32 group |
// 8 u32 slot | 12 u32 length | 16 u64 chunk_version | 24 u64 chain_version |
// 32 u32 tail block crc32c | 36 u32 crc32c of the CRC-area entries |
// 40 u32 chain | 44 u32 crc32c of bytes 0..43. Version 3: no chain (its
// record crc32c at 40 covers bytes 0..39); version 2: no bytes 36..43 either
// (its record crc32c at 36 covers bytes 0..35). A record without crcs_crc is
// written as version 2, so it keeps no chain (only targets older than
// chains hold such records).
std::string encodeChunkMeta(const ChunkMeta& m) {
  const size_t body = m.crcs_crc ? kChunkMetaBytes - 4 : kChunkMetaBytes2 - 4;
  std::string out(body + 4, '\0');
  putLE<uint16_t>(out, 0, m.crcs_crc ? kChunkMetaVersion : kChunkMetaVersion2);
  putLE<uint8_t>(out, 2, static_cast<uint8_t>(m.size_class));
  putLE<uint8_t>(out, 3, m.flags);
  putLE<uint32_t>(out, 4, m.addr.group);
  putLE<uint32_t>(out, 8, m.addr.slot);
  putLE<uint32_t>(out, 12, m.length);
  putLE<uint64_t>(out, 16, m.chunk_version);
  putLE<uint64_t>(out, 24, m.chain_version);
  putLE<uint32_t>(out, 32, m.tail_crc);
  if (m.crcs_crc) {
    putLE<uint32_t>(out, 36, *m.crcs_crc);
    putLE<uint32_t>(out, 40, m.chain);
  }
  putLE<uint32_t>(out, body, crc32c(out.data(), body));
  return out;
}

Result<ChunkMeta> decodeChunkMeta(std::string_view in) {
  uint16_t expected = 0;
  if (in.size() == kChunkMetaBytes) expected = kChunkMetaVersion;
  if (in.size() == kChunkMetaBytes3) expected = kChunkMetaVersion3;
  if (in.size() == kChunkMetaBytes2) expected = kChunkMetaVersion2;
  if (expected == 0) return corrupt(fmt::format("record of {} bytes", in.size()));
  const size_t body = in.size() - 4;
  if (getLE<uint32_t>(in, body) != crc32c(in.data(), body))
    return corrupt("record checksum mismatch");
  const uint16_t version = getLE<uint16_t>(in, 0);
  if (version != expected)
    return corrupt(fmt::format("record version {} of {} bytes", version, in.size()));
  ChunkMeta m;
  m.size_class = getLE<uint8_t>(in, 2);
  m.flags = getLE<uint8_t>(in, 3);
  m.addr.group = getLE<uint32_t>(in, 4);
  m.addr.slot = getLE<uint32_t>(in, 8);
  m.length = getLE<uint32_t>(in, 12);
  m.chunk_version = getLE<uint64_t>(in, 16);
  m.chain_version = getLE<uint64_t>(in, 24);
  m.tail_crc = getLE<uint32_t>(in, 32);
  if (version != kChunkMetaVersion2) m.crcs_crc = getLE<uint32_t>(in, 36);
  if (version == kChunkMetaVersion) m.chain = getLE<uint32_t>(in, 40);
  if (m.size_class >= kClassCount) return corrupt(fmt::format("size class {}", m.size_class));
  if (m.length > classBytes(m.size_class)) {
    return corrupt(fmt::format("length {} exceeds class {}", m.length, classBytes(m.size_class)));
  }
  return m;
}

// Layout (little-endian): 0 u16 version | 2 u8 class | 3 u8 0 | 4 u32 group |
// 8 u32 slot | 12 u32 data offset | 16 u32 data bytes | 20 u32 CRC offset |
// 24 u32 CRC bytes | 28 data | CRCs.
std::string encodeLoggedWrite(const LoggedWrite& w) {
  std::string out(kLoggedWriteHeaderBytes, '\0');
  putLE<uint16_t>(out, 0, kLoggedWriteVersion);
  putLE<uint8_t>(out, 2, static_cast<uint8_t>(w.size_class));
  putLE<uint32_t>(out, 4, w.addr.group);
  putLE<uint32_t>(out, 8, w.addr.slot);
  putLE<uint32_t>(out, 12, w.data_offset);
  putLE<uint32_t>(out, 16, static_cast<uint32_t>(w.data.size()));
  putLE<uint32_t>(out, 20, w.crc_offset);
  putLE<uint32_t>(out, 24, static_cast<uint32_t>(w.crcs.size()));
  out.reserve(out.size() + w.data.size() + w.crcs.size());
  out.append(w.data);
  out.append(w.crcs);
  return out;
}

Result<LoggedWrite> decodeLoggedWrite(std::string_view in) {
  if (in.size() < kLoggedWriteHeaderBytes)
    return corrupt(fmt::format("logged write of {} bytes", in.size()));
  if (getLE<uint16_t>(in, 0) != kLoggedWriteVersion)
    return corrupt(fmt::format("logged write version {}", getLE<uint16_t>(in, 0)));
  LoggedWrite w;
  w.size_class = getLE<uint8_t>(in, 2);
  if (w.size_class >= kClassCount || getLE<uint8_t>(in, 3) != 0)
    return corrupt(fmt::format("logged write of size class {}", w.size_class));
  w.addr.group = getLE<uint32_t>(in, 4);
  w.addr.slot = getLE<uint32_t>(in, 8);
  w.data_offset = getLE<uint32_t>(in, 12);
  w.crc_offset = getLE<uint32_t>(in, 20);
  const uint64_t data_bytes = getLE<uint32_t>(in, 16), crc_bytes = getLE<uint32_t>(in, 24);
  if (kLoggedWriteHeaderBytes + data_bytes + crc_bytes != in.size()) {
    return corrupt(fmt::format("logged write of {} bytes says {} data and {} CRC bytes", in.size(),
                               data_bytes, crc_bytes));
  }
  if (w.data_offset % kBlockBytes != 0 || data_bytes % kBlockBytes != 0 ||
      w.data_offset + data_bytes > classBytes(w.size_class)) {
    return corrupt(fmt::format("logged write of {} bytes at {} in a slot of {}", data_bytes,
                               w.data_offset, classBytes(w.size_class)));
  }
  if (w.crc_offset % 4 != 0 || crc_bytes % 4 != 0 ||
      w.crc_offset + crc_bytes > classBytes(w.size_class) / kBlockBytes * 4) {
    return corrupt(fmt::format("logged write of {} CRC bytes at {} in class {}", crc_bytes,
                               w.crc_offset, w.size_class));
  }
  w.data = in.substr(kLoggedWriteHeaderBytes, data_bytes);
  w.crcs = in.substr(kLoggedWriteHeaderBytes + data_bytes);
  return w;
}

}  // namespace cistern::storage
