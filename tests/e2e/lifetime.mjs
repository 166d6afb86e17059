// The service worker's own lifetime in Chrome, with nothing attached to the
// worker: Chrome stops an extension worker 30 s after its last event, and a
// run must neither die with it nor keep it alive once the run is over.
// Run: node tests/e2e/lifetime.mjs (after make build).
//
// The other e2e files drive Chromium through Playwright, which attaches
// DevTools to the worker, and Chrome never stops a worker DevTools is
// attached to; these tests use tests/support/unattached-browser.mjs instead.
// The engine keeps the worker alive while a run is working (not while it
// waits for the user), while a paused thread probes the store or is being
// resumed, and while a side panel is connected (README, "Worker
// lifetime"): an extension-API call every 20 s resets Chrome's idle timer.
// For work, not for a panel, it also keeps a `chrome.alarms` alarm (every
// 30 s), which after a kill is what starts a new worker that resumes the
// run; a panel's own reconnect starts one.
//
// Each test waits on conditions; the durations below are what the scenario
// must outlast (Chrome's idle timeout), not timing assertions.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startMockLlm } from '../mock-llm/server.mjs';
import { startMockMcp } from '../mock-mcp/server.mjs';
import { DEFAULT_EXTENSION_PATH, FILL_DISK_IN_WORKER, exitUnlessExtensionBuilt, setPageVisibility, waitFor } from '../support/browser.mjs';
import { launchUnattached, readStoreExpression } from '../support/unattached-browser.mjs';
import { TEST_API_KEY, TEST_MODEL } from '../support/session.mjs';

exitUnlessExtensionBuilt('e2e');

/** Longer than Chrome's idle timeout (30 s) by a margin. */
const BEYOND_IDLE_MS = 45000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The mock LLM and an unattached browser with the provider configured in
 * chrome.storage (as the panel's settings form stores it) before any panel
 * opened. `body(ctx)` runs the scenario; everything is closed after.
 */
async function withLifetimeSession(script, body) {
  const mock = await startMockLlm({ quiet: true });
  mock.setScript(script);
  let browser = null;
  try {
    browser = await launchUnattached();
    const page = await browser.extensionPage();
    await page.evaluate(`chrome.storage.local.set({ settings: {
      provider: 'openai', baseUrl: ${JSON.stringify(mock.url)}, model: ${JSON.stringify(TEST_MODEL)}, apiKey: ${JSON.stringify(TEST_API_KEY)},
    } })`);
    const runs = () => page.evaluate(readStoreExpression('runs'));
    await body({ mock, browser, runs });
  } catch (error) {
    if (browser) {
      process.stderr.write(`lifetime: worker statuses ${JSON.stringify(browser.workerLog)}\n`);
      process.stderr.write(`lifetime: provider requests ${JSON.stringify(mock.requests().map((r) => r.outcome))}\n`);
    }
    throw error;
  } finally {
    if (browser) await browser.close();
    await mock.close();
  }
}

/** Opens the panel, sends `text` and waits for the provider request. */
async function submitFromPanel(browser, mock, text) {
  const panel = await browser.openPanel();
  await panel.evaluate(`(() => {
    const input = document.getElementById('task-input');
    input.value = ${JSON.stringify(text)};
    input.dispatchEvent(new Event('input', { bubbles: true }));
    document.getElementById('send-button').click();
  })()`);
  await mock.waitForRequests(1, { timeout: 60000 });
  return panel;
}

const onlyRun = async (runs) => {
  const all = await runs();
  assert.equal(all.length, 1, `one run: ${JSON.stringify(all.map((r) => r.state))}`);
  return all[0];
};

test('heartbeat_keeps_the_worker_alive_through_a_stream_longer_than_chromes_idle_timeout_and_goes_when_the_run_ends', { timeout: 300000 }, async () => {
  // The model thinks for 45 s (a delta every 2 s), then answers.
  const script = [{ stallMs: BEYOND_IDLE_MS, tickMs: 2000, text: 'Thinking', then: { text: 'The answer, after a long think.' } }];
  await withLifetimeSession(script, async ({ mock, browser, runs }) => {
    const panel = await submitFromPanel(browser, mock, 'Think about it for a long time.');
    // The user closes the panel: no Port, no event from a page.
    await panel.close();
    const from = browser.workerLog.length;
    await waitFor(() => mock.requests()[0].outcome === 'completed' || browser.workerStatusesSince(from).includes('stopped'), {
      timeout: BEYOND_IDLE_MS + 60000,
      interval: 200,
      message: 'the long stream to complete (or the worker to be stopped)',
    });
    assert.deepEqual(browser.workerStatusesSince(from), [], 'Chrome did not stop the worker while it streamed');
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 30000, message: 'the run saved as completed' });
    assert.equal(mock.requests().length, 1, 'one provider request: the stream was never cut and asked again');
    // The run is over and the heartbeat with it: Chrome stops the idle worker
    // (within its 30 s idle timeout and a margin for a loaded machine).
    await browser.waitForWorkerStop(from, 'Chrome to stop the idle worker once the run ended (the heartbeat cleared)');
  });
});

