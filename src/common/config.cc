#include "common/config.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "common/assert.h"

namespace cistern {
namespace {

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <typename T>
std::string defaultText(T* p) {
  if constexpr (std::is_same_v<T, bool>) {
    return *p ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return quote(*p);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string out = "[";
    for (size_t i = 0; i < p->size(); ++i) out += (i ? ", " : "") + quote((*p)[i]);
    return out + "]";
  } else {
    return fmt::format("{}", *p);
  }
}

const char* typeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    default:
      return "date/time";
  }
}

// A pending assignment; all are applied only after every key validated.
using Apply = std::function<void()>;

template <typename Int>
Status convertInt(const toml::node& n, Int* field, std::vector<Apply>* out,
                  const std::string& where) {
  auto v = n.value<int64_t>();
  if (!n.is_integer() || !v) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("{}: expected integer, got {}", where, typeName(n.type())));
  }
  int64_t x = *v;
  if constexpr (std::is_unsigned_v<Int>) {
    if (x < 0 || static_cast<uint64_t>(x) > std::numeric_limits<Int>::max()) {
      return Status(ErrorCode::kConfigInvalid, fmt::format("{}: {} is out of range [0, {}]", where,
                                                           x, std::numeric_limits<Int>::max()));
    }
  } else {
    if (x < std::numeric_limits<Int>::min() || x > std::numeric_limits<Int>::max()) {
      return Status(ErrorCode::kConfigInvalid, fmt::format("{}: {} is out of range", where, x));
    }
  }
  out->push_back([field, x] { *field = static_cast<Int>(x); });
  return Status::OK();
}

Status typeError(const std::string& where, const char* want, const toml::node& n) {
  return Status(ErrorCode::kConfigInvalid,
                fmt::format("{}: expected {}, got {}", where, want, typeName(n.type())));
}

// toml++ 3.3's is_non_ascii_horizontal_whitespace() reaches
// __builtin_unreachable() (undefined behaviour) for every code point in
// U+00A1..U+0499, U+2C5E..U+2FFF, U+3001..U+3057 and U+FB26..U+FEFE: it
// splits U+00A0..U+FEFF into blocks of 0x3FA, and its bit mask sends blocks
// 0, 11 and 63 to a switch that handles only blocks 5 and 7. The parser asks
// it about characters in many places (found by tests/fuzz/config_fuzz.cc).
// Such characters are rejected before toml++ sees the text; inside strings
// they can still be written as \uXXXX escapes.
Status rejectCodePointsTomlppMishandles(std::string_view text, std::string_view source) {
  size_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    auto b = static_cast<unsigned char>(text[i]);
    if (b == '\n') ++line;
    if (b < 0x80) continue;
    uint32_t cp = 0;
    size_t len = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      cp = b & 0x1F;
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      cp = b & 0x0F;
      len = 3;
    } else {
      continue;  // 4-byte sequences are out of the affected ranges; bad UTF-8 is toml++'s to reject
    }
    if (i + len > text.size()) break;
    bool valid = true;
    for (size_t k = 1; k < len; ++k) {
      auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) valid = false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (!valid) continue;
    bool affected = (cp >= 0xA1 && cp <= 0x499) || (cp >= 0x2C5E && cp <= 0x3057 && cp != 0x3000) ||
                    (cp >= 0xFB26 && cp <= 0xFEFE);
    if (affected) {
      return Status(ErrorCode::kConfigInvalid,
                    fmt::format("{}:{}: character U+{:04X} is not supported in config files; "
                                "write it as \\u{:04X} inside a string",
                                source, line, cp, cp));
    }
    i += len - 1;
  }
  return Status::OK();
}

}  // namespace

void ConfigBinder::add(std::string key, Ptr field, std::string doc) {
  CISTERN_CHECK(find(key) == nullptr, "config key bound twice");
  std::string def = std::visit([](auto* p) { return defaultText(p); }, field);
  entries_.push_back(Entry{std::move(key), field, std::move(doc), std::move(def)});
}

