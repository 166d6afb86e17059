// End-to-end tests of the embedding extension's own tools
// (extension/host-tools.js → Engine.start({ tools }), src/platform/host_tools.rs):
// a copy of the built extension whose host-tools.js defines tools the way an
// extension developer would, in headless Chromium with the mock LLM scripted
// to call them. The tests check what the model received (the mock's recorded
// requests), what the side panel showed and asked, and what the tools did
// (they write into chrome.storage.local, which the test reads back).
//
// Run:  node tests/e2e/host-tools.mjs       (after `make build`)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  copyOfBuild,
  waitForToolProgress,
  answerApprovalInPanel,
  exitUnlessExtensionBuilt,
  readApprovalCard,
  readPanel,
  submitTask,
  transcriptLines,
  dumpIndexedDb,
  waitFor,
  waitForApprovalCard,
  waitForExtensionServiceWorker,
} from '../support/browser.mjs';
import {
  isolatedTest as sharedIsolatedTest,
  orphanToolCallProblems,
  toolCards,
  waitForSettledTurn,
  resultsByTool,
  scriptModel,
} from '../support/session.mjs';

exitUnlessExtensionBuilt('e2e');

const TEST_TIMEOUT = 300000;

// The definitions as an extension developer writes them. Every call is
// recorded in chrome.storage.local (`hostCalls`), so the test can count what
// really ran; console errors of the worker are kept in `__consoleErrors`.
const HOST_TOOLS_JS = `
const errors = (globalThis.__consoleErrors = []);
const consoleError = console.error.bind(console);
console.error = (...args) => {
  errors.push(args.map(String).join(' '));
  consoleError(...args);
};

async function record(name, params) {
  const { hostCalls = [] } = await chrome.storage.local.get('hostCalls');
  hostCalls.push({ name, params });
  await chrome.storage.local.set({ hostCalls });
}

export const HOST_TOOLS = [
  {
    name: 'notes_read',
    label: 'Read the notes',
    description: 'The notes kept about the current customer.',
    effects: 'read',
    execute: async (params, { callId, signal }) => {
      await record('notes_read', params);
      if (!(signal instanceof AbortSignal) || typeof callId !== 'string' || !callId) throw new Error('no call context');
      const { notes = [] } = await chrome.storage.local.get('notes');
      return { content: 'Notes: ' + (notes.length ? notes.join('; ') : '(none)'), details: { count: notes.length } };
    },
  },
  {
    name: 'notes_add',
    label: 'Add a note',
    description: 'Add a note about the current customer.',
    parameters: {
      type: 'object',
      properties: { text: { type: 'string' } },
      required: ['text'],
      additionalProperties: false,
    },
    effects: 'write',
    execute: async ({ text }, { progress }) => {
      progress('saving the note');
      await record('notes_add', { text });
      const { notes = [] } = await chrome.storage.local.get('notes');
      notes.push(text);
      await chrome.storage.local.set({ notes });
      return 'Added the note ' + JSON.stringify(text) + '.';
    },
  },
  {
    name: 'notes_sync',
    description: 'Send the notes to the CRM.',
    effects: 'read',
    execute: () => {
      throw new Error('The CRM is not reachable.');
    },
  },
  {
    name: 'notes_wait',
    label: 'Wait for the CRM',
    description: 'Wait until the CRM answers.',
    effects: 'read',
    execute: (params, { signal, progress }) =>
      new Promise((resolve, reject) => {
        progress('waiting for the CRM');
        record('notes_wait', params);
        signal.addEventListener('abort', () => {
          chrome.storage.local.set({ waitAborted: true });
          reject(new Error('stopped'));
        });
      }),
  },
  {
    name: 'notes_slow',
    label: 'Ask the slow CRM',
    description: 'Ask the CRM, which may take long.',
    effects: 'read',
    timeoutMs: 1000,
    execute: (params, { signal }) =>
      new Promise((resolve, reject) => {
        record('notes_slow', params);
        signal.addEventListener('abort', () => {
          chrome.storage.local.set({ slowAborted: true });
          reject(new Error('stopped'));
        });
      }),
  },
  // Two reads that may run together: each waits (up to 3 s) for the other
  // to have started, so run one after the other each would say "alone".
  ...['orders', 'tickets'].map((what) => ({
    name: 'crm_' + what,
    description: "List the customer's " + what + ".",
    effects: 'read',
    parallelSafe: true,
    execute: async () => {
      globalThis.__crmStarted = (globalThis.__crmStarted ?? 0) + 1;
      const until = Date.now() + 3000;
      while (globalThis.__crmStarted < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      return what + ': ' + (globalThis.__crmStarted >= 2 ? 'together' : 'alone');
    },
  })),
  // Details far over the engine's 64 KiB: kept as a note saying so.
  {
    name: 'notes_dump',
    description: 'Dump every note with its history.',
    effects: 'read',
    execute: () => ({ content: 'Dumped.', details: { history: 'x'.repeat(70000) } }),
  },
  // Wrong definitions: left out, named in the console; the others work.
  { name: 'notes_delete', description: 'Delete every note.', execute: () => 'deleted' },
  { name: 'click', description: 'Shadows a built-in tool.', effects: 'read', execute: () => 'no' },
  { name: 'notes_export', description: 'Export.', effects: 'read', execute: 'not a function' },
  { name: 'notes_forever', description: 'Never ends.', effects: 'read', timeoutMs: 3600000, execute: () => 'no' },
];
`;

