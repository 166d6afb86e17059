#!/usr/bin/env bash
# Build the wasm package with the settings of wasm-pack.toml and assemble the
# unpacked extension in dist/extension/.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(python3 scripts/wasm_pack_config.py)"

profile_flag="--release"
case "$WP_BUILD_PROFILE" in
  release) profile_flag="--release" ;;
  dev) profile_flag="--dev" ;;
  profiling) profile_flag="--profiling" ;;
  *) echo "wasm-pack.toml: unknown build.profile $WP_BUILD_PROFILE" >&2; exit 1 ;;
esac

# A module the worker imports that does not parse would stop it at every
# start (the embedding extension's files above all): fail here instead.
node scripts/check-js.mjs extension

# --no-opt: wasm-pack would download binaryen; we run npm's wasm-opt below.
wasm-pack build --mode no-install --target "$WP_BUILD_TARGET" "$profile_flag" \
  --out-dir "$WP_BUILD_OUT_DIR" --out-name "$WP_BUILD_OUT_NAME" --no-opt --no-pack

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
# its own build.
build_id=$(cat "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm" "$out/pkg/$WP_BUILD_OUT_NAME.js" | sha256sum | cut -c1-16)
node -e '
  const fs = require("fs");
  const m = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  m.version_name = `${m.version} (wasm ${process.argv[2]})`;
  fs.writeFileSync(process.argv[1], JSON.stringify(m, null, 2) + "\n");
  const fail = (why) => { console.error("manifest: " + why); process.exit(1); };
  if (m.manifest_version !== 3) fail("manifest_version must be 3");
  if (m.background?.type !== "module") fail("service worker must be a module");
  if (!/wasm-unsafe-eval/.test(m.content_security_policy?.extension_pages ?? "")) fail("CSP needs wasm-unsafe-eval");
' "$out/manifest.json" "$build_id"
echo "built $out ($(du -sh "$out" | cut -f1)); wasm $(stat -c %s "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm") bytes, gzip $(gzip -9c "$out/pkg/${WP_BUILD_OUT_NAME}_bg.wasm" | wc -c) bytes"
