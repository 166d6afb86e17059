// End-to-end suite: the built extension (dist/extension) in headless
// Chromium, driven from its side panel page (opened as a tab) against the
// mock LLM and a local test page. Kills the service worker through CDP and
// checks that the run resumes and that the invariants hold.
//
// Run:  node tests/e2e/run.mjs            (after `make build`)
//       node --test-name-pattern=full_turn tests/e2e/run.mjs   (one test)
// On failure: target/e2e/<test>.png (panel screenshot) and <test>.txt
// (transcript, mock requests, console, Port log).
// Exits non-zero on any failure.

import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEFAULT_EXTENSION_PATH,
  assertExtensionBuilt,
  readPanel,
  submitTask,
  killServiceWorker,
  serviceWorkerStatusLog,
  watchConnection,
  connectionLog,
  portLog,
  dumpIndexedDb,
  evaluateInContentScriptWorld,
  transcriptLines,
  waitFor,
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
} from '../support/session.mjs';

try {
  assertExtensionBuilt(DEFAULT_EXTENSION_PATH);
} catch (error) {
  process.stderr.write(`e2e: ${error.message}\n`);
  process.exit(1);
}

const TASK = 'Subscribe to the newsletter';
const TEST_TIMEOUT = 300000;
/** A stall far longer than any test: only a SW kill ends it. */
const STALL_FOREVER_MS = 600000;

/**
 * Runs `body(session)` and, when it throws, saves artifacts before rethrowing.
 * `getSession` returns the session to document (it may be created by body).
 */
async function withArtifacts(slug, getSession, body) {
  try {
    await body();
  } catch (error) {
    const written = await saveArtifacts(getSession(), slug, error);
    if (written.length) process.stderr.write(`e2e: ${slug} failed; artifacts: ${written.join(', ')}\n`);
    throw error;
  }
}

/** A test with its own fresh session (browser, profile, servers). */
function isolatedTest(name, options, body) {
  test(name, { timeout: TEST_TIMEOUT }, async () => {
    let session = null;
    try {
      await withArtifacts(name, () => session, async () => {
        session = await startSession(options);
        await body(session);
      });
    } finally {
      if (session) await session.close();
    }
  });
}

function assertNoOrphans(session) {
  const problems = orphanToolCallProblems(session.mock.requests());
  assert.deepEqual(problems, [], 'no_orphan_tool_calls on every provider request');
}

function assertEveryCardResolved(panelState) {
  for (const card of toolCards(panelState)) {
    assert.notEqual(card.status, 'running', `tool call ${card.callId} (${card.toolName}) still running`);
    assert.equal(card.results.length, 1, `tool call ${card.callId} (${card.toolName}) has exactly one rendered result`);
  }
}

function describeState(panelState) {
  return `state=${panelState.state}\n${transcriptLines(panelState).join('\n')}`;
}

/** The tool call of `name` in an assistant message of `request` and its tool result message. */
function toolExchange(request, name) {
  const messages = request.body?.messages ?? [];
  for (const message of messages) {
    if (message.role !== 'assistant' || !Array.isArray(message.tool_calls)) continue;
    const call = message.tool_calls.find((c) => c.function?.name === name);
    if (call) {
      return { call, result: messages.find((m) => m.role === 'tool' && m.tool_call_id === call.id) ?? null };
    }
  }
  return null;
}

