// A real workload on the mount: unpack a generated C project of thousands of
// files, build it there with make -j2 and compare with the same build on the
// local disk; then use git on the mount (init, add, commit, status).
#include <cstdio>
#include <fstream>

#include "tests/fuse/mount_env.h"

namespace cistern::testing {
namespace {

constexpr int kModules = 1000;  // 2,000 sources + 1,000 objects + tree

struct Shell {
  int rc = -1;
  std::string out;
};

Shell sh(const std::string& cmd) {
  Shell r;
  FILE* p = ::popen(("set -e; " + cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

// A C project: kModules modules in 10 directories, each a .c and a .h, a
// main that calls them all and prints a checksum, and a Makefile.
void generate(const std::string& root) {
  ASSERT_EQ(sh("mkdir -p " + root).rc, 0);
  std::ofstream mk(root + "/Makefile");
  mk << "CFLAGS = -O1 -Wall -Werror -Iinclude\n"
     << "SRCS = main.c $(wildcard src/*/*.c)\n"
     << "OBJS = $(SRCS:.c=.o)\n"
     << "app: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
     << "%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n";
  mk.close();
  ASSERT_EQ(sh("mkdir -p " + root + "/include").rc, 0);
  std::ofstream all(root + "/include/all.h");
  std::ofstream main(root + "/main.c");
  main << "#include <stdio.h>\n#include \"all.h\"\nint main(void) {\n  unsigned long s = 0;\n";
  for (int i = 0; i < kModules; ++i) {
    std::string dir = root + "/src/d" + std::to_string(i % 10);
    if (i < 10) {
      ASSERT_EQ(sh("mkdir -p " + dir).rc, 0);
    }
    std::string m = "mod" + std::to_string(i);
    std::ofstream h(dir + "/" + m + ".h");
    h << "#pragma once\nunsigned long " << m << "(unsigned long x);\n";
    std::ofstream c(dir + "/" + m + ".c");
    c << "#include \"" << m << ".h\"\n"
      << "unsigned long " << m << "(unsigned long x) {\n"
      << "  unsigned long r = x * " << (2 * i + 1) << "ul + " << i << "ul;\n"
      << "  for (int k = 0; k < " << (i % 7 + 1) << "; ++k) r ^= r >> " << (i % 13 + 1)
      << ";\n  return r;\n}\n";
    all << "#include \"../src/d" << i % 10 << "/" << m << ".h\"\n";
    main << "  s += " << m << "(s + " << i << "ul);\n";
  }
  main << "  printf(\"checksum %lu\\n\", s);\n  return 0;\n}\n";
}

TEST(Workload, UnpackAndBuildACProjectLikeOnLocalDisk) {
  const std::string d = testDir();
  char tmpl[] = "/tmp/cistern-workload-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string local = tmpl;
  generate(local + "/gen");
  ASSERT_EQ(sh("tar -C " + local + "/gen -czf " + local + "/project.tar.gz .").rc, 0);

  // Unpack on both, build on both.
  for (const std::string& where : {local + "/build", d + "/build"}) {
    auto r = sh("mkdir -p " + where + " && tar -C " + where + " -xzf " + local +
                "/project.tar.gz && make -s -j2 -C " + where + " app");
    ASSERT_EQ(r.rc, 0) << where << ":\n" << r.out;
  }
  auto files = sh("find " + d + "/build -type f | wc -l");
  EXPECT_GE(std::stoi(files.out), 3 * kModules + 2);  // .c .h .o + Makefile, main.c, ...
  auto diff = sh("diff -r " + local + "/build " + d + "/build");
  EXPECT_EQ(diff.rc, 0) << "the trees differ:\n" << diff.out.substr(0, 4000);
  auto a = sh(local + "/build/app"), b = sh(d + "/build/app");
  EXPECT_EQ(a.rc, 0);
  EXPECT_EQ(b.rc, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out.find("checksum"), std::string::npos);

  // An incremental rebuild after touching one source rebuilds one object.
  auto rebuild = sh("sleep 1 && touch " + d + "/build/src/d3/mod3.c && make -j2 -C " + d +
                    "/build app | grep -c -- '-c -o' || true");
  EXPECT_EQ(rebuild.out, "1\n") << rebuild.out;
  (void)sh("rm -rf " + local);
}

TEST(Workload, GitOnTheMount) {
  const std::string d = testDir();
  const std::string git =
      "git -c user.name=cistern -c user.email=t@cistern -c init.defaultBranch=main ";
  ASSERT_EQ(sh("mkdir -p " + d + "/repo/sub && cd " + d + "/repo && printf 'one\\n' > a.txt && " +
               "printf 'two\\n' > sub/b.txt && ln -s a.txt link")
                .rc,
            0);
  auto r = sh("cd " + d + "/repo && " + git + "init -q && " + git + "add -A && " + git +
              "commit -q -m first && " + git + "status --porcelain");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "");
  r = sh("cd " + d + "/repo && printf 'changed\\n' > a.txt && rm sub/b.txt && " + git +
         "status --porcelain");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, " M a.txt\n D sub/b.txt\n");
  r = sh("cd " + d + "/repo && " + git + "commit -q -am second && " + git +
         "log --oneline | wc -l && " + git + "fsck --strict 2>&1 | grep -v '^Checking' || true");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "2\n");
  r = sh("cd " + d + " && " + git +
         "clone -q repo clone && cat clone/a.txt && test ! -e clone/sub && cat clone/link");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "changed\nchanged\n");
}

}  // namespace
}  // namespace cistern::testing

CISTERN_FUSE_TEST_MAIN()
