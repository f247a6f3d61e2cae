// Memory for direct I/O in 2 MiB pages (transparent huge pages).
//
// A direct read or write hands the device its buffer page by page: 1 MiB in
// 4 KiB pages is 256 scatter-gather segments, in one 2 MiB page it is one.
// Virtual disks pay per segment (a VMM may serve each with a system call of
// its own): on this project's virtio disk 1 MiB O_DIRECT reads ran 1.5–2x
// faster into 2 MiB pages than into 4 KiB ones (bench/results/HISTORY.md, session
// 24). The chunk engine's scratch buffers and the RPC payload pool come from
// here, and the engine reads through its own such buffer when a caller's is
// not (docs/chunk_format.md, "Buffers in 2 MiB pages").
//
// Regions are whole 2 MiB pages, aligned to 2 MiB and advised huge
// (MADV_HUGEPAGE); the kernel backs them with 2 MiB pages when its
// transparent huge pages are enabled (`always` or `madvise`) and it finds
// them, with 4 KiB pages otherwise — still correct, only not faster.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cistern::io_memory {

inline constexpr size_t kPageBytes = size_t{2} << 20;

// `bytes` rounded up to whole 2 MiB pages; mapped, not touched. nullptr when
// the memory cannot be mapped (errno says why) or `bytes` is 0.
uint8_t* allocate(size_t bytes);
// Unmaps a region `allocate(bytes)` returned (the same `bytes`).
void free(uint8_t* p, size_t bytes);
// Whether [p, p + n) lies within one region that allocate() returned and
// free() has not taken back.
bool contains(const void* p, size_t n);
// Whether the kernel's transparent huge pages are on for advised memory
// (/sys/kernel/mm/transparent_hugepage/enabled is not `never`). Read once.
bool hugePagesEnabled();

// Owns one region; movable.
class Region {
 public:
  Region() = default;
  explicit Region(size_t bytes) : data_(allocate(bytes)), bytes_(data_ ? bytes : 0) {}
  Region(Region&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  Region& operator=(Region&& o) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() { reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset();

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace cistern::io_memory