describe('one browser: a full turn, then checks on what it left behind', () => {
  let session = null;
  before(async () => {
    session = await startSession();
  });
  after(async () => {
    if (session) await session.close();
  });

  test('full_turn_clicks_on_page', { timeout: TEST_TIMEOUT }, async () => {
    await withArtifacts('full_turn_clicks_on_page', () => session, async () => {
      const { panel, shop, mock } = session;
      assert.equal(await subscribeClicks(shop), 0);
      await submitTask(panel, TASK);
      const final = await waitForSettledTurn(panel);
      assert.equal(final.state, 'completed', describeState(final));
      assert.equal(await subscribeClicks(shop), 1, 'the agent clicked Subscribe exactly once');
      assert.match(await shop.textContent('#subscribe-status'), /Subscribed! \(1\)/);

      const nodes = topLevelNodes(final);
      const users = nodes.filter((n) => n.kind === 'user_message');
      assert.equal(users.length, 1);
      assert.match(users[0].text, /Subscribe to the newsletter/);
      const cards = toolCards(final);
      assert.deepEqual(
        cards.map((c) => [c.toolName, c.status]),
        [['read_page', 'ok'], ['click', 'ok']],
        describeState(final),
      );
      assertEveryCardResolved(final);
      const order = nodes.map((n) => n.kind);
      assert.ok(order.indexOf('user_message') < order.indexOf('tool_call'), 'user message before tool calls');
      assert.ok(order.includes('assistant_message'), 'assistant messages rendered');
      const last = nodes.at(-1);
      assert.equal(last.kind, 'assistant_message', describeState(final));
      assert.match(last.text, /Done: clicked "Subscribe"\./);
      assert.ok(!last.streaming, 'final assistant message is no longer streaming');

      const requests = mock.requests();
      assert.equal(requests.length, 3, 'three provider requests: read_page, click, final answer');
      for (const request of requests) {
        assert.equal(request.headers.authorization, `Bearer ${TEST_API_KEY}`);
        assert.equal(request.body.model, 'mock-1');
        assert.equal(request.body.stream, true);
        const toolNames = (request.body.tools ?? []).map((t) => t.function?.name);
        assert.ok(toolNames.includes('read_page') && toolNames.includes('click'), `tools offered: ${toolNames}`);
      }
      const readExchange = toolExchange(requests[1], 'read_page');
      assert.ok(readExchange?.result, 'the second request carries the read_page tool result');
      const readContent = String(readExchange.result.content);
      assert.match(readContent, /Acme Newsletter/);
      assert.match(readContent, /Interactive elements:/);
      assert.match(readContent, /\[e\d+\] button "Subscribe"/);
      assert.doesNotMatch(readContent, /SECRET HIDDEN TEXT/, 'read_page leaves out hidden text');
      const clickExchange = toolExchange(requests[2], 'click');
      assert.ok(clickExchange?.result, 'the third request carries the click tool result');
      assertNoOrphans(session);
    });
  });

  test('content_script_cannot_command', { timeout: TEST_TIMEOUT }, async () => {
    await withArtifacts('content_script_cannot_command', () => session, async () => {
      const { panel, shop, mock, extensionId } = session;
      // A web page's own scripts have no way to reach the extension at all.
      assert.equal(await shop.evaluate(() => typeof globalThis.chrome?.runtime?.connect), 'undefined');

      // A real content-script sender: code evaluated in the extension's
      // isolated world inside the test page (where the engine injected
      // content.js). It tries the panel channel with ops a panel would send.
      const requestsBefore = mock.requests().length;
      const threadsBefore = await panel.evaluate(() => document.getElementById('thread-list')?.textContent ?? '');
      const outcome = await evaluateInContentScriptWorld(
        shop,
        extensionId,
        `new Promise((resolve) => {
          const received = [];
          const ops = [
            { type: 'initialize', clientId: 'evil', submissionId: 'evil-1', threadId: null },
            { type: 'turn.submit', clientId: 'evil', submissionId: 'evil-2', threadId: null, input: { text: 'Unsubscribe me from the newsletter' } },
            { type: 'thread.create', clientId: 'evil', submissionId: 'evil-3' },
          ];
          let port;
          const finish = (disconnected) => resolve({ received, disconnected });
          try {
            port = chrome.runtime.connect({ name: 'panel' });
          } catch (error) {
            resolve({ received, disconnected: true, connectError: String(error) });
            return;
          }
          port.onMessage.addListener((message) => {
            received.push(message);
            const answered = ops.every((op) => received.some((m) => m.submissionId === op.submissionId));
            if (answered) finish(false);
          });
          port.onDisconnect.addListener(() => finish(true));
          for (const op of ops) {
            try { port.postMessage(op); } catch { finish(true); return; }
          }
          setTimeout(() => finish('timeout'), 20000);
        })`,
        { ensureWorld: panel },
      );
      assert.notEqual(outcome.disconnected, 'timeout', `the engine neither rejected nor disconnected: ${JSON.stringify(outcome)}`);
      for (const message of outcome.received) {
        assert.equal(message.type, 'command.reject', `a content script got ${JSON.stringify(message).slice(0, 300)}`);
        assert.equal(message.error?.kind, 'forbidden');
      }
      if (!outcome.disconnected) assert.equal(outcome.received.length, 3, 'every op rejected');
      assert.equal(mock.requests().length, requestsBefore, 'no provider request was made');
      assert.equal(await shop.evaluate(() => window.unsubscribeClicks), 0);
      const threadsAfter = await panel.evaluate(() => document.getElementById('thread-list')?.textContent ?? '');
      assert.equal(threadsAfter, threadsBefore, 'no thread was created');
    });
  });

  test('api_key_never_persisted', { timeout: TEST_TIMEOUT }, async () => {
    await withArtifacts('api_key_never_persisted', () => session, async () => {
      const { panel, mock, browser } = session;
      assert.ok(mock.requests().length > 0, 'precondition: a turn ran with the key');
      const dump = JSON.stringify(await dumpIndexedDb(panel));
      assert.ok(dump.includes('Subscribe to the newsletter'), 'the dump holds the persisted thread (so the search is meaningful)');
      assert.ok(!dump.includes(TEST_API_KEY), 'the API key is not in IndexedDB');
      assert.ok(!dump.includes('SECRET-123'), 'no fragment of the API key is in IndexedDB');

      const ports = await portLog(panel);
      assert.ok(Array.isArray(ports) && ports.some((entry) => entry.dir === 'in'), 'the Port recorder saw events');
      const leaked = ports.filter((entry) => entry.json && entry.json.includes(TEST_API_KEY));
      assert.deepEqual(leaked.map((e) => `${e.dir}: ${e.json.slice(0, 200)}`), [], 'the API key never crosses a Port');

      const logged = browser.consoleLog.filter((entry) => entry.text.includes(TEST_API_KEY));
      assert.deepEqual(logged, [], 'the API key is never logged to the console');
      for (const request of mock.requests()) {
        assert.ok(!JSON.stringify(request.body).includes(TEST_API_KEY), 'the API key is only in the Authorization header');
      }
    });
  });
});

