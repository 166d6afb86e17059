// End-to-end tests of MCP servers (extension/mcp-servers.js →
// Engine.start({ mcpServers }), src/mcp.rs, src/platform/mcp.rs): a copy of
// the built extension whose mcp-servers.js names the mock MCP server
// (tests/mock-mcp/server.mjs, Streamable HTTP on 127.0.0.1), in headless
// Chromium, with the mock LLM scripted to call the server's tools.
//
// Also: a server's request for input during a call (elicitation/create),
// shown as a form in the side panel's interaction card and answered there;
// and servers the user adds in Settings (chrome.storage.local.mcpUserServers,
// which the worker follows), in a copy whose mcp-servers.js names none.
//
// Run:  node tests/e2e/mcp.mjs       (after `make build`)
//       node --test-name-pattern=request_for_input tests/e2e/mcp.mjs   (some tests)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import {
  copyOfBuild,
  shownMcpServers as shownServers,
  answerApprovalInPanel,
  exitUnlessExtensionBuilt,
  killServiceWorker,
  portLog,
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
  opRewriterInitScript,
} from '../support/session.mjs';
import { BOOKING_MESSAGE, BOOKING_SCHEMA, demoTools, startMockMcp } from '../mock-mcp/server.mjs';

exitUnlessExtensionBuilt('e2e');

const TEST_TIMEOUT = 300000;
const DEMO_TOOLS = ['search', 'create_ticket', 'slow_report', 'broken', 'ask_model', 'book_table', 'check_availability', 'add_faq_tool'];
/**
 * A copy of the built extension whose mcp-servers.js exports `servers`
 * (a function of the mock's URL) and records the worker's console errors.
 */
function extensionWithServers(servers) {
  return copyOfBuild({
    'mcp-servers.js': `${RECORD_CONSOLE_ERRORS}\nexport const MCP_SERVERS = ${JSON.stringify(servers, null, 2)};\n`,
  });
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
async function keptCatalog(panel, server, count, { timeout = 60000 } = {}) {
  return waitFor(
    async () => {
      const catalog = await panel.evaluate(async () => (await chrome.storage.local.get('mcpCatalog')).mcpCatalog ?? null);
      return catalog?.[server]?.tools?.length === count ? catalog : null;
    },
    { timeout, message: `the tools of "${server}" to be kept in chrome.storage.local` },
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
    assert.match(search.description, /^\[Tool of the MCP server "docs"; described by that server, not by the user\] Search the product documentation/);
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
    assert.equal(listed.text, `docs — Connected ${mcp.url} Added by the extension 8 tools: Search the docs, create_ticket, Build a report, broken, ask_model, Book a table, Check availability, Publish a FAQ tool`);
    assert.equal(listed.addedBy, 'extension');
    assert.equal(listed.remove, null, 'the extension\'s server cannot be removed in the panel');
  },
);

mcpTest(
  'a_call_the_user_stops_is_cancelled_at_the_server',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    await scriptModel(mock, [call('docs__slow_report', { steps: 100 }), { text: 'Stopped.' }]);
    await submitTask(panel, 'Build the usage report');
    await answerApprovalInPanel(panel, 'acceptOnce');
    await waitForToolProgress(panel);
    await panel.click('#stop-button');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'interrupted', transcriptLines(final).join('\n'));
    const [slow] = mcp.calls();
    // A disconnection is no cancellation: the server is told.
    await mcp.waitFor(() => mcp.cancellations().length === 1, { message: 'notifications/cancelled after a stop' });
    assert.equal(mcp.cancellations()[0].params.requestId, slow.id);
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
    assert.match(down.text, /^docs — Not reachable: The MCP server "docs" answered HTTP 503: .* Offering the 8 tools it listed before\./);
    mcp.setDown(null);
    await killServiceWorker(context, extensionId);
    const [back] = await serversIn(panel, { docs: 'ready' });
    assert.match(back.text, /^docs — Connected .* 8 tools: Search the docs,/);
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
    assert.match(listed[0].text, /^gone — Not reachable: The MCP server "gone" could not be reached \(.*\)\. http:\/\/127\.0\.0\.1:9\/mcp Added by the extension No tools offered\.$/);
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

/**
 * A server on 127.0.0.1 that takes every request and never answers: the
 * connection stays open until the client gives up (or close()).
 * → { url, requests() → [{ httpMethod, method (JSON-RPC), at, closedAt
 * (null while open) }], close() }.
 */
async function startSilentServer() {
  const requests = [];
  const server = http.createServer((req, res) => {
    const entry = { httpMethod: req.method, method: null, at: Date.now(), closedAt: null };
    requests.push(entry);
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => { body += chunk; });
    req.on('end', () => {
      try {
        entry.method = JSON.parse(body).method ?? null;
      } catch {
        entry.method = null;
      }
    });
    // The client gave up: its fetch was aborted and the connection closed.
    res.on('close', () => { entry.closedAt = Date.now(); });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/mcp`,
    requests: () => requests.map((e) => ({ ...e })),
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

/** The silent server's time limit for `initialize` (INITIALIZE_TIMEOUT_MS in src/platform/mcp.rs). */
const INITIALIZE_TIMEOUT_MS = 30000;

sharedIsolatedTest(
  test,
  'a_server_that_never_answers_initialize_does_not_hold_the_others',
  {
    launch: async (session) => {
      session.mcp = await startMockMcp();
      session.closers.push(() => session.mcp.close());
      session.silent = await startSilentServer();
      session.closers.push(() => session.silent.close());
      return {
        extensionPath: extensionWithServers([
          { name: 'silent', url: session.silent.url },
          { name: 'docs', url: session.mcp.url },
        ]),
      };
    },
  },
  async (session) => {
    const { panel, mock, silent } = session;
    const initializations = () => silent.requests().filter((e) => e.method === 'initialize');
    await waitFor(() => initializations().length === 1, { message: 'the silent server to get initialize' });

    // Each server's answer is used as it comes: the other server is ready
    // (its tools offered) while this one is still being waited for.
    await serversIn(panel, { silent: 'listing', docs: 'ready' });
    assert.equal(initializations()[0].closedAt, null, 'the silent server is still being waited for');
    // Given up at its time limit: the other server's tools are kept, not
    // held for ever.
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length, { timeout: INITIALIZE_TIMEOUT_MS + 90000 });
    const [first] = await waitFor(() => {
      const all = initializations();
      return all[0].closedAt !== null ? all : null;
    }, { message: 'the worker to give up its initialize (the connection closed)' });
    assert.ok(first.closedAt - first.at >= INITIALIZE_TIMEOUT_MS - 1000, `given up after ${first.closedAt - first.at} ms, not before its time limit`);
    assert.deepEqual(silent.requests().map((e) => e.method), ['initialize'], 'nothing else was sent to it');
    const listed = await serversIn(panel, { silent: 'unreachable', docs: 'ready' });
    assert.match(listed[0].text, /^silent — Not reachable: The MCP server "silent" did not answer initialize within 30 s\. /);
    assert.match(listed[1].text, /^docs — Connected .* 8 tools: Search the docs,/);
    assert.equal(listed[0].refresh, 'Check again');
    const errors = await consoleErrors(session);
    assert.ok(errors.some((e) => /The MCP server "silent" did not answer initialize within 30 s\./.test(e)), errors.join('\n'));

    // Check again asks it once more; meanwhile the other server's tools
    // work, and the check ends at the time limit too.
    await panel.getByRole('button', { name: 'Ask the MCP server silent for its tools again', exact: true }).click();
    await waitFor(() => initializations().length === 2, { message: 'initialize sent again' });
    await serversIn(panel, { silent: 'listing', docs: 'ready' });
    await panel.click('#settings-toggle');
    await scriptModel(mock, [call('docs__search', { query: 'refund' }), { text: 'Found it.' }]);
    await submitTask(panel, 'How do refunds work?');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__search, /passages for "refund"/);
    const offered = offeredTools(mock.requests()[0]);
    assert.ok(offered.includes('docs__search'), offered.join(','));
    assert.ok(!offered.some((name) => name.startsWith('silent__')), offered.join(','));
    // The turn did not wait for the check (unless the machine is so slow
    // that the check ended first).
    const checking = initializations()[1];
    if (Date.now() - checking.at < INITIALIZE_TIMEOUT_MS - 1000) assert.equal(checking.closedAt, null, 'the check still waiting meanwhile');

    const [again] = await serversIn(panel, { silent: 'unreachable', docs: 'ready' });
    assert.match(again.text, /^silent — Not reachable: The MCP server "silent" did not answer initialize within 30 s\. /);
    assert.equal(again.refresh, 'Check again');
    const second = initializations()[1];
    assert.notEqual(second.closedAt, null, 'the second initialize given up too');
    assert.ok(second.closedAt - second.at >= INITIALIZE_TIMEOUT_MS - 1000, `given up after ${second.closedAt - second.at} ms`);
  },
  { timeout: TEST_TIMEOUT },
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

// ------------------------------------------- servers the user adds ---
// Settings' form adds an entry to chrome.storage.local.mcpUserServers (an
// array shaped like MCP_SERVERS); the worker follows that key, connects the
// server and lists it "Added by you", with Remove. These copies of the
// extension name no server of their own (or one, to collide with).

const TOKEN = 'Bearer t0k3n';

/** The user's servers as stored (null: none ever written). */
function storedUserServers(panel) {
  return panel.evaluate(async () => (await chrome.storage.local.get('mcpUserServers')).mcpUserServers ?? null);
}

/** Settings' "Add an MCP server" form, by the controls' accessible names. */
function addForm(panel) {
  return {
    name: panel.getByRole('textbox', { name: 'Name', exact: true }),
    url: panel.getByRole('textbox', { name: 'Address (URL)', exact: true }),
    headerName: panel.getByRole('textbox', { name: 'Header name', exact: true }),
    // A password field has no role: found by its label.
    headerValue: panel.getByLabel('Header value', { exact: true }),
    clientId: panel.getByRole('textbox', { name: 'Sign-in client id', exact: true }),
    add: panel.getByRole('button', { name: 'Add', exact: true }),
  };
}

/** The add form as drawn: values, each field's error line, marks, focus and status. */
function readAddForm(panel) {
  return panel.evaluate(() => {
    const ids = { name: 'mcp-add-name', url: 'mcp-add-url', headerName: 'mcp-add-header-name', headerValue: 'mcp-add-header-value', clientId: 'mcp-add-client-id' };
    const form = { values: {}, errors: {}, describedBy: {}, invalid: [], types: {} };
    for (const [key, id] of Object.entries(ids)) {
      const input = document.getElementById(id);
      form.values[key] = input.value;
      form.types[key] = input.type;
      form.errors[key] = (document.getElementById(`${id}-error`)?.textContent ?? '').trim();
      form.describedBy[key] = input.getAttribute('aria-describedby');
      if (input.getAttribute('aria-invalid') === 'true') form.invalid.push(key);
    }
    form.active = document.activeElement?.id ?? null;
    form.status = document.getElementById('mcp-add-status').textContent.trim();
    return form;
  });
}

/**
 * Fills the form (Settings opened first) and presses Add; resolves with the
 * form once the panel said how it went.
 */
async function addServerInPanel(panel, { name, url, header = null, clientId = null }) {
  await shownServers(panel);
  const form = addForm(panel);
  await form.name.fill(name);
  await form.url.fill(url);
  if (header) {
    await form.headerName.fill(header[0]);
    await form.headerValue.fill(header[1]);
  }
  if (clientId !== null) await form.clientId.fill(clientId);
  await form.add.click();
  return waitFor(async () => {
    const drawn = await readAddForm(panel);
    return drawn.status !== '' && drawn.status !== 'Adding…' ? drawn : null;
  }, { timeout: 15000, message: 'the add form to say how it went' });
}

async function closeSettings(panel) {
  if (await panel.locator('#settings-section').isVisible()) await panel.click('#settings-toggle');
}

/** Waits until Settings lists exactly `wanted` ([name, addedBy, state], in order); returns the list. */
function serversListedAs(panel, wanted) {
  return waitFor(async () => {
    const shown = await shownServers(panel);
    return shown.length === wanted.length && shown.every((s, i) => s.name === wanted[i][0] && s.addedBy === wanted[i][1] && s.state === wanted[i][2])
      ? shown
      : null;
  }, { message: `Settings to list the MCP servers as ${JSON.stringify(wanted)}` });
}

mcpTest(
  'a_server_the_user_adds_in_settings_is_connected_with_its_header_every_call_asks_and_remove_takes_it_away',
  () => [],
  async (session) => {
    const { panel, mock, mcp } = session;
    // The extension names no server: the section is there, to add one.
    assert.deepEqual(await shownServers(panel), []);
    await waitFor(() => panel.locator('#mcp-servers-empty').isVisible(), { timeout: 15000, message: 'the empty list said' });
    assert.equal(await panel.locator('#mcp-servers').isVisible(), true);
    const blank = await readAddForm(panel);
    assert.deepEqual(blank.values, { name: '', url: '', headerName: 'Authorization', headerValue: '', clientId: '' });
    assert.equal(blank.types.headerValue, 'password', 'the header value is masked');
    assert.match(await panel.locator('#mcp-add-note').textContent(), /each call asks you first.*goes to that address with every message and is kept in this browser profile's extension storage/);

    const added = await addServerInPanel(panel, { name: 'mine', url: mcp.url, header: ['Authorization', TOKEN] });
    assert.deepEqual(added.invalid, [], JSON.stringify(added));
    assert.match(added.status, /^Added “mine”/);
    assert.deepEqual(added.values, { name: '', url: '', headerName: 'Authorization', headerValue: '', clientId: '' }, 'the form is cleared');
    assert.deepEqual(await storedUserServers(panel), [{ name: 'mine', url: mcp.url, headers: { Authorization: TOKEN } }]);

    const [listed] = await serversIn(panel, { mine: 'ready' });
    assert.equal(listed.addedBy, 'user');
    assert.equal(listed.text, `mine — Connected ${mcp.url} Added by you 8 tools: Search the docs, create_ticket, Build a report, broken, ask_model, Book a table, Check availability, Publish a FAQ tool`);
    assert.equal(listed.remove, 'Remove the MCP server mine');
    await closeSettings(panel);

    await scriptModel(mock, [call('mine__search', { query: 'refund' }, 'Looking it up.'), { text: 'Two passages mention refunds.' }]);
    await submitTask(panel, 'Search my docs for refunds');
    const card = await waitForApprovalCard(panel);
    assert.equal(card.toolName, 'mine__search');
    assert.deepEqual(card.params, { query: 'refund' });
    assert.equal(await panel.locator('#approval-server').textContent(), `mine (${mcp.url})`);
    assert.equal(mcp.calls().length, 0, 'nothing ran before the user answered');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));

    const requests = mock.requests();
    const offered = offeredTools(requests[0]);
    for (const tool of DEMO_TOOLS) assert.ok(offered.includes(`mine__${tool}`), `mine__${tool} offered: ${offered}`);
    assert.match(resultsByTool(requests.at(-1)).mine__search, /^<untrusted_tool_content origin="mcp:mine">\n2 passages for "refund":/);
    assert.deepEqual(mcp.calls().map((c) => [c.tool, c.arguments]), [['search', { query: 'refund' }]]);
    // The header went with every message; it never crossed the Port nor shows.
    const log = mcp.log();
    assert.ok(log.some((e) => e.method === 'initialize'));
    for (const entry of log) assert.equal(entry.headers.authorization, TOKEN, `${entry.method ?? entry.kind} carries the user's header`);
    const ports = (await portLog(panel)) ?? [];
    assert.ok(ports.length > 0);
    assert.ok(!ports.some((entry) => entry.json && entry.json.includes('t0k3n')), 'the header value never crosses the Port');
    assert.ok(!(await panel.evaluate(() => document.body.innerText)).includes('t0k3n'), 'nor shows as text');
    assert.deepEqual(orphanToolCallProblems(requests), []);

    // Remove: asks nothing, the list and the storage lose it, focus stays in the section.
    await shownServers(panel);
    await panel.getByRole('button', { name: 'Remove the MCP server mine', exact: true }).click();
    assert.deepEqual(await serversIn(panel, {}), []);
    assert.deepEqual(await storedUserServers(panel), []);
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'mcp-servers-heading', 'focus on the heading, not the page\'s start');
    assert.equal(await panel.locator('#mcp-servers-empty').isVisible(), true);
    await closeSettings(panel);

    await scriptModel(mock, [{ text: 'Only the page tools are left.' }]);
    await submitTask(panel, 'Which tools do you have now?');
    const after = await waitForSettledTurn(panel, { previousTurnId: final.turnId });
    assert.equal(after.state, 'completed', transcriptLines(after).join('\n'));
    const offeredAfter = offeredTools(mock.requests().at(-1));
    assert.ok(offeredAfter.length > 0, 'the page tools are still offered');
    assert.ok(!offeredAfter.some((name) => name.startsWith('mine__')), offeredAfter.join(','));
    assert.deepEqual(await consoleErrors(session), []);
  },
);

