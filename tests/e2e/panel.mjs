// End-to-end tests of the side panel's own flows: the built extension
// (dist/extension) in headless Chromium, driven from its side panel page
// (opened as a tab) against the mock LLM and the local test pages, like
// tests/e2e/run.mjs. Covered here: questions from the model (`ask_user`)
// answered in the interaction card, also across a service-worker kill; a
// repeated and a conflicting approval.response sent on a Port of the panel
// page; the keyboard shortcuts (Enter steers, Shift+Alt+Enter queues, Esc
// interrupts, Continue); provider errors in plain words; a settings round trip.
//
// Every run saves screenshots of the main states to target/e2e/screens/
// (streaming, approval card, interaction card, interrupted banner, settings,
// error banner) for review; they are checked into nothing.
//
// Run:  node tests/e2e/panel.mjs            (after `make build`)
//       node --test-name-pattern=ask_user tests/e2e/panel.mjs   (some tests)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import {
  DEFAULT_EXTENSION_PATH,
  REPO_ROOT,
  assertExtensionBuilt,
  readPanel,
  submitTask,
  killServiceWorker,
  watchConnection,
  connectionLog,
  portLog,
  dumpIndexedDb,
  transcriptLines,
  waitFor,
  waitForRunState,
  readApprovalCard,
  waitForApprovalCard,
  approvalHistory,
  openPanel,
} from '../support/browser.mjs';
import {
  TEST_API_KEY,
  startSession,
  subscribeClicks,
  waitForSettledTurn,
  topLevelNodes,
  toolCards,
  orphanToolCallProblems,
  saveArtifacts,
  isolatedTest as sharedIsolatedTest,
} from '../support/session.mjs';

try {
  assertExtensionBuilt(DEFAULT_EXTENSION_PATH);
} catch (error) {
  process.stderr.write(`e2e: ${error.message}\n`);
  process.exit(1);
}

const TASK = 'Subscribe to the newsletter';
const TEST_TIMEOUT = 300000;
/** A stall far longer than any test: only an interrupt or a SW kill ends it. */
const STALL_FOREVER_MS = 600000;
const SCREENS_DIR = path.join(REPO_ROOT, 'target', 'e2e', 'screens');

/** A test with its own fresh session (see tests/support/session.mjs). */
function isolatedTest(name, options, body) {
  sharedIsolatedTest(test, name, options, body, { timeout: TEST_TIMEOUT });
}

/** Saves a screenshot of the panel as target/e2e/screens/<name>.png (on every run, for review). */
async function screenshot(panel, name) {
  mkdirSync(SCREENS_DIR, { recursive: true });
  const file = path.join(SCREENS_DIR, `${name}.png`);
  await panel.screenshot({ path: file });
  return file;
}

function describeState(panelState) {
  return `state=${panelState.state}\n${transcriptLines(panelState).join('\n')}`;
}

function assertNoOrphans(session) {
  assert.deepEqual(orphanToolCallProblems(session.mock.requests()), [], 'no_orphan_tool_calls on every provider request');
}

/** Text of a message's content (a string or an array of parts). */
function messageText(message) {
  const content = message?.content;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === 'string' ? part : part?.text ?? '')).join('');
  return '';
}

function requestMessages(request) {
  return Array.isArray(request.body?.messages) ? request.body.messages : [];
}

/** Every tool call of `name` in the conversation of `request`, each with all the tool messages answering it. */
function toolExchanges(request, name) {
  const messages = requestMessages(request);
  const out = [];
  for (const message of messages) {
    if (message.role !== 'assistant' || !Array.isArray(message.tool_calls)) continue;
    for (const call of message.tool_calls) {
      if (call.function?.name !== name) continue;
      out.push({ call, results: messages.filter((m) => m.role === 'tool' && m.tool_call_id === call.id) });
    }
  }
  return out;
}

/** Parsed Port-recorder entries of one direction (`out`: panel → engine, `in`: engine → panel). */
async function portMessages(panel, dir) {
  const log = (await portLog(panel)) ?? [];
  return log
    .filter((entry) => entry.dir === dir && entry.json)
    .map((entry) => ({ ...entry, message: JSON.parse(entry.json) }));
}

/** The durable records of one object store of the extension's IndexedDB. */
async function stored(panel, storeName) {
  const dump = await dumpIndexedDb(panel);
  return Object.values(dump).flatMap((stores) => (stores[storeName] ?? []).map((entry) => entry.value));
}

/** Assistant message elements that are visible but have nothing to read (the "empty bubble"). */
async function emptyAssistantBubbles(panel) {
  return panel.evaluate(() => [...document.querySelectorAll('#messages .node.assistant')]
    .filter((element) => element.getClientRects().length > 0 && element.innerText.trim() === '')
    .map((element) => element.dataset.nodeId ?? ''));
}

// ------------------------------------------------------ interaction card ---

/** The side panel's interaction card (`#interaction-card`), read from the DOM. */
async function readInteractionCard(panel) {
  return panel.evaluate(() => {
    const card = document.getElementById('interaction-card');
    if (!card) return null;
    const input = document.getElementById('interaction-answer');
    const submit = document.getElementById('interaction-submit');
    const options = [...card.querySelectorAll('.interaction-option')];
    return {
      visible: !card.hidden && card.getClientRects().length > 0,
      interactionId: card.dataset.interactionId ?? null,
      callId: card.dataset.callId ?? null,
      epoch: card.dataset.epoch ?? null,
      busy: card.getAttribute('aria-busy') === 'true',
      focused: card.contains(document.activeElement),
      heading: (document.getElementById('interaction-heading')?.textContent ?? '').trim(),
      question: (document.getElementById('interaction-question')?.textContent ?? '').trim(),
      // Element children of the question: it must be text only.
      questionElements: document.getElementById('interaction-question')?.children.length ?? -1,
      options: options.map((button) => ({ text: button.textContent, disabled: button.disabled })),
      optionsVisible: options.length > 0 && options.every((button) => button.getClientRects().length > 0),
      inputDisabled: input ? input.disabled : null,
      inputValue: input ? input.value : null,
      submitDisabled: submit ? submit.disabled : null,
      status: (document.getElementById('interaction-status')?.textContent ?? '').trim(),
    };
  });
}

/** Waits until the interaction card asks with its controls enabled; returns it (see readInteractionCard). */
async function waitForInteractionCard(panel, { timeout = 120000, message = '#interaction-card to ask' } = {}) {
  return waitFor(
    async () => {
      const card = await readInteractionCard(panel);
      return card?.visible && !card.busy && !card.inputDisabled && card.options.every((o) => !o.disabled) ? card : null;
    },
    { timeout, interval: 50, message },
  );
}

