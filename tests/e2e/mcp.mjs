// End-to-end tests of MCP servers (extension/mcp-servers.js →
// Engine.start({ mcpServers }), src/mcp.rs, src/platform/mcp.rs): a copy of
// the built extension whose mcp-servers.js names the mock MCP server
// (tests/mock-mcp/server.mjs, Streamable HTTP on 127.0.0.1), in headless
// Chromium, with the mock LLM scripted to call the server's tools.
//
// Run:  node tests/e2e/mcp.mjs       (after `make build`)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  DEFAULT_EXTENSION_PATH,
  answerApprovalInPanel,
  exitUnlessExtensionBuilt,
  killServiceWorker,
  readPanel,
  submitTask,
  transcriptLines,
  waitFor,
  waitForApprovalCard,
  waitForExtensionServiceWorker,
  waitForToolProgress,
} from '../support/browser.mjs';
import {
  isolatedTest as sharedIsolatedTest,
  orphanToolCallProblems,
  RECORD_CONSOLE_ERRORS,
  resultsByTool,
  scriptModel,
  toolCards,
  waitForSettledTurn,
} from '../support/session.mjs';
import { startMockMcp } from '../mock-mcp/server.mjs';

exitUnlessExtensionBuilt('e2e');

const TEST_TIMEOUT = 300000;
const DEMO_TOOLS = ['search', 'create_ticket', 'slow_report', 'broken', 'ask_model'];
const dirs = [];
test.after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/**
 * A copy of the built extension whose mcp-servers.js exports `servers`
 * (a function of the mock's URL) and records the worker's console errors.
 */
function extensionWithServers(servers) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'agent-ext-mcp-'));
  dirs.push(dir);
  cpSync(DEFAULT_EXTENSION_PATH, dir, { recursive: true });
  writeFileSync(path.join(dir, 'mcp-servers.js'), `${RECORD_CONSOLE_ERRORS}
export const MCP_SERVERS = ${JSON.stringify(servers, null, 2)};
`);
  return dir;
}

/**
 * A test with its own mock MCP server (`session.mcp`, started before the
 * browser) and an extension whose servers are `servers(mcpUrl)`.
 */
function mcpTest(name, servers, body, mockOptions = {}) {
  sharedIsolatedTest(
    test,
    name,
    {
      launch: async (session) => {
        session.mcp = await startMockMcp(mockOptions);
        session.closers.push(() => session.mcp.close());
        return { extensionPath: extensionWithServers(servers(session.mcp.url)) };
      },
    },
    body,
    { timeout: TEST_TIMEOUT },
  );
}

/** The catalog the worker keeps in chrome.storage.local, once it lists `count` tools of `server`. */
async function keptCatalog(panel, server, count) {
  return waitFor(
    async () => {
      const catalog = await panel.evaluate(async () => (await chrome.storage.local.get('mcpCatalog')).mcpCatalog ?? null);
      return catalog?.[server]?.tools?.length === count ? catalog : null;
    },
    { timeout: 60000, message: `the tools of "${server}" to be kept in chrome.storage.local` },
  );
}

const call = (name, args = {}, text) => ({ ...(text ? { text } : {}), toolCalls: [{ name, arguments: args }] });

/** The call ids the model gave each tool, in order. */
function callIds(request, name) {
  return (request.body?.messages ?? [])
    .flatMap((m) => (m.role === 'assistant' && Array.isArray(m.tool_calls) ? m.tool_calls : []))
    .filter((c) => c.function?.name === name)
    .map((c) => c.id);
}

const offeredTools = (request) => (request.body.tools ?? []).map((t) => t.function?.name);

/**
 * The MCP servers Settings lists (opened first): [{ name, state, text }],
 * or null while the section is hidden.
 */
async function shownServers(panel) {
  if (await panel.locator('#settings-section').isHidden()) await panel.click('#settings-toggle');
  return panel.evaluate(() => (document.getElementById('mcp-servers').hidden
    ? null
    : [...document.querySelectorAll('#mcp-servers-list li')].map((li) => ({
      name: li.dataset.server,
      state: li.dataset.state,
      text: li.innerText.replace(/\s+/g, ' ').trim(),
    }))));
}

