#!/usr/bin/env bash
# Install what building and testing need, skipping what is already present.
# Works on a fresh Debian 12 machine as root (CI) or with sudo. Downloads only
# from Debian apt, crates.io and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_missing=()
command -v chromium >/dev/null || apt_missing+=(chromium)
command -v chromedriver >/dev/null || apt_missing+=(chromium-driver)
command -v firefox-esr >/dev/null || command -v firefox >/dev/null || apt_missing+=(firefox-esr)
command -v node >/dev/null || apt_missing+=(nodejs npm)
command -v python3 >/dev/null || apt_missing+=(python3)
command -v gzip >/dev/null || apt_missing+=(gzip)
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "== apt: ${apt_missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}"
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "== rustup target wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown
fi

# wasm-bindgen-cli must match the wasm-bindgen version in Cargo.lock exactly.
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$want" ]; then
  echo "== cargo install wasm-bindgen-cli =$want (have: ${have:-none})"
  cargo install wasm-bindgen-cli --version "=$want" --force
fi

command -v wasm-pack >/dev/null || { echo "== cargo install wasm-pack"; cargo install wasm-pack; }
command -v geckodriver >/dev/null || { echo "== cargo install geckodriver"; cargo install geckodriver; }

if [ ! -x node_modules/.bin/wasm-opt ] || [ ! -d node_modules/playwright-core ] \
   || [ ! -x node_modules/.bin/tsc ] || [ ! -d node_modules/@types/chrome ] \
   || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "== npm ci"
  npm ci --no-audit --no-fund
fi
echo "== dependencies ready"