isolatedTest('auto_resume_streaming_run_after_sw_kill', { script: [{ stallMs: STALL_FOREVER_MS, text: 'Let me think', tickMs: 250, tickText: '.' }] }, async (session) => {
  const { panel, shop, mock, context, extensionId } = session;
  await watchConnection(panel);
  const epochBefore = (await readPanel(panel)).epoch;
  await submitTask(panel, TASK);
  await mock.waitForRequests(1, { timeout: 60000 });
  await waitFor(
    // Any streamed text counts: a snapshot that lands mid-stream may restart the
    // element from the next delta (the mock keeps sending "." while stalled).
    async () => (await readPanel(panel)).nodes.some((n) => n.kind === 'assistant_message' && n.streaming && n.text.length > 0),
    { timeout: 60000, message: 'a streaming assistant element with streamed text' },
  );
  assert.equal(mock.requests()[0].outcome, 'stalled');

  await killServiceWorker(context, extensionId, { page: panel });
  await waitFor(() => mock.requests()[0].outcome === 'aborted', { timeout: 30000, message: 'the killed worker to drop the stalled request' });

  const final = await waitForSettledTurn(panel);
  const connections = await connectionLog(panel);
  assert.ok(connections.some((entry) => entry.connected === 'false'), `the panel showed the disconnect: ${JSON.stringify(connections)}`);
  assert.notEqual(final.epoch, epochBefore, 'the panel reconnected to a new engine instance (new epoch)');
  assert.equal(final.connected, 'true');
  const statuses = (await serviceWorkerStatusLog(panel, extensionId)).map((e) => e.runningStatus);
  assert.ok(statuses.includes('stopped') && statuses.at(-1) === 'running', `worker stopped then restarted: ${statuses}`);

  assert.equal(final.state, 'completed', describeState(final));
  const users = topLevelNodes(final).filter((n) => n.kind === 'user_message');
  assert.equal(users.length, 1, 'the persisted user message is rendered once');
  assert.match(users[0].text, /Subscribe to the newsletter/);
  assert.equal(await subscribeClicks(shop), 1, 'the resumed run clicked Subscribe exactly once');
  assertEveryCardResolved(final);
  assert.match(topLevelNodes(final).at(-1).text, /Done: clicked "Subscribe"\./);

  const requests = mock.requests();
  assert.ok(requests.length >= 2, 'the run resumed with a new provider request');
  const lastUser = (request) => [...request.body.messages].reverse().find((m) => m.role === 'user');
  assert.deepEqual(lastUser(requests[1]), lastUser(requests[0]), 'the resumed request was rebuilt from the durable path');
  assertNoOrphans(session);
});

