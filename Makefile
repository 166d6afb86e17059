# The two commands for a new user: `make demo` and `make test`.
# Both install what is missing first (scripts/install-deps.sh).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: deps build build-no-mcp demo test test-native test-wasm test-node test-e2e lint typecheck protocol-types bench clean

deps:
	bash scripts/install-deps.sh

build: deps
	bash scripts/build.sh

# The package of the build without MCP (wasm-pack.toml [variant.no-mcp]),
# into target/pkg-no-mcp; tests/e2e/no-mcp.mjs runs it.
build-no-mcp: deps
	bash scripts/build.sh --variant no-mcp

demo: build
	node scripts/demo.mjs

# Every test layer; stops at the first failing layer.
test: deps test-native lint build build-no-mcp test-node test-wasm test-e2e
	@echo "== all test layers passed"

test-native:
	cargo test

test-wasm:
	bash scripts/test-wasm.sh

test-node:
	node --test tests/mock-llm/ tests/mock-mcp/ tests/support/ tests/extension/ tests/bench/

# The build without MCP is rebuilt first (up to date: seconds), so
# no-mcp.mjs never runs a stale variant beside the current build.
test-e2e: build-no-mcp
	node tests/e2e/run.mjs
	node tests/e2e/tools.mjs
	node tests/e2e/host-tools.mjs
	node tests/e2e/embedding.mjs
	node tests/e2e/no-mcp.mjs
	node tests/e2e/mcp.mjs
	node tests/e2e/long.mjs
	node tests/e2e/lifetime.mjs
	node tests/e2e/panel.mjs
	node tests/e2e/monkey.mjs

# Clippy on both targets, with the default features and without them (the
# build without MCP, wasm-pack.toml [variant.no-mcp]), so neither rots.
lint: typecheck
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --target wasm32-unknown-unknown --all-targets -- -D warnings
	cargo clippy --no-default-features --all-targets -- -D warnings
	cargo clippy --target wasm32-unknown-unknown --no-default-features --all-targets -- -D warnings

# The side panel's JavaScript against the protocol types generated from Rust
# (www/protocol.d.ts; tsconfig.json). Emits nothing.
typecheck:
	node_modules/.bin/tsc -p tsconfig.json

# Regenerates www/protocol.d.ts from src/protocol.rs and src/model.rs
# (tests/suite/protocol_ts.rs); `cargo test protocol_ts` fails while it is stale.
protocol-types:
	UPDATE_PROTOCOL_TS=1 cargo test --test all protocol_ts

# Benchmarks (BENCHMARKS.md): the release extension, then native criterion
# benches, the size of the build without MCP (scripts/build.sh --variant
# no-mcp, into target/pkg-no-mcp and target/variant-no-mcp) and the browser
# harness; writes target/bench/results.json.
# BENCH_ARGS=--quick for a short smoke run.
bench: deps
	bash scripts/build.sh
	node scripts/bench.mjs $(BENCH_ARGS)

clean:
	rm -rf dist target/pkg target/pkg-no-mcp target/variant-no-mcp target/demo target/e2e target/bench
