// The safetensors layout of a checkpoint's data files (docs/checkpoint_format.md):
//
//   u64 N (little-endian) | N bytes of JSON header | the byte buffer
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end)} (offsets into the byte buffer) and may hold "__metadata__",
// a map of strings to strings. It is padded with spaces to a multiple of 8
// bytes, so that the buffer starts aligned. The rules a reader holds a file
// to, as the format's own reader does: N at most 100 MB, the header one JSON
// object, every dtype known, every tensor's bytes exactly its element count
// times its dtype's size, and the tensors covering the byte buffer with
// neither holes nor overlaps.
//
// Pure functions over bytes (no I/O): the checkpoint engine writes and reads
// the files, the fuzz target (tests/fuzz/safetensors_fuzz.cc) feeds the
// decoder anything.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::ckpt {

enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
};

// "F32", "BF16", "BOOL", ... as safetensors spells them.
std::string_view dtypeName(DType d);
std::optional<DType> parseDType(std::string_view name);
// Bytes per element.
uint32_t dtypeBytes(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;  // empty: a 0-d tensor (one element)
  uint64_t begin = 0;           // [begin, end) in the byte buffer
  uint64_t end = 0;
  // Elements times dtype size; nullopt when that overflows 64 bits.
  std::optional<uint64_t> expectedBytes() const;
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors;  // in the order of their bytes
  uint64_t dataBytes() const { return tensors.empty() ? 0 : tensors.back().end; }
};

constexpr uint64_t kHeaderBytesMax = 100'000'000;

// Lays the tensors out back to back in the order given (setting each one's
// begin and end) and returns the file's first bytes: the 8-byte length and
// the padded JSON header. kInvalidArgument for an empty or repeated name,
// "__metadata__" as a name, or a size that overflows.
Result<std::string> encodeHeader(Header* header);

// The header length N from the first 8 bytes of a file of `file_bytes`
// bytes. kCorruption when fewer than 8 bytes, N above kHeaderBytesMax or
// past the end of the file.
Result<uint64_t> decodeHeaderLength(std::string_view first8, uint64_t file_bytes);

// Parses the N header bytes of a file whose byte buffer holds `data_bytes`
// bytes; the tensors come back sorted by offset. kCorruption naming what is
// wrong for anything the rules above refuse.
Result<Header> decodeHeader(std::string_view json, uint64_t data_bytes);

}  // namespace cistern::ckpt
