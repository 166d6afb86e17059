#!/usr/bin/env bash
# Replace dist/extension's .wasm with the same build carrying its function
# names (a name section), for scripts/bench-cold-profile.mjs: the code is the
# one build.sh optimized (same flags from wasm-pack.toml, `-g` instead of
# `--strip-debug`), so function indices and sizes match the shipped module's
# except for the name section. Run `bash scripts/build.sh` first; run it again
# to get the shipped module back.
#
# With `--out DIR` the named module is written to DIR/sw_agent_bg.wasm
# instead and dist/ is left alone (`make bench` reads the shipped module's
# size per owner from it: scripts/bench/wasm-size.mjs, gzipByOwner).
set -euo pipefail
cd "$(dirname "$0")/.."
out=""
if [ "${1:-}" = "--out" ] && [ -n "${2:-}" ]; then
  out=$2
elif [ $# -gt 0 ]; then
  echo "usage: bash scripts/bench-named-wasm.sh [--out DIR]" >&2
  exit 2
fi
eval "$(python3 scripts/wasm_pack_config.py)"
input=${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/release/${WP_BUILD_OUT_NAME}.wasm
[ -f "$input" ] || { echo "missing $input: run 'bash scripts/build.sh' first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wasm-bindgen --target "$WP_BUILD_TARGET" --keep-debug --out-dir "$tmp" --out-name "$WP_BUILD_OUT_NAME" "$input"
flags=()
for f in $WP_BUILD_WASM_OPT_FLAGS; do
  [ "$f" = "--strip-debug" ] || flags+=("$f")
done
if [ -n "$out" ]; then
  mkdir -p "$out"
  node_modules/.bin/wasm-opt "${flags[@]}" -g --strip-dwarf "$tmp/${WP_BUILD_OUT_NAME}_bg.wasm" -o "$out/${WP_BUILD_OUT_NAME}_bg.wasm"
  echo "$out/${WP_BUILD_OUT_NAME}_bg.wasm: the shipped module with function names"
  exit 0
fi
node_modules/.bin/wasm-opt "${flags[@]}" -g --strip-dwarf "$tmp/${WP_BUILD_OUT_NAME}_bg.wasm" -o "dist/extension/pkg/${WP_BUILD_OUT_NAME}_bg.wasm"
cp "$tmp/$WP_BUILD_OUT_NAME.js" "dist/extension/pkg/"
echo "dist/extension/pkg/${WP_BUILD_OUT_NAME}_bg.wasm now carries function names"