mcpTest(
  'a_wrong_server_is_caught_in_the_panel_before_it_is_stored_and_an_entry_written_by_hand_the_worker_refuses_is_listed_with_why_and_removable',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mcp } = session;
    const [docs] = await serversIn(panel, { docs: 'ready' });
    assert.equal(docs.addedBy, 'extension');
    assert.equal(docs.remove, null);

    // Capitals and an ftp: address, both said next to their fields.
    let form = await addServerInPanel(panel, { name: 'Mine', url: 'ftp://127.0.0.1/mcp' });
    assert.deepEqual(form.invalid, ['name', 'url']);
    assert.match(form.errors.name, /1 to 24 characters of a–z, 0–9 and -/);
    assert.match(form.errors.url, /must start with http:\/\/ or https:\/\//);
    assert.equal(form.describedBy.name, 'mcp-add-name-hint mcp-add-name-error', 'the message is read with the field');
    assert.equal(form.describedBy.url, 'mcp-add-url-hint mcp-add-url-error');
    assert.equal(form.active, 'mcp-add-name', 'focus on the first field to fix');
    assert.equal(form.status, 'Not added: check the 2 marked fields.');
    assert.equal(form.values.name, 'Mine', 'what was typed stays');
    // Typing in a marked field takes its mark away.
    await addForm(panel).url.fill('http://127.0.0.1/mcp');
    assert.deepEqual((await readAddForm(panel)).invalid, ['name']);

    // The name of the extension's server.
    form = await addServerInPanel(panel, { name: 'docs', url: mcp.url });
    assert.deepEqual(form.invalid, ['name']);
    assert.equal(form.errors.name, 'Another server is already called “docs”: choose another name.');
    // A header the client sets itself.
    form = await addServerInPanel(panel, { name: 'mine', url: mcp.url, header: ['Mcp-Session-Id', 'abc'] });
    assert.deepEqual(form.invalid, ['headerName']);
    assert.match(form.errors.headerName, /sets Mcp-Session-Id itself/);
    assert.equal(form.active, 'mcp-add-header-name');
    assert.equal(await storedUserServers(panel), null, 'nothing was stored');
    assert.deepEqual((await shownServers(panel)).map((s) => s.name), ['docs']);

    // Entries written by hand: one with a field the worker does not know, one
    // with the extension's server's name. Both listed as refused, with why.
    await panel.evaluate((url) => chrome.storage.local.set({ mcpUserServers: [{ name: 'hand', url, colour: 'blue' }, { name: 'docs', url }] }), mcp.url);
    const refused = await serversListedAs(panel, [['docs', 'extension', 'ready'], ['hand', 'user', 'refused'], ['docs', 'user', 'refused']]);
    assert.match(refused[1].text, /^hand — Not used: .*colour/, refused[1].text);
    assert.match(refused[1].text, /Added by you No tools offered\.$/);
    assert.equal(refused[1].remove, 'Remove the MCP server hand');
    assert.match(refused[2].text, /^docs — Not used: .*name/, refused[2].text);
    assert.equal(refused[2].remove, 'Remove the MCP server docs');
    assert.equal(refused[0].remove, null);

    await panel.getByRole('button', { name: 'Remove the MCP server hand', exact: true }).click();
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['docs', 'user', 'refused']]);
    assert.deepEqual(await storedUserServers(panel), [{ name: 'docs', url: mcp.url }]);
    assert.equal(await panel.evaluate(() => document.activeElement?.getAttribute('aria-label')), 'Remove the MCP server docs', 'focus moved on to the next Remove');
    // Keyboard: the focused Remove, Enter. The extension's "docs" stays.
    await panel.keyboard.press('Enter');
    await serversListedAs(panel, [['docs', 'extension', 'ready']]);
    assert.deepEqual(await storedUserServers(panel), []);
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'mcp-servers-heading');
  },
);

mcpTest(
  'a_server_the_user_added_is_connected_again_by_a_new_worker_and_its_tools_offered',
  () => [],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await addServerInPanel(panel, { name: 'mine', url: mcp.url, header: ['Authorization', TOKEN] });
    await serversIn(panel, { mine: 'ready' });
    const epochBefore = (await readPanel(panel)).epoch;
    const logBefore = mcp.log().length;

    await killServiceWorker(context, extensionId);
    // The panel reconnects (a new worker); Settings is open, so it asks the
    // new worker for its list, which sets up a session with the server again.
    await mcp.waitFor(
      () => mcp.log().slice(logBefore).some((e) => e.method === 'tools/list' && e.status === 200),
      { message: 'the new worker to list the tools of the user\'s server' },
    );
    const [listed] = await serversIn(panel, { mine: 'ready' });
    assert.notEqual((await readPanel(panel)).epoch, epochBefore, 'a new worker');
    assert.equal(listed.addedBy, 'user');
    assert.match(listed.text, /^mine — Connected .* Added by you 8 tools: Search the docs,/);
    assert.equal(listed.remove, 'Remove the MCP server mine');
    assert.deepEqual(await storedUserServers(panel), [{ name: 'mine', url: mcp.url, headers: { Authorization: TOKEN } }]);
    await closeSettings(panel);

    await scriptModel(mock, [call('mine__search', { query: 'shipping' }), { text: 'Shipping takes two days.' }]);
    await submitTask(panel, 'How long does shipping take?');
    const card = await waitForApprovalCard(panel);
    assert.equal(card.toolName, 'mine__search');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.ok(offeredTools(mock.requests()[0]).includes('mine__search'), 'the new worker offers its tools');
    assert.match(resultsByTool(mock.requests().at(-1)).mine__search, /^<untrusted_tool_content origin="mcp:mine">\n2 passages for "shipping":/);
    for (const entry of mcp.log().slice(logBefore)) assert.equal(entry.headers.authorization, TOKEN, `${entry.method ?? entry.kind} carries the user's header`);
    assert.deepEqual(orphanToolCallProblems(mock.requests()), []);
  },
);

