# cistern — top-level entry points. See README.md.
#
#   make run     install deps, build the cistern binary, start the one-machine cluster
#   make test    install deps, build, run every test
#   make test-long  soak runs: 200 kill rounds of a whole cluster and 50,000 seeds of the
#                   cluster simulation (about 15 minutes)
#   make build   optimized build with debug info into build/ (CLI at build/cistern)
#   make asan    ASan+UBSan build into build-asan/, runs every test (fsx: 20,000 operations)
#   make fuzz    clang + libFuzzer build into build-fuzz/, runs each target FUZZ_SECONDS
#   make bench   every benchmark under bench/ (bench/run NAME for one)
#   make install the cistern binary into $(PREFIX)/bin, the Python module into Debian's
#                site directory for /usr/bin/python3 (PREFIX=/usr/local)

SHELL := /bin/bash
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CTEST_ARGS ?=
PYTHON ?= /usr/bin/python3
PREFIX ?= /usr/local
PYSITE ?= $(PREFIX)/lib/python3.$(shell $(PYTHON) -c 'import sys; print(sys.version_info[1])')/dist-packages

.PHONY: all deps build test test-long run asan fuzz bench clean format install

all: build

deps:
	@scripts/install-deps.sh

build/build.ninja:
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: build/build.ninja
	cmake --build build -j $(JOBS)

test: deps
	@$(MAKE) --no-print-directory build
	cd build && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

install: build
	install -D -m 755 build/cistern $(DESTDIR)$(PREFIX)/bin/cistern
	install -d $(DESTDIR)$(PYSITE)/cistern
	install -m 644 build/python/cistern/*.py build/python/cistern/*.pyi $(DESTDIR)$(PYSITE)/cistern/
	install -m 755 build/python/cistern/_cistern*.so $(DESTDIR)$(PYSITE)/cistern/
	@echo "installed: $(DESTDIR)$(PREFIX)/bin/cistern, $(DESTDIR)$(PYSITE)/cistern"

test-long: deps
	@$(MAKE) --no-print-directory build
	cd build && CISTERN_SIM_SEEDS=$${CISTERN_SIM_SEEDS:-50000} ./tests/sim/sim_test \
	  --gtest_filter='Sim.EverySeed*'
	cd build && CISTERN_KILL_ROUNDS=$${CISTERN_KILL_ROUNDS:-200} ./tests/cluster/data_cluster_test \
	  --gtest_filter='DataCluster.KillRounds*'

# Builds only the cistern binary (not the tests and benchmarks) before it runs.
run: deps build/build.ninja
	@[ -x build/cistern ] || echo "make run: first build of build/cistern: about 3 minutes on 2 cores (later builds: seconds)"
	cmake --build build -j $(JOBS) --target cistern
	./build/cistern up --data ./cistern-data --mount ./mnt

build-asan/build.ninja:
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCISTERN_SANITIZE=address,undefined

asan: deps build-asan/build.ninja
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 CISTERN_FSX_OPS=20000 \
	  ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

build-fuzz/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCISTERN_FUZZ=ON -DCISTERN_WERROR=OFF

fuzz: deps build-fuzz/build.ninja
	cmake --build build-fuzz -j $(JOBS) --target fuzz_targets
	tests/fuzz/run-all build-fuzz $(FUZZ_SECONDS)

bench: deps
	@for b in $$(bench/run --list); do bench/run $$b || exit 1; done

format:
	git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf build build-asan build-fuzz
