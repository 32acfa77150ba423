#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs the consumer against it with
# CMake's find_package and, separately, with pkg-config.
set -euo pipefail
build_dir="$1"; source_dir="$2"
prefix="$build_dir/install-test"
rm -rf "$prefix" "$build_dir/consumer-build"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$build_dir/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build_dir/consumer-build" >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$build_dir/consumer-build/consumer"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
c++ $(pkg-config --cflags flux) "$source_dir/tests/consumer/main.cpp" -o "$build_dir/consumer-build/consumer-pc" $(pkg-config --libs flux)
LD_LIBRARY_PATH="$prefix/lib" "$build_dir/consumer-build/consumer-pc"
test -x "$prefix/bin/flux-info"
LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/flux-info" >/dev/null
echo "install consumer: ok"