/**
 * Records every change of the interaction card (visible, busy, controls
 * disabled) into `window.__interactionCardLog`, so a state that lasts less
 * than a poll cannot be missed.
 */
async function watchInteractionCard(panel) {
  await panel.evaluate(() => {
    const card = document.getElementById('interaction-card');
    if (!card || window.__interactionCardLog) return;
    const log = [];
    window.__interactionCardLog = log;
    const record = () => {
      const controls = [...card.querySelectorAll('button, input')];
      const entry = {
        visible: !card.hidden,
        busy: card.getAttribute('aria-busy') === 'true',
        allDisabled: controls.length > 0 && controls.every((c) => c.disabled),
        anyDisabled: controls.some((c) => c.disabled),
        interactionId: card.dataset.interactionId ?? null,
      };
      const last = log.at(-1);
      if (!last || JSON.stringify({ ...last, at: undefined }) !== JSON.stringify({ ...entry, at: undefined })) log.push({ ...entry, at: Date.now() });
    };
    record();
    new MutationObserver(record).observe(card, { attributes: true, subtree: true, childList: true, attributeFilter: ['hidden', 'aria-busy', 'disabled', 'data-interaction-id'] });
  });
}

async function interactionCardLog(panel) {
  return panel.evaluate(() => window.__interactionCardLog ?? []);
}

/** The tool card of an ask_user call: its status text, answer line and rendered results. */
async function readAskUserCard(panel, callId) {
  return panel.evaluate((id) => {
    const card = document.querySelector(`#messages .node.tool-call[data-call-id="${CSS.escape(id)}"]`);
    if (!card) return null;
    return {
      statusText: (card.querySelector(':scope > .tool-header > .tool-status')?.textContent ?? '').trim(),
      dataStatus: card.dataset.status ?? null,
      awaiting: card.dataset.awaitingAnswer === 'true',
      answer: (card.querySelector(':scope > .tool-answer')?.textContent ?? '').trim(),
      results: card.querySelectorAll(':scope > .tool-result').length,
    };
  }, callId);
}

const PLAN_QUESTION = 'Which plan should I subscribe you to?';
const PLAN_OPTIONS = ['Basic', 'Pro (monthly)', 'Team <b>bold</b>'];

