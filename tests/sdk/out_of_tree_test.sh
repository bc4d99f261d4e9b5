#!/usr/bin/env bash
# The installed plugin SDK (meson test sdk_out_of_tree): stages
# `meson install --tags devel` into a temporary directory, builds
# sdk_probe_plugin.cpp there with the C++ compiler and only the flags of the
# staged allocscope.pc (PKG_CONFIG_LIBDIR / PKG_CONFIG_SYSROOT_DIR), checks
# that every allocscope header it read came from the staged tree and that
# it exports allocscope_plugin_v2, then replays a recorded trace with it and
# asserts its finding. Then the same for a version 1 plugin built with the
# C compiler against plugin_v1.h as version 1 was released
# (tests/plugins/v1_frozen) and nothing else: the host's v1 adapter runs it. Exits 77 (skipped) only when meson, pkg-config or a
# C++ compiler is missing.
#   out_of_tree_test.sh BUILD_DIR ALLOCSCOPE_CLI TRACE
set -euo pipefail
build=$(cd "$1" && pwd)
cli=$2
trace=$3
src=$(cd "$(dirname "$0")" && pwd)
cxx=${CXX:-c++}
for tool in meson pkg-config "$cxx" nm; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: no $tool"
    exit 77
  fi
done
fail() {
  echo "FAIL: $*"
  exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
meson install -C "$build" --no-rebuild --tags devel --destdir "$root" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install --destdir failed"; }

for h in plugin_v1.h plugin_v2.h doctest.h allocscope.h allocscope_dl.h sdk.h sdk/adapter.h sdk/tag_rules.h \
  sdk/evidence.h sdk/flat_map.h sdk/weight_params.h; do
  [ -n "$(find "$root" -path "*/include/allocscope/$h")" ] || fail "allocscope/$h not installed"
done
pc=$(find "$root" -name allocscope.pc | head -n 1)
[ -n "$pc" ] || fail "no allocscope.pc installed"
export PKG_CONFIG_LIBDIR
PKG_CONFIG_LIBDIR=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$root
unset PKG_CONFIG_PATH
cflags=$(pkg-config --cflags allocscope)
echo "cflags: $cflags"
case "$cflags" in
  *"$root"*) ;;
  *) fail "pkg-config --cflags does not point into the staged tree: $cflags" ;;
esac
[ "$(pkg-config --variable=plugin_symbol allocscope)" = allocscope_plugin_v2 ] ||
  fail "allocscope.pc: plugin_symbol is not allocscope_plugin_v2"

# Built away from the source tree, so no relative include can reach it.
mkdir "$tmp/plugin"
cp "$src/sdk_probe_plugin.cpp" "$tmp/plugin/"
cd "$tmp/plugin"
# shellcheck disable=SC2086
# As plugins/README.md says: one exported symbol, the plugin's struct.
echo '{ global: allocscope_plugin_v2; local: *; };' >exports.map
"$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror -O1 -fPIC -shared -fvisibility=hidden \
  -Wl,--version-script=exports.map \
  $cflags -MD -MF deps.d sdk_probe_plugin.cpp -o allocscope-plugin-sdk-probe.so ||
  fail "the out-of-tree plugin does not build against the installed headers"
used=$(sed 's/[ \\]/\n/g' deps.d | grep 'allocscope/' || true)
[ -n "$used" ] || fail "no allocscope header was read"
while read -r header; do
  [ -z "$header" ] && continue
  case "$header" in
    "$root"/*) ;;
    *) fail "read $header, outside the installed tree" ;;
  esac
done <<<"$used"
exported=$(nm -D --defined-only allocscope-plugin-sdk-probe.so | awk '$2 ~ /^[A-Za-z]$/ && $2 != "A" {print $3}')
[ "$exported" = allocscope_plugin_v2 ] ||
  fail "the plugin exports $(echo "$exported" | wc -l) symbols, not only allocscope_plugin_v2: $(echo "$exported" | head -5 | tr '\n' ' ')"

"$cli" replay "$trace" --plugins "$tmp/plugin/allocscope-plugin-sdk-probe.so" \
  -o "$tmp/findings.json" >"$tmp/out" 2>"$tmp/err" ||
  { cat "$tmp/out" "$tmp/err"; fail "allocscope replay with the plugin failed"; }
cat "$tmp/out" "$tmp/err"
grep -q 'disabled' "$tmp/err" && fail "the plugin was disabled"
grep -q 'sdk-probe' "$tmp/out" || fail "replay printed no sdk-probe finding"
grep -q '"plugin": *"sdk-probe"' "$tmp/findings.json" || fail "findings.json has no sdk-probe finding"
grep -Eq '"summary": *"sdk-probe: [^"]*forward [1-9][0-9]* \(' "$tmp/findings.json" ||
  fail "the sdk-probe finding counts no forward allocation"
echo "PASS: an out-of-tree plugin built on the installed SDK ran in allocscope replay"

# A version 1 plugin from before version 2: test-count's source built with
# -DTEST_V1 against the frozen header alone, away from the source tree,
# exported as that header says (allocscope_plugin), one symbol.
cc=${CC:-cc}
if ! command -v "$cc" >/dev/null; then
  echo "SKIP: no $cc for the version 1 plugin"
  exit 0
fi
mkdir -p "$tmp/v1/allocscope"
cp "$src/../plugins/v1_frozen/allocscope/plugin_v1.h" "$tmp/v1/allocscope/"
cp "$src/../plugins/count_plugin.c" "$tmp/v1/"
cd "$tmp/v1"
echo '{ global: allocscope_plugin; local: *; };' >exports.map
"$cc" -std=c11 -Wall -Wextra -Werror -O1 -fPIC -shared -fvisibility=hidden \
  -Wl,--version-script=exports.map -I. -DTEST_V1 '-DTEST_NAME="test-v1-oot"' \
  count_plugin.c -o allocscope-plugin-test-v1-oot.so ||
  fail "the version 1 plugin does not build against the released plugin_v1.h"
exported=$(nm -D --defined-only allocscope-plugin-test-v1-oot.so | awk '$2 ~ /^[A-Za-z]$/ && $2 != "A" {print $3}')
[ "$exported" = allocscope_plugin ] ||
  fail "the version 1 plugin exports $(echo "$exported" | wc -l) symbols, not only allocscope_plugin: $(echo "$exported" | head -5 | tr '\n' ' ')"
"$cli" replay "$trace" --plugins "$tmp/v1/allocscope-plugin-test-v1-oot.so" \
  -o "$tmp/findings-v1.json" >"$tmp/out" 2>"$tmp/err" ||
  { cat "$tmp/out" "$tmp/err"; fail "allocscope replay with the version 1 plugin failed"; }
cat "$tmp/out" "$tmp/err"
grep -q 'disabled' "$tmp/err" && fail "the version 1 plugin was disabled"
grep -q '"plugin": *"test-v1-oot"' "$tmp/findings-v1.json" ||
  fail "findings-v1.json has no test-v1-oot finding"
grep -Eq '"summary": *"events=[1-9][0-9]* alloc=[1-9][0-9]* [^"]* derived=0 ' "$tmp/findings-v1.json" ||
  fail "the version 1 plugin saw no allocation, or a DERIVED event"
echo "PASS: a version 1 plugin built against the released plugin_v1.h ran in allocscope replay"
