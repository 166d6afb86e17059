// Unit tests of scripts/check-js.mjs, the build's syntax check of the
// extension's JavaScript. Run: node --test tests/extension/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { syntaxErrors } from '../../scripts/check-js.mjs';

function extensionDir(files) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'check-js-'));
  mkdirSync(path.join(dir, 'content'));
  for (const [name, source] of Object.entries(files)) writeFileSync(path.join(dir, name), source);
  return dir;
}

test('the shipped extension parses', () => {
  assert.deepEqual(syntaxErrors('extension'), []);
});

test('a syntax error in an embedding extension file is named with its line, and the build script fails', () => {
  const dir = extensionDir({
    'sw.js': 'import * as d from "./settings-defaults.js";\nexport const ok = d;\n',
    'settings-defaults.js': 'export const SETTINGS_DEFAULTS = {\n  model: "acme",,\n};\n',
    'instructions.js': 'export const INSTRUCTIONS = "Be brief.";\n',
    'content/agent.js': '(() => { const x = 1; })();\n',
  });
  try {
    const errors = syntaxErrors(dir);
    assert.equal(errors.length, 1, JSON.stringify(errors));
    assert.equal(errors[0].file, path.join(dir, 'settings-defaults.js'));
    assert.match(errors[0].message, /settings-defaults\.js:2\n/);
    assert.match(errors[0].message, /SyntaxError: Unexpected token ','/);

    const run = spawnSync(process.execPath, ['scripts/check-js.mjs', dir], { encoding: 'utf8' });
    assert.equal(run.status, 1);
    assert.match(run.stderr, /settings-defaults\.js does not parse; the service worker would not start/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('top-level files are checked as modules and content scripts as classic scripts', () => {
  const dir = extensionDir({
    // `export` parses in a module, not in a classic content script.
    'host-tools.js': 'export const HOST_TOOLS = [];\n',
    'content/agent.js': 'export const nope = 1;\n',
  });
  try {
    const errors = syntaxErrors(dir);
    assert.deepEqual(errors.map((e) => path.basename(e.file)), ['agent.js']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