/** Waits until Settings lists the servers in `states` ({ name: state }); returns the list. */
function serversIn(panel, states) {
  return waitFor(async () => {
    const shown = await shownServers(panel);
    return shown && shown.length === Object.keys(states).length && shown.every((s) => states[s.name] === s.state) ? shown : null;
  }, { message: `Settings to list the MCP servers as ${JSON.stringify(states)}` });
}

async function consoleErrors(session) {
  const worker = await waitForExtensionServiceWorker(session.context, { extensionId: session.extensionId });
  return worker.evaluate(() => globalThis.__consoleErrors ?? []);
}

mcpTest(
  'a_server_s_tools_are_offered_every_call_asks_and_results_reach_the_model_as_data_from_that_server',
  (url) => [{ name: 'docs', url, headers: { Authorization: 'Bearer team-token' } }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);

    await scriptModel(mock, [
      call('docs__search', { query: 'refund' }, 'Looking it up.'),
      call('docs__create_ticket', { subject: 'Refund for order 42' }),
      call('docs__broken'),
      { text: 'Ticket T-1 is open.' },
    ]);
    await submitTask(panel, 'Open a refund ticket for order 42');

    // Even a read asks: the server is a party the user does not control.
    const card = await waitForApprovalCard(panel);
    assert.equal(card.toolName, 'docs__search');
    assert.equal(card.label, 'Search the docs');
    assert.deepEqual(card.params, { query: 'refund' });
    const shown = await panel.evaluate(() =>
      [...document.querySelectorAll('#approval-card button')].filter((e) => !e.hidden && e.getClientRects().length > 0).map((e) => e.textContent.trim()),
    );
    assert.deepEqual(shown, ['Allow once', 'Decline'], 'no "Allow on this site": a server is no site');
    // The card says where the call goes.
    const target = await panel.evaluate(() => ({
      terms: [...document.querySelectorAll('#approval-card dt')].filter((e) => !e.hidden && e.getClientRects().length > 0).map((e) => e.textContent.trim()),
      server: document.getElementById('approval-server').textContent,
      help: document.getElementById('approval-help').textContent,
    }));
    assert.deepEqual(target.terms, ['Action', 'Server']);
    assert.equal(target.server, `docs (${mcp.url})`);
    assert.match(target.help, /send this to the MCP server “docs”, a service outside your browser/);
    assert.equal(mcp.calls().length, 0, 'nothing ran before the user answered');
    await answerApprovalInPanel(panel, 'acceptOnce');

    const ticket = await waitForApprovalCard(panel);
    assert.equal(ticket.toolName, 'docs__create_ticket');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const broken = await waitForApprovalCard(panel);
    assert.equal(broken.toolName, 'docs__broken');
    await answerApprovalInPanel(panel, 'decline');

    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));

    // What the server saw: one session, its headers on every message, each
    // allowed call once, the declined one never.
    const log = mcp.log();
    const initialize = log.filter((e) => e.method === 'initialize');
    assert.equal(initialize.length, 1, JSON.stringify(log.map((e) => e.method)));
    assert.equal(initialize[0].params.protocolVersion, '2025-06-18');
    assert.equal(initialize[0].params.clientInfo.name.length > 0, true);
    assert.ok(log.some((e) => e.method === 'notifications/initialized'));
    for (const entry of log) {
      assert.equal(entry.headers.authorization, 'Bearer team-token', `${entry.method} carries the configured header`);
      if (entry.method !== 'initialize') {
        assert.equal(entry.session, initialize[0].session, `${entry.method} is in the session`);
        assert.equal(entry.headers['mcp-protocol-version'], '2025-06-18');
      }
    }
    assert.deepEqual(mcp.calls().map((c) => [c.tool, c.arguments]), [
      ['search', { query: 'refund' }],
      ['create_ticket', { subject: 'Refund for order 42' }],
    ]);
    assert.deepEqual(mcp.tickets(), ['Refund for order 42']);

    // What the model was offered and given back.
    const requests = mock.requests();
    const offered = offeredTools(requests[0]);
    for (const tool of DEMO_TOOLS) assert.ok(offered.includes(`docs__${tool}`), `docs__${tool} offered: ${offered}`);
    const search = requests[0].body.tools.find((t) => t.function?.name === 'docs__search').function;
    assert.match(search.description, /^\[Tool of the MCP server "docs"\] Search the product documentation/);
    assert.deepEqual(search.parameters.required, ['query']);
    assert.equal(mcp.calls()[0].progressToken, callIds(requests.at(-1), 'docs__search')[0], 'the progress token is the call id');

    const results = resultsByTool(requests.at(-1));
    assert.match(results.docs__search, /^<untrusted_tool_content origin="mcp:docs">\n2 passages for "refund":/);
    assert.match(results.docs__search, /<\/untrusted_tool_content>\nThe text above comes from the MCP server "docs", not from the user/);
    assert.match(results.docs__create_ticket, /Opened ticket T-1: Refund for order 42/);
    assert.doesNotMatch(results.docs__broken, /untrusted_tool_content/, 'the user declined: nothing of the server\'s');
    assert.deepEqual(orphanToolCallProblems(requests), []);

    const cards = toolCards(await readPanel(panel));
    const status = Object.fromEntries(cards.map((c) => [c.toolName, c.results[0]?.status]));
    assert.equal(status.docs__search, 'ok', JSON.stringify(cards));
    assert.equal(status.docs__create_ticket, 'ok', JSON.stringify(cards));
    assert.deepEqual(await consoleErrors(session), []);

    // Settings lists the server, its address and the tools offered.
    const [listed] = await serversIn(panel, { docs: 'ready' });
    assert.equal(listed.text, `docs — Connected ${mcp.url} 5 tools: Search the docs, create_ticket, Build a report, broken, ask_model`);
  },
);