isolatedTest(
  'ask_user_answered_in_the_panel',
  {
    script: [
      // Only a tool call, no text: the panel must not draw an empty bubble for it.
      { toolCalls: [{ name: 'ask_user', arguments: { question: PLAN_QUESTION, options: PLAN_OPTIONS } }] },
      { text: 'Subscribed you to the Pro (monthly) plan.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await watchInteractionCard(panel);
    await submitTask(panel, 'Subscribe me to a plan');

    const card = await waitForInteractionCard(panel);
    const waiting = await readPanel(panel);
    assert.equal(waiting.state, 'waiting_interaction', describeState(waiting));
    assert.equal(card.heading, 'The agent asks you');
    assert.equal(card.question, PLAN_QUESTION);
    assert.deepEqual(card.options.map((o) => o.text), PLAN_OPTIONS, 'one button per option, in order, as text');
    assert.ok(card.optionsVisible, 'the options are shown');
    assert.equal(card.questionElements, 0, 'the question is text only');
    assert.ok(card.focused, 'focus moved to the card when it appeared');
    assert.equal(await panel.evaluate(() => document.querySelectorAll('#interaction-card b').length), 0, 'an option is never parsed as HTML');
    assert.equal(await panel.getByRole('region', { name: 'The agent asks you' }).count(), 1, 'the card is a named region');
    assert.equal(await panel.getByRole('group', { name: 'Suggested answers' }).count(), 1);
    for (const option of PLAN_OPTIONS) {
      assert.equal(await panel.getByRole('button', { name: option, exact: true }).count(), 1, `a button named ${option}`);
    }
    assert.equal(await panel.getByRole('textbox', { name: 'Your answer' }).count(), 1, 'the free-text field has a name');
    assert.equal(await panel.getByRole('button', { name: 'Answer', exact: true }).count(), 1);
    assert.equal(mock.requests().length, 1, 'no provider request while the run waits for the answer');

    // The ask_user call on the transcript says what it waits for; no empty bubble for the text-less step.
    const askCard = toolCards(waiting).find((c) => c.toolName === 'ask_user');
    assert.ok(askCard, describeState(waiting));
    assert.equal(askCard.callId, card.callId, 'the card asks the drawn ask_user call');
    const drawn = await readAskUserCard(panel, card.callId);
    assert.equal(drawn.statusText, 'waiting for your answer');
    assert.ok(drawn.awaiting);
    assert.deepEqual(await emptyAssistantBubbles(panel), [], 'no empty assistant bubble');
    const inbound = await portMessages(panel, 'in');
    const requestEvent = inbound.find((e) => e.message.type === 'interaction.request');
    assert.equal(requestEvent?.message.interaction.id, card.interactionId);
    assert.equal(requestEvent.message.interaction.status, 'pending');
    assert.equal(requestEvent.message.interaction.callId, card.callId);
    assert.deepEqual(requestEvent.message.interaction.options, PLAN_OPTIONS);
    const statusAt = inbound.findIndex((e) => e.message.type === 'run.status' && e.message.state === 'waiting_interaction');
    assert.ok(statusAt >= 0 && statusAt < inbound.indexOf(requestEvent), 'run.status{waiting_interaction}, then interaction.request');
    await screenshot(panel, 'interaction-card');

    await panel.getByRole('button', { name: 'Pro (monthly)', exact: true }).click();
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', describeState(final));
    assert.match(topLevelNodes(final).filter((n) => n.text).at(-1).text, /Subscribed you to the Pro \(monthly\) plan\./);
    assert.equal((await readInteractionCard(panel)).visible, false, 'the card is gone');

    // The model's next request carries the answer as the call's one result.
    const requests = mock.requests();
    assert.equal(requests.length, 2, 'the question, then the final answer');
    const [exchange] = toolExchanges(requests[1], 'ask_user');
    assert.equal(exchange?.call.id, card.callId);
    assert.deepEqual(JSON.parse(exchange.call.function.arguments), { question: PLAN_QUESTION, options: PLAN_OPTIONS });
    assert.equal(exchange.results.length, 1, 'exactly one tool result');
    assert.equal(messageText(exchange.results[0]), 'The user answered: Pro (monthly)');
    assertNoOrphans(session);

    // The card went busy (all controls disabled) before it closed; it never re-opened.
    const log = await interactionCardLog(panel);
    const busyAt = log.findIndex((e) => e.visible && e.busy && e.allDisabled);
    assert.ok(busyAt > 0, `disabled while the answer was on its way: ${JSON.stringify(log)}`);
    assert.ok(log.slice(busyAt).some((e) => !e.visible), 'then hidden');
    assert.equal(log.filter((e, i) => e.visible && (i === 0 || !log[i - 1].visible)).length, 1, 'shown once');

    // The transcript: the call shows the answer.
    const answered = await readAskUserCard(panel, card.callId);
    assert.equal(answered.statusText, 'answered');
    assert.equal(answered.dataStatus, 'ok');
    assert.equal(answered.answer, 'Your answer: Pro (monthly)');
    assert.equal(answered.results, 1);
    assert.deepEqual(await emptyAssistantBubbles(panel), [], 'no empty assistant bubble after the turn');

    // The wire: one answer, acknowledged once, resolved once.
    const sent = (await portMessages(panel, 'out')).filter((e) => e.message.type === 'interaction.response');
    assert.deepEqual(sent.map((e) => [e.message.interactionId, e.message.answer]), [[card.interactionId, 'Pro (monthly)']]);
    const received = (await portMessages(panel, 'in')).map((e) => e.message);
    const acks = received.filter((m) => m.type === 'command.ack' && m.submissionId === sent[0].message.submissionId);
    assert.deepEqual(acks.map((m) => m.result), [{ interactionId: card.interactionId, status: 'answered' }]);
    const resolved = received.filter((m) => m.type === 'interaction.resolved');
    assert.deepEqual(resolved.map((m) => [m.interactionId, m.status]), [[card.interactionId, 'answered']]);
    // Order on the wire: the ACK (durable), the resolution, then the call's result.
    const ackAt = received.indexOf(acks[0]);
    const resolvedAt = received.indexOf(resolved[0]);
    const resultAt = received.findIndex((m) => m.type === 'item.complete' && m.node?.kind === 'tool_result' && m.node.callId === card.callId);
    assert.ok(ackAt >= 0 && ackAt < resolvedAt && resolvedAt < resultAt, `ack ${ackAt} < resolved ${resolvedAt} < result ${resultAt}`);
    const records = await stored(panel, 'interactions');
    assert.deepEqual(records.map((r) => [r.id, r.status, r.answer]), [[card.interactionId, 'answered', 'Pro (monthly)']]);
  },
);

isolatedTest(
  'ask_user_pending_across_sw_kill_answered_after_restart',
  {
    script: [
      { text: 'I need one detail first.', toolCalls: [{ name: 'ask_user', arguments: { question: 'What name should the newsletter use?' } }] },
      { text: 'Thanks, I will use that name.' },
    ],
  },
  async (session) => {
    const { panel, mock, context, extensionId } = session;
    await watchConnection(panel);
    await submitTask(panel, 'Sign me up for the newsletter');
    const before = await waitForInteractionCard(panel);
    const epochBefore = (await readPanel(panel)).epoch;
    assert.equal(before.epoch, epochBefore);
    assert.deepEqual(before.options, [], 'no options: free text only');
    assert.equal(before.optionsVisible, false);
    const durable = await stored(panel, 'interactions');
    assert.deepEqual(durable.map((r) => [r.id, r.status]), [[before.interactionId, 'pending']], 'the question is durable');
    const runs = await stored(panel, 'runs');
    assert.deepEqual(runs.map((r) => [r.state, r.pendingInteraction]), [['waiting_interaction', before.interactionId]], 'the run waits for it');
    assert.equal(mock.requests().length, 1);

    await killServiceWorker(context, extensionId, { page: panel });
    // The panel reconnects to a new worker whose snapshot shows the question again.
    const after = await waitFor(
      async () => {
        const card = await readInteractionCard(panel);
        const state = await readPanel(panel);
        return state.epoch !== epochBefore && card.visible && card.epoch === state.epoch && !card.busy ? { card, state } : null;
      },
      { timeout: 60000, message: 'the interaction card re-rendered from the new engine\'s snapshot' },
    );
    const connections = await connectionLog(panel);
    assert.ok(connections.some((entry) => entry.connected === 'false'), 'the panel saw the disconnect');
    assert.equal(after.card.interactionId, before.interactionId, 'the same question, not a new one');
    assert.equal(after.card.callId, before.callId);
    assert.equal(after.card.question, 'What name should the newsletter use?');
    assert.equal(after.state.state, 'waiting_interaction', describeState(after.state));
    assert.equal(after.card.inputDisabled, false, 'the answer field works after the restart');
    const snapshots = (await portMessages(panel, 'in')).filter((e) => e.message.type === 'initialized' && e.message.epoch === after.state.epoch);
    assert.ok(
      snapshots.some((e) => e.message.snapshot?.thread?.pendingInteraction?.id === before.interactionId),
      'the new engine\'s snapshot carries thread.pendingInteraction',
    );
    assert.ok(
      snapshots.some((e) => e.message.snapshot?.thread?.run?.pendingInteraction === before.interactionId),
      'and the run names it as run.pendingInteraction',
    );
    assert.equal(mock.requests().length, 1, 'the restarted run did not ask the model again');
    const drawn = await readAskUserCard(panel, before.callId);
    assert.equal(drawn.statusText, 'waiting for your answer', 'the redrawn call still waits');

    // Free text, keyboard only: the field, type, Enter.
    await panel.focus('#interaction-answer');
    await panel.keyboard.type('Ada Lovelace');
    await panel.keyboard.press('Enter');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', describeState(final));
    assert.match(topLevelNodes(final).filter((n) => n.text).at(-1).text, /Thanks, I will use that name\./);

    const requests = mock.requests();
    assert.equal(requests.length, 2, 'the question, then one continuation');
    const exchanges = toolExchanges(requests[1], 'ask_user');
    assert.equal(exchanges.length, 1);
    assert.equal(exchanges[0].call.id, before.callId);
    assert.equal(exchanges[0].results.length, 1, 'exactly one tool result');
    assert.equal(messageText(exchanges[0].results[0]), 'The user answered: Ada Lovelace');
    assertNoOrphans(session);
    const asked = toolCards(final).filter((c) => c.toolName === 'ask_user');
    assert.equal(asked.length, 1);
    assert.equal(asked[0].results.length, 1, 'one rendered result');
    assert.equal((await readAskUserCard(panel, before.callId)).answer, 'Your answer: Ada Lovelace');
    const sent = (await portMessages(panel, 'out')).filter((e) => e.message.type === 'interaction.response');
    assert.deepEqual(sent.map((e) => e.message.answer), ['Ada Lovelace'], 'one answer sent');
    const records = await stored(panel, 'interactions');
    assert.deepEqual(records.map((r) => [r.id, r.status, r.answer]), [[before.interactionId, 'answered', 'Ada Lovelace']]);
    assert.equal((await readInteractionCard(panel)).visible, false);
  },
);

isolatedTest(
  'ask_user_conflicting_answer_from_another_client_is_rejected',
  {
    script: [
      { toolCalls: [{ name: 'ask_user', arguments: { question: PLAN_QUESTION, options: ['Basic', 'Pro'] } }] },
      { text: 'Subscribed you to the plan you chose.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await submitTask(panel, 'Subscribe me to a plan');
    const card = await waitForInteractionCard(panel);
    const { threadId } = (await portMessages(panel, 'in')).find((e) => e.message.type === 'interaction.request').message;
    // Another client (a second Port of this extension page) answers "Basic"; in
    // the same task the user clicks "Pro" in the card. The first answer is
    // claimed; the card's answer is refused and changes nothing.
    const outcome = await panel.evaluate(({ threadId: thread, interactionId }) => new Promise((resolve) => {
      const port = chrome.runtime.connect({ name: 'panel' });
      port.onMessage.addListener((message) => {
        if (message.submissionId === 'other-1') resolve(message);
      });
      port.postMessage({ type: 'interaction.response', clientId: 'e2e-other-client', submissionId: 'other-1', threadId: thread, interactionId, answer: 'Basic' });
      document.querySelector('#interaction-card .interaction-option[data-answer="Pro"]').click();
      setTimeout(() => resolve(null), 20000);
    }), { threadId, interactionId: card.interactionId });
    assert.equal(outcome?.type, 'command.ack', JSON.stringify(outcome));
    assert.deepEqual(outcome.result, { interactionId: card.interactionId, status: 'answered' });
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', describeState(final));

    const sent = (await portMessages(panel, 'out')).find((e) => e.message.type === 'interaction.response' && e.message.clientId !== 'e2e-other-client');
    assert.equal(sent?.message.answer, 'Pro');
    const reject = await waitFor(
      async () => (await portMessages(panel, 'in')).find((e) => e.message.submissionId === sent.message.submissionId),
      { timeout: 30000, message: 'the answer to the panel\'s op' },
    );
    assert.equal(reject.message.type, 'command.reject', `the later answer is refused: ${reject.json}`);
    assert.equal(reject.message.error.kind, 'invalid_command');
    assert.equal((await readInteractionCard(panel)).visible, false, 'the card closed with the resolved question');
    const banner = (await readPanel(panel)).error;
    assert.match(banner, /^Could not send your answer to the agent's question: /, `the refusal is shown: ${banner}`);

    const [exchange] = toolExchanges(mock.requests()[1], 'ask_user');
    assert.equal(exchange.results.length, 1);
    assert.equal(messageText(exchange.results[0]), 'The user answered: Basic', 'the first answer is the one the model got');
    assert.equal((await readAskUserCard(panel, card.callId)).answer, 'Your answer: Basic');
    const records = await stored(panel, 'interactions');
    assert.deepEqual(records.map((r) => [r.status, r.answer]), [['answered', 'Basic']]);
    assertNoOrphans(session);
    const order = (await portMessages(panel, 'in'))
      .filter((e) => e.message.submissionId === sent.message.submissionId || e.message.type === 'interaction.resolved')
      .map((e) => e.message.type);
    process.stderr.write(`e2e: conflicting answer: panel saw ${order.join(' → ')} (${reject.message.error.message})\n`);
  },
);

/**
 * Lets the test rewrite what the panel posts on its Port (init script, so it
 * wraps the Port the panel opens): `window.__rewriteOp = (op) => op`.
 */
function opRewriterInitScript() {
  if (location.protocol !== 'chrome-extension:') return;
  const runtime = globalThis.chrome && globalThis.chrome.runtime;
  if (!runtime || typeof runtime.connect !== 'function' || globalThis.__opRewriterInstalled) return;
  globalThis.__opRewriterInstalled = true;
  const connect = runtime.connect.bind(runtime);
  runtime.connect = (...args) => {
    const port = connect(...args);
    const post = port.postMessage.bind(port);
    port.postMessage = (message) => post(typeof globalThis.__rewriteOp === 'function' ? globalThis.__rewriteOp(message) : message);
    return port;
  };
}

isolatedTest(
  'ask_user_rejected_answer_gives_the_card_back',
  {
    script: [
      { toolCalls: [{ name: 'ask_user', arguments: { question: PLAN_QUESTION, options: ['Basic', 'Pro'] } }] },
      { text: 'Subscribed you to the Pro plan.' },
    ],
  },
  async (session) => {
    const { panel, context, mock } = session;
    await context.addInitScript(opRewriterInitScript);
    await panel.reload();
    await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });
    await submitTask(panel, 'Subscribe me to a plan');
    const card = await waitForInteractionCard(panel);
    await watchInteractionCard(panel);
    // The first answer reaches the engine blank (a refused op, as if it had been
    // garbled): the engine rejects it and the question stays open.
    await panel.evaluate(() => {
      globalThis.__rewriteOp = (op) => {
        if (op.type !== 'interaction.response' || globalThis.__rewritten) return op;
        globalThis.__rewritten = true;
        return { ...op, answer: '   ' };
      };
    });
    await panel.getByRole('button', { name: 'Pro', exact: true }).click();
    const reject = await waitFor(
      async () => (await portMessages(panel, 'in')).find((e) => e.message.type === 'command.reject'),
      { timeout: 30000, message: 'the engine to refuse the blank answer' },
    );
    assert.equal(reject.message.opType, 'interaction.response');
    assert.equal(reject.message.error.kind, 'invalid_command');
    const back = await waitForInteractionCard(panel, { timeout: 15000, message: 'the card to give its controls back' });
    assert.equal(back.interactionId, card.interactionId, 'the same question, still open');
    assert.ok(back.focused, 'focus stayed in the card');
    const log = await interactionCardLog(panel);
    assert.ok(log.some((e) => e.visible && e.busy && e.allDisabled), `busy while the answer was on its way: ${JSON.stringify(log)}`);
    assert.match((await readPanel(panel)).error, /^Could not send your answer to the agent's question: The answer is empty\./);
    assert.equal(mock.requests().length, 1, 'nothing went to the model');

    await panel.getByRole('button', { name: 'Pro', exact: true }).click();
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', describeState(final));
    assert.equal(final.error, '', 'the accepted answer cleared the error');
    const [exchange] = toolExchanges(mock.requests()[1], 'ask_user');
    assert.equal(exchange.results.length, 1, 'exactly one tool result');
    assert.equal(messageText(exchange.results[0]), 'The user answered: Pro');
    assertNoOrphans(session);
  },
);

isolatedTest(
  'ask_user_interrupt_withdraws_the_card',
  { script: [{ toolCalls: [{ name: 'ask_user', arguments: { question: PLAN_QUESTION, options: ['Basic', 'Pro'] } }] }] },
  async (session) => {
    const { panel, mock } = session;
    await submitTask(panel, 'Subscribe me to a plan');
    const card = await waitForInteractionCard(panel);
    assert.ok(card.focused);
    // Esc from the focused card stops the run (the same as the Stop button).
    await panel.keyboard.press('Escape');
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'interrupted', describeState(final));
    assert.equal((await readInteractionCard(panel)).visible, false, 'the question is withdrawn with the run');
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'task-input', 'focus goes back to the composer');
    const received = (await portMessages(panel, 'in')).map((e) => e.message);
    const resolvedAt = received.findIndex((m) => m.type === 'interaction.resolved');
    const completeAt = received.findIndex((m) => m.type === 'turn.complete');
    assert.ok(resolvedAt >= 0, 'interaction.resolved is sent for the withdrawn question');
    assert.deepEqual([received[resolvedAt].interactionId, received[resolvedAt].status], [card.interactionId, 'cancelled']);
    assert.ok(resolvedAt < completeAt, 'before turn.complete');
    const asked = toolCards(final).find((c) => c.callId === card.callId);
    assert.ok(asked && asked.status !== 'running' && asked.status !== 'ok', describeState(final));
    assert.equal(asked.results.length, 1, 'the open call got its one result');
    const records = await stored(panel, 'interactions');
    assert.deepEqual(records.map((r) => [r.id, r.status, r.answer ?? null]), [[card.interactionId, 'cancelled', null]]);
    const runs = await stored(panel, 'runs');
    assert.deepEqual(runs.map((r) => [r.state, r.pendingInteraction ?? null]), [['interrupted', null]]);
    assert.equal(mock.requests().length, 1, 'no provider request after the interrupt');
    // A late answer to the withdrawn question is refused.
    const late = await panel.evaluate(({ threadId, interactionId }) => new Promise((resolve) => {
      const port = chrome.runtime.connect({ name: 'panel' });
      port.onMessage.addListener((message) => {
        if (message.submissionId === 'late-1') resolve(message);
      });
      port.postMessage({ type: 'interaction.response', clientId: 'e2e-late', submissionId: 'late-1', threadId, interactionId, answer: 'Pro' });
      setTimeout(() => resolve(null), 20000);
    }), { threadId: received[resolvedAt].threadId, interactionId: card.interactionId });
    assert.equal(late?.type, 'command.reject', JSON.stringify(late));
    assert.equal(late.error.kind, 'invalid_command');
    process.stderr.write(`e2e: withdrawn ask_user result: status=${asked.status} text=${JSON.stringify(asked.results[0].text)}\n`);
  },
);

// ------------------------------------------------- approvals on the wire ---

isolatedTest('same_approval_twice_and_a_conflicting_one', {}, async (session) => {
  const { panel, shop, mock } = session;
  await submitTask(panel, TASK);
  const card = await waitForApprovalCard(panel);
  assert.match(card.element, /^button "Subscribe"/, 'the element the ref named in the last page read');
  await screenshot(panel, 'approval-card');
  const [asked] = await approvalHistory(panel);
  assert.equal(asked?.id, card.approvalId);

  // A Port of our own from the panel page (an extension page, so a trusted
  // client): the same approval.response twice under one submissionId, then a
  // conflicting decision under a new one.
  const replies = await panel.evaluate(({ threadId, approvalId }) => new Promise((resolve, reject) => {
    const received = [];
    const port = chrome.runtime.connect({ name: 'panel' });
    const op = (submissionId, decision) => ({ type: 'approval.response', clientId: 'e2e-wire-client', submissionId, threadId, approvalId, decision });
    port.onMessage.addListener((message) => {
      if (message.type !== 'command.ack' && message.type !== 'command.reject') return;
      if (message.submissionId !== 'same-1' && message.submissionId !== 'other-2') return;
      received.push(message);
      if (received.length === 2) port.postMessage(op('other-2', 'decline'));
      if (received.length === 3) resolve(received);
    });
    port.onDisconnect.addListener(() => reject(new Error('the engine closed the Port')));
    port.postMessage(op('same-1', 'acceptOnce'));
    port.postMessage(op('same-1', 'acceptOnce'));
    setTimeout(() => resolve(received), 30000);
  }), { threadId: asked.threadId, approvalId: card.approvalId });

  assert.deepEqual(
    replies.map((m) => [m.type, m.submissionId, m.opType]),
    [
      ['command.ack', 'same-1', 'approval.response'],
      ['command.ack', 'same-1', 'approval.response'],
      ['command.reject', 'other-2', 'approval.response'],
    ],
    JSON.stringify(replies),
  );
  assert.deepEqual(replies[0].result, { approvalId: card.approvalId, status: 'accepted_once' });
  assert.deepEqual(replies[1].result, replies[0].result, 'the repeat replays the stored outcome');
  assert.equal(replies[2].error.kind, 'invalid_command', 'a different decision is refused');

  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed', describeState(final));
  assert.equal(await subscribeClicks(shop), 1, 'the page counted exactly one click');
  assert.equal(final.error, '', 'another client\'s reject is not shown in this panel');
  assert.equal((await readApprovalCard(panel)).visible, false, 'the card is gone');
  const history = await approvalHistory(panel);
  assert.deepEqual(history.map((a) => [a.id, a.status]), [[card.approvalId, 'accepted_once']], 'resolved once, as accepted once');
  const resolvedEvents = (await portMessages(panel, 'in')).filter((e) => e.message.type === 'approval.resolved');
  assert.equal(resolvedEvents.length, 1, 'one approval.resolved for the panel');
  const approvals = await stored(panel, 'approvals');
  assert.deepEqual(approvals.map((a) => [a.id, a.status]), [[card.approvalId, 'accepted_once']], 'the first outcome stands');
  assert.deepEqual(await stored(panel, 'site_rules'), [], 'the declined repeat stored no rule and changed nothing');
  const receipts = (await stored(panel, 'receipts')).filter((r) => r.key.startsWith('e2e-wire-client'));
  assert.deepEqual(receipts.map((r) => [r.key.split('\u001f')[1], r.opType]), [['same-1', 'approval.response']], 'one receipt, for the accepted submission');
  const clicks = toolCards(final).filter((c) => c.toolName === 'click');
  assert.deepEqual(clicks.map((c) => [c.callId, c.status]), [[card.callId, 'ok']]);
  assert.equal(mock.requests().length, 3, 'read_page, click, final answer');
  assertNoOrphans(session);
});

// ---------------------------------------------------- keyboard shortcuts ---

const GATE_TEXT = 'Gate open [panel-e2e]';
const STEER_TEXT = 'Please also mention the spring catalogue [steer-panel-e2e]';
const QUEUED_TEXT = 'Then tell me a joke [queued-panel-e2e]';

/** Types `text` into the focused element and presses `keys`, keyboard only. */
async function typeAndPress(panel, text, keys) {
  await panel.keyboard.type(text);
  await panel.keyboard.press(keys);
}

isolatedTest(
  'keyboard_enter_steers_shift_alt_enter_queues_esc_interrupts',
  {
    script: [
      // Turn 1: the page tool waits until the test opens the gate (a read: no approval).
      { text: 'Waiting for the gate.', toolCalls: [{ name: 'wait_for', arguments: { text: GATE_TEXT, timeout_ms: 30000 } }] },
      // Turn 1 goes on with the steer in its conversation.
      { text: 'Noted: I will mention the spring catalogue.' },
      // Turn 2: the queued message.
      { text: 'Here is a joke about queues.' },
      // Turn 3: streams until Esc.
      { stallMs: STALL_FOREVER_MS, text: 'Let me think', tickMs: 250, tickText: '.' },
      // Turn 4: Continue.
      { text: 'Continuing where I stopped.' },
    ],
  },
  async (session) => {
    const { panel, shop, mock } = session;
    // Keyboard only from here: focus is put in the composer once, the rest is typing.
    await panel.focus('#task-input');
    await typeAndPress(panel, 'Wait for the gate to open', 'Enter');
    const running = await waitFor(
      async () => {
        const state = await readPanel(panel);
        const waiting = toolCards(state).some((c) => c.toolName === 'wait_for' && c.status === 'running');
        return state.state === 'executing_tools' && waiting && state.turnId ? state : null;
      },
      { timeout: 60000, message: 'the wait_for call running' },
    );
    assert.equal(await panel.evaluate(() => document.getElementById('send-button').textContent), 'Steer', 'the send button says what Enter does now');

    // Enter while the turn runs: a steer for that turn.
    await typeAndPress(panel, STEER_TEXT, 'Enter');
    const steerOp = await waitFor(
      async () => (await portMessages(panel, 'out')).find((e) => e.message.type === 'turn.steer' && e.message.input?.text === STEER_TEXT),
      { timeout: 15000, message: 'the panel to send turn.steer' },
    );
    assert.equal(steerOp.message.expectedTurnId, running.turnId);
    const steerAck = await waitFor(
      async () => (await portMessages(panel, 'in')).find((e) => e.message.submissionId === steerOp.message.submissionId),
      { timeout: 30000, message: 'the answer to the steer' },
    );
    assert.equal(steerAck.message.type, 'command.ack', steerAck.json);
    assert.equal(typeof steerAck.message.result?.steerId, 'string', `a steer, not downgraded: ${steerAck.json}`);
    await waitFor(
      () => panel.evaluate((text) => [...document.querySelectorAll('#steer-list li')].some((li) => li.textContent.includes(text)), STEER_TEXT),
      { timeout: 15000, message: 'the steer listed as not yet read' },
    );

    // Shift+Alt+Enter: queued as the next turn.
    await typeAndPress(panel, QUEUED_TEXT, 'Shift+Alt+Enter');
    const enqueueOp = await waitFor(
      async () => (await portMessages(panel, 'out')).find((e) => e.message.type === 'turn.enqueue' && e.message.input?.text === QUEUED_TEXT),
      { timeout: 15000, message: 'the panel to send turn.enqueue' },
    );
    await waitFor(
      () => panel.evaluate((text) => [...document.querySelectorAll('#queue-list li')].some((li) => li.textContent.includes(text)), QUEUED_TEXT),
      { timeout: 15000, message: 'the queued message in the queue list' },
    );
    assert.equal(await panel.evaluate(() => document.getElementById('queue-section').hidden), false, 'the queue is visible');
    const removeName = await panel.evaluate(() => document.querySelector('#queue-list li button')?.getAttribute('aria-label'));
    assert.match(removeName, /^Remove queued message: Then tell me a joke/);
    assert.equal(mock.requests().length, 1, 'nothing was sent to the model while the tool runs');
    assert.equal(await panel.evaluate(() => document.getElementById('task-input').value), '', 'the composer is empty again');

    // Open the gate: the tool returns, the steer lands in turn 1, then the queued turn runs.
    await shop.evaluate((text) => {
      const p = document.createElement('p');
      p.textContent = text;
      document.body.append(p);
    }, GATE_TEXT);
    const afterQueue = await waitFor(
      async () => {
        const state = await readPanel(panel);
        return mock.requests().length >= 3 && state.state === 'completed' && state.turnId !== running.turnId ? state : null;
      },
      { timeout: 120000, message: 'the queued turn to complete after the steered turn' },
    );
    const nodes = topLevelNodes(afterQueue).filter((n) => n.text);
    const index = (predicate, what) => {
      const found = nodes.findIndex(predicate);
      assert.ok(found >= 0, `${what}:\n${describeState(afterQueue)}`);
      return found;
    };
    const waitAt = index((n) => n.kind === 'tool_call' && n.toolName === 'wait_for', 'the wait_for call');
    const steerAt = index((n) => n.kind === 'user_message' && n.text.includes(STEER_TEXT), 'the steer');
    const notedAt = index((n) => n.kind === 'assistant_message' && /Noted: I will mention the spring catalogue/.test(n.text), 'the answer to the steer');
    const queuedAt = index((n) => n.kind === 'user_message' && n.text.includes(QUEUED_TEXT), 'the queued message');
    const jokeAt = index((n) => n.kind === 'assistant_message' && /Here is a joke about queues/.test(n.text), 'the queued turn\'s answer');
    assert.ok(waitAt < steerAt && steerAt < notedAt && notedAt < queuedAt && queuedAt < jokeAt, describeState(afterQueue));
    assert.equal(nodes.filter((n) => n.text.includes(STEER_TEXT)).length, 1, 'the steer is drawn once');
    const steerNode = await panel.evaluate((text) => {
      const element = [...document.querySelectorAll('#messages .node.user')].find((e) => e.textContent.includes(text));
      return element ? { label: element.getAttribute('aria-label'), badge: element.querySelector('.badge-steer')?.textContent ?? null } : null;
    }, STEER_TEXT);
    assert.deepEqual(steerNode, { label: 'You (steering)', badge: 'steer' }, 'the steer is drawn as a steered user message');
    const queuedNode = await panel.evaluate((text) => {
      const element = [...document.querySelectorAll('#messages .node.user')].find((e) => e.textContent.includes(text));
      return element ? element.querySelector('.badge-steer') === null : null;
    }, QUEUED_TEXT);
    assert.equal(queuedNode, true, 'the queued message is an ordinary user message');
    assert.equal(await panel.evaluate(() => document.querySelectorAll('#queue-list li, #steer-list li').length), 0, 'nothing left waiting');
    assert.equal(await panel.evaluate(() => document.getElementById('queue-section').hidden), true);
    assert.equal(
      (await portMessages(panel, 'in')).find((e) => e.message.submissionId === enqueueOp.message.submissionId)?.message.type,
      'command.ack',
    );

    // What the model saw: the steer in turn 1's second request (after the tool result), the queued text as its own turn.
    const requests = mock.requests();
    assert.equal(requests.length, 3, 'wait_for, the steered continuation, the queued turn');
    assert.ok(!JSON.stringify(requests[0].body).includes(STEER_TEXT), 'the first request was made before the steer');
    const second = requestMessages(requests[1]);
    const steerMessages = second.filter((m) => messageText(m).includes(STEER_TEXT));
    assert.equal(steerMessages.length, 1);
    assert.equal(steerMessages[0].role, 'user');
    assert.ok(second.indexOf(steerMessages[0]) > second.findIndex((m) => m.role === 'tool'), 'the steer follows the tool result');
    assert.ok(!JSON.stringify(requests[1].body).includes(QUEUED_TEXT), 'the queued message waits for its own turn');
    const third = requestMessages(requests[2]);
    assert.ok(messageText(third.filter((m) => m.role === 'user').at(-1)).startsWith(QUEUED_TEXT), 'the queued turn starts with the queued text');

    // Esc: a streaming turn is interrupted; Continue (reached with Tab) resumes.
    await panel.focus('#task-input');
    await typeAndPress(panel, 'Think about it for a long time', 'Enter');
    const streaming = await waitFor(
      async () => {
        const state = await readPanel(panel);
        const growing = state.nodes.some((n) => n.kind === 'assistant_message' && n.streaming && n.text.length > 0);
        return growing && state.state === 'streaming_model' ? state : null;
      },
      { timeout: 60000, message: 'a streaming assistant message' },
    );
    await screenshot(panel, 'streaming');
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'task-input');
    await panel.keyboard.press('Escape');
    const interrupted = await waitForSettledTurn(panel, { previousTurnId: afterQueue.turnId });
    assert.equal(interrupted.state, 'interrupted', describeState(interrupted));
    assert.equal(interrupted.turnId, streaming.turnId);
    assert.ok(await panel.locator('#continue-button').isVisible(), 'the Continue button is shown');
    assert.ok(await panel.locator('#interrupted-banner').isVisible(), 'the interrupted banner is shown');
    assert.match(await panel.locator('#interrupted-banner').innerText(), /stopped.*Continue/s);
    assert.equal(await panel.evaluate(() => document.getElementById('status-text').textContent), 'Stopped');
    assert.ok(await panel.locator('#stop-button').isDisabled(), 'nothing left to stop');
    assert.equal(
      (await portMessages(panel, 'out')).filter((e) => e.message.type === 'turn.interrupt').length,
      1,
      'one Esc, one interrupt',
    );
    await waitFor(() => mock.requests()[3]?.outcome === 'aborted', { timeout: 30000, message: 'the interrupted request to be closed' });
    await screenshot(panel, 'interrupted');

    for (let i = 0; i < 8; i += 1) {
      if ((await panel.evaluate(() => document.activeElement?.id)) === 'continue-button') break;
      await panel.keyboard.press('Tab');
    }
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'continue-button', 'Continue is reachable with Tab');
    await panel.keyboard.press('Enter');
    const resumed = await waitForSettledTurn(panel, { previousTurnId: interrupted.turnId });
    assert.equal(resumed.state, 'completed', describeState(resumed));
    assert.match(topLevelNodes(resumed).filter((n) => n.text).at(-1).text, /Continuing where I stopped\./);
    assert.equal(await panel.locator('#interrupted-banner').isVisible(), false, 'the banner is gone');
    assert.equal(await panel.locator('#continue-button').isVisible(), false);
    assert.equal(mock.requests().length, 5);
    assert.equal(messageText(requestMessages(mock.requests()[4]).filter((m) => m.role === 'user').at(-1)).split('\n')[0], 'Continue.');
    assert.deepEqual(await emptyAssistantBubbles(panel), [], 'no empty assistant bubble anywhere');
    assertNoOrphans(session);
  },
);

