// Unit tests of scripts/built-manifest.mjs, the build's last step on the
// manifest. Run: node --test tests/extension/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { builtManifest, hasMcp } from '../../scripts/built-manifest.mjs';

const SHIPPED = JSON.parse(readFileSync('extension/manifest.json', 'utf8'));

test('the build id goes into version_name and the MCP build keeps every permission', () => {
  const { manifest, problems } = builtManifest(SHIPPED, { buildId: '0123456789abcdef', mcp: true });
  assert.deepEqual(problems, []);
  assert.equal(manifest.version_name, `${SHIPPED.version} (wasm 0123456789abcdef)`);
  assert.deepEqual(manifest.permissions, SHIPPED.permissions);
  assert.ok(manifest.permissions.includes('identity'), 'signing in to MCP servers needs it');
});

test('a build without MCP does not ask for the identity permission and keeps the rest', () => {
  const { manifest } = builtManifest(SHIPPED, { buildId: 'x', mcp: false });
  assert.deepEqual(manifest.permissions, SHIPPED.permissions.filter((p) => p !== 'identity'));
  assert.ok(SHIPPED.permissions.includes('identity'), 'the source manifest is not changed');
});

test('wasm-pack.toml features tell whether the module has the MCP client', () => {
  assert.equal(hasMcp('default'), true);
  assert.equal(hasMcp('mcp'), true);
  assert.equal(hasMcp(''), false);
  assert.equal(hasMcp('  '), false);
  assert.equal(hasMcp('other mcp'), true);
  assert.equal(hasMcp('mcpx'), false);
});

test('a manifest the worker cannot start with is refused with its reasons, and the script fails', () => {
  const broken = { ...SHIPPED, background: { service_worker: 'sw.js' }, content_security_policy: {} };
  assert.deepEqual(builtManifest(broken, { buildId: 'x', mcp: true }).problems, [
    'the service worker must be a module',
    'the CSP of extension pages needs wasm-unsafe-eval',
  ]);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'built-manifest-'));
  try {
    const file = path.join(dir, 'manifest.json');
    writeFileSync(file, JSON.stringify(broken));
    const run = spawnSync(process.execPath, ['scripts/built-manifest.mjs', file, 'abc', 'default'], { encoding: 'utf8' });
    assert.equal(run.status, 1);
    assert.match(run.stderr, /manifest: the service worker must be a module/);
    assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), broken, 'left as it was');
    writeFileSync(file, JSON.stringify(SHIPPED));
    const ok = spawnSync(process.execPath, ['scripts/built-manifest.mjs', file, 'abc', ''], { encoding: 'utf8' });
    assert.equal(ok.status, 0, ok.stderr);
    const written = JSON.parse(readFileSync(file, 'utf8'));
    assert.equal(written.version_name, `${SHIPPED.version} (wasm abc)`);
    assert.ok(!written.permissions.includes('identity'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
