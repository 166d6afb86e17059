// Unit tests of the bench's build without MCP (scripts/bench/variant-size.mjs):
// the variant's settings as build.sh reads them from wasm-pack.toml (MCP off,
// its own out_dir, the default build's settings untouched), and which
// function names are the MCP client's (`make bench` reports a problem when
// the build without MCP still has any). BENCHMARKS.md item 52.
// Run: node --test tests/bench/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { isMcpClientFunction, parseAssignments, variantConfig } from '../../scripts/bench/variant-size.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

test('the_no_mcp_variant_builds_without_default_features_into_its_own_directory_and_the_default_build_is_unchanged', () => {
  const defaults = parseAssignments(execFileSync('python3', [path.join(ROOT, 'scripts', 'wasm_pack_config.py')], { cwd: ROOT, encoding: 'utf8' }));
  // The default build passes no feature flags: Cargo.toml's defaults, MCP included.
  assert.equal(defaults.WP_BUILD_FEATURES, 'default');
  assert.equal(defaults.WP_BUILD_FEATURE_FLAGS, '');
  assert.equal(defaults.WP_VARIANT, '');

  const noMcp = variantConfig(ROOT, 'no-mcp');
  assert.equal(noMcp.WP_VARIANT, 'no-mcp');
  assert.equal(noMcp.WP_BUILD_FEATURES, '');
  assert.equal(noMcp.WP_BUILD_FEATURE_FLAGS, '--no-default-features');
  assert.notEqual(noMcp.WP_BUILD_OUT_DIR, defaults.WP_BUILD_OUT_DIR, 'the variant must not replace the default package');
  // Everything else is the default build's (the same wasm-opt flags: sizes compare).
  for (const key of ['WP_BUILD_TARGET', 'WP_BUILD_PROFILE', 'WP_BUILD_OUT_NAME', 'WP_BUILD_WASM_OPT', 'WP_BUILD_WASM_OPT_FLAGS']) {
    assert.equal(noMcp[key], defaults[key], key);
  }
  assert.throws(() => variantConfig(ROOT, 'no-such-variant'));
});

test('assignments_read_as_shlex_quote_writes_them', () => {
  const parsed = parseAssignments("A=plain\nB='two words'\nC=''\nD='it'\"'\"'s'\nnot an assignment\n");
  assert.deepEqual(parsed, { A: 'plain', B: 'two words', C: '', D: "it's" });
});

test('the_mcp_client_is_named_in_every_form_a_build_carries_and_nothing_else_is', () => {
  const client = [
    // cargo's output: legacy and v0 manglings
    '_ZN8sw_agent8platform3mcp6Server4call17h0123456789abcdefE',
    '_ZN8sw_agent8platform5oauth7refresh28_$u7b$$u7b$closure$u7d$$u7d$17h0123456789abcdefE',
    '_ZN4core3ptr87drop_in_place$LT$sw_agent..platform..mcp..Server..call..$u7b$$u7b$closure$u7d$$u7d$$GT$17h3c596f197d6f1194E',
    '_ZN83_$LT$sw_agent..platform..mcp..CancelOnDrop$u20$as$u20$core..ops..drop..Drop$GT$4drop17h0123456789abcdefE',
    '_RNvMNtNtCs1a2b3c4d_8sw_agent8platform3mcpNtB2_6Server4call',
    // wasm-opt's names (demangled, with or without the crate hash)
    'sw_agent::platform::mcp::Server::list_tools::{{closure}}::h87b9ea666fad1cf3',
    'sw_agent[1a2b3c4d5e6f7a8b]::platform::oauth::sign_in',
    'core::ptr::drop_in_place<sw_agent::platform::mcp::McpServers>',
  ];
  for (const name of client) assert.ok(isMcpClientFunction(name), name);
  const others = [
    // the build without MCP's own stand-in
    '_ZN8sw_agent8platform6no_mcp8not_used17hde035ad068816944E',
    'sw_agent::platform::no_mcp::<impl sw_agent::platform::Driver>::mcp_at_start',
    // the engine and the pure halves stay in both builds
    '_ZN8sw_agent6engine6Engine17handle_mcp_status17h40cde5036aae27a4E',
    '_ZN8sw_agent3mcp13parse_servers17h0123456789abcdefE',
    '_ZN8sw_agent5oauth9challenge17h0123456789abcdefE',
    'sw_agent::platform::Driver::run_tool::{{closure}}::h87b9ea666fad1cf3',
    '_ZN8sw_agent8platform12EngineHandle19on_mcp_user_servers17h10f817e0f172b3ddE',
    '',
  ];
  for (const name of others) assert.ok(!isMcpClientFunction(name), name);
});
