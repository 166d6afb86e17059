// The size of a variant of the build (wasm-pack.toml [variant.NAME]; `make
// bench` measures `no-mcp`, the module without the MCP client: BENCHMARKS.md
// item 52), and whether the MCP client really is out of it.
//
// Owns: building the variant with scripts/build.sh --variant, which puts it
// in the variant's own out_dir and cargo target directory (never
// dist/extension, never the default build's files), its raw and gzip -9
// bytes, and counting the functions of the MCP client (src/platform/mcp.rs,
// src/platform/oauth.rs) in a module's name section (cargo's own output,
// before wasm-bindgen and wasm-opt drop the names).
// Must not: depend on any package.

import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { parseWasm } from './wasm-size.mjs';

/**
 * `wasm_pack_config.py --variant NAME`'s assignments as an object (WP_BUILD_OUT_DIR
 * → 'target/pkg-no-mcp', …): the variant's settings as build.sh sees them.
 */
export function variantConfig(root, name) {
  const text = execFileSync('python3', [path.join(root, 'scripts', 'wasm_pack_config.py'), '--variant', name], { cwd: root, encoding: 'utf8' });
  return parseAssignments(text);
}

/** `KEY=value` lines as shlex.quote writes them (bare, or in single quotes). */
export function parseAssignments(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const match = /^([A-Z0-9_]+)=(.*)$/.exec(line);
    if (!match) continue;
    let value = match[2];
    if (value.startsWith("'")) {
      // shlex.quote: 'it'"'"'s' is it's
      value = value.slice(1, -1).replaceAll(`'"'"'`, "'");
    }
    out[match[1]] = value;
  }
  return out;
}

/**
 * Builds variant `name` (scripts/build.sh --variant NAME; into `outDir`
 * instead of its out_dir if given) and returns its files: the shipped module
 * (after wasm-opt) and cargo's own output (with names), in the variant's own
 * cargo target directory.
 */
export function buildVariant(root, name, outDir = null) {
  const args = [path.join(root, 'scripts', 'build.sh'), '--variant', name, ...(outDir ? ['--out-dir', outDir] : [])];
  execFileSync('bash', args, { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  const config = variantConfig(root, name);
  const targetDir = path.resolve(root, process.env.CARGO_TARGET_DIR || 'target', `variant-${name}`);
  return {
    config,
    wasm: path.resolve(root, outDir ?? config.WP_BUILD_OUT_DIR, `${config.WP_BUILD_OUT_NAME}_bg.wasm`),
    cargoWasm: path.join(targetDir, 'wasm32-unknown-unknown', 'release', `${config.WP_BUILD_OUT_NAME}.wasm`),
  };
}

/** Raw and gzip -9 bytes of a module. */
export function wasmBytes(file) {
  const bytes = readFileSync(file);
  return { raw: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length };
}

/**
 * Whether a function name (legacy `_ZN` or v0 `_R` mangling, or demangled)
 * is one of the MCP client's: a function of `sw_agent::platform::mcp` or
 * `sw_agent::platform::oauth` (a closure or an impl in them included).
 */
export function isMcpClientFunction(name) {
  // Mangled, each segment is length-prefixed (`8platform3mcp6Server…`);
  // demangled, `::` or (inside a legacy `$LT$…$GT$`) `..` separates them.
  return /8sw_agent8platform(?:3mcp|5oauth)/.test(name)
    || /sw_agent(?:\[[0-9a-f]+\])?(?:::|\.\.)platform(?:::|\.\.)(?:mcp|oauth)(?:::|\.\.)/.test(name);
}

/** How many functions of the MCP client a module names (null: no name section). */
export function mcpClientFunctions(file) {
  const parsed = parseWasm(readFileSync(file));
  if (parsed.names.size === 0) return null;
  let count = 0;
  for (const name of parsed.names.values()) if (isMcpClientFunction(name)) count += 1;
  return count;
}

/**
 * The module without the MCP client: variant `no-mcp` built (into `outDir`
 * if given), its raw and gzip -9 bytes, and how many functions of the
 * client its cargo output names (must be 0) next to how many the default
 * build's does (`defaultCargoWasm`; must be more than 0, or the count
 * would prove nothing).
 */
export function measureNoMcp(root, defaultCargoWasm, outDir = null) {
  const built = buildVariant(root, 'no-mcp', outDir);
  return {
    features: built.config.WP_BUILD_FEATURE_FLAGS,
    wasm: built.wasm,
    ...wasmBytes(built.wasm),
    clientFunctions: mcpClientFunctions(built.cargoWasm),
    defaultClientFunctions: mcpClientFunctions(defaultCargoWasm),
  };
}
