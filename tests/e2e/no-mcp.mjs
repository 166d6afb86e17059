// End-to-end test of the build without MCP (cargo feature `mcp` off;
// wasm-pack.toml [variant.no-mcp], README "A build without MCP"): the built
// extension with its module and glue replaced by the variant's, whose
// extension/mcp-servers.js names the mock MCP server, in headless Chromium.
// The server must be listed as not used, with the reason, and never asked;
// a user's own server likewise; a turn offers no server's tool.
//
// Run:  node tests/e2e/no-mcp.mjs
//       (after `make build` and `bash scripts/build.sh --variant no-mcp`)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import {
  copyOfBuild,
  shownMcpServers as shownServers,
  REPO_ROOT,
  exitUnlessExtensionBuilt,
  submitTask,
  waitFor,
  waitForExtensionServiceWorker,
} from '../support/browser.mjs';
import { isolatedTest, RECORD_CONSOLE_ERRORS, scriptModel, waitForSettledTurn } from '../support/session.mjs';
import { startMockMcp } from '../mock-mcp/server.mjs';

exitUnlessExtensionBuilt('e2e');

/** Where `bash scripts/build.sh --variant no-mcp` puts the package (wasm-pack.toml). */
const VARIANT_PKG = path.join(REPO_ROOT, 'target', 'pkg-no-mcp');
const wasmFiles = existsSync(VARIANT_PKG) ? readdirSync(VARIANT_PKG).filter((f) => f.endsWith('_bg.wasm')) : [];
if (wasmFiles.length !== 1) {
  process.stderr.write(`e2e: no package of the build without MCP in ${VARIANT_PKG}: run \`bash scripts/build.sh --variant no-mcp\` first\n`);
  process.exit(1);
}

/**
 * A copy of the built extension with the variant's module and glue (the
 * manifest made for them as scripts/build.sh makes it: their build id, no
 * `identity` permission) and an mcp-servers.js naming `servers`.
 */
function extensionWithoutMcp(servers) {
  return copyOfBuild(
    { 'mcp-servers.js': `${RECORD_CONSOLE_ERRORS}\nexport const MCP_SERVERS = ${JSON.stringify(servers)};\n` },
    { pkg: VARIANT_PKG, mcp: false },
  );
}

const NOT_USED = /Not used: This build of sw_agent has no MCP support \(built without the cargo feature "mcp"\)\./;

isolatedTest(test, 'a_build_without_mcp_lists_every_server_as_not_used_and_asks_none', {
  launch: async (session) => {
    session.mcp = await startMockMcp();
    session.closers.push(() => session.mcp.close());
    return { extensionPath: extensionWithoutMcp([{ name: 'docs', url: session.mcp.url }]) };
  },
}, async (session) => {
  const { panel, mock, mcp } = session;
  // The extension's server: listed as not used, nothing to check again or sign in to.
  const [docs] = await waitFor(async () => {
    const shown = await shownServers(panel);
    return shown.length === 1 && shown[0].state === 'refused' ? shown : null;
  }, { message: 'the extension\'s server listed as not used' });
  assert.equal(docs.addedBy, 'extension');
  assert.match(docs.text, NOT_USED);
  assert.equal(docs.refresh, null);
  assert.equal(docs.sign, null);
  // Signing in is what `identity` is for: a build without MCP does not ask for it.
  const permissions = await panel.evaluate(() => chrome.runtime.getManifest().permissions);
  assert.ok(!permissions.includes('identity'), permissions.join(', '));
  assert.ok(permissions.includes('scripting'), permissions.join(', '));
  const worker = await waitForExtensionServiceWorker(session.context, { extensionId: session.extensionId });
  const errors = await worker.evaluate(() => globalThis.__consoleErrors ?? []);
  assert.ok(
    errors.some((e) => /extension\/mcp-servers\.js names 1 MCP server\(s\) \(docs\), but this build of sw_agent has no MCP support/.test(e)),
    errors.join('\n'),
  );

  // A server of the user's own: listed as not used too, and removable.
  await panel.evaluate((url) => chrome.storage.local.set({ mcpUserServers: [{ name: 'mine', url }] }), mcp.url);
  const both = await waitFor(async () => {
    const shown = await shownServers(panel);
    return shown.length === 2 ? shown : null;
  }, { message: 'the user\'s server listed' });
  const mine = both.find((s) => s.name === 'mine');
  assert.equal(mine.state, 'refused');
  assert.equal(mine.addedBy, 'user');
  assert.match(mine.text, NOT_USED);
  assert.ok(mine.remove, 'the user can remove it');
  await panel.evaluate(() => chrome.storage.local.set({ mcpUserServers: [] }));
  await waitFor(async () => ((await shownServers(panel)).length === 1 ? true : null), { message: 'the user\'s server gone' });

  // A turn offers no server's tool, and the server was never asked anything.
  await scriptModel(mock, [{ text: 'Nothing to call.' }]);
  await submitTask(panel, 'Hello');
  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed');
  const offered = (mock.requests()[0].body.tools ?? []).map((t) => t.function?.name);
  assert.ok(offered.includes('page_snapshot'), offered.join(', '));
  assert.ok(!offered.some((name) => name.startsWith('docs__') || name.startsWith('mine__')), offered.join(', '));
  assert.equal(mcp.log().length, 0, 'the server was never asked');
});