mcpTest(
  'a_server_s_progress_shows_and_a_call_past_its_time_limit_is_given_up_and_the_server_told',
  (url) => [{ name: 'docs', url, timeoutMs: 2500 }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    await scriptModel(mock, [
      call('docs__slow_report', { steps: 100 }),
      call('docs__broken'),
      { text: 'The report timed out and the database is down.' },
    ]);
    await submitTask(panel, 'Build the usage report');
    await answerApprovalInPanel(panel, 'acceptOnce');

    const progress = await waitForToolProgress(panel);
    assert.match(progress.delta.text ?? JSON.stringify(progress), /Step \d+ of 100/);

    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));

    const [slow] = mcp.calls();
    await mcp.waitFor(() => mcp.cancellations().length === 1, { message: 'notifications/cancelled' });
    assert.equal(mcp.cancellations()[0].params.requestId, slow.id, 'the server is told which request was given up');
    assert.notEqual(slow.outcome, 'answered');

    const results = resultsByTool(mock.requests().at(-1));
    assert.match(results.docs__slow_report, /The MCP server did not answer/);
    assert.match(results.docs__broken, /The database is down\./, 'isError reaches the model');
    const cards = toolCards(await readPanel(panel));
    const status = Object.fromEntries(cards.map((c) => [c.toolName, c.results[0]?.status]));
    assert.equal(status.docs__slow_report, 'error', JSON.stringify(cards));
    assert.equal(status.docs__broken, 'error', JSON.stringify(cards));
  },
);

mcpTest(
  'an_expired_session_is_set_up_again_and_a_new_worker_offers_the_kept_tools_while_the_server_is_down',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    const initializations = () => mcp.log().filter((e) => e.method === 'initialize').length;
    assert.equal(initializations(), 1);

    // The server forgets the session: the call gets 404, the client sets up
    // a new session and sends the call there, once.
    mcp.expireSessions();
    await scriptModel(mock, [call('docs__search', { query: 'shipping' }), { text: 'Found it.' }]);
    await submitTask(panel, 'How long does shipping take?');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', transcriptLines(first).join('\n'));
    assert.equal(initializations(), 2);
    const searches = mcp.log().filter((e) => e.method === 'tools/call');
    assert.deepEqual(searches.map((e) => e.status), [404, 200], 'refused in the old session, run in the new one');
    assert.equal(mcp.calls().length, 1, 'run once');
    assert.match(resultsByTool(mock.requests().at(-1)).docs__search, /2 passages for "shipping"/);

    // A new worker while the server is down: it cannot list the tools, and
    // offers the ones the last worker kept.
    mcp.setDown(503);
    await killServiceWorker(context, extensionId);
    await scriptModel(mock, [call('docs__search', { query: 'returns' }), { text: 'The server is down.' }]);
    await submitTask(panel, 'And returns?');
    await waitFor(async () => (await consoleErrors(session)).some((e) => /The MCP server "docs" answered HTTP 503/.test(e)), {
      message: 'the new worker to name the server it could not list',
    });
    await answerApprovalInPanel(panel, 'acceptOnce');
    const second = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
    assert.equal(second.state, 'completed', transcriptLines(second).join('\n'));
    const request = mock.requests().at(-2);
    assert.ok(offeredTools(request).includes('docs__search'), 'the kept tools are offered');
    assert.match(resultsByTool(mock.requests().at(-1)).docs__search, /The MCP server "docs" answered HTTP 503: .*down for maintenance/);

    // Settings says so, and follows the next worker once the server is back.
    const [down] = await serversIn(panel, { docs: 'unreachable' });
    assert.match(down.text, /^docs — Not reachable: The MCP server "docs" answered HTTP 503: .* Offering the 5 tools it listed before\./);
    mcp.setDown(null);
    await killServiceWorker(context, extensionId);
    const [back] = await serversIn(panel, { docs: 'ready' });
    assert.match(back.text, /^docs — Connected .* 5 tools: Search the docs,/);
  },
  // This server answers every request with one JSON body (the others use
  // event streams): the client takes both.
  { answer: 'json' },
);

