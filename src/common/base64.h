// Base64 (RFC 4648, standard alphabet, padded), as etcd's JSON API carries
// keys and values.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cistern {

std::string base64Encode(std::string_view bytes);
// nullopt for anything that is not padded, canonical standard base64 (the
// bits a padded group drops are zero).
std::optional<std::string> base64Decode(std::string_view text);

}  // namespace cistern