// ------------------------------------------------------ errors, settings ---

isolatedTest(
  'provider_errors_in_plain_words_with_what_to_do',
  {
    script: [
      { error: { status: 401, body: 'Incorrect API key provided' } },
      { error: { status: 404, body: 'The model `mock-9` does not exist' } },
    ],
  },
  async (session) => {
    const { panel } = session;
    await submitTask(panel, 'Say hello');
    const failed = await waitForSettledTurn(panel);
    assert.equal(failed.state, 'failed', describeState(failed));
    const banner = panel.locator('#error-banner');
    assert.equal(await banner.getAttribute('data-kind'), 'auth');
    assert.equal(await panel.locator('#error-text').textContent(), 'The provider rejected the API key. Open Settings and check the key.');
    assert.match(await panel.locator('#error-detail').textContent(), /^Details: .*HTTP 401.*Incorrect API key provided/);
    assert.ok(!(await banner.innerText()).includes(TEST_API_KEY), 'the key itself is never shown');
    await screenshot(panel, 'error-banner');
    // "Open Settings" takes the user to the field to fix.
    await panel.getByRole('button', { name: 'Open Settings', exact: true }).click();
    await waitFor(
      () => panel.evaluate(() => document.activeElement?.id === 'settings-api-key' && !document.getElementById('settings-section').hidden),
      { timeout: 15000, message: 'the API key field focused in the open settings' },
    );
    await panel.click('#settings-toggle');

    await submitTask(panel, 'Say hello again');
    const second = await waitForSettledTurn(panel, { previousTurnId: failed.turnId });
    assert.equal(second.state, 'failed', describeState(second));
    assert.equal(await banner.getAttribute('data-kind'), 'model_not_found');
    assert.equal(await panel.locator('#error-text').textContent(), 'The provider does not know this model. Open Settings and check the model name.');
    assert.ok(await panel.getByRole('button', { name: 'Open Settings', exact: true }).isVisible());
  },
);