isolatedTest(
  'kill_between_steps_never_retry_at_most_once',
  { script: [{ auto: true }, { auto: true }, { stallMs: STALL_FOREVER_MS, text: 'Wrapping up' }] },
  async (session) => {
    const { panel, shop, mock, context, extensionId } = session;
    await submitTask(panel, TASK);
    // The click ran and its result is durable (rendered), the next model request is in flight.
    await mock.waitForRequests(3, { timeout: 120000 });
    await waitFor(
      async () => toolCards(await readPanel(panel)).some((c) => c.toolName === 'click' && c.status === 'ok'),
      { timeout: 60000, message: 'the click tool card to show its ok result' },
    );
    assert.equal(await subscribeClicks(shop), 1);
    assert.equal(mock.requests()[2].outcome, 'stalled');

    await killServiceWorker(context, extensionId, { page: panel });
    const final = await waitForSettledTurn(panel);
    assert.equal(final.state, 'completed', describeState(final));
    assert.equal(await subscribeClicks(shop), 1, 'never_retry_at_most_once: the click was not dispatched again');
    const cards = toolCards(final);
    assert.equal(cards.filter((c) => c.toolName === 'click').length, 1, 'one click tool call');
    assertEveryCardResolved(final);
    assertNoOrphans(session);
    const clickIds = new Set();
    for (const request of mock.requests()) {
      for (const message of request.body.messages) {
        for (const call of message.tool_calls ?? []) if (call.function?.name === 'click') clickIds.add(call.id);
      }
    }
    assert.equal(clickIds.size, 1, 'the provider only ever saw one click tool call');
  },
);

isolatedTest('kill_during_click_never_retry_at_most_once', {}, async (session) => {
  const { panel, shop, context, extensionId } = session;
  await submitTask(panel, TASK);
  // Kill as soon as the page registered the click: the result may or may not
  // be durable yet. Either way the click must never be dispatched again.
  await waitFor(async () => (await subscribeClicks(shop)) >= 1, { timeout: 120000, interval: 10, message: 'the click on the page' });
  await killServiceWorker(context, extensionId, { page: panel });
  const final = await waitForSettledTurn(panel, { states: ['completed', 'failed', 'interrupted', 'paused_uncertain'] });
  assert.equal(await subscribeClicks(shop), 1, 'never_retry_at_most_once');
  assert.ok(['completed', 'paused_uncertain'].includes(final.state), describeState(final));
  if (final.state === 'completed') assertEveryCardResolved(final);
  assertNoOrphans(session);
});
