#include "ckpt/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace cistern::ckpt {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "cistern.checkpoint";

Status corrupt(std::string_view why) {
  return Status(ErrorCode::kCorruption, fmt::format("checkpoint manifest: {}", why));
}

}  // namespace

bool plainName(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\0') == std::string_view::npos;
}

const ManifestTensor* Manifest::find(std::string_view name) const {
  auto it =
      std::lower_bound(tensors.begin(), tensors.end(), name,
                       [](const ManifestTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::string encodeManifest(const Manifest& m) {
  json tensors = json::object();
  for (const ManifestTensor& t : m.tensors) {
    tensors[t.name] = {{"in", t.in},         {"file", t.file},     {"dtype", dtypeName(t.dtype)},
                       {"shape", t.shape},   {"offset", t.offset}, {"bytes", t.bytes},
                       {"crc32c", t.crc32c}, {"blocks", t.blocks}};
    if (!t.codec.empty()) {
      tensors[t.name]["codec"] = t.codec;
      tensors[t.name]["stored"] = t.stored;
    }
  }
  json doc = {{"format", kFormat},
              {"version", m.version},
              {"created_ns", m.created_ns},
              {"block_bytes", m.block_bytes},
              {"base", m.base},
              {"metadata", m.metadata},
              {"tensors", std::move(tensors)}};
  return doc.dump(1, ' ', false, json::error_handler_t::strict) + "\n";
}

Result<Manifest> decodeManifest(std::string_view text) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return corrupt("not one JSON object");
  auto str = [&](const json& o, const char* key, std::string* out) -> bool {
    auto it = o.find(key);
    if (it == o.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  auto u64 = [&](const json& o, const char* key, uint64_t* out) -> bool {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number_unsigned()) return false;
    *out = it->get<uint64_t>();
    return true;
  };
  std::string format;
  if (!str(doc, "format", &format) || format != kFormat) return corrupt("not a cistern checkpoint");
  Manifest m;
  uint64_t version = 0, block = 0;
  if (!u64(doc, "version", &version) || version != 1)
    return corrupt("version is not 1 (a newer cistern wrote it?)");
  m.version = 1;
  auto created = doc.find("created_ns");
  if (created == doc.end() || !created->is_number_integer()) return corrupt("no created_ns");
  m.created_ns = created->get<int64_t>();
  if (!u64(doc, "block_bytes", &block) || block == 0 || block > kBlockBytesMax)
    return corrupt("block_bytes out of range");
  m.block_bytes = block;
  if (!str(doc, "base", &m.base) || !(m.base.empty() || plainName(m.base)))
    return corrupt("base is not a checkpoint's name");
  auto meta = doc.find("metadata");
  if (meta == doc.end() || !meta->is_object()) return corrupt("no metadata object");
  for (auto it = meta->begin(); it != meta->end(); ++it) {
    if (!it->is_string()) return corrupt(fmt::format("metadata {:?} is not a string", it.key()));
    m.metadata[it.key()] = it->get<std::string>();
  }
  auto tensors = doc.find("tensors");
  if (tensors == doc.end() || !tensors->is_object()) return corrupt("no tensors object");
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    auto bad = [&name](std::string_view why) {
      return corrupt(fmt::format("tensor {:?}: {}", name, why));
    };
    if (!v.is_object()) return bad("not an object");
    ManifestTensor t;
    t.name = name;
    std::string dtype;
    if (!str(v, "in", &t.in) || !(t.in.empty() || plainName(t.in))) return bad("bad \"in\"");
    if (!str(v, "file", &t.file) || !plainName(t.file)) return bad("bad file name");
    if (!str(v, "dtype", &dtype) || !parseDType(dtype)) return bad("unknown dtype");
    t.dtype = *parseDType(dtype);
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) return bad("no shape");
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) return bad("a dimension that is not a whole number");
      t.shape.push_back(d.get<uint64_t>());
    }
    uint64_t crc = 0;
    if (!u64(v, "offset", &t.offset) || !u64(v, "bytes", &t.bytes) || !u64(v, "crc32c", &crc) ||
        crc > UINT32_MAX)
      return bad("offset, bytes or crc32c missing");
    t.crc32c = static_cast<uint32_t>(crc);
    TensorInfo info{name, t.dtype, t.shape};
    if (info.expectedBytes() != t.bytes) return bad("bytes do not match its dtype and shape");
    t.stored = t.bytes;
    if (v.contains("codec")) {
      if (!str(v, "codec", &t.codec) || (t.codec != "zstd" && t.codec != "lz4"))
        return bad("unknown codec");
      if (!u64(v, "stored", &t.stored)) return bad("a codec without stored bytes");
    }
    if (t.offset > UINT64_MAX - t.stored) return bad("offset past the end");
    auto blocks = v.find("blocks");
    if (blocks == v.end() || !blocks->is_array()) return bad("no blocks");
    for (const json& b : *blocks) {
      if (!b.is_string() || b.get_ref<const std::string&>().size() != 32 ||
          b.get_ref<const std::string&>().find_first_not_of("0123456789abcdef") !=
              std::string::npos)
        return bad("a block hash that is not 32 hex digits");
      t.blocks.push_back(b.get<std::string>());
    }
    if (t.blocks.size() != (t.bytes + m.block_bytes - 1) / m.block_bytes)
      return bad("block count does not match its bytes");
    m.tensors.push_back(std::move(t));
  }
  // json objects iterate in key order: m.tensors is sorted by name.
  return m;
}

}  // namespace cistern::ckpt
