// End-to-end tests of the side panel's own flows: the built extension
// (dist/extension) in headless Chromium, driven from its side panel page
// (opened as a tab) against the mock LLM and the local test pages, like
// tests/e2e/run.mjs. Covered here: questions from the model (`ask_user`)
// answered in the interaction card, also across a service-worker kill; a
// repeated and a conflicting approval.response sent on a Port of the panel
// page; the keyboard shortcuts (Enter steers, Shift+Alt+Enter queues, Esc
// interrupts, Continue); provider errors in plain words; a settings round trip;
// a message typed while another thread opens (held until it is shown, also
// across a reconnect that lost the new thread's answer), and the left
// thread's buttons and approval card taking no key press meanwhile (the
// composer's note says why).
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
import net from 'node:net';
import path from 'node:path';
import {
  REPO_ROOT,
  exitUnlessExtensionBuilt,
  readPanel,
  submitTask,
  killServiceWorker,
  watchConnection,
  connectionLog,
  portLog,
  holdOutgoing,
  injectIncoming,
  dropIncoming,
  setPageVisibility,
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
  messageText,
  inEngineWorker,
  enableVision,
  opRewriterInitScript,
} from '../support/session.mjs';

exitUnlessExtensionBuilt('e2e');

const TASK = 'Subscribe to the newsletter';
const TEST_TIMEOUT = 300000;
/** A stall far longer than any test: only an interrupt or a SW kill ends it. */
const STALL_FOREVER_MS = 600000;
const SCREENS_DIR = path.join(REPO_ROOT, 'target', 'e2e', 'screens');
/** The composer's note when an action is not taken while another thread opens (www/panel.js). */
const OPENING_NOTE = 'The thread is still opening: try again once it is shown.';

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
  'an_answer_stopped_before_its_first_word_leaves_no_message_behind',
  // The second answer: headers, then nothing. It has started (item.start)
  // and has no word yet when the user stops it.
  { script: [{ text: 'Hello.' }, { stallMs: STALL_FOREVER_MS, stallAt: 'headers' }] },
  async (session) => {
    const { panel } = session;
    // A first turn, so that the thread is shown and stays shown (a new
    // thread's snapshot would redraw the panel and hide what is tested).
    await submitTask(panel, 'Say hello');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', describeState(first));
    const assistantStarts = async () =>
      ((await portLog(panel)) ?? [])
        .filter((entry) => entry.dir === 'in' && entry.json)
        .map((entry) => JSON.parse(entry.json))
        .filter((m) => m.type === 'item.start' && m.kind === 'assistant_message').length;
    const before = await assistantStarts();
    await submitTask(panel, 'Say something');
    await waitFor(async () => (await assistantStarts()) > before, { timeout: 30000, interval: 50, message: "the second answer's item.start" });
    await panel.click('#stop-button');
    const final = await waitForSettledTurn(panel, { previousTurnId: first.turnId, states: ['interrupted'] });
    const drawn = await panel.evaluate(() =>
      [...document.querySelectorAll('#messages [data-kind="assistant_message"]')].map((e) => e.querySelector('.message-text')?.textContent.trim() ?? ''),
    );
    assert.deepEqual(drawn, ['Hello.'], `only the first answer is drawn, shown or hidden\n${describeState(final)}`);
    // As stored, which a new panel is drawn from.
    const stored = ((await dumpIndexedDb(panel))['sw-agent']?.nodes ?? []).map((entry) => entry.value);
    assert.deepEqual(stored.filter((n) => n.kind === 'assistant_message').map((n) => n.text), ['Hello.']);
  },
);

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

  // The answer is kept with the click's result, so the card shows it after
  // a reload (the approval record itself goes after its retention).
  const clickResult = (await stored(panel, 'nodes')).find((n) => n.kind === 'tool_result' && n.callId === card.callId);
  assert.deepEqual([clickResult?.approval?.status, clickResult?.approval?.origin], ['accepted_once', new URL(shop.url()).origin]);
  assert.equal(typeof clickResult.approval.decidedAt, 'number');
  await panel.reload();
  const badge = panel.locator(`[data-call-id="${card.callId}"] .badge-approval`);
  await waitFor(async () => (await badge.count()) === 1, { timeout: 30000, message: 'the answer on the card after a reload' });
  assert.equal(await badge.textContent(), 'allowed once');
  assert.match(await badge.getAttribute('title'), new RegExp(`^Your answer to the approval request on ${new URL(shop.url()).host.replace(/[.]/g, '\\.')}: allowed once at `));
});

// ------------------------------------------------ a client in the worker ---

isolatedTest(
  'a_client_in_the_worker_submits_a_turn_that_the_side_panel_lists_and_shows',
  // Engine.connectClient: the embedding extension's own worker code (a
  // context-menu command, say) drives a turn as a panel would.
  { script: [{ text: 'Hello from the worker [worker-client-e2e].' }] },
  async (session) => {
    const { panel } = session;
    const threadsBefore = (await stored(panel, 'threads')).length;
    await inEngineWorker(session, () => {
      const events = (globalThis.__e2eWorkerEvents = []);
      const client = globalThis.__swAgent.engine.connectClient((event) => events.push(event));
      globalThis.__e2eWorkerClient = client;
      client.send({ type: 'turn.submit', clientId: 'worker-e2e', submissionId: 'w-1', threadId: null, input: { text: 'Say hello [worker-client-e2e]' } });
      // A malformed op is answered on the client too, not thrown.
      client.send({ type: 'turn.submit', clientId: 'worker-e2e', submissionId: 'w-bad' });
    });
    const events = await waitFor(
      () => inEngineWorker(session, () => (globalThis.__e2eWorkerEvents.some((e) => e.type === 'turn.complete') ? globalThis.__e2eWorkerEvents : null)),
      { timeout: 60000, message: 'the worker client saw its turn end' },
    );
    const ack = events.findIndex((e) => e.type === 'command.ack' && e.submissionId === 'w-1');
    const complete = events.findIndex((e) => e.type === 'turn.complete');
    assert.ok(ack >= 0 && ack < complete, JSON.stringify(events.map((e) => e.type)));
    assert.equal(events[complete].stopReason, 'end');
    const threadId = events[ack].result.threadId;
    const bad = events.find((e) => e.submissionId === 'w-bad');
    assert.deepEqual([bad?.type, bad?.error?.kind], ['command.reject', 'invalid_op']);
    const streamed = events.filter((e) => e.type === 'item.delta').map((e) => e.delta?.text ?? '').join('');
    assert.match(streamed, /Hello from the worker/);

    // The side panel lists the new thread and shows its turn when chosen.
    assert.equal((await stored(panel, 'threads')).length, threadsBefore + 1);
    await waitFor(async () => (await panel.locator(`#thread-list option[value="${threadId}"]`).count()) === 1, { timeout: 30000, message: 'the thread in the panel\'s list' });
    await panel.selectOption('#thread-list', threadId);
    await waitFor(async () => transcriptLines(await readPanel(panel)).some((line) => line.includes('Hello from the worker')), { timeout: 30000, message: 'the worker\'s turn in the panel' });

    // Closed, the client gets nothing more and refuses to send.
    const closed = await inEngineWorker(session, () => {
      const client = globalThis.__e2eWorkerClient;
      client.close();
      try {
        client.send({ type: 'siteRules.list', clientId: 'worker-e2e', submissionId: 'w-2' });
        return 'sent';
      } catch (err) {
        return String(err.message);
      }
    });
    assert.equal(closed, 'This engine client was closed.');
  },
);

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
    const removeName = await panel.evaluate(() => document.querySelector('#queue-list li button.icon-button')?.getAttribute('aria-label'));
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
    // Every (turn, state) pair the status line shows from here on: the continued
    // turn must never be drawn as the old turn's "interrupted" (the resume ACK
    // can arrive before the new turn's turn.start).
    await panel.evaluate(() => {
      const status = document.getElementById('status');
      window.__statusTrail = [];
      new MutationObserver(() => window.__statusTrail.push([status.dataset.turnId, status.dataset.state]))
        .observe(status, { attributes: true, attributeFilter: ['data-state', 'data-turn-id'] });
    });
    await panel.keyboard.press('Enter');
    const resumed = await waitForSettledTurn(panel, { previousTurnId: interrupted.turnId });
    assert.equal(resumed.state, 'completed', describeState(resumed));
    const trail = await panel.evaluate(() => window.__statusTrail);
    assert.deepEqual(
      trail.filter(([turnId, state]) => turnId === resumed.turnId && !['queued', 'streaming_model', 'completed'].includes(state)),
      [],
      `the continued turn is only ever queued, streaming or completed: ${JSON.stringify(trail)}`,
    );
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
  // The next turn types into that ref (a write: the card names the element
  // as the page describes it when the engine asks), looks again, and types
  // once more: the card then describes the element as it is then (its value,
  // its focus).
  mock.setScript([
    { toolCalls: [{ name: 'type', arguments: { ref, text: 'Ada "the first"' } }] },
    { toolCalls: [{ name: 'page_snapshot', arguments: {} }] },
    { toolCalls: [{ name: 'type', arguments: { ref, text: 'Ada Lovelace' } }] },
    { text: 'Typed the name.' },
  ]);
  await submitTask(panel, 'Type Ada into the name field');
  const firstCard = await waitForApprovalCard(panel);
  assert.equal(firstCard.toolName, 'type');
  assert.equal(firstCard.element, 'textbox "Full name" required');
  await panel.click('#approval-accept-once');
  const secondCard = await waitForApprovalCard(panel, { message: 'the second type to ask' });
  assert.notEqual(secondCard.approvalId, firstCard.approvalId);
  assert.equal(
    secondCard.element,
    'textbox "Full name" value="Ada \\"the first\\"" required focused',
    'the element as the page has it when asked, its state after the name',
  );
  await panel.click('#approval-decline');
  const final = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
  assert.equal(final.state, 'completed', describeState(final));
});

// ------------------------------------------- versions, forks and the queue ---

/** The last `initialized` snapshot the panel received. */
async function lastSnapshot(panel) {
  const inbound = await portMessages(panel, 'in');
  return inbound.filter((e) => e.message.type === 'initialized').at(-1)?.message.snapshot ?? null;
}

/** Presses New thread and waits until a thread other than `shownId` is shown; returns its id. */
async function openNewThread(panel, shownId) {
  await panel.click('#new-thread-button');
  return waitFor(async () => {
    const id = (await lastSnapshot(panel))?.thread?.id;
    return id && id !== shownId ? id : null;
  }, { timeout: 30000, message: 'the new thread shown' });
}

/** Outbound ops of one type (panel → engine), in order. */
async function sentOps(panel, type) {
  return (await portMessages(panel, 'out')).filter((e) => e.message.type === type).map((e) => e.message);
}

/** The engine's answer (ack or reject) to one submission. */
async function answerTo(panel, submissionId, what) {
  return waitFor(
    async () => (await portMessages(panel, 'in')).find((e) => e.message.submissionId === submissionId)?.message,
    { timeout: 30000, message: `the answer to ${what}` },
  );
}

/** Focuses a control and presses a key on it (keyboard use, no mouse). */
async function pressOn(locator, key = 'Enter') {
  await locator.focus();
  await locator.page().keyboard.press(key);
}

/** What has keyboard focus: its accessible name, data-action and tag. */
async function focused(panel) {
  return panel.evaluate(() => {
    const element = document.activeElement;
    return {
      tag: element?.tagName.toLowerCase() ?? '',
      name: element?.getAttribute('aria-label') ?? element?.textContent?.trim() ?? '',
      action: element instanceof HTMLElement ? element.dataset.action ?? '' : '',
      id: element?.id ?? '',
      value: element && 'value' in element ? element.value : null,
    };
  });
}

/** The conversation as "kind: text" lines (drawn, visible nodes only). */
async function conversation(panel) {
  const state = await readPanel(panel);
  return topLevelNodes(state).filter((n) => n.text && (n.kind === 'user_message' || n.kind === 'assistant_message')).map((n) => `${n.kind === 'user_message' ? 'user' : 'agent'}: ${n.text}`);
}

