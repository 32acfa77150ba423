#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs the consumer against it with
# CMake's find_package and, separately, with pkg-config, both with the compiler's default standard
# (flux::flux and flux.pc bring -std=c++20) and run WITHOUT LD_LIBRARY_PATH (CMake's build rpath;
# the -Wl,-rpath in flux.pc's Libs).
set -euo pipefail
build_dir="$1"; source_dir="$2"
prefix="$build_dir/install-test"
rm -rf "$prefix" "$build_dir/consumer-build"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$build_dir/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build_dir/consumer-build" >/dev/null
grep -q cxx_std_20 "$prefix"/lib*/cmake/flux/fluxTargets.cmake || { echo "flux::flux lacks cxx_std_20"; exit 1; }
env -u LD_LIBRARY_PATH "$build_dir/consumer-build/consumer"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
c++ $(pkg-config --cflags flux) "$source_dir/tests/consumer/main.cpp" -o "$build_dir/consumer-build/consumer-pc" $(pkg-config --libs flux)
env -u LD_LIBRARY_PATH "$build_dir/consumer-build/consumer-pc"
test -x "$prefix/bin/flux-info"
env -u LD_LIBRARY_PATH "$prefix/bin/flux-info" >/dev/null
test -x "$prefix/bin/flux-tune"
env -u LD_LIBRARY_PATH "$prefix/bin/flux-tune" --help >/dev/null
# The README's "Use it from your project" quotes tests/consumer/CMakeLists.txt: keep them equal.
awk '/^## Use it from your project/{on=1} on && /^```cmake/{grab=1; next} grab && /^```/{exit} grab' \
  "$source_dir/README.md" | diff - "$source_dir/tests/consumer/CMakeLists.txt" \
  || { echo "README's CMakeLists block differs from tests/consumer/CMakeLists.txt"; exit 1; }
echo "install consumer: ok"