// ------------------------------------------- a server's request for input ---
// During a call of `book_table` the mock server sends `elicitation/create`
// on the call's event stream; the engine shows it in the panel's interaction
// card as the server's form, and sends the user's answer back to the server.

/** The interaction card as an MCP server's form, read from the DOM. */
async function readServerForm(panel) {
  return panel.evaluate(() => {
    const text = (element) => (element?.textContent ?? '').replace(/\s+/g, ' ').trim();
    const card = document.getElementById('interaction-card');
    const form = document.getElementById('elicitation-form');
    const active = document.activeElement;
    return {
      visible: !card.hidden && card.getClientRects().length > 0,
      server: card.dataset.server ?? null,
      interactionId: card.dataset.interactionId ?? null,
      callId: card.dataset.callId ?? null,
      busy: card.getAttribute('aria-busy') === 'true',
      focused: card.contains(active),
      activeField: active instanceof HTMLElement ? active.dataset.field ?? null : null,
      describedBy: card.getAttribute('aria-describedby'),
      heading: text(document.getElementById('interaction-heading')),
      serverUrl: text(document.getElementById('interaction-server-url')),
      message: text(document.getElementById('interaction-question')),
      formVisible: !form.hidden && form.getClientRects().length > 0,
      answerBoxVisible: !document.getElementById('interaction-form').hidden,
      note: text(document.getElementById('elicitation-note')),
      fields: [...document.querySelectorAll('#elicitation-fields .elicitation-field')].map((wrapper) => {
        const control = wrapper.querySelector('input, select');
        return {
          name: wrapper.dataset.field,
          control: control.tagName === 'SELECT' ? 'select' : control.type,
          required: control.required,
          value: control.type === 'checkbox' ? control.checked : control.value,
          min: control.getAttribute('min'),
          max: control.getAttribute('max'),
          step: control.getAttribute('step'),
          minLength: control.getAttribute('minlength'),
          maxLength: control.getAttribute('maxlength'),
          options: control.tagName === 'SELECT' ? [...control.options].map((o) => [o.value, o.textContent]) : null,
          hint: text(document.getElementById(`${control.id}-hint`)),
          error: text(document.getElementById(`${control.id}-error`)),
          describedBy: control.getAttribute('aria-describedby'),
          invalid: control.getAttribute('aria-invalid') === 'true',
          disabled: control.disabled,
        };
      }),
      buttons: [...form.querySelectorAll('button')].map((b) => ({ text: b.textContent.trim(), disabled: b.disabled })),
      status: text(document.getElementById('interaction-status')),
    };
  });
}

/** Waits until the card shows a server's form with its controls enabled (another than `previousId`); returns it. */
async function waitForServerForm(panel, { previousId = null, timeout = 120000 } = {}) {
  return waitFor(
    async () => {
      const form = await readServerForm(panel);
      return form.visible && form.server && form.formVisible && !form.busy && form.interactionId !== previousId
        && form.buttons.every((b) => !b.disabled) && form.fields.every((f) => !f.disabled) ? form : null;
    },
    { timeout, interval: 50, message: 'the interaction card to show the MCP server\'s form' },
  );
}

/** Parsed Port-recorder messages of one direction (`out`: panel → engine, `in`: engine → panel). */
async function portMessages(panel, dir) {
  return ((await portLog(panel)) ?? [])
    .filter((entry) => entry.dir === dir && entry.json)
    .map((entry) => JSON.parse(entry.json));
}

/** The text of each result of `name`'s calls in the conversation of `request`, in order. */
function resultsOfCalls(request, name) {
  const messages = request.body?.messages ?? [];
  return callIds(request, name).map((id) => {
    const result = messages.find((m) => m.role === 'tool' && m.tool_call_id === id);
    return typeof result?.content === 'string' ? result.content : JSON.stringify(result?.content ?? null);
  });
}

/** The badge that says how a server's request ended, on the tool card of `callId` ('' when none). */
function elicitationBadge(panel, callId) {
  return panel.evaluate((id) => {
    const card = document.querySelector(`#messages .node.tool-call[data-call-id="${CSS.escape(id)}"]`);
    return (card?.querySelector(':scope > .tool-header > .badge-elicitation')?.textContent ?? '').trim();
  }, callId);
}

/** The status text on the tool card of `callId`. */
function toolCardStatus(panel, callId) {
  return panel.evaluate((id) => {
    const card = document.querySelector(`#messages .node.tool-call[data-call-id="${CSS.escape(id)}"]`);
    return (card?.querySelector(':scope > .tool-header > .tool-status')?.textContent ?? '').trim();
  }, callId);
}


const BOOKING_FIELDS = Object.keys(BOOKING_SCHEMA.properties);

mcpTest(
  'a_server_s_request_for_input_shows_its_form_in_the_panel_and_the_typed_answer_reaches_the_server',
  (url) => [{ name: 'diner', url }],
  async (session) => {
    const { panel, mock, mcp, context } = session;
    await keptCatalog(panel, 'diner', DEMO_TOOLS.length);
    // The engine's own check of the values is tried by changing one op on its way.
    await context.addInitScript(opRewriterInitScript);
    await panel.reload();
    await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });

    await scriptModel(mock, [
      call('diner__book_table', { date: '2025-07-01' }, 'I will book it.'),
      { text: 'Your table is booked.' },
    ]);
    await submitTask(panel, 'Book a table for 4 on July 1st');
    const approval = await waitForApprovalCard(panel);
    assert.equal(approval.toolName, 'diner__book_table');
    await answerApprovalInPanel(panel, 'acceptOnce');

    // The server asks; the card shows its form.
    const form = await waitForServerForm(panel);
    const waiting = await readPanel(panel);
    // The run executes the server's call, which waits for the user.
    assert.equal(waiting.state, 'executing_tools', transcriptLines(waiting).join('\n'));
    assert.equal(await panel.locator('#status-text').textContent(), 'Waiting for your answer');
    assert.equal(form.heading, 'The MCP server “diner” asks you');
    assert.equal(form.serverUrl, mcp.url);
    assert.equal(form.message, BOOKING_MESSAGE);
    assert.equal(form.answerBoxVisible, false, 'the form, not the single answer box');
    assert.ok(form.focused, 'focus moved to the card when it appeared');
    assert.equal(form.describedBy, 'interaction-question elicitation-note');
    assert.match(form.note, /goes to the MCP server “diner”, not to the agent\. Share nothing you would not give that server: never a password\./);
    assert.deepEqual(form.fields.map((f) => [f.name, f.control, f.required]), [
      ['name', 'text', true],
      ['email', 'email', true],
      ['partySize', 'number', true],
      ['seating', 'select', false],
      ['highChair', 'checkbox', false],
    ]);
    const field = Object.fromEntries(form.fields.map((f) => [f.name, f]));
    assert.deepEqual([field.name.minLength, field.name.maxLength, field.name.value], ['2', '60', '']);
    assert.equal(field.email.hint, 'The confirmation goes there.');
    assert.match(field.email.describedBy, /-hint .*-error$/, 'the hint is read with the field');
    assert.deepEqual([field.partySize.value, field.partySize.min, field.partySize.max, field.partySize.step], ['2', '1', '12', '1'], 'the default, the range, whole numbers');
    // Each option's value is its index (an option of the server's may be "" or have edge spaces).
    assert.deepEqual(field.seating.options, [['', '(none)'], ['0', 'Indoors'], ['1', 'On the terrace'], ['2', 'At the bar']]);
    assert.equal(field.seating.value, '', 'not required: the empty choice');
    assert.equal(field.highChair.value, false, 'the default');
    assert.deepEqual(form.buttons.map((b) => b.text), ['Submit', 'Decline', 'Cancel']);
    // Every control has its label as its accessible name (the required mark is not read).
    assert.equal(await panel.getByRole('region', { name: 'The MCP server “diner” asks you' }).count(), 1);
    for (const [role, name] of [['textbox', 'Your name'], ['textbox', 'Email'], ['spinbutton', 'Guests'], ['combobox', 'Seating'], ['checkbox', 'High chair needed']]) {
      assert.equal(await panel.getByRole(role, { name, exact: true }).count(), 1, `a ${role} named ${name}`);
    }
    assert.equal(await toolCardStatus(panel, form.callId), 'waiting for your answer');

    // What the engine told the panel, and what the server asked.
    const request = (await portMessages(panel, 'in')).find((m) => m.type === 'interaction.request');
    assert.equal(request?.interaction.id, form.interactionId);
    assert.equal(request.interaction.server, 'diner');
    assert.equal(request.interaction.serverUrl, mcp.url);
    assert.equal(request.interaction.question, BOOKING_MESSAGE);
    assert.deepEqual(request.interaction.form.fields.map((f) => f.name), BOOKING_FIELDS, 'in the server\'s order');
    const [asked] = mcp.elicitations();
    assert.deepEqual(asked.params.requestedSchema, BOOKING_SCHEMA);
    assert.equal(asked.callId, mcp.calls()[0].id);
    assert.deepEqual(mcp.elicitationResponses(), [], 'the server still waits');

    // Bad values are caught in the panel: nothing is sent.
    await panel.getByRole('textbox', { name: 'Your name', exact: true }).fill('Ada Lovelace');
    await panel.getByRole('textbox', { name: 'Email', exact: true }).fill('ada-at-example');
    await panel.getByRole('spinbutton', { name: 'Guests', exact: true }).fill('40');
    await panel.getByRole('combobox', { name: 'Seating', exact: true }).selectOption({ label: 'On the terrace' });
    await panel.getByRole('checkbox', { name: 'High chair needed', exact: true }).check();
    await panel.getByRole('button', { name: 'Submit', exact: true }).click();
    const checked = await readServerForm(panel);
    const marked = Object.fromEntries(checked.fields.map((f) => [f.name, f]));
    assert.equal(marked.email.error, 'Enter an email address, like name@example.com.');
    assert.equal(marked.partySize.error, 'Enter a number from 1 to 12.');
    assert.deepEqual(checked.fields.filter((f) => f.invalid).map((f) => f.name), ['email', 'partySize']);
    assert.equal(checked.activeField, 'email', 'focus on the first field to fix');
    assert.equal(checked.status, 'Not sent: check the 2 marked fields.');
    assert.equal(checked.busy, false);
    assert.deepEqual((await portMessages(panel, 'out')).filter((m) => m.type === 'elicitation.response'), [], 'nothing sent');

    // The engine checks again: an answer it refuses (changed on its way) is
    // said next to the field it names, and the form works again.
    await panel.getByRole('textbox', { name: 'Email', exact: true }).fill('ada@example.com');
    await panel.getByRole('spinbutton', { name: 'Guests', exact: true }).fill('4');
    await panel.evaluate(() => {
      globalThis.__rewriteOp = (op) => {
        if (op.type !== 'elicitation.response' || globalThis.__rewritten) return op;
        globalThis.__rewritten = true;
        return { ...op, content: { ...op.content, email: 'not-an-email' } };
      };
    });
    await panel.getByRole('button', { name: 'Submit', exact: true }).click();
    const refused = await waitFor(
      async () => (await portMessages(panel, 'in')).find((m) => m.type === 'command.reject' && m.opType === 'elicitation.response'),
      { timeout: 30000, message: 'the engine to refuse the answer that does not fit the form' },
    );
    assert.equal(refused.error.kind, 'invalid_command');
    assert.match(refused.error.message, /email/, 'the message names the field');
    const back = await waitForServerForm(panel);
    assert.equal(back.interactionId, form.interactionId, 'the same request, still open');
    assert.equal(back.status, `Not sent: ${refused.error.message.trim()}${/[.!?]$/.test(refused.error.message.trim()) ? '' : '.'}`);
    const emailBack = back.fields.find((f) => f.name === 'email');
    assert.ok(emailBack.invalid && emailBack.error !== '', `the engine's message next to the field: ${JSON.stringify(emailBack)}`);
    assert.equal(back.activeField, 'email');
    assert.equal(emailBack.value, 'ada@example.com', 'what was typed stays');
    assert.equal((await readPanel(panel)).error, '', 'said in the card, not in the banner');
    assert.deepEqual(mcp.elicitationResponses(), [], 'the server got nothing');

    await panel.getByRole('button', { name: 'Submit', exact: true }).click();
    await mcp.waitFor(() => mcp.elicitationResponses().length === 1, { message: 'the answer to reach the server' });
    const [response] = mcp.elicitationResponses();
    assert.equal(response.id, asked.id);
    assert.equal(response.action, 'accept');
    assert.deepEqual(response.content, { name: 'Ada Lovelace', email: 'ada@example.com', partySize: 4, seating: 'terrace', highChair: true }, 'typed: a number, a boolean');
    assert.equal(response.late, false);
    assert.equal(response.session, mcp.calls()[0].session, 'in the session of the call');
    assert.equal(response.requestSession, response.session);
    assert.equal(response.headers['mcp-protocol-version'], '2025-06-18');

    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.equal((await readServerForm(panel)).visible, false, 'the card is gone');
    const result = resultsByTool(mock.requests().at(-1)).diner__book_table;
    assert.match(result, /^<untrusted_tool_content origin="mcp:diner">\nBooked for 4 on 2025-07-01 \(name: Ada Lovelace, email: ada@example\.com, seating: terrace, high chair: yes\)/);
    assert.equal(mock.requests().length, 2, 'the model was not asked while the form waited');
    assert.deepEqual(orphanToolCallProblems(mock.requests()), []);
    assert.equal(await elicitationBadge(panel, form.callId), 'accepted');
    assert.equal(await toolCardStatus(panel, form.callId), 'ok');

    // The wire: the refused answer, then the one recorded, acknowledged and resolved.
    const sent = (await portMessages(panel, 'out')).filter((m) => m.type === 'elicitation.response');
    assert.deepEqual(sent.map((m) => [m.interactionId, m.action, m.content.email]), [
      [form.interactionId, 'accept', 'not-an-email'],
      [form.interactionId, 'accept', 'ada@example.com'],
    ]);
    const received = await portMessages(panel, 'in');
    const ack = received.find((m) => m.type === 'command.ack' && m.submissionId === sent[1].submissionId);
    assert.deepEqual(ack?.result, { interactionId: form.interactionId, status: 'answered', action: 'accept' });
    const resolved = received.filter((m) => m.type === 'interaction.resolved');
    assert.deepEqual(resolved.map((m) => [m.interactionId, m.status]), [[form.interactionId, 'answered']]);
    assert.deepEqual(mcp.bookings().map((b) => b.name), ['Ada Lovelace']);
    assert.deepEqual(await consoleErrors(session), []);
  },
);

