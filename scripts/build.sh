#!/usr/bin/env bash
# Build the wasm package with the settings of wasm-pack.toml and assemble the
# unpacked extension in dist/extension/.
#
# Usage: bash scripts/build.sh [--variant NAME] [--out-dir DIR]
#   --variant NAME  a [variant.NAME] of wasm-pack.toml (its features, its
#                   out_dir), built with a cargo target directory of its own
#                   ($CARGO_TARGET_DIR/variant-NAME, else target/variant-NAME)
#   --out-dir DIR   the package goes to DIR instead of the out_dir
# With either, only the package is built: dist/extension and the default
# build's files are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=""
out_override=""
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) [ -n "${2:-}" ] || { echo "build.sh: --variant needs a name" >&2; exit 2; }; variant=$2; shift 2 ;;
    --out-dir) [ -n "${2:-}" ] || { echo "build.sh: --out-dir needs a directory" >&2; exit 2; }; out_override=$2; shift 2 ;;
    *) echo "usage: bash scripts/build.sh [--variant NAME] [--out-dir DIR]" >&2; exit 2 ;;
  esac
done
config=$(python3 scripts/wasm_pack_config.py ${variant:+--variant "$variant"})
eval "$config"
[ -z "$out_override" ] || WP_BUILD_OUT_DIR=$out_override
if [ -n "$variant" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/variant-$variant"
fi

profile_flag="--release"
case "$WP_BUILD_PROFILE" in
  release) profile_flag="--release" ;;
  dev) profile_flag="--dev" ;;
  profiling) profile_flag="--profiling" ;;
  *) echo "wasm-pack.toml: unknown build.profile $WP_BUILD_PROFILE" >&2; exit 1 ;;
esac

package_only=""
[ -z "$variant" ] && [ -z "$out_override" ] || package_only=1

# A module the worker imports that does not parse would stop it at every
# start (the embedding extension's files above all): fail here instead.
[ -n "$package_only" ] || node scripts/check-js.mjs extension

# --no-opt: wasm-pack would download binaryen; we run npm's wasm-opt below.
# The features (build.features) go to cargo after `--`.
# shellcheck disable=SC2086
wasm-pack build --mode no-install --target "$WP_BUILD_TARGET" "$profile_flag" \
  --out-dir "$WP_BUILD_OUT_DIR" --out-name "$WP_BUILD_OUT_NAME" --no-opt --no-pack \
  ${WP_BUILD_FEATURE_FLAGS:+-- $WP_BUILD_FEATURE_FLAGS}

wasm="$WP_BUILD_OUT_DIR/${WP_BUILD_OUT_NAME}_bg.wasm"
if [ "$WP_BUILD_WASM_OPT" = "binaryen-npm" ]; then
  opt=node_modules/.bin/wasm-opt
  [ -x "$opt" ] || { echo "missing $opt: run 'make deps' (npm install)" >&2; exit 1; }
  before=$(stat -c %s "$wasm")
  # shellcheck disable=SC2086
  "$opt" $WP_BUILD_WASM_OPT_FLAGS "$wasm" -o "$wasm.opt"
  mv "$wasm.opt" "$wasm"
  echo "wasm-opt: $before -> $(stat -c %s "$wasm") bytes"
fi

if [ -n "$package_only" ]; then
  echo "built $WP_BUILD_OUT_DIR${variant:+ (variant $variant: ${WP_BUILD_FEATURE_FLAGS:-default features})}; wasm $(stat -c %s "$wasm") bytes, gzip $(gzip -9c "$wasm" | wc -c) bytes"
  exit 0
fi

out=dist/extension
rm -rf "$out"
mkdir -p "$out/pkg" "$out/sidepanel"
cp -r extension/. "$out/"
cp -r www/. "$out/sidepanel/"
# Type declarations are for `make typecheck` only.
rm -f "$out"/sidepanel/*.d.ts
cp "$WP_BUILD_OUT_DIR/$WP_BUILD_OUT_NAME.js" "$wasm" "$out/pkg/"
# The build id (first 16 hex digits of the SHA-256 of the module and its JS
# glue) goes into the built manifest's version_name: extension/wasm-cache.js
# caches the module under it, so a cached module only ever meets the glue of
# its own build. scripts/built-manifest.mjs also checks the manifest and,
# for a module without MCP, drops the `identity` permission.
build_id=$(cat "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm" "$out/pkg/$WP_BUILD_OUT_NAME.js" | sha256sum | cut -c1-16)
node scripts/built-manifest.mjs "$out/manifest.json" "$build_id" "$WP_BUILD_FEATURES"
echo "built $out ($(du -sh "$out" | cut -f1)); wasm $(stat -c %s "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm") bytes, gzip $(gzip -9c "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm" | wc -c) bytes"