isolatedTest('settings_round_trip', {}, async (session) => {
  const { panel, context, extensionId, mock } = session;
  const values = {
    baseUrl: mock.url,
    model: 'mock-round-trip',
    apiKey: 'sk-round-trip-KEY-4711',
    maxOutputTokens: '1234',
    temperature: '0.7',
  };
  await panel.click('#settings-toggle');
  await panel.locator('#settings-base-url').waitFor({ state: 'visible', timeout: 15000 });
  assert.equal(await panel.locator('#settings-toggle').getAttribute('aria-expanded'), 'true');
  await panel.locator('#settings-provider').selectOption('openai');
  await panel.fill('#settings-base-url', `${values.baseUrl}/`);
  await panel.fill('#settings-model', values.model);
  await panel.fill('#settings-api-key', values.apiKey);
  await panel.fill('#settings-max-tokens', values.maxOutputTokens);
  await panel.fill('#settings-temperature', values.temperature);
  await panel.locator('#settings-tool-use').setChecked(false);
  await panel.locator('#settings-vision').setChecked(true);
  await panel.fill('#settings-context-window', '128000');
  await panel.fill('#settings-token-budget', '');
  await panel.click('#settings-save');
  await waitFor(async () => (await panel.locator('#settings-status').textContent()) === 'Saved', { timeout: 15000, message: 'Saved' });
  await screenshot(panel, 'settings');
  const saved = await panel.evaluate(async () => (await chrome.storage.local.get('settings')).settings);
  assert.deepEqual(
    { ...saved },
    {
      provider: 'openai',
      baseUrl: values.baseUrl.replace(/\/+$/, ''),
      model: values.model,
      apiKey: values.apiKey,
      maxOutputTokens: 1234,
      temperature: 0.7,
      toolUse: false,
      vision: true,
      contextWindow: 128000,
      tokenBudget: null,
    },
    'stored in chrome.storage.local (the trailing slash of the URL dropped)',
  );

  // Reload the panel: the form shows what was stored; the key stays masked.
  await panel.reload();
  await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });
  assert.equal(await panel.locator('#settings-section').isVisible(), false, 'settings start closed');
  await panel.click('#settings-toggle');
  await panel.locator('#settings-base-url').waitFor({ state: 'visible', timeout: 15000 });
  await waitFor(async () => (await panel.inputValue('#settings-model')) === values.model, { timeout: 15000, message: 'the stored model in the form' });
  assert.equal(await panel.inputValue('#settings-provider'), 'openai');
  assert.equal(await panel.inputValue('#settings-base-url'), values.baseUrl);
  assert.equal(await panel.inputValue('#settings-api-key'), values.apiKey);
  assert.equal(await panel.inputValue('#settings-max-tokens'), values.maxOutputTokens);
  assert.equal(await panel.inputValue('#settings-temperature'), values.temperature);
  assert.equal(await panel.locator('#settings-tool-use').isChecked(), false);
  assert.equal(await panel.locator('#settings-vision').isChecked(), true);
  assert.equal(await panel.inputValue('#settings-context-window'), '128000');
  assert.equal(await panel.inputValue('#settings-token-budget'), '');
  assert.equal(await panel.getAttribute('#settings-api-key', 'type'), 'password', 'the API key field is masked');
  assert.ok(!(await panel.evaluate(() => document.body.innerText)).includes(values.apiKey), 'the key is not shown as text anywhere');
  assert.equal(await panel.getByRole('textbox', { name: 'Model' }).count(), 1, 'fields have accessible names');

  // A second panel (another instance) reads the same settings.
  const other = await openPanel(context, extensionId);
  await other.click('#settings-toggle');
  await waitFor(async () => (await other.inputValue('#settings-model')) === values.model, { timeout: 15000, message: 'the second panel\'s form' });
  assert.equal(await other.inputValue('#settings-api-key'), values.apiKey);
  await other.close();
  const ports = (await portLog(panel)) ?? [];
  assert.ok(!ports.some((entry) => entry.json && entry.json.includes(values.apiKey)), 'the key never crosses the Port');
});