/** A user message as the model got it, without the engine's "[Context at send time: …]" note. */
function withoutContextNote(text) {
  return text.replace(/\n+\[Context at send time:[^\]]*\]\s*$/, '');
}

/** No horizontal scrolling in the panel (it fits its width). */
async function assertFitsWidth(panel, what) {
  const overflow = await panel.evaluate(() => {
    const root = document.documentElement;
    const messages = document.getElementById('messages');
    return { root: root.scrollWidth - root.clientWidth, messages: messages.scrollWidth - messages.clientWidth };
  });
  assert.deepEqual(overflow, { root: 0, messages: 0 }, `${what}: no horizontal overflow`);
}

const Q1 = 'Question one [versions-e2e]';
const Q1_EDITED = 'Question one, edited [versions-e2e]';
const Q2 = 'Question two [versions-e2e]';
const FORK_FOLLOW_UP = 'A follow-up in the fork [versions-e2e]';

isolatedTest(
  'copy_puts_a_message_s_text_on_the_clipboard_an_answer_as_its_markdown',
  { script: [{ text: '**Done.** Run `make test`:\n\n- one\n- two' }] },
  async (session) => {
    const { panel, context, shop, pages } = session;
    // The browser's one clipboard, read from the test page (CDP grants no
    // permission to an extension's origin); each side needs the focus.
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: new URL(pages.url('shop.html')).origin });
    const clipboard = async () => {
      await shop.bringToFront();
      const text = await shop.evaluate(() => navigator.clipboard.readText());
      await panel.bringToFront();
      return text;
    };
    await panel.bringToFront();
    await panel.focus('#task-input');
    await typeAndPress(panel, 'How do I <test> it?', 'Enter');
    await waitForSettledTurn(panel);

    const answer = panel.locator('#messages .node.assistant').last();
    assert.equal(await answer.locator('strong').count(), 1, 'the answer is drawn as Markdown');
    await answer.getByRole('button', { name: 'Copy', exact: true }).click();
    // "Copied" once the write resolved: the clipboard is read after it (the
    // panel must keep the focus until then).
    await waitFor(async () => (await answer.getByRole('button', { name: 'Copied' }).count()) === 1, { timeout: 5000, message: 'the button to say Copied' });
    assert.equal(await clipboard(), '**Done.** Run `make test`:\n\n- one\n- two', 'the Markdown source, not the drawing');
    await waitFor(async () => (await answer.getByRole('button', { name: 'Copy', exact: true }).count()) === 1, { timeout: 10000, message: 'the button to read Copy again' });

    const question = panel.locator('#messages .node.user').last();
    await pressOn(question.getByRole('button', { name: 'Copy', exact: true }));
    await waitFor(async () => (await question.getByRole('button', { name: 'Copied' }).count()) === 1, { timeout: 5000, message: 'the question\'s button to say Copied' });
    assert.equal(await clipboard(), 'How do I <test> it?', 'the user\'s text as typed');
    const after = await readPanel(panel);
    assert.equal(after.state, 'completed', 'copying sent nothing');
    assert.equal((await conversation(panel)).length, 2, 'copying changed no message');
  },
);