test('a_worker_killed_with_the_panel_closed_is_started_again_by_its_alarm_and_finishes_the_run', { timeout: 300000 }, async () => {
  // The first request never finishes; the resumed run's request is answered.
  const script = [
    { stallMs: 600000, tickMs: 1000, text: 'Thinking' },
    { text: 'Answered by the worker the alarm started.' },
  ];
  await withLifetimeSession(script, async ({ mock, browser, runs }) => {
    const panel = await submitFromPanel(browser, mock, 'Answer even if the worker dies.');
    await waitFor(() => mock.requests()[0].outcome === 'stalled', { timeout: 30000, message: 'the first stream under way' });
    await panel.close();
    const from = browser.workerLog.length;
    // Chrome stops the worker (as on a crash, an update or its 5-minute
    // limit): nothing is open that would start it again but its alarm.
    await browser.killWorker();
    await waitFor(() => mock.requests()[0].outcome === 'aborted', { timeout: 30000, message: 'the killed worker to drop its stream' });
    await waitFor(() => mock.requests().length >= 2 && mock.requests()[1].outcome === 'completed', {
      timeout: 120000,
      interval: 200,
      message: 'a worker started by the alarm to resume the run with a new request',
    });
    const statuses = browser.workerStatusesSince(from);
    assert.ok(statuses.indexOf('running', statuses.indexOf('stopped')) > 0, `the worker ran again after the kill: ${statuses}`);
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 30000, message: 'the resumed run saved as completed' });
    assert.equal(mock.requests().length, 2, 'one request per worker');
  });
});

test('a_worker_paused_by_a_full_disk_stays_alive_while_it_probes_and_resumes_the_run_itself', { timeout: 300000 }, async () => {
  // The answer streams for 6 s; the disk fills up meanwhile, so its
  // checkpoint fails and the thread pauses. The resumed run asks again.
  const script = [
    { stallMs: 6000, tickMs: 1000, text: 'Thinking', then: { text: 'An answer that cannot be saved.' } },
    { text: 'The answer, saved once the disk had room.' },
  ];
  await withLifetimeSession(script, async ({ mock, browser, runs }) => {
    const panel = await submitFromPanel(browser, mock, 'Answer once there is room on disk.');
    // The disk fills up (FILL_DISK_IN_WORKER).
    await browser.inWorker(FILL_DISK_IN_WORKER);
    await waitFor(async () => /saving failed/i.test(await panel.evaluate(`document.getElementById('error-banner')?.textContent ?? ''`)), {
      timeout: 60000,
      message: 'the panel to say that saving failed',
    });
    await panel.close();
    const from = browser.workerLog.length;
    // The paused worker probes the store (5 s, 15 s, 35 s … after the
    // pause) with no page open and nothing attached: past Chrome's idle
    // timeout, it must still be running.
    await sleep(BEYOND_IDLE_MS);
    assert.deepEqual(browser.workerStatusesSince(from), [], 'Chrome did not stop the probing worker');
    assert.equal(mock.requests().length, 1, 'a paused worker asks the provider nothing');
    const refused = await browser.inWorker(`(() => { self.__diskFull = false; return self.__refusedWrites; })()`);
    assert.ok(refused >= 4, `the checkpoint and its retries, then probes, were refused: ${refused}`);
    // The next probe commits and this same worker resumes the run.
    await waitFor(() => mock.requests().length >= 2 && mock.requests()[1].outcome === 'completed', {
      timeout: 120000,
      interval: 200,
      message: 'the same worker to resume the run once the disk has room',
    });
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 30000, message: 'the resumed run saved as completed' });
    assert.deepEqual(browser.workerStatusesSince(from), [], 'the worker that paused is the one that resumed');
  });
});

