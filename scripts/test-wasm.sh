#!/usr/bin/env bash
# Run the wasm tests (tests/web.rs) in every browser listed in wasm-pack.toml,
# headless, with drivers that are already installed (never downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(python3 scripts/wasm_pack_config.py)"
headless=""
[ "$WP_TEST_HEADLESS" = "true" ] && headless="--headless"
for browser in $WP_TEST_BROWSERS; do
  case "$browser" in
    chrome) driver=(--chrome --chromedriver "$WP_TEST_CHROMEDRIVER") ;;
    firefox) driver=(--firefox --geckodriver "$WP_TEST_GECKODRIVER") ;;
    *) echo "wasm-pack.toml: unknown browser $browser" >&2; exit 1 ;;
  esac
  echo "== wasm tests in $browser"
  wasm-pack test --mode no-install $headless "${driver[@]}" -- --test web
done
