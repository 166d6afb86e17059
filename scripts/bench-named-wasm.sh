#!/usr/bin/env bash
# Replace dist/extension's .wasm with the same build carrying its function
# names (a name section), for scripts/bench-cold-profile.mjs: the code is the
# one build.sh optimized (same flags from wasm-pack.toml, `-g` instead of
# `--strip-debug`), so function indices and sizes match the shipped module's
# except for the name section. Run `bash scripts/build.sh` first; run it again
# to get the shipped module back.
set -euo pipefail
cd "$(dirname "$0")/.."
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
node_modules/.bin/wasm-opt "${flags[@]}" -g --strip-dwarf "$tmp/${WP_BUILD_OUT_NAME}_bg.wasm" -o "dist/extension/pkg/${WP_BUILD_OUT_NAME}_bg.wasm"
cp "$tmp/$WP_BUILD_OUT_NAME.js" "dist/extension/pkg/"
echo "dist/extension/pkg/${WP_BUILD_OUT_NAME}_bg.wasm now carries function names"
