#!/usr/bin/env bash
# Installs this build into a fresh prefix and builds two programs against it as an embedding project would:
# tests/consumer (C++, find_package(smla) -> smla::smla) and tests/test_c_header.c (C, pkg-config smla), then runs
# both from the prefix alone. Usage: install_consumer.sh <build-dir> <source-dir> <work-dir>
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# A step that fails shows its own log: the steps below write theirs to files, and set -e alone would end the test with
# no word of what failed (it once failed in a parallel ctest run and left nothing to read).
step=start
trap 'rc=$?; echo "install: failed at step \"$step\" (exit $rc)"; for f in "$work"/*.log; do [ -s "$f" ] &&
  { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }; done; exit $rc' ERR
prefix=$work/prefix
step="install"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

libdir=$(dirname "$(find "$prefix" -name smlaConfig.cmake -path '*/cmake/smla/*')")/../..
for f in include/smla/smla.h include/smla/smla.hpp bin/smla-bench bin/smla-warmup bin/smla-tune bin/smla-cache; do
  test -e "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
test -L "$libdir/libsmla.so" || { echo "no libsmla.so link in $libdir"; exit 1; }
soname=$(readelf -d "$libdir/libsmla.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
test -e "$libdir/$soname" || { echo "the soname $soname is not in $libdir"; exit 1; }
echo "installed: soname $soname"

step="configure the consumer"
cmake -S "$src/tests/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$work/consumer-configure.log"
step="build the consumer"
cmake --build "$work/consumer" > "$work/consumer-build.log"
# The program must run against the installed library, not the build tree's.
step="check the consumer's library"
ldd "$work/consumer/consumer" | grep -F "$(cd "$libdir" && pwd)/$soname" > /dev/null ||
  { echo "consumer does not load $soname from the prefix:"; ldd "$work/consumer/consumer"; exit 1; }
step="run the consumer"
SMLA_CACHE_DIR=$work/cache "$work/consumer/consumer"

step="pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
test "$(pkg-config --modversion smla)" = "$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$libdir/cmake/smla/smlaConfigVersion.cmake")" ||
  { echo "smla.pc and smlaConfigVersion.cmake disagree"; exit 1; }
step="build the C test"
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -Werror -o "$work/c_header" "$src/tests/test_c_header.c" $(pkg-config --cflags --libs smla)
step="run the C test"
LD_LIBRARY_PATH=$libdir SMLA_CACHE_DIR=$work/cache "$work/c_header"
echo "install: both consumers passed"
