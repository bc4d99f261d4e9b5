#!/usr/bin/env bash
# The installed plugin SDK (meson test sdk_out_of_tree): stages
# `meson install --tags devel` into a temporary directory, builds
# sdk_probe_plugin.cpp there with the C++ compiler and only the flags of the
# staged allocscope.pc (PKG_CONFIG_LIBDIR / PKG_CONFIG_SYSROOT_DIR), checks
# that every allocscope header it read came from the staged tree and that
# it exports allocscope_plugin_v1, then replays a recorded trace with it and
# asserts its finding. Exits 77 (skipped) only when meson, pkg-config or a
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

for h in plugin_v1.h doctest.h allocscope.h allocscope_dl.h sdk.h sdk/adapter.h sdk/tag_rules.h \
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
[ "$(pkg-config --variable=plugin_symbol allocscope)" = allocscope_plugin_v1 ] ||
  fail "allocscope.pc: plugin_symbol is not allocscope_plugin_v1"

# Built away from the source tree, so no relative include can reach it.
mkdir "$tmp/plugin"
cp "$src/sdk_probe_plugin.cpp" "$tmp/plugin/"
cd "$tmp/plugin"
# shellcheck disable=SC2086
# As plugins/README.md says: one exported symbol, the plugin's struct.
echo '{ global: allocscope_plugin_v1; local: *; };' >exports.map
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
[ "$exported" = allocscope_plugin_v1 ] ||
  fail "the plugin exports $(echo "$exported" | wc -l) symbols, not only allocscope_plugin_v1: $(echo "$exported" | head -5 | tr '\n' ' ')"

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
