#!/usr/bin/env bash
# Installs the Debian packages that cistern's build, tests and benchmarks need
# (DESIGN.md §11, plus libjemalloc-dev: the cistern binary's allocator, and
# libarchive-dev: `cistern pack` reading tar and WebDataset shards, and
# python3-torchvision: ImageFolder over the mount and pack views in tests
# and benchmarks).
# Idempotent: when every package is already installed it only
# runs dpkg-query and exits, without touching apt.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang clang-format clang-tidy
  libclang-rt-14-dev llvm
  # libraries
  libasio-dev libprotobuf-dev protobuf-compiler librocksdb-dev libisal-dev
  liburing-dev libfuse3-dev fuse3 libzstd-dev liblz4-dev libxxhash-dev
  libspdlog-dev libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libcpp-httplib-dev libcurl4-openssl-dev libssl-dev pybind11-dev python3-dev libjemalloc-dev
  libarchive-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev python3-pytest python3-numpy python3-torch
  python3-torchvision fio
  etcd-server iproute2 nftables procps psmisc git
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
