#include "common/host.h"

#include <fstream>

namespace cistern {

const std::string& hostBootId() {
  static const std::string id = [] {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(f, s);
    return s;
  }();
  return id;
}

}  // namespace cistern