mcpTest(
  'a_server_s_request_for_input_declined_or_cancelled_sends_no_values_and_the_call_ends_as_the_server_says',
  (url) => [{ name: 'diner', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'diner', DEMO_TOOLS.length);
    await scriptModel(mock, [
      call('diner__book_table', { date: '2025-07-01' }),
      call('diner__book_table', { date: '2025-07-02' }),
      { text: 'No table was booked.' },
    ]);
    await submitTask(panel, 'Book a table, July 1st or 2nd');

    await answerApprovalInPanel(panel, 'acceptOnce');
    const first = await waitForServerForm(panel);
    await panel.getByRole('textbox', { name: 'Your name', exact: true }).fill('Ada Lovelace');
    await panel.getByRole('button', { name: 'Decline', exact: true }).click();
    await mcp.waitFor(() => mcp.elicitationResponses().length === 1, { message: 'the decline to reach the server' });

    await answerApprovalInPanel(panel, 'acceptOnce');
    const second = await waitForServerForm(panel, { previousId: first.interactionId });
    assert.equal(second.fields.find((f) => f.name === 'name').value, '', 'a new request starts empty');
    // Keyboard: the button, Enter.
    await panel.getByRole('button', { name: 'Cancel', exact: true }).press('Enter');
    await mcp.waitFor(() => mcp.elicitationResponses().length === 2, { message: 'the cancel to reach the server' });

    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.deepEqual(mcp.elicitationResponses().map((r) => [r.action, r.content]), [['decline', undefined], ['cancel', undefined]], 'no values with either');
    const sent = (await portMessages(panel, 'out')).filter((m) => m.type === 'elicitation.response');
    assert.deepEqual(sent.map((m) => [m.interactionId, m.action, 'content' in m]), [
      [first.interactionId, 'decline', false],
      [second.interactionId, 'cancel', false],
    ]);
    const results = resultsOfCalls(mock.requests().at(-1), 'diner__book_table');
    assert.equal(results.length, 2);
    assert.match(results[0], /Booking declined/);
    assert.match(results[1], /Booking cancelled/);
    assert.deepEqual(mcp.bookings(), []);
    assert.equal(await elicitationBadge(panel, first.callId), 'declined');
    assert.equal(await elicitationBadge(panel, second.callId), 'cancelled');
    assert.equal((await readServerForm(panel)).visible, false);
    assert.deepEqual(orphanToolCallProblems(mock.requests()), []);
  },
);

mcpTest(
  'a_read_whose_server_asked_for_input_when_the_worker_died_is_not_run_again_and_the_model_is_told',
  (url) => [{ name: 'diner', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'diner', DEMO_TOOLS.length);
    await scriptModel(mock, [
      call('diner__check_availability', {}),
      { text: 'I could not check; tell me the day again.' },
    ]);
    await submitTask(panel, 'Is there a table free?');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const before = await waitForServerForm(panel);
    assert.deepEqual(before.fields.map((f) => [f.name, f.control, f.required]), [['day', 'date', true]]);
    const epochBefore = (await readPanel(panel)).epoch;
    assert.equal(mcp.elicitations().length, 1);

    await killServiceWorker(context, extensionId, { page: panel });
    // A new worker cannot answer a request of the old worker's call (its
    // stream is gone): the form goes away, and the read, which a restart
    // would otherwise run again, ends with a result that says why.
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.notEqual(final.epoch, epochBefore, 'a new worker finished the run');
    assert.equal((await readServerForm(panel)).visible, false, 'the form is gone');
    const fromNewWorker = (await portMessages(panel, 'in')).filter((m) => m.epoch !== undefined && m.epoch !== epochBefore);
    const withdrawn = fromNewWorker.filter((m) => m.type === 'interaction.resolved' && m.interactionId === before.interactionId);
    assert.ok(withdrawn.every((m) => m.status === 'cancelled'), JSON.stringify(withdrawn));

    const [result] = resultsOfCalls(mock.requests().at(-1), 'diner__check_availability');
    assert.match(result, /asked the user for input during this call/, result);
    assert.match(result, /cannot be continued/, result);
    assert.match(result, /Call the tool again only if that is safe/, result);
    assert.equal(mock.requests().length, 2, 'the run went on: the model got the result');
    assert.match(topLevelText(final), /I could not check/);
    const calls = mcp.calls();
    assert.equal(calls.length, 1, 'a read, yet not run again: the user would be asked again unasked');
    assert.deepEqual(mcp.elicitationResponses(), [], 'the server never got an answer');
    assert.deepEqual(orphanToolCallProblems(mock.requests()), []);
  },
);

mcpTest(
  'never_retry_at_most_once_a_write_whose_server_asked_for_input_when_the_worker_died_is_the_user_s_to_decide',
  (url) => [{ name: 'diner', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'diner', DEMO_TOOLS.length);
    await scriptModel(mock, [
      call('diner__book_table', { date: '2025-07-01' }),
      { text: 'Done.' },
    ]);
    await submitTask(panel, 'Book a table for July 1st');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const before = await waitForServerForm(panel);
    const epochBefore = (await readPanel(panel)).epoch;
    await panel.getByRole('textbox', { name: 'Your name', exact: true }).fill('Ada Lovelace');

    await killServiceWorker(context, extensionId, { page: panel });
    // The booking may have happened on the server's side: the new worker
    // neither runs it again nor guesses; the user decides (paused_uncertain),
    // and the server's form, whose call is gone, is withdrawn.
    const paused = await waitForSettledTurn(panel);
    assert.equal(paused.state, 'paused_uncertain', transcriptLines(paused).join('\n'));
    assert.notEqual(paused.epoch, epochBefore);
    await waitFor(async () => !(await readServerForm(panel)).visible, { timeout: 30000, message: 'the form to go away' });
    const fromNewWorker = (await portMessages(panel, 'in')).filter((m) => m.epoch !== undefined && m.epoch !== epochBefore);
    const snapshots = fromNewWorker.filter((m) => m.type === 'initialized');
    const withdrawn = fromNewWorker.filter((m) => m.type === 'interaction.resolved' && m.interactionId === before.interactionId);
    const askedAgain = snapshots.filter((m) => m.snapshot?.thread?.pendingInteraction?.id === before.interactionId);
    assert.ok(askedAgain.length === 0 || withdrawn.some((m) => m.status === 'cancelled'), JSON.stringify(withdrawn));
    const calls = mcp.calls();
    assert.equal(calls.length, 1, 'never run twice by itself');
    assert.equal(calls[0].outcome, 'disconnected');
    assert.deepEqual(mcp.elicitationResponses(), []);
    assert.deepEqual(mcp.bookings(), []);
    assert.equal(mock.requests().length, 1, 'the model is not asked until the user decides');
  },
);

/** The text of the panel's top-level messages, joined. */
function topLevelText(panelState) {
  return panelState.nodes.filter((n) => !n.parentNodeId).map((n) => n.text).join('\n');
}

/** Waits until the server has `count` open event streams (GET); returns their log entries. */
function openStreams(mcp, count) {
  return waitFor(() => {
    const open = mcp.log().filter((e) => e.kind === 'stream' && !e.closed);
    return mcp.streamCount() === count && open.length === count ? open : null;
  }, { message: `${count} open event stream(s) at the MCP server` });
}

/** The names of the tools Settings lists for a server (by their labels). */
const listedTools = (server) => (server.text.match(/\d+ tools?: (.*)$/)?.[1] ?? '').split(', ');

