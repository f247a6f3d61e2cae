// Assertions. CISTERN_CHECK is always on (cheap invariants that guard data:
// lengths, versions, state transitions). CISTERN_DCHECK is compiled only into
// debug and sanitizer builds (costly checks). A failed assertion logs the
// expression, the location and the message, then aborts: a storage process
// that has broken an invariant must not go on writing.
#pragma once

#include <string>
#include <string_view>

namespace cistern {
[[noreturn]] void assertFailed(const char* file, int line, std::string_view expr,
                               std::string_view message);
}

#define CISTERN_CHECK(cond, ...)                                                           \
  do {                                                                                     \
    if (__builtin_expect(!(cond), 0)) {                                                    \
      ::cistern::assertFailed(__FILE__, __LINE__, #cond, ::std::string_view{__VA_ARGS__}); \
    }                                                                                      \
  } while (0)

#if !defined(NDEBUG) || defined(CISTERN_DEBUG_CHECKS)
#define CISTERN_DCHECK(cond, ...) CISTERN_CHECK(cond, __VA_ARGS__)
#else
#define CISTERN_DCHECK(cond, ...) \
  do {                            \
  } while (0 && (cond))
#endif