/** A copy of the built extension with HOST_TOOLS_JS as its host-tools.js. */
function extensionWithHostTools() {
  return copyOfBuild({ 'host-tools.js': HOST_TOOLS_JS });
}

function isolatedTest(name, options, body) {
  sharedIsolatedTest(test, name, options, body, { timeout: TEST_TIMEOUT });
}

const call = (name, args = {}) => ({ toolCalls: [{ name, arguments: args }] });

/** The details blocks the panel shows under extension tools' results. */
function shownToolDetails(panel) {
  return panel.evaluate(() => [...document.querySelectorAll('.tool-details-data')].map((box) => ({
    summary: box.querySelector('summary')?.textContent,
    text: box.querySelector('pre')?.textContent,
    open: box.open,
  })));
}

/** Scripts the model, sends `task` and waits for the turn to complete. */
async function completedTurn({ panel, mock }, script, task) {
  await scriptModel(mock, script);
  await submitTask(panel, task);
  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
  return final;
}

const extensionDir = extensionWithHostTools();

isolatedTest(
  'host_tools_are_offered_run_without_a_page_and_their_writes_ask_once_without_a_site',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { panel, mock, context } = session;
    await scriptModel(mock, [
      call('notes_read'),
      call('notes_sync'),
      { text: 'Adding it.', ...call('notes_add', { text: 'Prefers e-mail' }) },
      { text: 'Done: the note is saved.' },
    ]);
    await submitTask(panel, 'Note that the customer prefers e-mail');

    // The write asks: no site to name, no "Allow on this site".
    const card = await waitForApprovalCard(panel);
    assert.equal(card.toolName, 'notes_add');
    assert.equal(card.label, 'Add a note');
    assert.deepEqual(card.params, { text: 'Prefers e-mail' });
    const heading = await panel.evaluate(() => document.getElementById('approval-heading').innerText.replace(/\s+/g, ' ').trim());
    assert.equal(heading, 'Allow “Add a note”?');
    const shown = await panel.evaluate(() =>
      [...document.querySelectorAll('#approval-card button, #approval-card dt')].filter((e) => !e.hidden && e.getClientRects().length > 0).map((e) => e.textContent.trim()),
    );
    assert.deepEqual(shown, ['Action', 'Allow once', 'Decline'], 'only the action, "Allow once" and "Decline"');
    const callsBefore = await panel.evaluate(async () => (await chrome.storage.local.get('hostCalls')).hostCalls ?? []);
    assert.deepEqual(callsBefore.map((c) => c.name), ['notes_read'], 'the read ran; the write waits for the user');

    await answerApprovalInPanel(panel, 'acceptOnce');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));

    // What the tools did: each ran once.
    const stored = await panel.evaluate(async () => chrome.storage.local.get(['hostCalls', 'notes']));
    assert.deepEqual(stored.notes, ['Prefers e-mail']);
    assert.deepEqual(stored.hostCalls.map((c) => c.name), ['notes_read', 'notes_add']);

    // What the model was offered and received.
    const requests = mock.requests();
    const offered = (requests[0].body.tools ?? []).map((t) => t.function?.name);
    for (const name of ['notes_read', 'notes_add', 'notes_sync', 'page_snapshot', 'click']) assert.ok(offered.includes(name), `${name} offered: ${offered}`);
    for (const name of ['notes_delete', 'notes_export', 'notes_forever']) assert.ok(!offered.includes(name), `the wrong definition ${name} is left out`);
    assert.equal(offered.filter((n) => n === 'click').length, 1, 'the built-in click, once');
    const addSchema = requests[0].body.tools.find((t) => t.function?.name === 'notes_add').function.parameters;
    assert.deepEqual(addSchema.required, ['text']);
    const results = resultsByTool(requests.at(-1));
    assert.equal(results.notes_read, 'Notes: (none)');
    assert.match(results.notes_sync, /notes_sync failed: The CRM is not reachable\./);
    assert.equal(results.notes_add, 'Added the note "Prefers e-mail".');
    assert.deepEqual(orphanToolCallProblems(requests), []);

    // The side panel shows them like any tool: label, status, result.
    const cards = toolCards(await readPanel(panel));
    const byName = Object.fromEntries(cards.map((c) => [c.toolName, c]));
    assert.equal(byName.notes_read.results[0]?.status, 'ok', JSON.stringify(byName.notes_read));
    assert.equal(byName.notes_sync.results[0]?.status, 'error', JSON.stringify(byName.notes_sync));
    assert.equal(byName.notes_add.results[0]?.status, 'ok', JSON.stringify(byName.notes_add));
    // Its details (never sent to the model) show as data under its result;
    // a built-in tool's do not.
    const shownDetails = await shownToolDetails(panel);
    assert.equal(shownDetails.length, 1, JSON.stringify(shownDetails));
    assert.equal(shownDetails[0].summary, 'Details');
    assert.deepEqual(JSON.parse(shownDetails[0].text), { count: 0 });
    assert.equal(shownDetails[0].open, false, 'closed until opened');
    assert.ok(!JSON.stringify(requests.map((r) => r.body.messages)).includes('"count"'), 'the details never reach the model');

    // The worker's console named each wrong definition and what to fix.
    const worker = await waitForExtensionServiceWorker(context, { extensionId: session.extensionId });
    const errors = await worker.evaluate(() => globalThis.__consoleErrors);
    const leftOut = errors.filter((e) => e.includes('left out'));
    assert.equal(leftOut.length, 4, errors.join('\n'));
    assert.match(leftOut[0], /"notes_delete".*`effects` must be "read" or "write"/);
    assert.match(leftOut[1], /"click" is already registered/);
    assert.match(leftOut[2], /"notes_export".*`execute` must be a function/);
    assert.match(leftOut[3], /"notes_forever".*`timeoutMs` must be a whole number of milliseconds from 1 to 300000/);
  },
);