mcpTest(
  'a_server_that_announces_a_change_of_its_tools_is_listed_again_its_new_tool_offered_and_a_new_worker_follows_it_too',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    // The server declared listChanged: the worker keeps its event stream
    // open, in the session, with the agreed revision.
    const [stream] = await openStreams(mcp, 1);
    const initialize = mcp.log().find((e) => e.method === 'initialize');
    assert.equal(stream.session, initialize.session);
    assert.equal(stream.headers['mcp-protocol-version'], '2025-06-18');
    assert.equal(stream.headers.accept, 'text/event-stream');
    const listings = () => mcp.log().filter((e) => e.method === 'tools/list' && !e.params?.cursor).length;
    assert.equal(listings(), 1);
    const [before] = await serversIn(panel, { docs: 'ready' });
    assert.equal(listedTools(before).length, DEMO_TOOLS.length);

    // A call publishes a new tool; the server announces it on the stream:
    // listed again at once, Settings (still open) shows it, the worker keeps it.
    await closeSettings(panel);
    await scriptModel(mock, [call('docs__add_faq_tool', { topic: 'Returns' }), { text: 'Published.' }]);
    await submitTask(panel, 'Publish a FAQ tool about returns');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', transcriptLines(first).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__add_faq_tool, /Published faq_returns\./);
    assert.ok(mcp.log().some((e) => e.kind === 'sent' && e.method === 'notifications/tools/list_changed' && e.stream === stream.stream));
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length + 1);
    assert.equal(listings(), 2, 'listed again once');
    const [after] = await waitFor(async () => {
      const shown = await shownServers(panel);
      return shown.length === 1 && listedTools(shown[0]).includes('faq_returns') ? shown : null;
    }, { message: 'Settings to list the new tool' });
    assert.equal(after.state, 'ready');
    await closeSettings(panel);

    // The next request offers it, and it runs.
    await scriptModel(mock, [call('docs__faq_returns', { question: 'How long?' }), { text: 'See the help centre.' }]);
    await submitTask(panel, 'Ask the returns FAQ');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const second = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
    assert.equal(second.state, 'completed', transcriptLines(second).join('\n'));
    assert.ok(offeredTools(mock.requests().at(-2)).includes('docs__faq_returns'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__faq_returns, /FAQ on Returns: see the help centre\./);

    // A new worker opens a stream of its own and follows the server too:
    // the tool taken back is no longer offered.
    await killServiceWorker(context, extensionId);
    await panel.reload();
    await waitFor(() => mcp.log().filter((e) => e.kind === 'stream').length === 2 && mcp.streamCount() === 1, {
      message: 'the new worker to open its own event stream (the old one closed)',
    });
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length + 1);
    const listedBefore = listings();
    assert.equal(mcp.setTools(demoTools({ tickets: [], bookings: [] })), 1, 'announced on the one open stream');
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    assert.equal(listings(), listedBefore + 1);
    const [last] = await serversIn(panel, { docs: 'ready' });
    assert.ok(!listedTools(last).includes('faq_returns'), last.text);
    assert.deepEqual(await consoleErrors(session), []);
  },
);

mcpTest(
  'a_server_that_was_unreachable_is_asked_again_with_check_again_and_connects_without_a_new_worker',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mcp, context, extensionId } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    // A new worker while the server is down: unreachable, with the reason.
    mcp.setDown(503);
    await killServiceWorker(context, extensionId);
    await panel.reload();
    const [down] = await serversIn(panel, { docs: 'unreachable' });
    assert.match(down.text, /^docs — Not reachable: The MCP server "docs" answered HTTP 503/);
    assert.equal(down.refresh, 'Check again');
    const button = panel.getByRole('button', { name: 'Ask the MCP server docs for its tools again', exact: true });

    // Still down: asked again, and unreachable again.
    const asked = () => mcp.log().filter((e) => e.status === 503).length;
    const before = asked();
    await button.click();
    await waitFor(() => asked() > before, { message: 'the server to be asked again' });
    await serversIn(panel, { docs: 'unreachable' });

    // Back: Check again connects it, in this worker, and focus stays on the button.
    mcp.setDown(null);
    await button.click();
    const [back] = await serversIn(panel, { docs: 'ready' });
    assert.match(back.text, /^docs — Connected .* 8 tools: Search the docs,/);
    assert.equal(back.refresh, 'Check again');
    assert.equal(await panel.evaluate(() => document.activeElement?.getAttribute('aria-label')), 'Ask the MCP server docs for its tools again');
    const refreshes = ((await portLog(panel)) ?? [])
      .filter((e) => e.dir === 'out' && e.json)
      .map((e) => JSON.parse(e.json))
      .filter((m) => m.type === 'mcpServers.refresh');
    assert.deepEqual(refreshes.map((m) => m.name), ['docs', 'docs']);
    // It follows the server again: an event stream is open.
    await openStreams(mcp, 1);
  },
);

/** The mock of the test below, for its tool to change the list. */
const inline = { mcp: null };
const INLINE_SEARCH = {
  name: 'search',
  description: 'Search.',
  annotations: { readOnlyHint: true },
  inputSchema: { type: 'object', properties: {} },
  run: () => ({ content: [{ type: 'text', text: 'Nothing.' }] }),
};
const INLINE_GLOSSARY = {
  name: 'glossary',
  description: 'Look a word up.',
  annotations: { readOnlyHint: true },
  inputSchema: { type: 'object', properties: {} },
  run: () => ({ content: [{ type: 'text', text: 'A word.' }] }),
};
/** Publishes the glossary tool and says so in its own answer (not on an event stream). */
const INLINE_PUBLISH = {
  name: 'publish',
  description: 'Publish the glossary tool.',
  inputSchema: { type: 'object', properties: {} },
  run: (_args, ctx) => {
    inline.mcp.setTools([INLINE_SEARCH, INLINE_PUBLISH, INLINE_GLOSSARY], { notify: false });
    ctx.notify('notifications/tools/list_changed');
    return { content: [{ type: 'text', text: 'Published.' }] };
  },
};

mcpTest(
  'a_change_announced_in_a_call_s_answer_lists_the_tools_again_and_a_server_that_announces_nothing_is_asked_for_no_event_stream',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    inline.mcp = mcp;
    await keptCatalog(panel, 'docs', 2);
    // The server declared no listChanged: no event stream is asked for.
    assert.equal(mcp.log().filter((e) => e.method === 'GET').length, 0);
    const listings = () => mcp.log().filter((e) => e.method === 'tools/list' && !e.params?.cursor).length;
    assert.equal(listings(), 1);

    await scriptModel(mock, [call('docs__publish', {}), { text: 'Published.' }]);
    await submitTask(panel, 'Publish the glossary');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    assert.ok(mcp.sent().some((e) => e.method === 'notifications/tools/list_changed' && e.callId !== undefined), 'sent in the call\'s answer');
    await keptCatalog(panel, 'docs', 3);
    assert.equal(listings(), 2, 'listed again once');
    const [shown] = await serversIn(panel, { docs: 'ready' });
    assert.deepEqual(listedTools(shown), ['search', 'publish', 'glossary']);
    assert.equal(mcp.log().filter((e) => e.method === 'GET').length, 0, 'still no event stream asked for');
    assert.deepEqual(await consoleErrors(session), []);
  },
  { listChanged: false, tools: [INLINE_SEARCH, INLINE_PUBLISH] },
);

/** The sign-in window the worker opened at the mock's authorization endpoint. */
function signInWindow(context, mcp) {
  return waitFor(
    () => context.pages().find((p) => p.url().startsWith(mcp.auth.authorizationEndpoint)) ?? null,
    { message: 'the server\'s sign-in window' },
  );
}

const grantIn = (panel, url) => panel.evaluate(async (key) => (await chrome.storage.local.get(key))[key] ?? null, `mcpGrant:${url}`);

mcpTest(
  'a_server_that_asks_for_a_sign_in_is_signed_in_from_settings_its_token_sent_renewed_and_kept_for_a_new_worker',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    // The server answers 401: Settings says a sign-in is needed and offers it.
    const [asks] = await serversIn(panel, { docs: 'sign_in_needed' });
    assert.match(asks.text, /^docs — Sign-in needed\. The MCP server "docs" needs you to sign in/);
    assert.equal(mcp.log().filter((e) => e.status === 401).length > 0, true);
    await panel.getByRole('button', { name: 'Sign in to the MCP server docs', exact: true }).click();

    // The sign-in window: the mock's page, asked as MCP authorization says.
    const window = await signInWindow(context, mcp);
    const asked = new URL(window.url());
    assert.equal(asked.searchParams.get('response_type'), 'code');
    assert.equal(asked.searchParams.get('code_challenge_method'), 'S256');
    assert.equal(asked.searchParams.get('resource'), mcp.url);
    assert.equal(asked.searchParams.get('redirect_uri'), `https://${extensionId}.chromiumapp.org/mcp-sign-in`);
    assert.equal(asked.searchParams.get('scope'), 'tools');
    assert.ok(asked.searchParams.get('state').length >= 20);
    assert.equal(mcp.clients()[0].client_name, 'SW Agent');
    // Every redraw meanwhile shows the sign-in under way.
    await waitFor(async () => (await panel.evaluate(() => {
      const button = document.querySelector('#mcp-servers-list button.mcp-sign');
      return button?.textContent === 'Signing in…' && button.getAttribute('aria-disabled') === 'true'
        && document.getElementById('mcp-servers-status').textContent.includes('sign-in window is open');
    })), { message: 'the panel to show the sign-in under way' });
    await window.click('#allow');

    const [ready] = await serversIn(panel, { docs: 'ready' });
    assert.match(ready.text, /^docs — Connected .* 8 tools: Search the docs,/);
    assert.equal(await panel.evaluate(() => document.getElementById('mcp-servers-status').textContent), '', 'the window line went');
    assert.deepEqual(await panel.evaluate(() => [...document.querySelectorAll('#mcp-servers-list button.mcp-sign')].map((b) => b.textContent)), ['Sign out']);
    const [token] = mcp.tokens();
    assert.equal(token.grantType, 'authorization_code');
    const exchange = mcp.authLog().find((e) => e.kind === 'token');
    assert.equal(exchange.params.resource, mcp.url);
    assert.equal(exchange.params.code_verifier.length, 43);
    const kept = await grantIn(panel, mcp.url);
    assert.equal(kept.accessToken, token.accessToken);
    assert.equal(kept.serverUrl, mcp.url);
    // Every message after the sign-in carries the token; it never crosses the Port.
    const afterSignIn = mcp.log().filter((e) => e.status !== 401 && e.kind !== 'rejected');
    assert.ok(afterSignIn.length > 0);
    for (const entry of afterSignIn) assert.equal(entry.headers.authorization, `Bearer ${token.accessToken}`, entry.method ?? entry.kind);
    assert.ok(!((await portLog(panel)) ?? []).some((e) => e.json && e.json.includes(token.accessToken)), 'the token never crosses the Port');
    await closeSettings(panel);

    // A call with the token; then the token expires: renewed once, the call goes through.
    await scriptModel(mock, [call('docs__search', { query: 'refund' }), { text: 'Found.' }, call('docs__search', { query: 'returns' }), { text: 'Found again.' }]);
    await submitTask(panel, 'Search refunds');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', transcriptLines(first).join('\n'));
    mcp.expireAccessTokens();
    await submitTask(panel, 'Search returns');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const second = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
    assert.equal(second.state, 'completed', transcriptLines(second).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__search, /2 passages for "returns"/);
    const renewals = mcp.tokens().filter((t) => t.grantType === 'refresh_token');
    assert.equal(renewals.length, 1, 'renewed once');
    assert.equal((await grantIn(panel, mcp.url)).accessToken, renewals[0].accessToken, 'the renewed grant is kept');
    assert.deepEqual(mcp.calls().map((c) => c.arguments.query), ['refund', 'returns'], 'each call ran once');

    // A new worker reads the kept grant: connected without a sign-in.
    await killServiceWorker(context, extensionId);
    await panel.reload();
    await serversIn(panel, { docs: 'ready' });
    assert.equal(mcp.clients().length, 1, 'no new registration');
    assert.equal(mcp.log().at(-1).headers.authorization, `Bearer ${renewals[0].accessToken}`);
    assert.deepEqual(await consoleErrors(session), []);
  },
  { auth: true },
);

