// A program that uses nothing but libcistern's public header, linked the way
// a user's program is: ctest `libcistern_links_no_server_stack` checks that
// it needs none of the server stack (no RocksDB, no KV, no metadata store).
// Run by hand against a cluster, it writes one file and reads it back:
//   build/tests/e2e/libcistern_only [HOST:PORT] [/path]
#include <cistern/client.h>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  cistern::Client::Options o;
  if (argc > 1) o.cluster = argv[1];
  const std::string path = argc > 2 ? argv[2] : "/libcistern_only.txt";
  auto [client, err] = cistern::Client::connect(o);
  if (err) {
    std::fprintf(stderr, "%s\n", err.message.c_str());
    return 1;
  }
  std::unique_ptr<cistern::File> f;
  const char text[] = "written with libcistern alone\n";
  size_t n = 0;
  if ((err = client->open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f)) ||
      (err = f->pwrite(text, sizeof text - 1, 0, &n)) || (err = f->close())) {
    std::fprintf(stderr, "%s\n", err.message.c_str());
    return 1;
  }
  char back[64] = {};
  if ((err = client->open(path, O_RDONLY, 0, &f)) || (err = f->pread(back, sizeof back, 0, &n)) ||
      (err = f->close())) {
    std::fprintf(stderr, "%s\n", err.message.c_str());
    return 1;
  }
  std::fputs(back, stdout);
  return std::strcmp(back, text) == 0 ? 0 : 1;
}