isolatedTest(
  'a_host_tool_s_details_over_the_limit_show_as_a_note_and_the_result_stays',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { panel, mock } = session;
    await completedTurn(session, [call('notes_dump'), { text: 'Dumped them.' }], 'Dump the notes');
    assert.equal(resultsByTool(mock.requests().at(-1)).notes_dump, 'Dumped.');
    const shown = await shownToolDetails(panel);
    assert.equal(shown.length, 1, JSON.stringify(shown));
    assert.equal(shown[0].summary, 'Details not kept');
    assert.match(shown[0].text, /^The tool's details took 70014 bytes, more than the 65536 kept; they were left out\.$/);
    const stored = JSON.stringify(await dumpIndexedDb(panel));
    assert.ok(stored.includes('they were left out'), 'the store keeps the note');
    assert.ok(!stored.includes('x'.repeat(1000)), 'and not the 70 KB');
  },
);

isolatedTest(
  'a_declined_host_write_does_not_run_and_the_model_is_told',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { panel, mock } = session;
    await scriptModel(mock, [call('notes_add', { text: 'Not wanted' }), { text: 'Understood, no note.' }]);
    await submitTask(panel, 'Add a note');
    await answerApprovalInPanel(panel, 'decline');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', transcriptLines(final).join('\n'));
    const stored = await panel.evaluate(async () => chrome.storage.local.get(['hostCalls', 'notes']));
    assert.equal(stored.notes, undefined, 'nothing was written');
    assert.equal(stored.hostCalls, undefined, 'the tool never ran');
    const results = resultsByTool(mock.requests().at(-1));
    // (A result that is not ok reaches the model marked as an error.)
    assert.equal(results.notes_add, 'Error: The user declined this action (Add a note). Do not retry it; ask the user or choose another way.');
    const card = await readApprovalCard(panel);
    assert.equal(card.visible, false);
  },
);