test('a_side_panel_left_open_keeps_one_worker_instead_of_a_new_one_every_30_s', { timeout: 300000 }, async () => {
  await withLifetimeSession([], async ({ browser }) => {
    const panel = await browser.openPanel();
    const epoch = () => panel.evaluate(`document.getElementById('connection').dataset.epoch ?? ''`);
    const first = await epoch();
    // Only the panel holds the worker: the keepalive does, with no wake-up
    // alarm (a stopped worker would be started by the panel's reconnect).
    assert.equal(await browser.inWorker(`chrome.alarms.get('sw-agent-heartbeat').then((a) => a ?? null)`), null, 'no wake-up alarm for a panel');
    const from = browser.workerLog.length;
    // Nothing runs; the user reads the panel. A Port alone does not keep a
    // worker (Chrome 114+), and a stopped worker drops the panel's Port,
    // whose reconnect would start a new one: every 30 s without the
    // keepalive a connected panel holds.
    await sleep(BEYOND_IDLE_MS);
    assert.deepEqual(browser.workerStatusesSince(from), [], 'Chrome did not stop the worker while the panel was open');
    assert.equal(await epoch(), first, 'the panel is still connected to the engine it opened with');
    // The panel closes: nothing holds the worker any more.
    await panel.close();
    await browser.waitForWorkerStop(from, 'Chrome to stop the idle worker once the panel closed');
  });
});

test('a_side_panel_hidden_for_a_while_lets_chrome_stop_the_idle_worker_and_reconnects_when_shown', { timeout: 300000 }, async () => {
  await withLifetimeSession([{ text: 'Hello from the model.' }], async ({ mock, browser, runs }) => {
    const panel = await submitFromPanel(browser, mock, 'Say hello.');
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 60000, message: 'the turn saved as completed' });
    const connection = () =>
      panel.evaluate(`(() => { const c = document.getElementById('connection'); return { connected: c.dataset.connected, epoch: c.dataset.epoch ?? '', text: c.textContent.trim() }; })()`);
    const shown = async () => panel.evaluate(`document.getElementById('messages').textContent`);
    const before = await connection();
    assert.equal(before.connected, 'true');
    const from = browser.workerLog.length;
    // Hidden for less than the release delay and shown again: nothing changes.
    await setPageVisibility(panel, 'hidden');
    await sleep(2000);
    await setPageVisibility(panel, 'visible');
    assert.deepEqual(await connection(), before, 'a panel hidden briefly keeps its Port');
    // Hidden for good: after 30 s it lets go of its Port, and the idle
    // worker no longer has anything holding it.
    await setPageVisibility(panel, 'hidden');
    const released = await waitFor(async () => ((await connection()).connected === 'false' ? connection() : null), {
      timeout: 60000,
      message: 'the hidden panel to let go of its Port',
    });
    assert.match(released.text, /Paused while hidden/);
    await browser.waitForWorkerStop(from, 'Chrome to stop the idle worker under the hidden panel');
    assert.deepEqual((await connection()).connected, 'false', 'a hidden panel does not reconnect by itself');
    // Shown again: it reconnects to a new worker and shows the same thread.
    await setPageVisibility(panel, 'visible');
    const after = await waitFor(async () => {
      const now = await connection();
      return now.connected === 'true' && now.epoch !== before.epoch ? now : null;
    }, { timeout: 60000, message: 'the panel reconnected once shown' });
    assert.notEqual(after.epoch, before.epoch, 'a new engine');
    const text = await shown();
    assert.ok(text.includes('Say hello.') && text.includes('Hello from the model.'), `the thread is shown again: ${text.slice(0, 200)}`);
    assert.equal(mock.requests().length, 1, 'nothing was asked of the model again');
  });
});

test('a_question_left_open_with_the_panel_closed_lets_chrome_stop_the_worker_and_the_answer_resumes_the_run', { timeout: 300000 }, async () => {
  const script = [
    { toolCalls: [{ name: 'ask_user', arguments: { question: 'Which plan?', options: ['Basic', 'Pro'] } }] },
    { text: 'You chose a plan.' },
  ];
  await withLifetimeSession(script, async ({ mock, browser, runs }) => {
    let panel = await submitFromPanel(browser, mock, 'Pick a plan with me.');
    const card = `document.querySelector('#interaction-card:not([hidden])')`;
    await waitFor(() => panel.evaluate(`Boolean(${card})`), { timeout: 60000, message: 'the question card' });
    assert.equal((await onlyRun(runs)).state, 'waiting_interaction');
    // The user closes the panel and leaves the question open for a while:
    // the saved run needs no worker until the answer comes.
    await panel.close();
    const from = browser.workerLog.length;
    await browser.waitForWorkerStop(from, 'Chrome to stop the worker while the question waits');
    assert.equal(mock.requests().length, 1);
    // The panel opened again wakes a new worker, which shows the question;
    // the answer resumes the run.
    panel = await browser.openPanel();
    await waitFor(() => panel.evaluate(`Boolean(${card})`), { timeout: 60000, message: 'the question card shown again' });
    await panel.evaluate(`[...${card}.querySelectorAll('button')].find((b) => b.textContent.trim() === 'Pro').click()`);
    await waitFor(() => mock.requests().length >= 2 && mock.requests()[1].outcome === 'completed', {
      timeout: 60000,
      interval: 200,
      message: 'the answered run to ask the model again',
    });
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 30000, message: 'the run saved as completed' });
  });
});