isolatedTest(
  'edit_and_resend_switch_versions_and_fork_from_the_panel',
  {
    script: [
      { text: 'Answer one.' },
      { text: 'Answer two.' },
      { text: 'Answer to the edited question.' },
      { text: 'Answer in the fork.' },
      // The turn during which an edit and a version switch are refused.
      { stallMs: STALL_FOREVER_MS, text: 'Working', tickMs: 250, tickText: '.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await panel.focus('#task-input');
    await typeAndPress(panel, Q1, 'Enter');
    const first = await waitForSettledTurn(panel);
    await typeAndPress(panel, Q2, 'Enter');
    const second = await waitForSettledTurn(panel, { previousTurnId: first.turnId });
    assert.deepEqual(await conversation(panel), [`user: ${Q1}`, 'agent: Answer one.', `user: ${Q2}`, 'agent: Answer two.']);

    // Every message offers Fork from here; the messages that opened a turn offer Edit.
    const q1 = panel.locator('#messages .node.user', { hasText: Q1 });
    const answerOne = panel.locator('#messages .node.assistant', { hasText: 'Answer one.' });
    assert.equal(await q1.getByRole('button', { name: 'Edit', exact: true }).count(), 1);
    assert.equal(await q1.getByRole('button', { name: 'Fork from here' }).count(), 1);
    assert.equal(await answerOne.getByRole('button', { name: 'Fork from here' }).count(), 1);
    assert.equal(await answerOne.getByRole('button', { name: 'Edit', exact: true }).count(), 0, 'the agent\'s messages are not edited');
    assert.equal(await panel.locator('#messages .branch-switcher').count(), 0, 'no versions yet');
    const q1NodeId = await q1.getAttribute('data-node-id');

    // Edit with the keyboard: Enter opens the editor on the text, Esc closes it and sends nothing.
    await pressOn(q1.getByRole('button', { name: 'Edit', exact: true }));
    assert.deepEqual(await focused(panel), { tag: 'textarea', name: 'Edit your message', action: '', id: '', value: Q1 });
    await panel.keyboard.press('Escape');
    assert.equal(await panel.locator('#messages .message-editor').count(), 0, 'Esc closed the editor');
    assert.equal((await focused(panel)).action, 'edit', 'focus back on the Edit button');
    assert.equal((await readPanel(panel)).state, 'completed', 'Esc in the editor did nothing else');

    // Enter sends the new text as a new version of that turn.
    await panel.keyboard.press('Enter');
    await panel.keyboard.press('Control+A');
    await typeAndPress(panel, Q1_EDITED, 'Enter');
    const edited = await waitForSettledTurn(panel, { previousTurnId: second.turnId });
    assert.equal(edited.state, 'completed', describeState(edited));
    const [editOp] = (await sentOps(panel, 'turn.submit')).filter((op) => op.replaces);
    assert.deepEqual({ replaces: editOp.replaces, text: editOp.input.text, threadId: editOp.threadId }, { replaces: q1NodeId, text: Q1_EDITED, threadId: editOp.threadId });
    assert.equal((await answerTo(panel, editOp.submissionId, 'the edit')).type, 'command.ack');
    await waitFor(async () => (await conversation(panel)).length === 2, { timeout: 15000, message: 'the new version drawn' });
    assert.deepEqual(await conversation(panel), [`user: ${Q1_EDITED}`, 'agent: Answer to the edited question.'], 'the new version replaces the old turn and what followed');
    const editRequest = mock.requests()[2];
    const userTexts = requestMessages(editRequest).filter((m) => m.role === 'user').map((m) => withoutContextNote(messageText(m)));
    assert.deepEqual(userTexts.filter((t) => t.includes('[versions-e2e]')), [Q1_EDITED], 'the model saw only the new version');

    // The version switcher, from the snapshot's branches.
    const snapshot = await lastSnapshot(panel);
    assert.equal(snapshot.thread.branches.length, 1, JSON.stringify(snapshot.thread.branches));
    const [point] = snapshot.thread.branches;
    assert.equal(point.nodeIds.length, 2);
    assert.equal(point.active, 1);
    const q1Edited = panel.locator('#messages .node.user', { hasText: Q1_EDITED });
    const switcher = q1Edited.getByRole('group', { name: 'Version 2 of 2' });
    assert.equal(await switcher.count(), 1, 'the edited message says which version it is');
    assert.equal((await switcher.textContent()).replace(/\s+/g, ''), '‹2/2›');
    assert.equal(await switcher.getByRole('button', { name: 'Next version' }).isDisabled(), true);
    await screenshot(panel, 'versions');

    // ‹ with the keyboard: thread.selectBranch to the first version; focus stays on the switcher.
    await pressOn(switcher.getByRole('button', { name: 'Previous version' }));
    await waitFor(async () => (await conversation(panel)).length === 4, { timeout: 30000, message: 'the first version drawn again' });
    assert.deepEqual(await conversation(panel), [`user: ${Q1}`, 'agent: Answer one.', `user: ${Q2}`, 'agent: Answer two.']);
    const [select] = await sentOps(panel, 'thread.selectBranch');
    assert.equal(select.nodeId, point.nodeIds[0]);
    assert.equal((await answerTo(panel, select.submissionId, 'the switch')).type, 'command.ack');
    assert.equal(await panel.locator('#messages .node.user', { hasText: Q1 }).getByRole('group', { name: 'Version 1 of 2' }).count(), 1);
    assert.equal((await focused(panel)).name, 'Next version', 'the focus stays on the switcher (‹ is disabled at 1/2)');
    assert.equal(mock.requests().length, 3, 'switching versions asks the model nothing');
    // › (focused): back to the edited version.
    await panel.keyboard.press('Enter');
    await waitFor(async () => (await conversation(panel))[0] === `user: ${Q1_EDITED}`, { timeout: 30000, message: 'the edited version again' });
    assert.equal((await focused(panel)).name, 'Previous version');

    // Narrow and dark: it still fits.
    await panel.setViewportSize({ width: 320, height: 640 });
    await panel.emulateMedia({ colorScheme: 'dark' });
    await q1Edited.hover();
    await assertFitsWidth(panel, 'versions at 320 px');
    await screenshot(panel, 'versions-320-dark');
    await panel.setViewportSize({ width: 500, height: 800 });
    await panel.emulateMedia({ colorScheme: 'light' });
    await assertFitsWidth(panel, 'versions at 500 px');

    // Fork from the agent's answer: a new thread with the conversation up to there, opened.
    const originalThreadId = snapshot.thread.id;
    const answerEdited = panel.locator('#messages .node.assistant', { hasText: 'Answer to the edited question.' });
    const answerNodeId = await answerEdited.getAttribute('data-node-id');
    await pressOn(answerEdited.getByRole('button', { name: 'Fork from here' }));
    const [fork] = await sentOps(panel, 'thread.fork');
    assert.deepEqual({ threadId: fork.threadId, nodeId: fork.nodeId }, { threadId: originalThreadId, nodeId: answerNodeId });
    const forkAck = await answerTo(panel, fork.submissionId, 'the fork');
    assert.equal(forkAck.type, 'command.ack', JSON.stringify(forkAck));
    const forkThreadId = forkAck.result.threadId;
    assert.notEqual(forkThreadId, originalThreadId);
    await waitFor(async () => (await lastSnapshot(panel))?.thread?.id === forkThreadId && (await panel.inputValue('#thread-list')) === forkThreadId, { timeout: 30000, message: 'the fork opened' });
    assert.deepEqual(await conversation(panel), [`user: ${Q1_EDITED}`, 'agent: Answer to the edited question.']);
    assert.equal(await panel.locator('#messages .branch-switcher').count(), 0, 'the fork has one version');
    assert.equal((await focused(panel)).id, 'task-input', 'the composer is ready for the fork');
    assert.match(await panel.locator('#composer-note').textContent(), /new thread/);
    await typeAndPress(panel, FORK_FOLLOW_UP, 'Enter');
    await waitForSettledTurn(panel, { previousTurnId: edited.turnId });
    assert.deepEqual(await conversation(panel), [`user: ${Q1_EDITED}`, 'agent: Answer to the edited question.', `user: ${FORK_FOLLOW_UP}`, 'agent: Answer in the fork.']);
    const forkRequest = mock.requests().at(-1);
    assert.deepEqual(
      requestMessages(forkRequest).filter((m) => m.role !== 'system').map((m) => `${m.role}: ${withoutContextNote(messageText(m))}`),
      [`user: ${Q1_EDITED}`, 'assistant: Answer to the edited question.', `user: ${FORK_FOLLOW_UP}`],
      'the fork continues from the copied conversation',
    );

    // Choosing another thread: until its snapshot arrives, the messages are
    // still the fork's, so they are marked busy (dimmed, no clicks) and say
    // whose they are; the snapshot redraws them as the original's.
    const forkConversation = await conversation(panel);
    const messagesOf = () => panel.evaluate(() => {
      const messages = document.getElementById('messages');
      return { thread: messages.dataset.threadId, busy: messages.getAttribute('aria-busy') === 'true', clicks: getComputedStyle(messages).pointerEvents !== 'none' };
    });
    assert.deepEqual(await messagesOf(), { thread: forkThreadId, busy: false, clicks: true });
    const release = await holdOutgoing(panel, ['initialize']);
    await panel.selectOption('#thread-list', originalThreadId);
    const [opening] = (await sentOps(panel, 'initialize')).slice(-1);
    assert.equal(opening.threadId, originalThreadId);
    assert.deepEqual(await messagesOf(), { thread: forkThreadId, busy: true, clicks: false }, 'the fork\'s messages, marked busy');
    assert.deepEqual(await conversation(panel), forkConversation);
    await screenshot(panel, 'thread-switch-pending');
    await release();
    await waitFor(async () => (await messagesOf()).thread === originalThreadId, { timeout: 30000, message: 'the original thread drawn' });
    assert.deepEqual(await messagesOf(), { thread: originalThreadId, busy: false, clicks: true });
    assert.deepEqual(await conversation(panel), [`user: ${Q1_EDITED}`, 'agent: Answer to the edited question.']);
    await panel.selectOption('#thread-list', forkThreadId);
    await waitFor(async () => (await messagesOf()).thread === forkThreadId, { timeout: 30000, message: 'the fork drawn again' });
    assert.deepEqual(await conversation(panel), forkConversation);
    // A thread that cannot be opened (its read failed): the panel stays on
    // the one it shows, says why, and takes clicks again.
    const releaseAgain = await holdOutgoing(panel, ['initialize']);
    await panel.selectOption('#thread-list', originalThreadId);
    const [failing] = (await sentOps(panel, 'initialize')).slice(-1);
    await injectIncoming(panel, {
      type: 'command.reject',
      submissionId: failing.submissionId,
      opType: 'initialize',
      error: { kind: 'storage', message: 'Could not read the conversation from storage.' },
    });
    assert.deepEqual(await messagesOf(), { thread: forkThreadId, busy: false, clicks: true });
    assert.equal(await panel.inputValue('#thread-list'), forkThreadId, 'the list shows the thread shown');
    assert.match((await readPanel(panel)).error ?? '', /Could not read the conversation from storage/);
    await releaseAgain({ drop: true });
    await panel.locator('#error-dismiss').click();

    // Delete the fork: two presses (Esc cancels the first), then the list has the original only.
    const deleteButton = panel.getByRole('button', { name: /^Delete thread: / });
    await pressOn(deleteButton);
    assert.equal(await panel.locator('#delete-thread-button').textContent(), 'Confirm delete');
    assert.match(await panel.locator('#delete-thread-note').textContent(), /Delete this thread with all its messages and versions\?/);
    await panel.keyboard.press('Escape');
    assert.equal(await panel.locator('#delete-thread-button').textContent(), 'Delete', 'Esc cancelled');
    await panel.keyboard.press('Enter');
    await panel.keyboard.press('Enter');
    const [removal] = await sentOps(panel, 'thread.delete');
    assert.equal(removal.threadId, forkThreadId);
    assert.equal((await answerTo(panel, removal.submissionId, 'the delete')).type, 'command.ack');
    await waitFor(
      async () => (await panel.evaluate(() => [...document.querySelectorAll('#thread-list option')].map((o) => o.value))).join() === originalThreadId
        && (await lastSnapshot(panel))?.thread?.id === originalThreadId,
      { timeout: 30000, message: 'the fork gone and the original thread shown' },
    );
    const threadsLeft = await stored(panel, 'threads');
    assert.deepEqual(threadsLeft.map((t) => t.id), [originalThreadId], 'the fork is deleted from storage');

    // Back in the original thread: unchanged, with its two versions.
    await waitFor(async () => (await conversation(panel))[0] === `user: ${Q1_EDITED}`, { timeout: 30000, message: 'the original thread' });
    assert.deepEqual(await conversation(panel), [`user: ${Q1_EDITED}`, 'agent: Answer to the edited question.']);

    // While a turn runs, an edit and a version switch are refused with the engine's reason.
    await panel.focus('#task-input');
    await typeAndPress(panel, 'Keep working on it', 'Enter');
    await waitForRunState(panel, ['streaming_model']);
    const editedNow = panel.locator('#messages .node.user', { hasText: Q1_EDITED });
    await pressOn(editedNow.getByRole('button', { name: 'Edit', exact: true }));
    await panel.keyboard.press('Control+A');
    await typeAndPress(panel, 'An edit while it runs', 'Enter');
    const refusal = await waitFor(
      async () => (await panel.locator('#messages .message-editor .editor-error').textContent())?.trim() || null,
      { timeout: 30000, message: 'the refusal in the editor' },
    );
    assert.equal(refusal, 'Not sent: A turn is running on this thread; stop it (Esc) before editing a message.');
    assert.deepEqual(await focused(panel), { tag: 'textarea', name: 'Edit your message', action: '', id: '', value: 'An edit while it runs' }, 'the text stays in the editor');
    await screenshot(panel, 'edit-refused');
    await panel.keyboard.press('Escape');
    assert.equal(await panel.locator('#messages .message-editor').count(), 0);
    assert.equal((await readPanel(panel)).state, 'streaming_model', 'Esc in the editor did not stop the turn');
    assert.equal((await sentOps(panel, 'turn.interrupt')).length, 0);
    await pressOn(editedNow.getByRole('group', { name: 'Version 2 of 2' }).getByRole('button', { name: 'Previous version' }));
    const banner = await waitFor(async () => (await readPanel(panel)).error || null, { timeout: 30000, message: 'the refused switch in the error banner' });
    assert.match(banner, /Could not switch to another version of the conversation: A turn is running on this thread; stop it \(Esc\) before switching branches\./);
    assert.equal((await readPanel(panel)).state, 'streaming_model');
    await panel.focus('#task-input');
    await panel.keyboard.press('Escape');
    await waitForRunState(panel, ['interrupted']);
  },
);

const QUEUED_ONE = 'Queued first [queue-edit-e2e]';
const QUEUED_ONE_EDITED = 'Queued first, edited [queue-edit-e2e]';
const QUEUED_TWO = 'Queued second [queue-edit-e2e]';

isolatedTest(
  'queued_messages_are_edited_in_place_and_removed',
  {
    script: [
      { stallMs: STALL_FOREVER_MS, text: 'Working', tickMs: 250, tickText: '.' },
      { text: 'Continuing.' },
      { text: 'Answer to the edited queued message.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await panel.focus('#task-input');
    await typeAndPress(panel, 'A long task', 'Enter');
    await waitForRunState(panel, ['streaming_model']);
    await typeAndPress(panel, QUEUED_ONE, 'Shift+Alt+Enter');
    await typeAndPress(panel, QUEUED_TWO, 'Shift+Alt+Enter');
    const queueTexts = () => panel.evaluate(() => [...document.querySelectorAll('#queue-list li')].map((li) => li.querySelector('.queue-text')?.textContent ?? `(editing) ${li.querySelector('input')?.value ?? ''}`));
    await waitFor(async () => (await queueTexts()).length === 2, { timeout: 30000, message: 'two queued messages' });
    assert.deepEqual(await queueTexts(), [QUEUED_ONE, QUEUED_TWO]);
    const editFirst = panel.getByRole('button', { name: `Edit queued message: ${QUEUED_ONE}` });
    assert.equal(await editFirst.count(), 1, 'each queued message has a named Edit button');
    assert.equal(await panel.getByRole('button', { name: `Remove queued message: ${QUEUED_TWO}` }).count(), 1);

    // Keyboard: Enter opens the editor, Esc cancels without sending anything and keeps the run going.
    await pressOn(editFirst);
    assert.deepEqual(await focused(panel), { tag: 'input', name: 'Edit queued message', action: '', id: '', value: QUEUED_ONE });
    await screenshot(panel, 'queue-editing');
    await panel.keyboard.press('Escape');
    assert.equal((await focused(panel)).name, `Edit queued message: ${QUEUED_ONE}`);
    assert.equal((await sentOps(panel, 'queue.update')).length, 0);
    assert.equal((await readPanel(panel)).state, 'streaming_model', 'Esc in the queue editor did not stop the turn');

    // Enter saves: queue.update, acknowledged; the list shows the new text.
    await panel.keyboard.press('Enter');
    await panel.keyboard.press('Control+A');
    await typeAndPress(panel, QUEUED_ONE_EDITED, 'Enter');
    const [edit] = await sentOps(panel, 'queue.update');
    assert.equal(edit.input.text, QUEUED_ONE_EDITED);
    assert.equal((await answerTo(panel, edit.submissionId, 'queue.update')).type, 'command.ack');
    await waitFor(async () => (await queueTexts())[0] === QUEUED_ONE_EDITED, { timeout: 15000, message: 'the edited text in the list' });
    assert.equal((await focused(panel)).name, `Edit queued message: ${QUEUED_ONE_EDITED}`, 'focus back on the item');
    const update = (await portMessages(panel, 'in')).filter((e) => e.message.type === 'queue.updated').at(-1).message;
    assert.deepEqual(update.queue.map((item) => item.text), [QUEUED_ONE_EDITED, QUEUED_TWO], 'the engine holds the new text');
    assert.equal(update.queue[0].id, edit.itemId, 'in place: the same item');

    // Remove the second one.
    await pressOn(panel.getByRole('button', { name: `Remove queued message: ${QUEUED_TWO}` }));
    await waitFor(async () => (await queueTexts()).length === 1, { timeout: 15000, message: 'the removed item gone' });
    assert.deepEqual(await queueTexts(), [QUEUED_ONE_EDITED]);

    // Stop, Continue: the queued (edited) message runs next, as edited.
    await panel.focus('#task-input');
    await panel.keyboard.press('Escape');
    await waitForRunState(panel, ['interrupted']);
    await panel.click('#continue-button');
    await waitFor(
      async () => {
        const state = await readPanel(panel);
        return state.state === 'completed' && state.nodes.some((n) => n.text.includes('Answer to the edited queued message.')) ? state : null;
      },
      { timeout: 120000, message: 'the queued turn to complete' },
    );
    const userTexts = mock.requests().flatMap((request) => requestMessages(request).filter((m) => m.role === 'user').map((m) => withoutContextNote(messageText(m))));
    assert.ok(userTexts.includes(QUEUED_ONE_EDITED), 'the model got the edited text');
    assert.ok(!userTexts.some((text) => text === QUEUED_ONE || text === QUEUED_TWO), 'never the old text nor the removed message');
    assert.deepEqual(await queueTexts(), []);
  },
);

isolatedTest(
  'test_connection_reports_success_and_errors_in_plain_words',
  {
    script: [
      { text: 'pong' },
      { error: { status: 401, body: 'Incorrect API key provided.' } },
      { error: { status: 404, body: 'The model `mock-missing` does not exist.' } },
      { error: { status: 429, headers: { 'retry-after': '30' }, body: 'Rate limit reached.' } },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await panel.click('#settings-toggle');
    await panel.locator('#settings-base-url').waitFor({ state: 'visible', timeout: 15000 });
    await waitFor(async () => (await panel.inputValue('#settings-model')) !== '', { timeout: 15000, message: 'the stored settings in the form' });
    const testButton = panel.getByRole('button', { name: 'Test connection' });
    const runTest = async (what) => {
      const before = mock.requests().length;
      const previous = await panel.locator('#settings-test-result').textContent();
      await pressOn(testButton);
      const outcome = await waitFor(
        async () => {
          const read = await panel.evaluate(() => {
            const element = document.getElementById('settings-test-result');
            return { outcome: element.dataset.outcome, kind: element.dataset.kind, text: element.textContent.trim(), visible: !element.hidden };
          });
          return read.outcome === 'ok' || read.outcome === 'error' ? read : null;
        },
        { timeout: 60000, message: `the test result (${what})` },
      );
      assert.notEqual(outcome.text, previous);
      assert.equal(mock.requests().length, before + 1, `${what}: exactly one provider request`);
      return { ...outcome, request: mock.requests().at(-1) };
    };

    // Success: the model, the time it took, its reply.
    const ok = await runTest('success');
    assert.equal(ok.outcome, 'ok');
    assert.match(ok.text, /^Connection works: mock-1 answered in [\d,]+ ms\. It replied: “pong”\.$/);
    assert.equal(ok.request.body.model, 'mock-1');
    assert.equal(ok.request.headers.authorization, `Bearer ${TEST_API_KEY}`, 'the stored key was used');
    assert.equal(await panel.locator('#settings-test-result').getAttribute('role'), 'status', 'the result is announced');
    await screenshot(panel, 'settings-test-ok');

    // A wrong key: saved first (the engine reads the stored key), then the provider says 401.
    await panel.fill('#settings-api-key', 'sk-wrong-KEY-0000');
    const auth = await runTest('401');
    assert.equal((await panel.evaluate(async () => (await chrome.storage.local.get('settings')).settings.apiKey)), 'sk-wrong-KEY-0000', 'saved before testing');
    assert.equal(auth.request.headers.authorization, 'Bearer sk-wrong-KEY-0000');
    assert.deepEqual([auth.outcome, auth.kind], ['error', 'auth']);
    assert.match(auth.text, /^Test failed: The provider rejected the API key\. Copy the key again from your provider's dashboard, paste it above, and test again\./);
    assert.match(auth.text, /Details: .*401/);
    await panel.emulateMedia({ colorScheme: 'dark' });
    await screenshot(panel, 'settings-test-error-dark');
    await panel.emulateMedia({ colorScheme: 'light' });

    // An unknown model.
    await panel.fill('#settings-api-key', TEST_API_KEY);
    await panel.fill('#settings-model', 'mock-missing');
    const missing = await runTest('404');
    assert.equal(missing.request.body.model, 'mock-missing');
    assert.deepEqual([missing.outcome, missing.kind], ['error', 'model_not_found']);
    assert.match(missing.text, /^Test failed: The provider does not know the model “mock-missing”\. Check the model name/);

    // Rate limited: said once, not retried behind the user's back.
    await panel.fill('#settings-model', 'mock-1');
    const limited = await runTest('429');
    assert.deepEqual([limited.outcome, limited.kind], ['error', 'rate_limited']);
    assert.match(limited.text, /^Test failed: The provider is rate limiting requests right now\. Wait a minute and test again/);

    // The network is down: nothing listens at the base URL.
    const closedPort = await new Promise((resolve, reject) => {
      const server = net.createServer();
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address();
        server.close(() => resolve(port));
      });
    });
    const deadUrl = `http://127.0.0.1:${closedPort}/v1`;
    await panel.fill('#settings-base-url', deadUrl);
    const before = mock.requests().length;
    await pressOn(testButton);
    const down = await waitFor(
      async () => {
        const read = await panel.evaluate(() => {
          const element = document.getElementById('settings-test-result');
          return { outcome: element.dataset.outcome, kind: element.dataset.kind, text: element.textContent.trim() };
        });
        return read.outcome === 'error' && read.kind !== 'rate_limited' ? read : null;
      },
      { timeout: 60000, message: 'the network failure' },
    );
    assert.equal(mock.requests().length, before);
    assert.equal(down.kind, 'network');
    assert.ok(down.text.startsWith(`Test failed: Could not reach the provider at ${deadUrl}. Check the base URL and your internet connection`), down.text);

    // Nothing was written: no thread, no run, no receipt; the key never crossed the Port.
    for (const storeName of ['threads', 'runs', 'nodes']) {
      assert.deepEqual(await stored(panel, storeName), [], `no ${storeName} written by a test`);
    }
    const ports = (await portLog(panel)) ?? [];
    assert.ok(!ports.some((entry) => entry.json && (entry.json.includes(TEST_API_KEY) || entry.json.includes('sk-wrong-KEY-0000'))), 'the key never crosses the Port');
    const tests = await sentOps(panel, 'provider.test');
    assert.equal(tests.length, 5);
    assert.deepEqual(Object.keys(tests[0].profile).sort(), ['baseUrl', 'contextWindow', 'kind', 'maxOutputTokens', 'model', 'temperatureCenti', 'tokenBudget', 'toolUse', 'vision']);
  },
);

isolatedTest(
  'input_typed_while_another_thread_opens_waits_for_it_and_goes_to_that_thread',
  {
    script: [
      { text: 'Answer in the first thread.' },
      // The second thread's run keeps going while the user switches away.
      { stallMs: STALL_FOREVER_MS, text: 'Working', tickMs: 250, tickText: '.' },
      { text: 'Second answer in the first thread.' },
      { text: 'Answer in the third thread.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await submitTask(panel, 'First question');
    const done = await waitForSettledTurn(panel);
    assert.equal(done.state, 'completed', describeState(done));
    const firstThreadId = (await lastSnapshot(panel)).thread.id;
    await openNewThread(panel, firstThreadId);
    await submitTask(panel, 'Work on this for a while');
    await waitForRunState(panel, ['streaming_model']);
    const submits = (await sentOps(panel, 'turn.submit')).length;

    // The user picks the first thread and types at once, before it is shown:
    // the panel still shows the running thread, so sending now would steer
    // the first thread with the second thread's turn. It waits instead.
    const release = await holdOutgoing(panel, ['initialize']);
    await panel.selectOption('#thread-list', firstThreadId);
    // The messages still shown are the second thread's: a key press on one
    // of their buttons does nothing (a fork would name the first thread
    // with the second thread's message).
    await pressOn(panel.locator('#messages .node.user').first().getByRole('button', { name: 'Fork from here' }));
    assert.deepEqual(await sentOps(panel, 'thread.fork'), [], 'no fork from a message of the thread being left');
    assert.equal(await panel.locator('#composer-note').textContent(), OPENING_NOTE, 'the panel says why nothing happened');
    await submitTask(panel, 'A follow-up for the first thread');
    assert.equal(await panel.locator('#composer-note').textContent(), 'Sends when the thread is shown…');
    assert.equal(await panel.inputValue('#task-input'), 'A follow-up for the first thread', 'kept in the composer until sent');
    assert.equal((await sentOps(panel, 'turn.submit')).length, submits, 'nothing sent yet');
    assert.deepEqual(await sentOps(panel, 'turn.steer'), []);
    await release();
    const sent = await waitFor(async () => (await sentOps(panel, 'turn.submit'))[submits], { timeout: 30000, message: 'the held input sent' });
    assert.equal(sent.threadId, firstThreadId);
    assert.deepEqual(sent.input, { text: 'A follow-up for the first thread' });
    assert.equal((await answerTo(panel, sent.submissionId, 'the held turn')).type, 'command.ack');
    const second = await waitForSettledTurn(panel, { previousTurnId: done.turnId });
    assert.equal(second.state, 'completed', describeState(second));
    assert.deepEqual(await conversation(panel), [
      'user: First question',
      'agent: Answer in the first thread.',
      'user: A follow-up for the first thread',
      'agent: Second answer in the first thread.',
    ]);
    assert.equal(await panel.locator('#composer-note').textContent(), '');
    assert.deepEqual(await sentOps(panel, 'turn.steer'), [], 'nothing was steered');
    assert.equal(mock.requests().length, 3);

    // A switch that is refused: the input held for it stays in the composer, unsent.
    const releaseAgain = await holdOutgoing(panel, ['initialize']);
    const other = await panel.evaluate((first) => [...document.querySelectorAll('#thread-list option')].map((o) => o.value).find((v) => v && v !== first), firstThreadId);
    await panel.selectOption('#thread-list', other);
    await submitTask(panel, 'Not for a thread that does not open');
    const [failing] = (await sentOps(panel, 'initialize')).slice(-1);
    assert.equal(failing.threadId, other);
    await injectIncoming(panel, {
      type: 'command.reject',
      submissionId: failing.submissionId,
      opType: 'initialize',
      error: { kind: 'storage', message: 'Could not read the conversation from storage.' },
    });
    assert.equal(await panel.inputValue('#task-input'), 'Not for a thread that does not open');
    assert.equal(await panel.locator('#composer-note').textContent(), '');
    await releaseAgain({ drop: true });
    assert.equal((await sentOps(panel, 'turn.submit')).length, submits + 1, 'nothing sent for the refused switch');
    await panel.fill('#task-input', '');

    // New thread, and a message typed before the engine created it: it goes
    // to the new thread, not to the one still shown.
    const releaseCreate = await holdOutgoing(panel, ['thread.create']);
    await panel.click('#new-thread-button');
    await submitTask(panel, 'Into the new thread');
    assert.equal(await panel.locator('#composer-note').textContent(), 'Sends when the thread is shown…');
    assert.equal((await sentOps(panel, 'turn.submit')).length, submits + 1, 'nothing sent before the thread exists');
    await releaseCreate();
    const third = await waitFor(async () => (await sentOps(panel, 'turn.submit'))[submits + 1], { timeout: 30000, message: 'the held input sent' });
    assert.ok(third.threadId && third.threadId !== firstThreadId && third.threadId !== other, `sent to the new thread (${third.threadId})`);
    assert.equal((await answerTo(panel, third.submissionId, 'the new thread\'s turn')).type, 'command.ack');
    await waitFor(async () => (await conversation(panel)).join('|') === 'user: Into the new thread|agent: Answer in the third thread.', {
      timeout: 30000,
      message: 'the new thread answered',
    });
  },
);

isolatedTest('a_page_without_a_site_is_not_offered_allow_on_this_site', {}, async (session) => {
  const { panel, pages } = session;
  await submitTask(panel, TASK);
  const card = await waitForApprovalCard(panel);
  const forSite = (c) => c.buttons.find((b) => b.id === 'approval-accept-site');
  assert.equal(card.origin, pages.origin);
  assert.equal(forSite(card).hidden, false, 'a site can be allowed');
  // The same question about a local file (file:// has no host: allowing
  // "the site" would allow every file; the engine refuses it too).
  const asked = (await portMessages(panel, 'in')).map((e) => e.message).filter((m) => m.type === 'approval.request').at(-1);
  assert.equal(asked.approval.id, card.approvalId);
  await injectIncoming(panel, {
    ...asked,
    approval: { ...asked.approval, id: 'a-file', origin: 'file://', url: 'file:///home/me/form.html' },
  });
  const local = await waitFor(async () => {
    const shown = await readApprovalCard(panel);
    return shown.approvalId === 'a-file' ? shown : null;
  }, { timeout: 15000, message: 'the card for the local file' });
  assert.equal(local.origin, 'file://');
  assert.equal(forSite(local).hidden, true, 'no Allow on this site for a local file');
  assert.equal(await panel.locator('#approval-site-hint').isHidden(), true);
  assert.equal(local.buttons.find((b) => b.id === 'approval-accept-once').hidden, false, 'once is offered');
});

isolatedTest('an_approval_card_of_the_thread_being_left_takes_no_answer', {}, async (session) => {
  const { panel, shop } = session;
  await submitTask(panel, TASK);
  const card = await waitForApprovalCard(panel);
  const threadA = (await lastSnapshot(panel)).thread.id;
  // A second, empty thread; then back to the first, whose card shows again.
  const threadB = await openNewThread(panel, threadA);
  await panel.selectOption('#thread-list', threadA);
  assert.equal((await waitForApprovalCard(panel)).approvalId, card.approvalId);

  // The user picks the empty thread, and presses Allow once before it is
  // shown: the card is the first thread's, the answer would name the
  // second thread. Nothing is sent.
  const release = await holdOutgoing(panel, ['initialize']);
  await panel.selectOption('#thread-list', threadB);
  await pressOn(panel.locator('#approval-accept-once'));
  assert.deepEqual(await sentOps(panel, 'approval.response'), [], 'no answer from the card of the thread being left');
  assert.equal(await panel.locator('#composer-note').textContent(), OPENING_NOTE, 'the panel says why nothing happened');
  await release();
  await waitFor(async () => (await lastSnapshot(panel))?.thread?.id === threadB && (await readApprovalCard(panel))?.visible === false, {
    timeout: 30000,
    message: 'the empty thread shown, without the card',
  });
  assert.equal(await panel.locator('#composer-note').textContent(), '', 'the note goes once the thread is shown');
  // Back on the first thread, the question still waits, and the answer counts.
  await panel.selectOption('#thread-list', threadA);
  await waitForApprovalCard(panel);
  await pressOn(panel.locator('#approval-accept-once'));
  const [answer] = await sentOps(panel, 'approval.response');
  assert.deepEqual({ threadId: answer.threadId, approvalId: answer.approvalId, decision: answer.decision }, { threadId: threadA, approvalId: card.approvalId, decision: 'acceptOnce' });
  const settled = await waitForSettledTurn(panel);
  assert.equal(settled.state, 'completed', describeState(settled));
  assert.equal(await subscribeClicks(shop), 1, 'Subscribe clicked once, after the answer given on its own thread');
});

/**
 * A first thread with one answered turn ("First question", answered with the
 * script's first text), then New thread (`how = 'fork'`: Fork from here on
 * that answer) and `text` typed at once. The engine makes the thread, but
 * its answer (the ACK and the snapshot) never reaches the panel
 * (`dropIncoming`; the test then kills the worker, as if it had died
 * first). The text waits in the composer.
 */
async function newThreadWithLostAnswer(panel, text, how = 'new') {
  await submitTask(panel, 'First question');
  const done = await waitForSettledTurn(panel);
  assert.equal(done.state, 'completed', describeState(done));
  const firstThreadId = (await lastSnapshot(panel)).thread.id;
  await dropIncoming(panel, ['command.ack', 'initialized']);
  if (how === 'fork') {
    await panel.locator('#messages .node.assistant').first().getByRole('button', { name: 'Fork from here' }).click();
  } else {
    await panel.click('#new-thread-button');
  }
  await submitTask(panel, text);
  assert.equal(await panel.locator('#composer-note').textContent(), 'Sends when the thread is shown…');
  const [create] = await sentOps(panel, how === 'fork' ? 'thread.fork' : 'thread.create');
  const lost = await answerTo(panel, create.submissionId, 'the thread.create');
  assert.equal(lost.type, 'command.ack');
  const created = lost.result.threadId;
  assert.ok(typeof created === 'string' && created !== firstThreadId);
  return { firstThreadId, create, created };
}

isolatedTest(
  'a_new_thread_whose_answer_was_lost_with_the_worker_opens_after_the_reconnect_and_takes_the_held_input',
  {
    script: [
      { text: 'Answer in the first thread.' },
      { text: 'Answer in the new thread.' },
    ],
  },
  async (session) => {
    const { panel, context, extensionId, mock } = session;
    const { firstThreadId, create, created } = await newThreadWithLostAnswer(panel, 'Into the new thread');
    await killServiceWorker(context, extensionId, { page: panel });

    // The panel reconnects: its `initialize` names the thread still shown,
    // and the create is sent again. The first thread's snapshot arrives
    // first and must not take the held message; the engine answers the
    // retry as it answered the first time, showing the new thread.
    const sent = await waitFor(
      async () => (await sentOps(panel, 'turn.submit')).find((op) => op.input.text === 'Into the new thread'),
      { timeout: 60000, message: 'the held input sent after the reconnect' },
    );
    assert.equal(sent.threadId, created, 'sent to the new thread, not to the one shown before');
    const creates = await sentOps(panel, 'thread.create');
    assert.deepEqual(creates.map((op) => op.submissionId), [create.submissionId, create.submissionId], 'the same create, sent again');
    await waitFor(async () => (await conversation(panel)).join('|') === 'user: Into the new thread|agent: Answer in the new thread.', {
      timeout: 60000,
      message: 'the new thread answered',
    });
    assert.equal(await panel.locator('#messages').getAttribute('data-thread-id'), created);
    assert.equal(await panel.locator('#composer-note').textContent(), '');
    const threads = await stored(panel, 'threads');
    assert.deepEqual(threads.map((t) => t.id).sort(), [created, firstThreadId].sort(), 'one thread created');
    const firstUsers = (await stored(panel, 'nodes')).filter((n) => n.threadId === firstThreadId && n.kind === 'user_message');
    assert.equal(firstUsers.length, 1, 'nothing more went to the first thread');
    assert.equal(mock.requests().length, 2);
  },
);

isolatedTest(
  'a_fork_whose_answer_was_lost_with_the_worker_opens_after_the_reconnect_and_takes_the_held_input',
  {
    script: [
      { text: 'Answer in the first thread.' },
      { text: 'Answer in the fork.' },
    ],
  },
  async (session) => {
    const { panel, context, extensionId, mock } = session;
    const { firstThreadId, create: fork, created } = await newThreadWithLostAnswer(panel, 'Into the fork', 'fork');
    await killServiceWorker(context, extensionId, { page: panel });
    const sent = await waitFor(
      async () => (await sentOps(panel, 'turn.submit')).find((op) => op.input.text === 'Into the fork'),
      { timeout: 60000, message: 'the held input sent after the reconnect' },
    );
    assert.equal(sent.threadId, created, 'sent to the fork, not to the thread it was forked from');
    assert.deepEqual((await sentOps(panel, 'thread.fork')).map((op) => op.submissionId), [fork.submissionId, fork.submissionId], 'the same fork, sent again');
    await waitFor(async () => (await conversation(panel)).join('|') === 'user: First question|agent: Answer in the first thread.|user: Into the fork|agent: Answer in the fork.', {
      timeout: 60000,
      message: 'the fork answered',
    });
    assert.equal(await panel.locator('#messages').getAttribute('data-thread-id'), created);
    const threads = await stored(panel, 'threads');
    assert.equal(threads.length, 2, 'forked once');
    const firstUsers = (await stored(panel, 'nodes')).filter((n) => n.threadId === firstThreadId && n.kind === 'user_message');
    assert.equal(firstUsers.length, 1, 'nothing more went to the first thread');
    assert.equal(mock.requests().length, 2);
  },
);

// A hidden panel lets go of its Port after 30 s (README, "Worker
// lifetime"), but not while something it sent waits for its answer: here
// a New thread whose op never reached the engine. Once answered, the panel
// lets go; shown again, it reconnects to the thread it shows.
isolatedTest(
  'a_hidden_panel_keeps_its_port_while_an_op_waits_for_its_answer_and_lets_go_after',
  { script: [{ text: 'Answer in the first thread.' }] },
  async (session) => {
    const { panel } = session;
    await submitTask(panel, 'First question');
    await waitForSettledTurn(panel);
    const firstThread = await panel.locator('#messages').getAttribute('data-thread-id');
    const connected = () => panel.evaluate(() => document.getElementById('connection').dataset.connected);
    const release = await holdOutgoing(panel, ['thread.create']);
    await panel.click('#new-thread-button');
    const [create] = await sentOps(panel, 'thread.create');
    assert.ok(create, 'thread.create sent (held on its way)');
    await setPageVisibility(panel, 'hidden');
    await new Promise((resolve) => setTimeout(resolve, 35000));
    assert.equal(await connected(), 'true', 'still connected: the new thread waits for its answer');
    await release();
    const created = await waitFor(async () => {
      const id = await panel.locator('#messages').getAttribute('data-thread-id');
      return id && id !== firstThread ? id : null;
    }, { timeout: 30000, message: 'the new thread shown' });
    await waitFor(async () => (await connected()) === 'false', { timeout: 60000, message: 'the hidden panel to let go of its Port once answered' });
    assert.match(await panel.locator('#connection').textContent(), /Paused while hidden/);
    await setPageVisibility(panel, 'visible');
    await waitFor(async () => (await connected()) === 'true', { timeout: 30000, message: 'the panel reconnected once shown' });
    const initializes = await sentOps(panel, 'initialize');
    assert.equal(initializes.at(-1).threadId, created, 'the reconnect opens the thread shown');
    assert.equal(await panel.locator('#messages').getAttribute('data-thread-id'), created);
  },
);

isolatedTest(
  'input_held_for_a_new_thread_deleted_before_it_was_shown_stays_in_the_composer',
  { script: [{ text: 'Answer in the first thread.' }] },
  async (session) => {
    const { panel, context, extensionId, mock } = session;
    const text = 'Into a thread that will be gone';
    const { firstThreadId, create, created } = await newThreadWithLostAnswer(panel, text);
    // Another panel deletes the new thread before this one sees it.
    const deleted = await panel.evaluate((threadId) => new Promise((resolve) => {
      const port = chrome.runtime.connect({ name: 'panel' });
      port.onMessage.addListener((message) => {
        if (message.submissionId !== 'delete-by-another-panel') return;
        port.disconnect();
        resolve(message);
      });
      port.postMessage({ type: 'thread.delete', clientId: 'another-panel', submissionId: 'delete-by-another-panel', threadId });
    }), created);
    assert.equal(deleted.type, 'command.ack', JSON.stringify(deleted));
    await killServiceWorker(context, extensionId, { page: panel });

    // The retried create is answered with the thread it made, which is gone:
    // the engine shows the most recent thread instead, and the text held for
    // the new thread is not sent to that one.
    await waitFor(
      async () => (await portMessages(panel, 'in')).filter((e) => e.message.submissionId === create.submissionId).length === 2,
      { timeout: 60000, message: 'the replayed answer to the create' },
    );
    await waitFor(
      async () => (await panel.locator('#composer-note').textContent()) === ''
        && (await panel.locator('#messages').getAttribute('aria-busy')) === null,
      { timeout: 30000, message: 'the panel settled on a thread' },
    );
    assert.equal(await panel.locator('#messages').getAttribute('data-thread-id'), firstThreadId);
    assert.equal(await panel.inputValue('#task-input'), text, 'the text stays in the composer');
    assert.deepEqual((await sentOps(panel, 'turn.submit')).filter((op) => op.input.text === text), [], 'not sent to another thread');
    assert.deepEqual(await conversation(panel), ['user: First question', 'agent: Answer in the first thread.']);
    assert.equal(mock.requests().length, 1);
  },
);

isolatedTest(
  'a_steer_answer_replayed_after_its_message_arrived_lists_nothing_as_waiting',
  {
    script: [
      { text: 'Waiting for the gate.', toolCalls: [{ name: 'wait_for', arguments: { text: GATE_TEXT, timeout_ms: 30000 } }] },
      { text: 'Noted the steer.' },
    ],
  },
  async (session) => {
    const { panel, shop, context, extensionId } = session;
    await submitTask(panel, 'Wait for the gate to open');
    await waitFor(
      async () => {
        const state = await readPanel(panel);
        return state.state === 'executing_tools' && toolCards(state).some((c) => c.toolName === 'wait_for' && c.status === 'running');
      },
      { timeout: 60000, message: 'the wait_for call running' },
    );
    // A steer whose ACK the panel never gets (the worker dies before it would
    // have been delivered, below); the agent reads the steer meanwhile.
    await dropIncoming(panel, ['command.ack']);
    const text = 'Also check the footer [steer-replay-e2e]';
    await submitTask(panel, text);
    const [sent] = await sentOps(panel, 'turn.steer');
    const first = await answerTo(panel, sent.submissionId, 'the steer');
    const steerId = first.result.steerId;
    assert.equal(typeof steerId, 'string', `a steer, not downgraded: ${JSON.stringify(first)}`);
    await shop.evaluate((gate) => {
      const p = document.createElement('p');
      p.textContent = gate;
      document.body.append(p);
    }, GATE_TEXT);
    const done = await waitForSettledTurn(panel);
    assert.equal(done.state, 'completed', describeState(done));
    assert.equal(await panel.locator(`#messages [data-node-id="${steerId}"]`).count(), 1, 'the steered message carries its steer id');

    // The reconnect re-sends the steer; the engine replays its ACK after the
    // snapshot that already shows the message. Nothing is listed as waiting.
    await killServiceWorker(context, extensionId, { page: panel });
    await waitFor(
      async () => (await portMessages(panel, 'in')).filter((e) => e.message.submissionId === sent.submissionId).length === 2,
      { timeout: 60000, message: 'the replayed answer to the steer' },
    );
    await panel.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => resolve())));
    assert.deepEqual(await panel.evaluate(() => [...document.querySelectorAll('#steer-list li')].map((li) => li.textContent)), [], 'no steer listed as not yet read');
    assert.equal(await panel.evaluate(() => document.getElementById('queue-section').hidden), true);
    assert.deepEqual(await conversation(panel), [
      'user: Wait for the gate to open',
      'agent: Waiting for the gate.',
      `user: steer ${text}`, // the steer badge, then the text
      'agent: Noted the steer.',
    ]);
  },
);

// ---------------------------------------------------------- long thread ---

/** Turns driven to seed the long thread: 3 nodes each (turn_context, user_message, assistant_message). */
const SEED_TURNS = 334;
const LONG_ANSWER = Array.from({ length: 40 }, (_, i) => `word${i + 1}`).join(' ');

isolatedTest('long_thread_streaming_touches_only_the_growing_element', {}, async (session) => {
  const { panel, mock } = session;
  // Seed a thread of more than 1,000 nodes by driving real turns fast (no
  // chunk delay) through a second Port of the panel page, like another panel.
  mock.setScript(Array.from({ length: SEED_TURNS }, (_, i) => ({ text: `Seed answer ${i + 1}.` })));
  const seededThreadId = await panel.evaluate(async (turns) => {
    const port = chrome.runtime.connect({ name: 'panel' });
    const clientId = crypto.randomUUID();
    /** @type {{ submissionId: string, turnId: string | null, ack: Function, done: Function, fail: Function } | null} */
    let waiting = null;
    port.onMessage.addListener((message) => {
      if (!waiting) return;
      if (message.submissionId === waiting.submissionId) {
        if (message.type === 'command.reject') waiting.fail(new Error(`${message.opType}: ${JSON.stringify(message.error)}`));
        else waiting.ack(message.result);
      } else if (message.type === 'turn.complete' && message.turnId === waiting.turnId) {
        waiting.done(message);
      }
    });
    const send = (op, untilComplete) => new Promise((resolve, reject) => {
      const submissionId = crypto.randomUUID();
      waiting = {
        submissionId,
        turnId: null,
        fail: reject,
        ack: (result) => {
          if (!untilComplete) return resolve(result);
          waiting.turnId = result.turnId;
          return undefined;
        },
        done: (complete) => (complete.stopReason === 'end' ? resolve(complete) : reject(new Error(`turn ended: ${complete.stopReason}`))),
      };
      port.postMessage({ ...op, clientId, submissionId });
    });
    // thread.create subscribes this Port to the thread, so it hears each turn.complete.
    const { threadId } = await send({ type: 'thread.create' }, false);
    for (let i = 0; i < turns; i += 1) {
      await send({ type: 'turn.submit', threadId, input: { text: `Seed question ${i + 1}` } }, true);
    }
    port.disconnect();
    return threadId;
  }, SEED_TURNS);
  assert.equal(mock.requests().length, SEED_TURNS);

  // Open it: the panel draws the whole thread from the snapshot.
  await panel.reload();
  await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });
  const snapshot = await waitFor(async () => {
    const found = await lastSnapshot(panel);
    return found?.thread?.id === seededThreadId ? found : null;
  }, { timeout: 60000, message: 'the seeded thread\'s snapshot' });
  const total = snapshot.thread.nodes.length + snapshot.thread.olderNodes;
  assert.ok(total >= 1000, `a thread of ${total} nodes`);
  // It arrives as its tail (the snapshot stays small); earlier pages on request.
  assert.ok(snapshot.thread.nodes.length <= 200 && snapshot.thread.olderNodes > 0, `the snapshot carries ${snapshot.thread.nodes.length} nodes`);
  // Drawn at the bottom, the list loads nothing by itself (a redraw's
  // transient scroll position does not count as the reader scrolling up).
  await panel.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
  const historyOpsSent = async () => (await portMessages(panel, 'out')).map((e) => e.message).filter((m) => m.type === 'thread.history');
  assert.equal((await historyOpsSent()).length, 0, 'no earlier page before the reader scrolls up');
  // Earlier pages load as the reader scrolls to the top; the last one by
  // keyboard (focus the button, Enter), which leaves the focus on the
  // earliest message.
  let pages = 0;
  for (;;) {
    const more = await panel.evaluate(() => {
      const button = document.querySelector('#messages > .load-earlier');
      return button ? { disabled: button.disabled, older: Number(/\((\d+) more/.exec(button.textContent)?.[1] ?? 0) } : null;
    });
    if (!more) break;
    if (more.disabled) continue;
    pages += 1;
    assert.ok(pages < 40, 'the earlier pages end');
    if (more.older > snapshot.thread.nodes.length) {
      await panel.evaluate(() => { document.getElementById('messages').scrollTop = 0; });
    } else {
      await panel.focus('#messages > .load-earlier');
      await panel.keyboard.press('Enter');
    }
    await waitFor(async () => (await historyOpsSent()).length >= pages && panel.evaluate(() => {
      const button = document.querySelector('#messages > .load-earlier');
      return !button || !button.disabled;
    }), { message: `page ${pages} of earlier messages` });
  }
  assert.ok(pages >= 4, `${pages} pages of earlier messages were loaded`);
  const historyOps = await historyOpsSent();
  assert.equal(historyOps.length, pages, 'one thread.history per page: none sent twice');
  assert.equal(new Set(historyOps.map((m) => m.beforeNodeId)).size, pages);
  // The earliest message has the focus, and the first question is drawn first.
  const firstText = await panel.evaluate(() => document.querySelector('#messages > .node')?.textContent ?? '');
  assert.ok(firstText.includes('Seed question 1'), firstText.slice(0, 80));
  const drawn = await panel.evaluate(() => document.querySelectorAll('#messages > .node').length);
  assert.equal(drawn, SEED_TURNS * 2, 'every user and agent message drawn (turn_context nodes have no element)');

  // Watch every change under #messages while a new answer streams in.
  await panel.evaluate(() => {
    const messages = document.getElementById('messages');
    for (const child of messages.children) child.__seeded = true;
    const describe = (node) => (node instanceof HTMLElement
      ? { nodeId: node.dataset.nodeId ?? '', streaming: node.classList.contains('streaming'), seeded: node.__seeded === true }
      : { nodeId: '#text', streaming: false, seeded: false });
    const log = [];
    window.__mutations = log;
    new MutationObserver((records) => {
      for (const record of records) {
        const element = record.target instanceof Element ? record.target : record.target.parentElement;
        // The conversation item the change is in (null: the list itself).
        const item = element === messages ? null : element?.closest('#messages > *');
        log.push({
          type: record.type,
          item: item ? item.dataset.nodeId ?? '?' : null,
          inList: element === messages || (item !== null && item !== undefined),
          attribute: record.attributeName,
          added: [...record.addedNodes].map(describe),
          removed: [...record.removedNodes].map(describe),
        });
      }
    }).observe(messages, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  mock.setScript([{ text: LONG_ANSWER, chunkDelayMs: 25 }]);
  const before = await readPanel(panel);
  await panel.focus('#task-input');
  await typeAndPress(panel, 'Now a long answer, please', 'Enter');
  const final = await waitFor(
    async () => {
      const state = await readPanel(panel);
      return state.state === 'completed' && state.turnId !== before.turnId && state.nodes.at(-1)?.text === LONG_ANSWER ? state : null;
    },
    { timeout: 120000, message: 'the long answer to complete' },
  );
  assert.equal(final.nodes.filter((n) => n.streaming).length, 0);

  const inbound = (await portMessages(panel, 'in')).map((e) => e.message);
  const start = inbound.find((m) => m.type === 'item.start' && m.kind === 'assistant_message' && m.turnId === final.turnId);
  assert.ok(start, 'the answer streamed as an item');
  const deltas = inbound.filter((m) => m.type === 'item.delta' && m.itemId === start.itemId && m.delta.kind === 'text');
  assert.ok(deltas.length >= 10, `the answer came in many deltas (${deltas.length})`);
  assert.equal(deltas.map((m) => m.delta.text).join(''), LONG_ANSWER);

  const log = await panel.evaluate(() => window.__mutations);
  const isStreamingItem = (entry) => entry.nodeId === start.itemId && entry.streaming;
  const appearedAt = log.findIndex((r) => r.item === null && r.added.some(isStreamingItem));
  const replacedAt = log.findIndex((r) => r.item === null && r.removed.some(isStreamingItem));
  assert.ok(appearedAt >= 0 && replacedAt > appearedAt, `the growing element was added, then replaced by the final one (${appearedAt}, ${replacedAt})`);
  const whileStreaming = log.slice(appearedAt + 1, replacedAt);
  const elsewhere = whileStreaming.filter((r) => r.item !== start.itemId);
  assert.deepEqual(elsewhere, [], 'while the answer streamed, nothing outside the growing element changed');
  const textChanges = whileStreaming.filter((r) => r.type === 'characterData');
  assert.equal(textChanges.length, deltas.length, 'each text delta is exactly one change of the growing element\'s text node');
  assert.ok(whileStreaming.every((r) => r.type !== 'childList' || r.removed.length === 0), 'nothing was removed while streaming');

  // Over the whole turn the list only grew: the user message, the growing answer, its final form.
  const listChanges = log.filter((r) => r.item === null);
  const added = listChanges.flatMap((r) => r.added);
  const removed = listChanges.flatMap((r) => r.removed);
  assert.deepEqual(removed, [{ nodeId: start.itemId, streaming: true, seeded: false }], 'only the streaming element left the list (replaced by the final message)');
  assert.equal(added.filter((a) => a.seeded).length, 0);
  assert.equal(added.length, 3, JSON.stringify(added));
  const intact = await panel.evaluate(() => [...document.getElementById('messages').children].filter((child) => child.__seeded).length);
  assert.equal(intact, SEED_TURNS * 2, 'none of the existing messages was redrawn');
  assert.equal(log.filter((r) => r.item !== null && r.item !== start.itemId).length, 0, 'no existing message was touched at all');

  // A list taller than its first page fills itself: in a tall panel the
  // snapshot's messages leave the list short, so earlier pages load with no
  // scrolling at all, and stop once the list scrolls.
  await panel.setViewportSize({ width: 500, height: 4000 });
  await panel.reload();
  await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded tall panel' });
  await waitFor(() => panel.evaluate(() => {
    const list = document.getElementById('messages');
    const button = list.querySelector(':scope > .load-earlier');
    return list.scrollHeight > list.clientHeight + 400 && (!button || !button.disabled);
  }), { message: 'the tall list to fill itself and settle' });
  const autoPages = (await historyOpsSent()).length;
  assert.ok(autoPages >= 1 && autoPages < pages, `${autoPages} of ${pages} pages loaded by themselves`);
});

isolatedTest(
  'a_thread_is_renamed_from_the_picker_keeps_its_name_and_is_deleted_with_its_running_turn',
  // The second and third answers stall: a rename while one runs is saved
  // too, and "Stop and delete" ends the third.
  { script: [{ text: 'Two plans.' }, { stallMs: STALL_FOREVER_MS, stallAt: 'headers' }, { stallMs: STALL_FOREVER_MS, stallAt: 'headers' }] },
  async (session) => {
    const { panel } = session;
    await submitTask(panel, 'Compare the plans');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', describeState(first));
    const selectedTitle = () => panel.evaluate(() => document.querySelector('#thread-list').selectedOptions[0]?.textContent ?? '');
    const titleBefore = await selectedTitle();
    const rename = panel.getByRole('button', { name: /^Rename thread: / });

    // Esc cancels: nothing is sent, the list is back, focus on Rename.
    await pressOn(rename);
    assert.equal((await focused(panel)).id, 'thread-title-input');
    assert.equal(await panel.inputValue('#thread-title-input'), titleBefore);
    assert.equal(await panel.locator('#thread-list').isVisible(), false);
    await panel.keyboard.type('Not this');
    await panel.keyboard.press('Escape');
    assert.equal(await panel.locator('#thread-title-input').isVisible(), false);
    assert.equal(await panel.locator('#thread-list').isVisible(), true);
    assert.equal((await focused(panel)).id, 'rename-thread-button');
    assert.equal((await sentOps(panel, 'thread.rename')).length, 0);
    assert.equal((await readPanel(panel)).state, 'completed', 'Esc in the field did not touch the turn');

    // Enter saves the title, its white space tidied.
    await panel.keyboard.press('Enter');
    await panel.keyboard.press('Control+A');
    await panel.keyboard.type('  Plans   compared ');
    await panel.keyboard.press('Enter');
    const [sent] = await sentOps(panel, 'thread.rename');
    assert.equal(sent.title, 'Plans compared');
    assert.equal((await answerTo(panel, sent.submissionId, 'the rename')).type, 'command.ack');
    await waitFor(async () => (await selectedTitle()) === 'Plans compared', { timeout: 30000, message: 'the new title in the list' });
    assert.equal((await focused(panel)).id, 'rename-thread-button');
    assert.deepEqual((await stored(panel, 'threads')).map((t) => t.title), ['Plans compared']);
    await screenshot(panel, 'thread-renamed');

    // While a turn runs, a rename is saved and the turn goes on; the
    // turn's later checkpoints keep it, and a new panel shows it.
    await submitTask(panel, 'And the prices?');
    await waitForRunState(panel, ['streaming_model']);
    assert.equal(await panel.locator('#rename-thread-button').isDisabled(), false);
    await pressOn(rename);
    await panel.keyboard.press('Control+A');
    await panel.keyboard.type('Plans and prices');
    await panel.keyboard.press('Enter');
    const running = (await sentOps(panel, 'thread.rename')).find((op) => op.title === 'Plans and prices');
    assert.ok(running, 'the rename was sent while the turn ran');
    assert.equal((await answerTo(panel, running.submissionId, 'the rename during the turn')).type, 'command.ack');
    await waitFor(async () => (await selectedTitle()) === 'Plans and prices', { timeout: 30000, message: 'the title while the turn runs' });
    assert.equal((await readPanel(panel)).state, 'streaming_model', 'the turn kept running');
    // Delete pressed while the turn runs asks whether to stop it too;
    // Esc cancels that question and leaves the turn running.
    await pressOn(panel.locator('#delete-thread-button'));
    assert.match(await panel.locator('#delete-thread-note').textContent(), /^This thread's turn is running\. Stop it and delete the thread/);
    assert.equal(await panel.locator('#delete-thread-button').textContent(), 'Stop and delete');
    await panel.keyboard.press('Escape');
    assert.equal(await panel.locator('#delete-thread-button').textContent(), 'Delete');
    assert.equal(await panel.locator('#delete-thread-note').textContent(), '');
    assert.equal((await sentOps(panel, 'thread.delete')).length, 0);
    assert.equal((await readPanel(panel)).state, 'streaming_model', 'Esc on the question did not stop the turn');
    // Asked while the turn ran, the question follows the turn's end.
    await pressOn(panel.locator('#delete-thread-button'));
    await panel.click('#stop-button');
    await waitForSettledTurn(panel, { previousTurnId: first.turnId, states: ['interrupted'] });
    assert.equal(await panel.locator('#delete-thread-button').textContent(), 'Delete', 'stop cancelled the question (the button lost focus)');
    assert.deepEqual((await stored(panel, 'threads')).map((t) => t.title), ['Plans and prices']);
    await panel.reload();
    await waitFor(async () => (await selectedTitle()) === 'Plans and prices', { timeout: 30000, message: 'the title after a reload' });

    // "Stop and delete": the turn is stopped (its end shown), then the
    // thread and everything in it are gone from the store.
    await submitTask(panel, 'And the delivery times?');
    await waitForRunState(panel, ['streaming_model']);
    const threadId = (await lastSnapshot(panel))?.thread?.id;
    await pressOn(panel.locator('#delete-thread-button'));
    await panel.keyboard.press('Enter');
    const [deleted] = await sentOps(panel, 'thread.delete');
    assert.deepEqual([deleted.threadId, deleted.stopTurn], [threadId, true]);
    assert.equal((await answerTo(panel, deleted.submissionId, 'the stop and delete')).type, 'command.ack');
    const received = (await portMessages(panel, 'in')).map((e) => e.message);
    const ended = received.findIndex((m) => m.type === 'turn.complete' && m.threadId === threadId && m.stopReason === 'interrupted');
    const acked = received.findIndex((m) => m.submissionId === deleted.submissionId);
    assert.ok(ended >= 0 && ended < acked, `the turn's end came before the ACK (${ended}, ${acked})`);
    assert.deepEqual(await stored(panel, 'threads'), []);
    assert.deepEqual(await stored(panel, 'nodes'), []);
    assert.deepEqual(await stored(panel, 'runs'), []);
  },
);

/**
 * Edits a drawn user message to `text` and sends it (Enter); resolves with
 * the last user message of the mock's `requests`th request, the edit's.
 */
async function editMessage(message, text, mock, requests) {
  await message.getByRole('button', { name: 'Edit', exact: true }).click();
  const editor = message.locator('textarea');
  await editor.fill(text);
  await editor.press('Enter');
  await waitFor(async () => mock.requests().length >= requests, { timeout: 60000, message: 'the edited turn\'s request' });
  return requestMessages(mock.requests().at(-1)).filter((m) => m.role === 'user').at(-1);
}

// Files attached in the composer (Attach button, paste): a small PNG sent as
// it is, a large image scaled to 1568 px and sent as JPEG, a text file as a
// delimited block, a PDF as a file part; an MP3 is refused with the reason. They reach the model in
// the OpenAI wire format, stay with the message in IndexedDB and in the
// transcript after a reload, and an edit of the message sends them again.
isolatedTest(
  'esc_closes_the_file_viewer_or_leaves_a_settings_field_without_stopping_the_turn',
  { script: [{ stallMs: 600000, text: 'Working on it' }] },
  async (session) => {
    const { panel } = session;
    await panel.setInputFiles('#attach-input', [{ name: 'list.csv', mimeType: 'text/csv', buffer: Buffer.from('sku,qty\nA1,2\n') }]);
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 1, { timeout: 15000, message: 'the file in the composer' });
    await submitTask(panel, 'Order these');
    await waitForRunState(panel, ['streaming_model']);
    // The viewer closes on Esc; the turn runs on.
    await panel.locator('#messages [data-kind="user_message"]').first().getByRole('button', { name: 'Open list.csv' }).click();
    const viewer = panel.locator('#attachment-viewer');
    await viewer.waitFor({ state: 'visible', timeout: 15000 });
    await panel.keyboard.press('Escape');
    await viewer.waitFor({ state: 'hidden', timeout: 15000 });
    // A Settings field: Esc there is the field's.
    await panel.click('#settings-toggle');
    await panel.focus('#settings-model');
    await panel.keyboard.press('Escape');
    await panel.click('#settings-toggle');
    // An Esc that stops sends turn.interrupt at once.
    assert.equal((await readPanel(panel)).state, 'streaming_model', 'still running');
    assert.deepEqual(await sentOps(panel, 'turn.interrupt'), [], 'nothing stopped it');
    // Anywhere else, Esc stops it.
    await panel.focus('#messages');
    await panel.keyboard.press('Escape');
    await waitForRunState(panel, ['interrupted']);
  },
);

isolatedTest(
  'files_attached_in_the_composer_reach_the_model_and_stay_with_the_message',
  { script: [{ text: 'I see them.' }, { text: 'Edited, still seen.' }] },
  async (session) => {
    const { panel, mock } = session;
    await enableVision(panel);

    const dot = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
    await panel.setInputFiles('#attach-input', [
      { name: 'dot.png', mimeType: 'image/png', buffer: Buffer.from(dot, 'base64') },
      { name: 'list.csv', mimeType: 'text/csv', buffer: Buffer.from('sku,qty\nA1,2\n') },
    ]);
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 2, { timeout: 15000, message: 'two files in the composer' });
    await panel.setInputFiles('#attach-input', [
      { name: 'song.mp3', mimeType: 'audio/mpeg', buffer: Buffer.from('ID3') },
      { name: 'doc.pdf', mimeType: 'application/pdf', buffer: Buffer.from('%PDF-1.4\n%%EOF\n') },
    ]);
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 3, { timeout: 15000, message: 'the PDF in the composer' });
    assert.match(await panel.locator('#composer-note').textContent(), /^song\.mp3: only images \(PNG, JPEG, GIF, WebP\), PDFs and text files can be attached\.$/);
    // A large image pasted into the composer.
    await panel.evaluate(async () => {
      const canvas = new OffscreenCanvas(3000, 2000);
      const context = canvas.getContext('2d');
      context.fillStyle = '#3366cc';
      context.fillRect(0, 0, 3000, 2000);
      const blob = await canvas.convertToBlob({ type: 'image/png' });
      const transfer = new DataTransfer();
      transfer.items.add(new File([blob], 'big.png', { type: 'image/png' }));
      document.getElementById('task-input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: transfer, bubbles: true, cancelable: true }));
    });
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 4, { timeout: 15000, message: 'the pasted image in the composer' });
    assert.deepEqual(await panel.locator('#attachment-list .attachment-name').allTextContents(), ['dot.png', 'list.csv', 'doc.pdf', 'big.png']);
    await screenshot(panel, 'attachments-composer');

    await submitTask(panel, 'Order these');
    const first = await waitForSettledTurn(panel);
    assert.equal(first.state, 'completed', describeState(first));
    assert.equal(await panel.locator('#attachment-list').isHidden(), true, 'the composer is empty again');

    const user = requestMessages(mock.requests()[0]).find((m) => m.role === 'user');
    assert.ok(Array.isArray(user.content), 'content parts');
    const text = user.content.filter((p) => p.type === 'text').map((p) => p.text).join('');
    assert.match(text, /^Order these\n\n<attached_file name="list\.csv" type="text\/csv">\nsku,qty\nA1,2\n\n<\/attached_file>/);
    const urls = user.content.filter((p) => p.type === 'image_url').map((p) => p.image_url.url);
    assert.equal(urls.length, 2);
    assert.equal(urls[0], `data:image/png;base64,${dot}`, 'a small PNG goes as it is');
    assert.match(urls[1], /^data:image\/jpeg;base64,/, 'a large image goes as JPEG');
    const size = await panel.evaluate(async (url) => {
      const bitmap = await createImageBitmap(await (await fetch(url)).blob());
      return [bitmap.width, bitmap.height];
    }, urls[1]);
    assert.deepEqual(size, [1568, 1045], 'scaled to 1568 px on its longer side');
    const [file] = user.content.filter((p) => p.type === 'file');
    assert.deepEqual(file.file, { filename: 'doc.pdf', file_data: `data:application/pdf;base64,${Buffer.from('%PDF-1.4\n%%EOF\n').toString('base64')}` });

    const nodes = await stored(panel, 'nodes');
    const message = nodes.find((n) => n.kind === 'user_message');
    assert.deepEqual(message.attachments.map((a) => [a.kind, a.name]), [['image', 'dot.png'], ['text', 'list.csv'], ['pdf', 'doc.pdf'], ['image', 'big.png']]);

    const drawn = async () => panel.evaluate(() => {
      const element = document.querySelector('#messages [data-kind="user_message"]');
      return {
        images: [...element.querySelectorAll('.attachment img')].map((img) => img.alt),
        names: [...element.querySelectorAll('.attachment-name')].map((n) => n.textContent),
      };
    });
    assert.deepEqual(await drawn(), { images: ['dot.png', 'big.png'], names: ['dot.png', 'list.csv', 'doc.pdf', 'big.png'] });
    await screenshot(panel, 'attachments-message');
    await panel.reload();
    await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });
    await waitFor(async () => (await drawn().catch(() => null))?.names.length === 4, { timeout: 30000, message: 'the files drawn after a reload' });

    // Each file opens: a text file and an image in the viewer (Esc closes it
    // and gives the focus back), a PDF in a new tab.
    const userMessage = panel.locator('#messages [data-kind="user_message"]').first();
    const openList = userMessage.getByRole('button', { name: 'Open list.csv' });
    await openList.click();
    const viewer = panel.locator('#attachment-viewer');
    await viewer.waitFor({ state: 'visible', timeout: 15000 });
    assert.equal(await panel.locator('#attachment-viewer-name').textContent(), 'list.csv');
    assert.equal(await viewer.locator('pre').textContent(), 'sku,qty\nA1,2\n');
    assert.equal(await panel.evaluate(() => document.activeElement?.id), 'attachment-viewer-close');
    await panel.keyboard.press('Escape');
    await viewer.waitFor({ state: 'hidden', timeout: 15000 });
    assert.equal(await panel.evaluate(() => document.activeElement?.getAttribute('aria-label')), 'Open list.csv', 'the focus is back on the file');
    await userMessage.getByRole('button', { name: 'Open big.png' }).click();
    await viewer.waitFor({ state: 'visible', timeout: 15000 });
    await waitFor(() => viewer.locator('img').evaluate((img) => img.complete && img.naturalWidth === 1568), { timeout: 15000, message: 'the image at its size' });
    await screenshot(panel, 'attachments-viewer');
    await panel.click('#attachment-viewer-close');
    await viewer.waitFor({ state: 'hidden', timeout: 15000 });
    const [pdfTab] = await Promise.all([
      session.context.waitForEvent('page', { timeout: 15000 }),
      userMessage.getByRole('button', { name: 'Open doc.pdf' }).click(),
    ]);
    assert.match(pdfTab.url(), /^blob:chrome-extension:\/\//, pdfTab.url());
    await pdfTab.close();

    // Edit the message: the new text goes with the same files.
    const edited = await editMessage(panel.locator('#messages [data-kind="user_message"]').first(), 'Order these, twice', mock, 2);
    assert.equal(edited.content.filter((p) => p.type === 'image_url').length, 2, 'the edit sends the images again');
    assert.equal(edited.content.filter((p) => p.type === 'file').length, 1, 'and the PDF');
    assert.match(messageText(edited), /^Order these, twice\n\n<attached_file name="list\.csv"/);
  },
);

// A snapshot carries at most 4 MiB of file content (the newest messages'
// first): an older message's PDF and image are shown by name, the image's
// thumbnail is fetched when it comes into view (`attachment.get`), the PDF
// opens after the panel fetched it, and both go again whole with an edit.
isolatedTest(
  'a_file_the_snapshot_leaves_out_opens_and_goes_again_with_an_edit',
  { script: [{ text: 'Read the first.' }, { text: 'Read the second.' }, { text: 'Read the first again.' }] },
  async (session) => {
    const { panel, mock } = session;
    await enableVision(panel);
    const pdf = (fill, bytes) => Buffer.from(`%PDF-1.4\n${fill.repeat(bytes)}\n%%EOF\n`);
    const attachPdf = async (name, buffer, count) => {
      await panel.setInputFiles('#attach-input', [{ name, mimeType: 'application/pdf', buffer }]);
      await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === count, { timeout: 15000, message: `${name} in the composer` });
    };
    const send = async (text, previousTurnId = '') => {
      await submitTask(panel, text);
      const settled = await waitForSettledTurn(panel, { previousTurnId });
      assert.equal(settled.state, 'completed', describeState(settled));
      return settled.turnId;
    };
    // The first message: a PDF (~3 MiB of base64) and a noisy PNG (sent as it is).
    await attachPdf('old.pdf', pdf('a', 2_300_000), 1);
    await panel.evaluate(async () => {
      const canvas = new OffscreenCanvas(300, 300);
      const context = canvas.getContext('2d');
      const pixels = context.createImageData(300, 300);
      // Noise (opaque) does not compress: the PNG stays ~350 KB.
      for (let i = 0; i < pixels.data.length; i += 1) pixels.data[i] = i % 4 === 3 ? 255 : Math.floor(Math.random() * 256);
      context.putImageData(pixels, 0, 0);
      const blob = await canvas.convertToBlob({ type: 'image/png' });
      const transfer = new DataTransfer();
      transfer.items.add(new File([blob], 'noise.png', { type: 'image/png' }));
      document.getElementById('task-input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: transfer, bubbles: true, cancelable: true }));
    });
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 2, { timeout: 15000, message: 'the pasted image in the composer' });
    const firstTurn = await send('Read this');
    const sentImage = requestMessages(mock.requests()[0]).find((m) => m.role === 'user').content.find((p) => p.type === 'image_url').image_url.url;
    assert.match(sentImage, /^data:image\/png;base64,/);
    assert.ok(sentImage.length > 100_000, `an image too large for what the budget leaves (${sentImage.length})`);
    // The second: a PDF that takes almost all of a snapshot's 4 MiB.
    await attachPdf('new.pdf', pdf('b', 3_100_000), 1);
    await send('And this', firstTurn);

    await panel.reload();
    await waitFor(() => panel.evaluate(() => document.body.dataset.ready === 'true'), { timeout: 60000, message: 'the reloaded panel' });
    const files = () => panel.evaluate(() => [...document.querySelectorAll('#messages [data-kind="user_message"] .attachment')]
      .map((li) => [li.querySelector('.attachment-name')?.textContent, li.dataset.kind, li.dataset.omitted === 'true']));
    await waitFor(async () => (await files()).length === 3, { timeout: 30000, message: 'both messages drawn' });
    assert.deepEqual(await files(), [['old.pdf', 'pdf', true], ['noise.png', 'image', true], ['new.pdf', 'pdf', false]]);
    const snapshot = (await portMessages(panel, 'in')).map((e) => e.message).filter((m) => m.type === 'initialized').at(-1);
    const sizeOfSnapshot = JSON.stringify(snapshot).length;
    assert.ok(sizeOfSnapshot < 4.2 * 1024 * 1024, `the snapshot carries one PDF, not all three files (${sizeOfSnapshot} characters)`);

    // The image's thumbnail is fetched and drawn.
    const first = panel.locator('#messages [data-kind="user_message"]').first();
    const thumbnail = first.locator('.attachment img[alt="noise.png"]');
    await thumbnail.waitFor({ state: 'attached', timeout: 30000 });
    assert.equal(await thumbnail.getAttribute('src'), sentImage, 'the thumbnail is the image sent');

    const [pdfTab] = await Promise.all([
      session.context.waitForEvent('page', { timeout: 30000 }),
      first.getByRole('button', { name: 'Open old.pdf' }).click(),
    ]);
    assert.match(pdfTab.url(), /^blob:chrome-extension:\/\//, pdfTab.url());
    await pdfTab.close();
    const fetches = await sentOps(panel, 'attachment.get');
    assert.deepEqual(fetches.map((op) => op.index).sort(), [0, 1], 'one fetch per file: the thumbnail and the PDF');
    for (const op of fetches) assert.equal((await answerTo(panel, op.submissionId, 'attachment.get')).type, 'command.ack');

    const edited = await editMessage(first, 'Read this again', mock, 3);
    const [file] = edited.content.filter((p) => p.type === 'file');
    assert.equal(file.file.filename, 'old.pdf');
    assert.equal(file.file.file_data, `data:application/pdf;base64,${pdf('a', 2_300_000).toString('base64')}`, 'the whole PDF goes again');
    assert.deepEqual(edited.content.filter((p) => p.type === 'image_url').map((p) => p.image_url.url), [sentImage], 'and the whole image');
    assert.match(messageText(edited), /^Read this again/);
  },
);

// A file dropped on the panel goes to the composer; queued with a message,
// it is listed with it, stays through an edit of its text (the panel sends
// the files again with `queue.update`), and goes to the model when the
// queued turn runs.
isolatedTest(
  'a_queued_message_keeps_its_file_through_an_edit_and_runs_with_it',
  {
    script: [
      { stallMs: STALL_FOREVER_MS, text: 'Working', tickMs: 250, tickText: '.' },
      { text: 'Continuing.' },
      { text: 'Read your notes.' },
    ],
  },
  async (session) => {
    const { panel, mock } = session;
    await panel.focus('#task-input');
    await typeAndPress(panel, 'A long task', 'Enter');
    await waitForRunState(panel, ['streaming_model']);
    // Dropped on the conversation: it goes with the next message.
    await panel.evaluate(() => {
      const transfer = new DataTransfer();
      transfer.items.add(new File(['milk, eggs'], 'notes.txt', { type: 'text/plain' }));
      const messages = document.getElementById('messages');
      messages.dispatchEvent(new DragEvent('dragover', { dataTransfer: transfer, bubbles: true, cancelable: true }));
      messages.dispatchEvent(new DragEvent('drop', { dataTransfer: transfer, bubbles: true, cancelable: true }));
    });
    await waitFor(async () => (await panel.locator('#attachment-list > li').count()) === 1, { timeout: 15000, message: 'the dropped file in the composer' });
    await panel.focus('#task-input');
    await typeAndPress(panel, 'Then read my notes', 'Shift+Alt+Enter');
    const queued = () => panel.evaluate(() => [...document.querySelectorAll('#queue-list > li')].map((li) => ({
      text: li.querySelector('.queue-text')?.textContent ?? null,
      files: [...li.querySelectorAll('.attachment-name')].map((n) => n.textContent),
    })));
    await waitFor(async () => (await queued()).length === 1, { timeout: 30000, message: 'the queued message' });
    assert.deepEqual(await queued(), [{ text: 'Then read my notes', files: ['notes.txt'] }]);
    assert.equal(await panel.locator('#attachment-list').isHidden(), true, 'the composer gave its file to the queued message');

    await pressOn(panel.getByRole('button', { name: 'Edit queued message: Then read my notes' }));
    await panel.keyboard.press('Control+A');
    await typeAndPress(panel, 'Then read my notes, twice', 'Enter');
    // The panel sends the edit after the key press returns: wait for it.
    await waitFor(async () => (await sentOps(panel, 'queue.update')).length === 1, { timeout: 15000, message: 'the queue.update sent' });
    const [edit] = await sentOps(panel, 'queue.update');
    assert.deepEqual(edit.input.attachments.map((a) => [a.kind, a.name, a.text]), [['text', 'notes.txt', 'milk, eggs']]);
    assert.equal((await answerTo(panel, edit.submissionId, 'queue.update')).type, 'command.ack');
    await waitFor(async () => (await queued())[0]?.text === 'Then read my notes, twice', { timeout: 15000, message: 'the edited text in the list' });
    assert.deepEqual((await queued())[0].files, ['notes.txt']);

    await panel.focus('#task-input');
    await panel.keyboard.press('Escape');
    await waitForRunState(panel, ['interrupted']);
    await panel.click('#continue-button');
    await waitFor(
      async () => {
        const state = await readPanel(panel);
        return state.state === 'completed' && state.nodes.some((n) => n.text.includes('Read your notes.')) ? state : null;
      },
      { timeout: 120000, message: 'the queued turn to complete' },
    );
    const sent = requestMessages(mock.requests().at(-1)).filter((m) => m.role === 'user').map((m) => messageText(m));
    assert.ok(
      sent.some((text) => text.startsWith('Then read my notes, twice\n\n<attached_file name="notes.txt" type="text/plain">\nmilk, eggs\n</attached_file>')),
      sent.join('\n---\n'),
    );
  },
);
