#!/usr/bin/env bash
# Run the wasm tests (tests/web.rs) in every browser listed in wasm-pack.toml,
# headless, with drivers that are already installed (never downloaded).
#
# The fetch/stream tests talk to the local mock LLM (tests/mock-llm/server.mjs,
# 127.0.0.1 only). It is started here on a free port and stopped on exit; its
# URL reaches the tests at compile time through MOCK_LLM_URL
# (`option_env!` in tests/web.rs: without it those tests fail, they never skip).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(python3 scripts/wasm_pack_config.py)"

mock_out="$(mktemp)"
mock_pid=""
stop_mock() {
  if [ -n "$mock_pid" ]; then
    kill "$mock_pid" 2>/dev/null || true
    wait "$mock_pid" 2>/dev/null || true
  fi
  rm -f "$mock_out"
}
trap stop_mock EXIT
node tests/mock-llm/server.mjs --port 0 >"$mock_out" &
mock_pid=$!
MOCK_LLM_URL=""
for _ in $(seq 1 100); do
  line="$(head -n 1 "$mock_out")"
  if [[ "$line" == MOCK_LLM_URL=*/v1 ]]; then
    MOCK_LLM_URL="${line#MOCK_LLM_URL=}"
    break
  fi
  if ! kill -0 "$mock_pid" 2>/dev/null; then
    echo "test-wasm.sh: the mock LLM server exited before printing its URL" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$MOCK_LLM_URL" ]; then
  echo "test-wasm.sh: the mock LLM server did not print MOCK_LLM_URL within 10 s" >&2
  exit 1
fi
export MOCK_LLM_URL
echo "== mock LLM at $MOCK_LLM_URL"

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