mcpTest(
  'a_sign_in_denied_a_grant_revoked_and_a_sign_out_leave_the_server_asking_for_a_sign_in_and_keep_no_token',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mcp, context } = session;
    await serversIn(panel, { docs: 'sign_in_needed' });
    const signIn = panel.getByRole('button', { name: 'Sign in to the MCP server docs', exact: true });

    // Denied in the sign-in window: still asking, with why; nothing kept.
    await signIn.click();
    await (await signInWindow(context, mcp)).click('#deny');
    const [denied] = await waitFor(async () => {
      const shown = await shownServers(panel);
      return shown[0]?.state === 'sign_in_needed' && /access_denied/.test(shown[0].text) ? shown : null;
    }, { message: 'the denied sign-in to be listed' });
    assert.match(denied.text, /Signing in to the MCP server "docs" failed: the sign-in did not complete \(access_denied/);
    assert.equal(await grantIn(panel, mcp.url), null);
    assert.equal(mcp.tokens().length, 0);

    // Signed in (approved at once), then the grant is revoked at the server:
    // Check again finds the renewal refused, forgets the grant, asks again.
    mcp.setAutoApprove(true);
    await signIn.click();
    await serversIn(panel, { docs: 'ready' });
    assert.ok(await grantIn(panel, mcp.url));
    mcp.revokeGrants();
    await panel.getByRole('button', { name: 'Ask the MCP server docs for its tools again', exact: true }).click();
    await serversIn(panel, { docs: 'sign_in_needed' });
    assert.equal(await grantIn(panel, mcp.url), null, 'a refused renewal forgets the grant');
    assert.ok(mcp.authLog().some((e) => e.kind === 'token' && e.grantType === 'refresh_token' && e.error === 'invalid_grant'));

    // Signed in again, then out: the grant is forgotten and the server asks again.
    await signIn.click();
    await serversIn(panel, { docs: 'ready' });
    await panel.getByRole('button', { name: 'Sign out of the MCP server docs', exact: true }).click();
    await serversIn(panel, { docs: 'sign_in_needed' });
    assert.equal(await grantIn(panel, mcp.url), null);
    const last = mcp.log().at(-1);
    assert.equal(last.status, 401);
    assert.equal(last.headers.authorization, undefined, 'no token sent after the sign-out');
    // Every sign-in used the one client registered at the first.
    assert.equal(mcp.authLog().filter((e) => e.kind === 'register').length, 1);
    assert.ok(mcp.authLog().filter((e) => e.kind === 'authorize').every((e) => e.params.client_id === mcp.clients()[0].client_id));

    // The sign-in server forgets its clients: its sign-in page refuses the
    // kept one (HTTP 400, no way back), so the window never completes; the
    // client is forgotten, and the next sign-in registers a new one.
    const forgotten = mcp.clients()[0].client_id;
    mcp.reset();
    await signIn.click();
    await waitFor(async () => {
      const shown = await shownServers(panel);
      return shown[0]?.state === 'sign_in_needed' && /did not complete \(Authorization page could not be loaded/.test(shown[0].text) ? shown : null;
    }, { message: 'the sign-in with the forgotten client to fail' });
    assert.equal(mcp.authLog().find((e) => e.kind === 'authorize')?.params.client_id, forgotten);
    mcp.setAutoApprove(true);
    await signIn.click();
    await serversIn(panel, { docs: 'ready' });
    assert.equal(mcp.clients().length, 1, 'registered again');
    assert.notEqual(mcp.clients()[0].client_id, forgotten);
  },
  { auth: true },
);

/** The Sign in / Sign out buttons Settings shows, in list order. */
const signButtons = (panel) => panel.evaluate(() => [...document.querySelectorAll('#mcp-servers-list button.mcp-sign')].map((b) => b.textContent));
const renewalsOf = (mcp) => mcp.tokens().filter((t) => t.grantType === 'refresh_token');
const refusedRenewals = (mcp) => mcp.authLog().filter((e) => e.kind === 'token' && e.error);

mcpTest(
  'one_sign_in_serves_every_server_at_its_address_and_a_renewal_outlives_a_call_given_up_at_its_time_limit',
  (url) => [{ name: 'docs', url, timeoutMs: 2500 }],
  async (session) => {
    const { panel, mock, mcp, context, extensionId } = session;
    mcp.setAutoApprove(true);
    await serversIn(panel, { docs: 'sign_in_needed' });
    // The user adds the same server under a name of their own: it asks for
    // the same sign-in.
    await addServerInPanel(panel, { name: 'mydocs', url: mcp.url });
    await serversListedAs(panel, [['docs', 'extension', 'sign_in_needed'], ['mydocs', 'user', 'sign_in_needed']]);

    // One sign-in, from either, serves both: one registration, one grant.
    await panel.getByRole('button', { name: 'Sign in to the MCP server mydocs', exact: true }).click();
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'ready']]);
    assert.equal(mcp.clients().length, 1);
    assert.equal(mcp.tokens().length, 1);
    assert.deepEqual(await signButtons(panel), ['Sign out', 'Sign out']);

    // The token expires while no worker runs; the next worker asks both
    // servers at once, both are refused, and the grant is renewed once (a
    // refresh token is good for one renewal: two copies of the grant would
    // each spend it, and one would be refused).
    mcp.expireAccessTokens();
    await killServiceWorker(context, extensionId);
    await panel.reload();
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'ready']]);
    assert.equal(renewalsOf(mcp).length, 1, 'renewed once for both');
    assert.deepEqual(refusedRenewals(mcp), []);
    const renewed = renewalsOf(mcp)[0].accessToken;
    const listings = mcp.log().filter((e) => e.method === 'tools/list' && e.status !== 401);
    assert.ok(listings.length >= 2 && listings.slice(-2).every((e) => e.headers.authorization === `Bearer ${renewed}`), 'both listed with the renewed token');
    await closeSettings(panel);

    // The token expires again and the renewal is slower than the call's
    // time limit (2.5 s): the call is given up while its token is renewed
    // (the server may already have replaced the refresh token). The
    // renewal still completes and is kept, so the next call needs no
    // sign-in and no second renewal.
    mcp.expireAccessTokens();
    mcp.setTokenDelay(5000);
    const received = mcp.tokenRequestsReceived();
    await scriptModel(mock, [call('docs__search', { query: 'refund' }), { text: 'It took too long.' }]);
    await submitTask(panel, 'Search refunds');
    await answerApprovalInPanel(panel, 'acceptOnce');
    await waitFor(() => mcp.tokenRequestsReceived() > received, { message: 'a renewal in flight' });
    const stopped = await waitForSettledTurn(panel);
    assert.equal(stopped.state, 'completed', transcriptLines(stopped).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__search, /within 2500 ms/);
    assert.equal(renewalsOf(mcp).length, 1, 'given up before the renewal answered');
    assert.deepEqual(mcp.calls(), [], 'the call never ran');
    const late = await waitFor(() => (renewalsOf(mcp).length === 2 ? renewalsOf(mcp)[1] : null), { message: 'the slow renewal to answer' });
    await waitFor(async () => (await grantIn(panel, mcp.url))?.accessToken === late.accessToken, { message: 'the late renewal to be kept' });
    mcp.setTokenDelay(0);

    await scriptModel(mock, [call('mydocs__search', { query: 'returns' }), { text: 'Found.' }]);
    await submitTask(panel, 'Search returns');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const found = await waitForSettledTurn(panel, { previousTurnId: stopped.turnId });
    assert.equal(found.state, 'completed', transcriptLines(found).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).mydocs__search, /2 passages for "returns"/);
    assert.equal(renewalsOf(mcp).length, 2, 'no renewal more');
    assert.deepEqual(refusedRenewals(mcp), []);
    assert.equal(mcp.log().filter((e) => e.method === 'tools/call').at(-1).headers.authorization, `Bearer ${late.accessToken}`);
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'ready']]);
    assert.deepEqual(await consoleErrors(session), []);
  },
  { auth: true },
);

mcpTest(
  'a_sign_in_finds_metadata_at_the_root_asks_for_the_challenge_s_scopes_checks_the_issuer_and_asks_again_when_a_tool_needs_more',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    mcp.setAutoApprove(true);
    // The 401 names no metadata address; the server's is at its origin's
    // root only (RFC 9728: the address with the path is tried first).
    await serversIn(panel, { docs: 'sign_in_needed' });
    const signIn = panel.getByRole('button', { name: 'Sign in to the MCP server docs', exact: true });

    // An answer naming another issuer is refused (RFC 9207: a mix-up).
    mcp.setRedirectIss('https://evil.example');
    await signIn.click();
    const [mixedUp] = await waitFor(async () => {
      const shown = await shownServers(panel);
      return /did not come from its sign-in server/.test(shown[0]?.text ?? '') ? shown : null;
    }, { message: 'the mixed-up sign-in to be refused' });
    assert.equal(mixedUp.state, 'sign_in_needed');
    assert.match(mixedUp.text, /it names the issuer "https:\/\/evil\.example"/);
    assert.equal(mcp.tokens().length, 0, 'the code was not exchanged');
    assert.equal(await grantIn(panel, mcp.url), null);
    assert.deepEqual(
      mcp.authLog().filter((e) => e.kind === 'metadata').map((e) => [e.path, e.status]),
      [['/.well-known/oauth-protected-resource', 200]],
      'found at the root',
    );
    // After the address with the server's path (RFC 9728 §3.1), which is 404 here.
    assert.ok(mcp.log().some((e) => e.kind === 'rejected' && e.status === 404 && e.path === '/.well-known/oauth-protected-resource/mcp'), 'the path address tried first');

    // Signed in: only the challenge's scope is asked for, not every scope
    // the metadata lists; the issuer named in the answer is checked.
    mcp.setRedirectIss(undefined);
    await signIn.click();
    await serversIn(panel, { docs: 'ready' });
    const first = mcp.authLog().filter((e) => e.kind === 'authorize').at(-1);
    assert.equal(first.params.scope, 'tools');
    assert.match(first.location, /[?&]iss=/);
    assert.equal(mcp.tokens().at(-1).scope, 'tools');

    // A tool that needs more: the server refuses the call (403
    // insufficient_scope), the model is told to have the user sign in,
    // and Settings asks for it.
    await closeSettings(panel);
    await scriptModel(mock, [call('docs__create_ticket', { subject: 'Refund for order 42' }), { text: 'It needs more permission.' }]);
    await submitTask(panel, 'Open a ticket');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const refused = await waitForSettledTurn(panel);
    assert.equal(refused.state, 'completed', transcriptLines(refused).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__create_ticket, /needs more permission than your sign-in gave \(tools admin\)/);
    assert.deepEqual(mcp.calls(), [], 'the tool did not run');
    assert.equal(mcp.log().filter((e) => e.status === 403).at(-1).authError, 'insufficient_scope');
    const [needs] = await serversIn(panel, { docs: 'sign_in_needed' });
    assert.match(needs.text, /needs more permission/);

    // Signed in again for the scopes the refusal named: the call goes through.
    await signIn.click();
    await serversIn(panel, { docs: 'ready' });
    assert.equal(mcp.authLog().filter((e) => e.kind === 'authorize').at(-1).params.scope, 'tools admin');
    await closeSettings(panel);
    await scriptModel(mock, [call('docs__create_ticket', { subject: 'Refund for order 42' }), { text: 'Opened.' }]);
    await submitTask(panel, 'Open a ticket again');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const opened = await waitForSettledTurn(panel, { previousTurnId: refused.turnId });
    assert.equal(opened.state, 'completed', transcriptLines(opened).join('\n'));
    assert.match(resultsByTool(mock.requests().at(-1)).docs__create_ticket, /Opened ticket T-1: Refund for order 42/);
    assert.equal(mcp.calls().length, 1);
  },
  { auth: { challengeScope: 'tools', challengeMetadata: false, metadataAt: 'root', scopes: ['tools', 'admin'], scopedTools: { create_ticket: 'admin' }, issParameter: true } },
);