isolatedTest(
  'a_host_tool_reports_progress_and_stop_aborts_its_signal',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { panel, mock } = session;
    await scriptModel(mock, [call('notes_wait'), { text: 'Not reached.' }]);
    await submitTask(panel, 'Wait for the CRM');
    const progress = await waitForToolProgress(panel, { message: 'the host tool\'s progress' });
    assert.equal(progress.delta.text, 'waiting for the CRM');
    await panel.click('#stop-button');
    const final = await waitForSettledTurn(panel, { states: ['interrupted'] });
    assert.equal(final.state, 'interrupted');
    const aborted = await waitFor(
      async () => (await panel.evaluate(async () => chrome.storage.local.get('waitAborted'))).waitAborted === true,
      { timeout: 10000, interval: 100, message: 'the tool\'s signal to abort' },
    );
    assert.ok(aborted);
    assert.equal(mock.requests().length, 1, 'no request after the stop');
  },
);

isolatedTest(
  'a_host_tool_past_its_own_time_limit_is_aborted_and_the_model_is_told',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { panel, mock } = session;
    await completedTurn(session, [call('notes_slow'), { text: 'The CRM is slow today.' }], 'Ask the CRM');
    const stored = await panel.evaluate(async () => chrome.storage.local.get(['hostCalls', 'slowAborted']));
    assert.deepEqual(stored.hostCalls.map((c) => c.name), ['notes_slow'], 'it ran once');
    assert.equal(stored.slowAborted, true, 'its signal was aborted at the limit');
    const results = resultsByTool(mock.requests().at(-1));
    assert.equal(results.notes_slow, 'Error: The tool did not finish within 1 second.');
    const cards = toolCards(await readPanel(panel));
    assert.equal(cards.find((c) => c.toolName === 'notes_slow')?.results[0]?.status, 'error');
  },
);

isolatedTest(
  'parallel_safe_host_reads_run_together_in_the_worker',
  { launch: { extensionPath: extensionDir } },
  async (session) => {
    const { mock } = session;
    await completedTurn(session, [
      { toolCalls: [{ name: 'crm_orders', arguments: {} }, { name: 'crm_tickets', arguments: {} }] },
      { text: 'Both listed.' },
    ], 'What does the customer have open?');
    const results = resultsByTool(mock.requests().at(-1));
    assert.equal(results.crm_orders, 'orders: together');
    assert.equal(results.crm_tickets, 'tickets: together');
  },
);

// A worker that keeps three built-in tools (one misspelt) next to its own.
const KEEP_SOME_JS = `
const errors = (globalThis.__consoleErrors = []);
const consoleError = console.error.bind(console);
console.error = (...args) => {
  errors.push(args.map(String).join(' '));
  consoleError(...args);
};
export const BUILT_IN_TOOLS = ['read_page', 'ask_user', 'clik'];
export const MAX_PARALLEL_READS = 0;
export const HOST_TOOLS = [
  { name: 'click', label: 'Click in the CRM', description: 'Click a button of the CRM.', effects: 'read', execute: () => 'clicked in the CRM' },
];
`;

isolatedTest(
  'an_extension_keeps_only_the_built_in_tools_it_names',
  {
    launch: () => ({ extensionPath: copyOfBuild({ 'host-tools.js': KEEP_SOME_JS }) }),
  },
  async (session) => {
    const { mock, context, shop } = session;
    await completedTurn(session, [call('click'), { text: 'Clicked.' }], 'Click it');
    const requests = mock.requests();
    const offered = (requests[0].body.tools ?? []).map((t) => t.function?.name).sort();
    assert.deepEqual(offered, ['ask_user', 'click', 'read_page'], 'the kept built-ins and the extension\'s own click');
    assert.equal(resultsByTool(requests.at(-1)).click, 'clicked in the CRM', 'the extension\'s click ran, not a page click');
    assert.equal(Number(await shop.evaluate(() => document.body.dataset.subscribeClicks ?? 0)), 0, 'nothing was clicked on the page');
    const worker = await waitForExtensionServiceWorker(context, { extensionId: session.extensionId });
    const errors = await worker.evaluate(() => globalThis.__consoleErrors);
    const named = errors.filter((e) => e.includes('BUILT_IN_TOOLS'));
    assert.equal(named.length, 1, errors.join('\n'));
    assert.match(named[0], /names no built-in tool: "clik" \(known: page_snapshot, read_page, click/);
    // A pool size out of bounds is named too; the default stays.
    const pool = errors.filter((e) => e.includes('MAX_PARALLEL_READS'));
    assert.deepEqual(pool.map((e) => e.replace(/^.*extension\/host-tools\.js: /, '')), ['MAX_PARALLEL_READS must be a whole number from 1 to 16, not 0; 4 is kept']);
  },
);