isolatedTest('approval_card_describes_the_page_snapshot_element', {
  page: 'form.html',
  script: [
    { text: 'Let me look at the form.', toolCalls: [{ name: 'page_snapshot', arguments: {} }] },
    { text: 'I see a contact form.' },
  ],
}, async (session) => {
  const { panel, mock } = session;
  await submitTask(panel, 'Look at the contact form');
  const first = await waitForSettledTurn(panel);
  assert.equal(first.state, 'completed', describeState(first));
  const snapshotResult = requestMessages(mock.requests()[1]).find((m) => m.role === 'tool');
  const line = messageText(snapshotResult).split('\n').find((l) => /\[e\d+\] textbox "Full name"/.test(l));
  assert.ok(line, messageText(snapshotResult));
  assert.match(line, /^ +\[e\d+\] textbox "Full name" required$/, 'an indented outline line with state after the name');
  const ref = /\[(e\d+)\]/.exec(line)[1];
  // The next turn types into that ref (a write: the card names the element),
  // looks again, and types once more: the card then describes the element as
  // the newest snapshot shows it (with its value).
  mock.setScript([
    { toolCalls: [{ name: 'type', arguments: { ref, text: 'Ada "the first"' } }] },
    { toolCalls: [{ name: 'page_snapshot', arguments: {} }] },
    { toolCalls: [{ name: 'type', arguments: { ref, text: 'Ada Lovelace' } }] },
    { text: 'Typed the name.' },
  ]);
  await submitTask(panel, 'Type Ada into the name field');
  const firstCard = await waitForApprovalCard(panel);
  assert.equal(firstCard.toolName, 'type');
  assert.equal(firstCard.element, 'textbox "Full name" required (as the page described it when last read)');
  await panel.click('#approval-accept-once');
  const secondCard = await waitForApprovalCard(panel, { message: 'the second type to ask' });
  assert.notEqual(secondCard.approvalId, firstCard.approvalId);
  assert.equal(
    secondCard.element,
    'textbox "Full name" value="Ada \\"the first\\"" required focused (as the page described it when last read)',
    'the newest page_snapshot, the name parsed up to its closing quote, the state after it',
  );
  await panel.click('#approval-decline');
  const final = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
  assert.equal(final.state, 'completed', describeState(final));
});