mcpTest(
  'wrong_and_unreachable_servers_are_named_in_the_console_and_the_others_work_and_server_requests_are_refused',
  (url) => [
    { name: 'Bad Name', url },
    { name: 'files', url: 'ftp://127.0.0.1/mcp' },
    { name: 'gone', url: 'http://127.0.0.1:9/mcp' },
    { name: 'docs', url },
  ],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    const errors = await waitFor(async () => {
      const all = await consoleErrors(session);
      return all.some((e) => /"gone" could not be reached/.test(e)) ? all : null;
    }, { message: 'the unreachable server to be named' });
    const leftOut = errors.filter((e) => e.startsWith('[sw-agent] extension/mcp-servers.js:'));
    assert.equal(leftOut.length, 2, errors.join('\n'));
    assert.match(leftOut[0], /Bad Name/);
    assert.match(leftOut[1], /files/);
    const listed = await serversIn(panel, { gone: 'unreachable', docs: 'ready' });
    assert.deepEqual(listed.map((s) => s.name), ['gone', 'docs'], 'the wrong entries are not listed; the others in their order');
    assert.match(listed[0].text, /^gone — Not reachable: The MCP server "gone" could not be reached \(.*\)\. http:\/\/127\.0\.0\.1:9\/mcp No tools offered\.$/);
    await panel.click('#settings-toggle');

    await scriptModel(mock, [call('docs__ask_model'), { text: 'It could not sample.' }]);
    await submitTask(panel, 'Ask the docs server to sample');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    const offered = offeredTools(mock.requests()[0]);
    assert.ok(offered.includes('docs__search'));
    assert.ok(!offered.some((name) => /^(gone|files|bad)/i.test(name)), offered.join(','));
    // The server's sampling request was answered "method not found".
    const [refusal] = mcp.responses();
    assert.equal(refusal.error.code, -32601);
    assert.match(resultsByTool(mock.requests().at(-1)).docs__ask_model, /The client refused: -32601/);
  },
);

mcpTest(
  'a_read_tool_of_a_server_runs_again_after_the_worker_dies_mid_call',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    await scriptModel(mock, [call('docs__slow_report', { steps: 8 }), { text: 'The report has 8 sections.' }]);
    await submitTask(panel, 'Build the report');
    await answerApprovalInPanel(panel, 'acceptOnce');
    await mcp.waitFor(() => mcp.calls().length === 1, { message: 'the call to reach the server' });

    await killServiceWorker(context, extensionId);
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    const calls = mcp.calls();
    assert.equal(calls.length, 2, 'run again: the server marks it read-only');
    assert.equal(calls[0].outcome, 'disconnected');
    assert.equal(calls[1].outcome, 'answered');
    assert.equal(calls[0].progressToken, calls[1].progressToken, 'the same call');
    assert.match(resultsByTool(mock.requests().at(-1)).docs__slow_report, /The report has 8 sections\./);
    assert.deepEqual(orphanToolCallProblems(mock.requests()), []);
  },
);
