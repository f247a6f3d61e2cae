// Shared memory lent by same-host clients: who may attach, what is refused,
// and that the registry stays bounded.
#include "storage/shm_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/host.h"

namespace cistern::storage {
namespace {

const std::string kToken = "0123456789abcdef-a-test-token-!";

// A memfd of `bytes` with `token` at its start, as a client makes it.
struct Memfd {
  explicit Memfd(uint64_t bytes, bool seal = true, const std::string& token = kToken)
      : bytes(bytes) {
    fd = ::memfd_create("test-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    data = static_cast<uint8_t*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    std::memcpy(data, token.data(), token.size());
  }
  ~Memfd() {
    ::munmap(data, bytes);
    ::close(fd);
  }
  int fd;
  uint64_t bytes;
  uint8_t* data;
};

uint32_t me() { return static_cast<uint32_t>(::getpid()); }

TEST(ShmRegistry, AttachedMemoryIsTheClientsMemory) {
  ASSERT_FALSE(hostBootId().empty());
  Memfd m(1 << 20);
  ShmRegistry reg;
  auto h = reg.attach(hostBootId(), me(), static_cast<uint32_t>(m.fd), m.bytes, kToken);
  ASSERT_TRUE(h.ok()) << h.status().toString();
  auto mapping = reg.get(*h);
  ASSERT_NE(mapping, nullptr);
  EXPECT_EQ(mapping->bytes, m.bytes);
  mapping->data[m.bytes - 1] = 0x5a;  // what a server writes, the client sees
  EXPECT_EQ(m.data[m.bytes - 1], 0x5a);
  reg.detach(*h);
  EXPECT_EQ(reg.get(*h), nullptr);
  EXPECT_EQ(reg.attached(), 0u);
  EXPECT_EQ(mapping->data[m.bytes - 1], 0x5a);  // a holder keeps its mapping
}

TEST(ShmRegistry, EveryUnreachableOrBadOfferIsRefused) {
  Memfd m(64 << 10);
  ShmRegistry reg(4, 1 << 20);
  auto fd = static_cast<uint32_t>(m.fd);
  // Not this host, not the same memory, not open, not a regular file.
  EXPECT_EQ(reg.attach("another-host", me(), fd, m.bytes, kToken).status().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(
      reg.attach(hostBootId(), me(), fd, m.bytes, "0123456789abcdef-another-token").status().code(),
      ErrorCode::kNotFound);
  EXPECT_EQ(reg.attach(hostBootId(), me(), 19999, m.bytes, kToken).status().code(),
            ErrorCode::kNotFound);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto r = reg.attach(hostBootId(), me(), static_cast<uint32_t>(pipe_fds[0]), 4096, kToken);
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("not a shared memory file"), std::string::npos)
      << r.status().toString();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  // Memory the client could still shrink under the server's mapping.
  Memfd unsealed(64 << 10, /*seal=*/false);
  auto u =
      reg.attach(hostBootId(), me(), static_cast<uint32_t>(unsealed.fd), unsealed.bytes, kToken);
  EXPECT_EQ(u.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(u.status().message().find("sealed"), std::string::npos) << u.status().toString();
  // Larger than the file, larger than allowed, not whole pages, a short token.
  EXPECT_EQ(reg.attach(hostBootId(), me(), fd, m.bytes * 2, kToken).status().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(reg.attach(hostBootId(), me(), fd, 2 << 20, kToken).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(reg.attach(hostBootId(), me(), fd, 5000, kToken).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(reg.attach(hostBootId(), me(), fd, m.bytes, "short").status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(reg.attached(), 0u);
  EXPECT_EQ(reg.get(12345), nullptr);
}

TEST(ShmRegistry, TheOldestMakesRoomAndDeadClientsAreDropped) {
  Memfd m(64 << 10);
  ShmRegistry reg(2, 1 << 20);
  auto fd = static_cast<uint32_t>(m.fd);
  auto a = reg.attach(hostBootId(), me(), fd, m.bytes, kToken);
  auto b = reg.attach(hostBootId(), me(), fd, m.bytes, kToken);
  auto c = reg.attach(hostBootId(), me(), fd, m.bytes, kToken);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(reg.get(*a), nullptr);
  EXPECT_NE(reg.get(*b), nullptr);
  EXPECT_NE(reg.get(*c), nullptr);

  // A child lends its memory and dies without detaching: the next attach drops it.
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  pid_t child = ::fork();
  if (child == 0) {
    Memfd mine(64 << 10);
    int n = mine.fd;
    (void)!::write(ready[1], &n, sizeof n);
    char x;
    (void)!::read(go[0], &x, 1);
    ::_exit(0);
  }
  int child_fd = -1;
  ASSERT_EQ(::read(ready[0], &child_fd, sizeof child_fd), static_cast<ssize_t>(sizeof child_fd));
  ShmRegistry reg2(8, 1 << 20);
  auto theirs = reg2.attach(hostBootId(), static_cast<uint32_t>(child),
                            static_cast<uint32_t>(child_fd), 64 << 10, kToken);
  ASSERT_TRUE(theirs.ok()) << theirs.status().toString();
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto mine = reg2.attach(hostBootId(), me(), fd, m.bytes, kToken);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(reg2.get(*theirs), nullptr) << "the dead client's memory is still mapped";
  EXPECT_EQ(reg2.attached(), 1u);
  for (int p : {ready[0], ready[1], go[0], go[1]}) ::close(p);
}

}  // namespace
}  // namespace cistern::storage