mcpTest(
  'never_retry_at_most_once_a_write_whose_answer_breaks_off_at_a_server_that_cannot_resume_is_reported_as_maybe_done',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    await scriptModel(mock, [call('docs__create_ticket', { subject: 'Refund' }), { text: 'I will check first.' }]);
    // The server numbers no events: the connection drops before the
    // answer, and nothing can be asked for again.
    mcp.cutNextCallStream({ afterEvents: 0 });
    await submitTask(panel, 'Open a ticket');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    const [result] = resultsOfCalls(mock.requests().at(-1), 'docs__create_ticket');
    assert.match(result, /The MCP server "docs" accepted the request, then its answer broke off \(.*\)\./);
    assert.match(result, /Whether the call did anything is unknown: check .* before calling it again; do not repeat it blindly\./);
    assert.doesNotMatch(result, /could not be reached/);
    assert.equal(mcp.calls().length, 1, 'sent once');
  },
);

mcpTest(
  'a_call_s_answer_stream_that_breaks_is_resumed_after_its_last_event_and_the_call_runs_once',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    // The connection drops after two events of the call's answer (the
    // socket destroyed); then the next call's answer ends cleanly after
    // three events, without the response.
    await scriptModel(mock, [
      call('docs__slow_report', { steps: 6 }),
      call('docs__slow_report', { steps: 5 }),
      { text: 'Both reports are done.' },
    ]);
    mcp.cutNextCallStream({ afterEvents: 2 });
    await submitTask(panel, 'Build two reports');
    await answerApprovalInPanel(panel, 'acceptOnce');
    await waitFor(() => mcp.log().some((e) => e.kind === 'resume'), { message: 'the first answer resumed' });
    mcp.cutNextCallStream({ afterEvents: 3, close: true });
    // The second's first resumption finds the server still holding the
    // cut connection (409): asked again after a while, from the same event.
    mcp.failNextResumptions(409, 1);
    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    const results = resultsOfCalls(mock.requests().at(-1), 'docs__slow_report');
    assert.deepEqual(results.map((r) => r.match(/The report has \d+ sections/)?.[0]), ['The report has 6 sections', 'The report has 5 sections']);

    // Each answer was asked for after the last event received, and the
    // server's rest came on that GET; neither call was sent again.
    const cuts = mcp.log().filter((e) => e.kind === 'cut');
    const resumes = mcp.log().filter((e) => e.kind === 'resume');
    assert.equal(cuts.length, 2);
    assert.equal(resumes.length, 2);
    // After the last event that arrived: a destroyed connection may lose
    // what was written last (then the server sends it again).
    resumes.forEach((r, i) => {
      const [stream, n] = r.lastEventId.split(':');
      assert.equal(stream, cuts[i].stream);
      assert.ok(Number(n) >= 1 && Number(n) <= cuts[i].written, `${r.lastEventId} of ${cuts[i].written} written`);
      assert.equal(r.status, 200);
    });
    assert.equal(resumes[1].lastEventId, `${cuts[1].stream}:3`, 'a clean end loses nothing');
    const conflict = mcp.log().filter((e) => e.kind === 'rejected' && e.forced);
    assert.equal(conflict.length, 1);
    assert.equal(conflict[0].status, 409);
    assert.equal(conflict[0].lastEventId, resumes[1].lastEventId, 'asked again from the same event');
    assert.ok(resumes.every((r) => r.headers['mcp-session-id'] && r.headers['mcp-protocol-version']), 'in the session');
    assert.ok(resumes.every((r) => r.delivered), 'each response came on its resumed stream');
    assert.equal(mcp.calls().length, 2, 'each call ran once');
    assert.equal(mcp.log().filter((e) => e.kind === 'request' && e.method === 'tools/call').length, 2, 'no call sent twice');
    assert.deepEqual(await consoleErrors(session), []);
  },
  { resumable: true },
);

mcpTest(
  'more_permission_granted_for_one_server_serves_every_server_at_its_address',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mock, mcp } = session;
    mcp.setAutoApprove(true);
    await serversIn(panel, { docs: 'sign_in_needed' });
    await addServerInPanel(panel, { name: 'mydocs', url: mcp.url });
    await panel.getByRole('button', { name: 'Sign in to the MCP server docs', exact: true }).click();
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'ready']]);
    assert.equal(mcp.authLog().filter((e) => e.kind === 'authorize').at(-1).params.scope, 'tools');

    // The user's server is refused a tool for want of a scope...
    await closeSettings(panel);
    await scriptModel(mock, [call('mydocs__create_ticket', { subject: 'Refund' }), { text: 'Needs more.' }]);
    await submitTask(panel, 'Open a ticket');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const refused = await waitForSettledTurn(panel);
    assert.match(resultsByTool(mock.requests().at(-1)).mydocs__create_ticket, /needs more permission than your sign-in gave \(tools admin\)/);
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'sign_in_needed']]);
    // ...its sign-in asks for what the refusal named, and the other
    // server at the address uses the new grant too.
    await panel.getByRole('button', { name: 'Sign in to the MCP server mydocs', exact: true }).click();
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mydocs', 'user', 'ready']]);
    assert.equal(mcp.authLog().filter((e) => e.kind === 'authorize').at(-1).params.scope, 'tools admin');
    await closeSettings(panel);
    await scriptModel(mock, [call('docs__create_ticket', { subject: 'Refund' }), { text: 'Opened.' }]);
    await submitTask(panel, 'Open it from the other one');
    await answerApprovalInPanel(panel, 'acceptOnce');
    const opened = await waitForSettledTurn(panel, { previousTurnId: refused.turnId });
    assert.match(resultsByTool(mock.requests().at(-1)).docs__create_ticket, /Opened ticket T-1: Refund/);
    assert.equal(mcp.clients().length, 1, 'one client for both');
    assert.equal(opened.state, 'completed');
  },
  { auth: { challengeScope: 'tools', scopes: ['tools', 'admin'], scopedTools: { create_ticket: 'admin' } } },
);

/** The server's entry in Settings once its text matches `pattern` (a sign-in's outcome, say). */
function serverShowing(panel, name, pattern) {
  return waitFor(async () => (await shownServers(panel)).find((s) => s.name === name && pattern.test(s.text)) ?? null, {
    message: `Settings to show ${name} as ${pattern}`,
  });
}

