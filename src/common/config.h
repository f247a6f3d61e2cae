// Typed configuration loaded from TOML.
//
// Each options struct binds its fields to dotted keys with a default (the
// field's initial value) and a one-line doc:
//
//   struct StorageServiceOptions {
//     uint32_t blocking_threads = 8;
//     void bind(ConfigBinder& b, const std::string& p) {
//       b.bind(p + ".blocking_threads", &blocking_threads, "threads that serve chunk I/O");
//     }
//   };
//
// ConfigBinder::loadFile() then sets the bound fields from a file. A key that
// nothing bound, a value of the wrong type or out of range for the field, and
// a TOML syntax error are rejected with a message that names the key and the
// file; on error no field is changed. describe() prints every key with its
// default and doc (`cistern config --defaults`). Not thread-safe: load config
// before starting services.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"

namespace cistern {

class ConfigBinder {
 public:
  void bind(std::string key, bool* field, std::string doc);
  void bind(std::string key, int64_t* field, std::string doc);
  void bind(std::string key, int32_t* field, std::string doc);
  void bind(std::string key, uint64_t* field, std::string doc);
  void bind(std::string key, uint32_t* field, std::string doc);
  void bind(std::string key, double* field, std::string doc);
  void bind(std::string key, std::string* field, std::string doc);
  void bind(std::string key, std::vector<std::string>* field, std::string doc);

  Status loadFile(const std::string& path);
  // `source` names the text in error messages (a file name or "<string>").
  Status loadString(std::string_view toml, std::string_view source = "<string>");

  // "key = default  # doc" lines, sorted by key, as valid TOML comments/values.
  std::string describe() const;

 private:
  using Ptr = std::variant<bool*, int64_t*, int32_t*, uint64_t*, uint32_t*, double*, std::string*,
                           std::vector<std::string>*>;
  struct Entry {
    std::string key;
    Ptr field;
    std::string doc;
    std::string default_text;
  };
  void add(std::string key, Ptr field, std::string doc);
  const Entry* find(std::string_view key) const;

  std::vector<Entry> entries_;
};

// For options' validate(): kInvalidArgument "<key> <value> is not <want>"
// (want e.g. "at most 1 GiB"), and the same with "in lo..hi" unless
// lo <= value <= hi.
Status badOptionValue(std::string_view key, uint64_t value, std::string_view want);
Status checkOptionRange(std::string_view key, uint64_t value, uint64_t lo, uint64_t hi);

}  // namespace cistern
