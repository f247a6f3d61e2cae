#include "ckpt/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/endian.h"

namespace cistern::ckpt {
namespace {

using nlohmann::json;

struct DTypeRow {
  DType type;
  std::string_view name;
  uint32_t bytes;
};
constexpr DTypeRow kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI64, "I64", 8},   {DType::kI32, "I32", 4},        {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},     {DType::kU64, "U64", 8},        {DType::kU32, "U32", 4},
    {DType::kU16, "U16", 2},   {DType::kU8, "U8", 1},          {DType::kBool, "BOOL", 1},
};

const DTypeRow& rowOf(DType d) {
  for (const DTypeRow& r : kDTypes)
    if (r.type == d) return r;
  return kDTypes[0];  // unreachable: every enumerator has a row
}

Status corrupt(std::string_view why) {
  return Status(ErrorCode::kCorruption, fmt::format("safetensors header: {}", why));
}

constexpr std::string_view kMetadataKey = "__metadata__";

}  // namespace

std::string_view dtypeName(DType d) { return rowOf(d).name; }
uint32_t dtypeBytes(DType d) { return rowOf(d).bytes; }

std::optional<DType> parseDType(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (r.name == name) return r.type;
  return std::nullopt;
}

std::optional<uint64_t> TensorInfo::expectedBytes() const {
  uint64_t n = dtypeBytes(dtype);
  for (uint64_t dim : shape) {
    if (dim != 0 && n > UINT64_MAX / dim) return std::nullopt;
    n *= dim;
  }
  return n;
}

Result<std::string> encodeHeader(Header* header) {
  json doc = json::object();
  if (!header->metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : header->metadata) meta[k] = v;
    doc[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t at = 0;
  for (TensorInfo& t : header->tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("tensor name {:?} is not allowed", t.name));
    }
    if (doc.contains(t.name))
      return Status(ErrorCode::kInvalidArgument, fmt::format("tensor {:?} twice", t.name));
    auto bytes = t.expectedBytes();
    if (!bytes || *bytes > UINT64_MAX - at)
      return Status(ErrorCode::kInvalidArgument, fmt::format("tensor {:?} is too large", t.name));
    t.begin = at;
    t.end = at + *bytes;
    at = t.end;
    doc[t.name] = {
        {"dtype", dtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = doc.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::strict);
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kHeaderBytesMax)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("a header of {} bytes (at most {})", text.size(), kHeaderBytesMax));
  std::string out;
  appendLE<uint64_t>(out, text.size());
  out += text;
  return out;
}

Result<uint64_t> decodeHeaderLength(std::string_view first8, uint64_t file_bytes) {
  if (first8.size() < 8 || file_bytes < 8) return corrupt("file shorter than 8 bytes");
  uint64_t n = getLE<uint64_t>(first8, 0);
  if (n > kHeaderBytesMax) return corrupt(fmt::format("length {} above {}", n, kHeaderBytesMax));
  if (n > file_bytes - 8)
    return corrupt(fmt::format("length {} past the end of a file of {} bytes", n, file_bytes));
  return n;
}

Result<Header> decodeHeader(std::string_view text, uint64_t data_bytes) {
  if (text.empty() || text.front() != '{') return corrupt("does not start with '{'");
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return corrupt("not one JSON object");
  Header h;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& value = it.value();
    if (name == kMetadataKey) {
      if (!value.is_object()) return corrupt("__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return corrupt(fmt::format("metadata {:?} is not a string", k));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](std::string_view why) {
      return corrupt(fmt::format("tensor {:?}: {}", name, why));
    };
    if (!value.is_object()) return bad("not an object");
    TensorInfo t;
    t.name = name;
    auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string()) return bad("no dtype");
    auto parsed = parseDType(dt->get_ref<const std::string&>());
    if (!parsed) return bad(fmt::format("unknown dtype {:?}", dt->get<std::string>()));
    t.dtype = *parsed;
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return bad("no shape");
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) return bad("a dimension that is not a whole number");
      t.shape.push_back(d.get<uint64_t>());
    }
    auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return bad("data_offsets is not [begin, end]");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.end < t.begin) return bad("data_offsets end before they begin");
    auto want = t.expectedBytes();
    if (!want || *want != t.end - t.begin) {
      return bad(fmt::format("{} bytes for its dtype and shape, {} in the file",
                             want ? fmt::format("{}", *want) : "too many", t.end - t.begin));
    }
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The byte buffer, covered exactly: no holes, no overlaps.
  uint64_t at = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != at) {
      return corrupt(t.begin < at ? fmt::format("tensor {:?} overlaps the one before", t.name)
                                  : fmt::format("a hole before tensor {:?}", t.name));
    }
    at = t.end;
  }
  if (at != data_bytes)
    return corrupt(fmt::format("tensors cover {} bytes of a buffer of {}", at, data_bytes));
  return h;
}

}  // namespace cistern::ckpt