mcpTest(
  'a_sign_in_server_that_registers_no_clients_takes_this_extension_s_client_metadata_document_or_a_client_id_given_with_the_server',
  (url) => [{ name: 'docs', url, oauth: { clientMetadataUrl: `${new URL(url).origin}/client-metadata.json` } }],
  async (session) => {
    const { panel, mcp, extensionId } = session;
    const redirect = `https://${extensionId}.chromiumapp.org/mcp-sign-in`;
    const documentUrl = mcp.auth.clientMetadataUrl;
    const authorizations = () => mcp.authLog().filter((e) => e.kind === 'authorize');
    mcp.setAutoApprove(true);
    await serversIn(panel, { docs: 'sign_in_needed' });
    const signIn = (name) => panel.getByRole('button', { name: `Sign in to the MCP server ${name}`, exact: true }).click();

    // The extension's document names another redirect: the sign-in server
    // refuses it, the window shows no sign-in page, and the user is told
    // whose client it was.
    mcp.setClientMetadata({ client_id: documentUrl, client_name: 'SW Agent', redirect_uris: ['https://elsewhere.example/cb'], token_endpoint_auth_method: 'none' });
    await signIn('docs');
    const refused = await serverShowing(panel, 'docs', /may not have accepted this extension's client metadata document/);
    assert.match(refused.text, /Signing in to the MCP server "docs" failed: the sign-in did not complete \(Authorization page could not be loaded/);
    assert.equal(refused.state, 'sign_in_needed');
    const fetched = mcp.authLog().filter((e) => e.kind === 'client-metadata');
    assert.equal(fetched.length, 1);
    assert.equal(fetched[0].ok, false);
    assert.match(fetched[0].reason, /redirect_uris do not include/);

    // The document fixed: its address is the client id, nothing registered.
    mcp.setClientMetadata({ client_id: documentUrl, client_name: 'SW Agent', redirect_uris: [redirect], token_endpoint_auth_method: 'none' });
    await signIn('docs');
    await serversIn(panel, { docs: 'ready' });
    assert.equal(authorizations().at(-1).params.client_id, documentUrl);
    assert.equal(mcp.authLog().filter((e) => e.kind === 'register').length, 0, 'no registration asked for');
    assert.deepEqual(mcp.tokens().map((t) => t.clientId), [documentUrl]);
    assert.equal((await grantIn(panel, mcp.url)).clientId, documentUrl);
    // Renewed as that client.
    mcp.expireAccessTokens();
    await panel.getByRole('button', { name: 'Ask the MCP server docs for its tools again', exact: true }).click();
    await waitFor(() => renewalsOf(mcp).length === 1, { message: 'the renewal' });
    await serversIn(panel, { docs: 'ready' });
    assert.equal(renewalsOf(mcp)[0].clientId, documentUrl);
    assert.equal(mcp.clientMetadataFetches(), 2, 'the token endpoint needs no fetch');
    await panel.getByRole('button', { name: 'Sign out of the MCP server docs', exact: true }).click();
    await serversIn(panel, { docs: 'sign_in_needed' });

    // A server the user adds at that address with nothing given: this
    // extension has no client id there, and the failure says what to give.
    await addServerInPanel(panel, { name: 'plain', url: mcp.url });
    await serversListedAs(panel, [['docs', 'extension', 'sign_in_needed'], ['plain', 'user', 'sign_in_needed']]);
    const before = authorizations().length;
    await signIn('plain');
    const none = await serverShowing(panel, 'plain', /has no client id for it/);
    assert.ok(none.text.includes(`registers no new clients, so this extension has no client id for it (a client registered there for the redirect ${redirect} can be given with the server: Settings' Sign-in client id for a server you added, oauth.clientId in the extension's MCP_SERVERS)`), none.text);
    assert.equal(authorizations().length, before, 'no window opened');
    await panel.getByRole('button', { name: 'Remove the MCP server plain', exact: true }).click();
    await serversListedAs(panel, [['docs', 'extension', 'sign_in_needed']]);

    // The form checks a client id: none beside an Authorization header.
    const form = addForm(panel);
    await form.name.fill('mine');
    await form.url.fill(mcp.url);
    await form.headerValue.fill('Bearer t');
    await form.clientId.fill('sw-agent-ext');
    await form.add.click();
    const conflict = await waitFor(async () => ((await readAddForm(panel)).invalid.length ? readAddForm(panel) : null), { message: 'the form to refuse' });
    assert.deepEqual(conflict.invalid, ['clientId']);
    assert.match(conflict.errors.clientId, /sent its own Authorization header, so it does not sign in/);
    await form.headerValue.fill('');
    await form.clientId.fill('caf\u00e9');
    await form.add.click();
    await waitFor(async () => /up to 255 Latin letters/.test((await readAddForm(panel)).errors.clientId), { message: 'the client id refused' });

    // Given a client id registered there by hand: that one is used (before
    // the document), and one sign-in serves both servers at the address.
    mcp.addClient({ client_id: 'sw-agent-ext', redirect_uris: [redirect] });
    await form.clientId.fill('sw-agent-ext');
    await form.add.click();
    await serversListedAs(panel, [['docs', 'extension', 'sign_in_needed'], ['mine', 'user', 'sign_in_needed']]);
    assert.deepEqual((await storedUserServers(panel)).map((e) => e.oauth ?? null), [{ clientId: 'sw-agent-ext' }]);
    await signIn('mine');
    await serversListedAs(panel, [['docs', 'extension', 'ready'], ['mine', 'user', 'ready']]);
    assert.equal(authorizations().at(-1).params.client_id, 'sw-agent-ext');
    assert.equal(mcp.tokens().at(-1).clientId, 'sw-agent-ext');
    assert.equal(mcp.clientMetadataFetches(), 2, 'the document was not asked for');
    // The worker's console names each failed sign-in, nothing else.
    const errors = await consoleErrors(session);
    assert.ok(errors.some((e) => e.includes('this extension\'s client metadata document (') && !e.includes('.;')), errors.join('\n'));
    assert.deepEqual(errors.filter((e) => !/needs you to sign in|^\[sw-agent\] Signing in to the MCP server "(docs|plain)" failed/.test(e)), []);
  },
  { auth: { registration: false, clientMetadataDocuments: true } },
);

mcpTest(
  'an_event_stream_that_ends_is_resumed_after_its_last_event_and_one_the_server_cannot_resume_is_replaced_and_the_tools_listed_again',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    const [stream] = await openStreams(mcp, 1);
    const listings = () => mcp.log().filter((e) => e.method === 'tools/list' && !e.params?.cursor).length;
    const resumptions = () => mcp.log().filter((e) => e.kind === 'resume');
    const tools = demoTools({ tickets: [], bookings: [] });
    assert.equal(listings(), 1);

    // Announced live: listed again; the stream's last event is get-1:1.
    assert.equal(mcp.setTools(tools.slice(0, 7)), 1);
    await keptCatalog(panel, 'docs', 7);
    assert.equal(listings(), 2);

    // The stream breaks (a network error); the server announces a change
    // meanwhile, kept for the stream. The worker resumes after get-1:1 in
    // the session, gets the announcement and lists once.
    assert.equal(mcp.breakStreams(), 1);
    assert.equal(mcp.setTools(tools.slice(0, 6)), 0, 'no stream open');
    assert.equal(mcp.sent().at(-1).kept, true);
    const [first] = await waitFor(() => (resumptions().length === 1 ? resumptions() : null), { message: 'the stream to be resumed' });
    assert.equal(first.lastEventId, `get-${stream.stream}:1`);
    assert.equal(first.status, 200);
    assert.equal(first.replayed, 1);
    assert.equal(first.session, stream.session);
    assert.equal(first.headers.accept, 'text/event-stream');
    await keptCatalog(panel, 'docs', 6);
    assert.equal(listings(), 3, 'listed once, for the replayed announcement');

    // Ended cleanly by the server: resumed the same way, after get-1:2.
    assert.equal(mcp.closeStreams(), 1);
    mcp.setTools(tools.slice(0, 5));
    const second = await waitFor(() => resumptions()[1] ?? null, { timeout: 60000, message: 'the stream to be resumed again' });
    assert.equal(second.lastEventId, `get-${stream.stream}:2`);
    assert.equal(second.replayed, 1);
    await keptCatalog(panel, 'docs', 5);
    assert.equal(listings(), 4);

    // The server lost its event store, and changed its tools without an
    // announcement: the resumption is refused (400), a new stream is
    // opened at once in the same session, and the tools are listed again
    // since something may have been missed.
    mcp.setTools(tools, { notify: false });
    assert.equal(mcp.forgetKeptGetStreams(), 1);
    const refused = await waitFor(() => resumptions()[2] ?? null, { timeout: 60000, message: 'a resumption the server cannot answer' });
    assert.equal(refused.status, 400);
    assert.equal(refused.lastEventId, `get-${stream.stream}:3`, 'after the last event replayed');
    await waitFor(() => mcp.streams().length === 2 && mcp.streamCount() === 1, { message: 'a new stream' });
    assert.equal(mcp.streams()[1].session, stream.session);
    assert.equal(mcp.streams()[1].headers['last-event-id'], undefined, 'a plain GET');
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    assert.equal(listings(), 5, 'listed again for what it may have missed');

    // The new stream is followed too.
    assert.equal(mcp.setTools(tools.slice(0, 7)), 1);
    await keptCatalog(panel, 'docs', 7);
    assert.equal(listings(), 6);
    assert.equal(resumptions().length, 3);
    assert.deepEqual(await consoleErrors(session), []);
  },
  { resumable: true },
);

mcpTest(
  'an_event_stream_the_server_closes_after_each_priming_event_is_polled_as_its_retry_says_and_failed_resumptions_are_asked_again_or_replaced',
  (url) => [{ name: 'docs', url }],
  async (session) => {
    const { panel, mcp } = session;
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    const listings = () => mcp.log().filter((e) => e.method === 'tools/list' && !e.params?.cursor).length;
    const resumed = () => mcp.log().filter((e) => e.kind === 'resume' && e.status === 200);
    const tools = demoTools({ tickets: [], bookings: [] });
    assert.equal(listings(), 1);

    // The server closes every stream 0.3 s after its priming event and asks
    // for 3 s between connections: the worker resumes each time, never
    // giving up (eight short streams in a row once ended the following),
    // and waits at least what retry: asks (so at most one resumption per
    // 3 s, however the machine is loaded).
    const started = Date.now();
    const already = resumed().length;
    const polls = await waitFor(() => (resumed().length >= 9 ? resumed() : null), { timeout: 120000, message: 'nine resumptions' });
    const elapsed = Date.now() - started;
    assert.ok(polls.length - already <= elapsed / 3000 + 1, `${polls.length - already} resumptions in ${elapsed} ms`);
    assert.ok(mcp.log().filter((e) => e.kind === 'prime').every((e) => e.stream === 1), 'one stream, resumed');
    assert.ok(polls.every((e, i) => i === 0 || e.lastEventId !== polls[i - 1].lastEventId), 'each after the latest priming');
    assert.equal(mcp.streams().length, 1, 'no new stream');
    assert.equal(listings(), 1, 'a resumption lists nothing');

    // Announced while the stream is closed: kept, replayed at the next
    // resumption, listed once.
    mcp.setTools(tools.slice(0, 7));
    await keptCatalog(panel, 'docs', 7);
    assert.equal(listings(), 2);

    // 409 (the server still holds the broken connection): asked again
    // from the same event, not replaced.
    const forced = () => mcp.log().filter((e) => e.kind === 'rejected' && e.forced);
    const before = resumed().length;
    mcp.failNextResumptions(409, 1);
    await waitFor(() => (resumed().length > before + 1 ? true : null), { timeout: 60000, message: 'resumptions after a 409' });
    assert.equal(forced().length, 1);
    assert.equal(resumed()[before].lastEventId, forced()[0].lastEventId, 'the same event asked for again');
    assert.equal(mcp.streams().length, 1, 'not replaced');
    assert.equal(listings(), 2);

    // Two failed resumptions in a row (the server's event store fails): a
    // new stream in the same session, and the tools listed again.
    mcp.setTools(tools, { notify: false });
    mcp.failNextResumptions(500, 2);
    await waitFor(() => (mcp.streams().length === 2 ? true : null), { timeout: 60000, message: 'a new stream' });
    assert.equal(forced().length, 3);
    assert.equal(forced()[1].lastEventId, forced()[2].lastEventId);
    assert.equal(mcp.streams()[1].headers['last-event-id'], undefined);
    await keptCatalog(panel, 'docs', DEMO_TOOLS.length);
    assert.equal(listings(), 3);
    assert.deepEqual(await consoleErrors(session), []);
  },
  { resumable: true, getStreamPolling: { closeAfterMs: 300, retryMs: 3000 } },
);

sharedIsolatedTest(
  test,
  'a_server_that_redirects_gets_no_request_with_its_headers_sent_on_and_one_without_headers_is_followed',
  {
    launch: async (session) => {
      session.mcp = await startMockMcp();
      session.closers.push(() => session.mcp.close());
      // In front of the mock: every request is redirected to it (307 keeps
      // the method, the body, and a browser keeps custom headers too).
      session.redirected = [];
      const redirector = http.createServer((req, res) => {
        session.redirected.push({ method: req.method, path: req.url, key: req.headers['x-team-key'] ?? null });
        res.writeHead(307, { Location: session.mcp.url, 'Access-Control-Allow-Origin': '*' });
        res.end();
      });
      await new Promise((resolve) => redirector.listen(0, '127.0.0.1', resolve));
      session.closers.push(() => new Promise((resolve) => redirector.close(resolve)));
      const origin = `http://127.0.0.1:${redirector.address().port}`;
      return {
        extensionPath: extensionWithServers([
          { name: 'docs', url: `${origin}/keyed/mcp`, headers: { 'X-Team-Key': 'team-secret-4711' } },
          { name: 'open', url: `${origin}/open/mcp` },
        ]),
      };
    },
  },
  async (session) => {
    const { panel, mcp } = session;
    // Both settled: `open` connected, `docs` connected too or not reachable.
    const [docs, open] = await waitFor(async () => {
      const shown = await shownServers(panel);
      return shown?.length === 2 && shown[1].state === 'ready' && ['ready', 'unreachable'].includes(shown[0].state) ? shown : null;
    }, { message: 'Settings to list both servers as settled' });
    assert.equal(docs.state, 'unreachable', 'docs was not followed');
    assert.match(docs.text, /^docs — Not reachable: The MCP server "docs" could not be reached \(http:\/\/127\.0\.0\.1:\d+\/keyed\/mcp answered with a redirect to another address, which was not followed: its headers and sign-in go only to the address configured for it\)\./);
    assert.match(open.text, /^open — Connected/);
    assert.ok(session.redirected.some((r) => r.path === '/keyed/mcp' && r.key === 'team-secret-4711'), 'precondition: docs asked at its own address, with its header');
    const keyed = mcp.log().filter((e) => e.headers?.['x-team-key'] !== undefined);
    assert.deepEqual(keyed, [], 'the header never reached the address redirected to');
    assert.ok(mcp.log().some((e) => e.method === 'initialize'), 'the server without headers was followed there');
  },
  { timeout: TEST_TIMEOUT },
);
