// The service worker's own lifetime in Chrome, with nothing attached to the
// worker: Chrome stops an extension worker 30 s after its last event, and a
// run must neither die with it nor keep it alive once the run is over.
// Run: node tests/e2e/lifetime.mjs (after make build).
//
// The other e2e files drive Chromium through Playwright, which attaches
// DevTools to the worker, and Chrome never stops a worker DevTools is
// attached to; these tests use tests/support/unattached-browser.mjs instead.
// The engine keeps a periodic `chrome.alarms` heartbeat (every 30 s) while a
// run is active, while a paused thread probes the store, and while a thread
// is being resumed; its event is what keeps Chrome from stopping the worker,
// and after a kill it is what starts a new worker that resumes the run.
//
// Each test waits on conditions; the durations below are what the scenario
// must outlast (Chrome's idle timeout), not timing assertions.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startMockLlm } from '../mock-llm/server.mjs';
import { exitUnlessExtensionBuilt, waitFor } from '../support/browser.mjs';
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
    await waitFor(() => mock.requests()[0].outcome === 'completed', {
      timeout: BEYOND_IDLE_MS + 60000,
      interval: 200,
      message: 'the long stream to complete',
    });
    assert.deepEqual(browser.workerStatusesSince(from), [], 'Chrome did not stop the worker while it streamed');
    await waitFor(async () => (await onlyRun(runs)).state === 'completed', { timeout: 30000, message: 'the run saved as completed' });
    assert.equal(mock.requests().length, 1, 'one provider request: the stream was never cut and asked again');
    // The run is over and the heartbeat with it: Chrome stops the idle worker
    // (within its 30 s idle timeout and a margin for a loaded machine).
    await waitFor(() => browser.workerStatusesSince(from).includes('stopped'), {
      timeout: 120000,
      interval: 200,
      message: 'Chrome to stop the idle worker once the run ended (the heartbeat cleared)',
    });
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
    // Every readwrite transaction of this worker aborts (as a full disk's
    // QuotaExceededError does) while `__diskFull` is set.
    await browser.inWorker(`(() => {
      const transaction = IDBDatabase.prototype.transaction;
      self.__diskFull = true;
      self.__refusedWrites = 0;
      IDBDatabase.prototype.transaction = function (names, mode, options) {
        const tx = transaction.call(this, names, mode, options);
        if (mode === 'readwrite' && self.__diskFull) {
          self.__refusedWrites += 1;
          queueMicrotask(() => tx.abort());
        }
        return tx;
      };
    })()`);
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