void ConfigBinder::bind(std::string k, bool* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, int64_t* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, int32_t* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, uint64_t* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, uint32_t* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, double* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, std::string* f, std::string d) {
  add(std::move(k), f, std::move(d));
}
void ConfigBinder::bind(std::string k, std::vector<std::string>* f, std::string d) {
  add(std::move(k), f, std::move(d));
}

const ConfigBinder::Entry* ConfigBinder::find(std::string_view key) const {
  for (const auto& e : entries_) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

Status ConfigBinder::loadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("{}: cannot open config file: {}", path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return loadString(text.str(), path);
}

Status ConfigBinder::loadString(std::string_view text, std::string_view source) {
  RETURN_ON_ERROR(rejectCodePointsTomlppMishandles(text, source));
  toml::table parsed;
  try {
    parsed = toml::parse(text, std::string(source));
  } catch (const toml::parse_error& err) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("{}:{}:{}: {}", source, err.source().begin.line,
                              err.source().begin.column, err.description()));
  }
  std::vector<Apply> applies;
  Status status;
  std::function<void(const toml::table&, const std::string&)> walk =
      [&](const toml::table& table, const std::string& prefix) {
        for (const auto& entry : table) {
          const auto& k = entry.first;
          const toml::node& node = entry.second;
          if (!status.ok()) return;
          std::string key =
              prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
          const Entry* e = find(key);
          if (e == nullptr && node.is_table()) {
            walk(*node.as_table(), key);
            continue;
          }
          std::string where = fmt::format("{}: key '{}'", source, key);
          if (e == nullptr) {
            status = Status(ErrorCode::kConfigInvalid, fmt::format("{}: unknown key", where));
            return;
          }
          status = std::visit(
              [&](auto* field) -> Status {
                using T = std::remove_pointer_t<decltype(field)>;
                if constexpr (std::is_same_v<T, bool>) {
                  if (!node.is_boolean()) return typeError(where, "boolean", node);
                  bool v = *node.value<bool>();
                  applies.push_back([field, v] { *field = v; });
                } else if constexpr (std::is_same_v<T, double>) {
                  if (!node.is_number()) return typeError(where, "number", node);
                  double v = *node.value<double>();
                  applies.push_back([field, v] { *field = v; });
                } else if constexpr (std::is_same_v<T, std::string>) {
                  if (!node.is_string()) return typeError(where, "string", node);
                  std::string v = *node.value<std::string>();
                  applies.push_back([field, v] { *field = v; });
                } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
                  if (!node.is_array()) return typeError(where, "array of strings", node);
                  std::vector<std::string> v;
                  for (const auto& item : *node.as_array()) {
                    if (!item.is_string()) return typeError(where + " item", "string", item);
                    v.push_back(*item.value<std::string>());
                  }
                  applies.push_back([field, v] { *field = v; });
                } else {
                  return convertInt(node, field, &applies, where);
                }
                return Status::OK();
              },
              e->field);
        }
      };
  walk(parsed, "");
  RETURN_ON_ERROR(status);
  for (auto& a : applies) a();
  return Status::OK();
}

std::string ConfigBinder::describe() const {
  std::vector<const Entry*> sorted;
  for (const auto& e : entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->key < b->key; });
  std::string out;
  for (const Entry* e : sorted) {
    out += fmt::format("{} = {}  # {}\n", e->key, e->default_text, e->doc);
  }
  return out;
}

Status badOptionValue(std::string_view key, uint64_t value, std::string_view want) {
  return Status(ErrorCode::kInvalidArgument, fmt::format("{} {} is not {}", key, value, want));
}

Status checkOptionRange(std::string_view key, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value >= lo && value <= hi) return Status::OK();
  return badOptionValue(key, value, fmt::format("in {}..{}", lo, hi));
}

}  // namespace cistern