test('settings_saved_while_the_worker_starts_are_the_ones_its_engine_uses', { timeout: 300000 }, async () => {
  await withLifetimeSession([{ text: 'Answered with the model saved during the start.' }], async ({ mock, browser }) => {
    const page = await browser.extensionPage();
    const save = (model) =>
      page.evaluate(`chrome.storage.local.get('settings').then(({ settings }) => chrome.storage.local.set({ settings: { ...settings, model: ${JSON.stringify(model)} } }))`);
    await save('model-before');
    // The engine's database exists once a panel opened it.
    const first = await browser.openPanel();
    await first.close();
    await browser.killWorker();
    // This page holds a readwrite transaction on every store, so the next
    // worker's start waits on IndexedDB after it read the settings: the
    // window in which a saved change used to be lost, held open.
    await page.evaluate(`(async () => {
      const request = (req) => new Promise((resolve, reject) => { req.onsuccess = () => resolve(req.result); req.onerror = () => reject(req.error); });
      const db = await request(indexedDB.open('sw-agent'));
      const names = [...db.objectStoreNames];
      const tx = db.transaction(names, 'readwrite');
      const store = tx.objectStore(names[0]);
      self.__holding = true;
      const spin = () => { if (self.__holding) store.count().onsuccess = spin; };
      spin();
      self.__released = new Promise((resolve) => { tx.oncomplete = resolve; });
    })()`);
    const from = browser.workerLog.length;
    const panel = await browser.openPage(`chrome-extension://${browser.extensionId}/sidepanel/index.html`);
    await waitFor(() => browser.workerStatusesSince(from).includes('running'), { timeout: 30000, message: 'a new worker' });
    // Its script read the settings at once (chrome.storage, not IndexedDB);
    // the user saves a new model while its start waits.
    await sleep(1000);
    await save('model-after');
    await sleep(1000);
    // The window was still open: the engine had not started (sw.js sets
    // `__swAgent` once it runs), so the change reached a worker whose
    // engine is yet to be built from settings read before it.
    assert.equal(await browser.inWorker('typeof globalThis.__swAgent'), 'undefined', 'the engine still waits on IndexedDB');
    await page.evaluate(`(async () => { self.__holding = false; await self.__released; })()`);
    await waitFor(() => panel.evaluate('document.body?.dataset.ready === "true"'), { timeout: 60000, message: 'the panel ready' });
    await panel.evaluate(`(() => {
      document.getElementById('task-input').value = 'Which model are you?';
      document.getElementById('send-button').click();
    })()`);
    await mock.waitForRequests(1, { timeout: 60000 });
    assert.equal(mock.requests()[0].body.model, 'model-after', 'the engine uses the settings saved last');
  });
});

test('an_mcp_server_s_open_event_stream_does_not_keep_an_idle_worker_alive_and_the_next_worker_opens_its_own', { timeout: 300000 }, async () => {
  const mcp = await startMockMcp();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'agent-ext-mcp-life-'));
  let browser = null;
  try {
    cpSync(DEFAULT_EXTENSION_PATH, dir, { recursive: true });
    writeFileSync(path.join(dir, 'mcp-servers.js'), `export const MCP_SERVERS = ${JSON.stringify([{ name: 'docs', url: mcp.url }])};\n`);
    browser = await launchUnattached({ extensionPath: dir });
    // The worker lists the server's tools and follows it on its event stream.
    await waitFor(() => mcp.streamCount() === 1, { message: 'the worker to open the server\'s event stream' });
    const from = browser.workerLog.length;
    // Nothing else holds the worker: Chrome stops it (an open fetch is no
    // activity), and the server sees the stream go.
    await browser.waitForWorkerStop(from, 'Chrome to stop the idle worker with the event stream open');
    await waitFor(() => mcp.streamCount() === 0, { message: 'the stream to close with the worker' });
    // A panel starts a new worker, which follows the server on a stream of its own.
    const panel = await browser.openPanel();
    await waitFor(() => mcp.streamCount() === 1 && mcp.streams().length === 2, { message: 'the new worker to open its own stream' });
    await panel.close();
  } finally {
    if (browser) await browser.close();
    await mcp.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
