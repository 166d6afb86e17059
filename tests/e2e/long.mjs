// A long task in the real extension: small context window, many page reads,
// so the engine must compact at least twice and still finish correctly
// (issue 8). Run: node tests/e2e/long.mjs (after make build).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { exitUnlessExtensionBuilt, dumpIndexedDb, submitTask } from '../support/browser.mjs';
import { startSession, waitForSettledTurn, orphanToolCallProblems, saveArtifacts } from '../support/session.mjs';

exitUnlessExtensionBuilt('e2e');

const STEPS = 14;

test('long_task_compacts_at_least_twice_and_finishes', { timeout: 300000 }, async () => {
  // Fourteen page reads, then the final answer. Compaction requests are
  // answered by the mock on the side and do not consume these steps.
  const script = [];
  for (let i = 0; i < STEPS; i += 1) {
    script.push({ toolCalls: [{ name: 'read_page', arguments: {} }], text: `Reading the page (${i + 1}).` });
  }
  script.push({ text: 'Done: I read the page fourteen times.' });
  let session = null;
  try {
    session = await startSession({ script });
    // A small context window (in tokens): the tool schemas alone are ~2k.
    await session.panel.evaluate(async () => {
      const { settings } = await chrome.storage.local.get('settings');
      await chrome.storage.local.set({ settings: { ...settings, contextWindow: 3000 } });
    });
    await submitTask(session.panel, 'Read this page again and again, then tell me you are done.');
    const state = await waitForSettledTurn(session.panel, { timeout: 240000 });
    assert.equal(state.state, 'completed', `run ended as ${state.state}`);

    const compactions = session.mock.compactions();
    assert.ok(compactions.length >= 2, `expected at least two compactions, got ${compactions.length}`);
    const requests = session.mock.requests();
    assert.equal(requests.length, STEPS + 1, 'every scripted step was served once');
    // After a compaction the model's view starts with the summary.
    const last = requests[requests.length - 1].body.messages;
    assert.ok(
      last.some((m) => m.role === 'user' && String(m.content).includes('Summary ')),
      'the last request leads with a compaction summary',
    );
    assert.deepEqual(orphanToolCallProblems(requests), []);
    // The stored history is never deleted: every read result is in IndexedDB.
    const db = await dumpIndexedDb(session.panel);
    const nodes = Object.values(db).flatMap((stores) => (stores.nodes ?? []).map((entry) => entry.value));
    const results = nodes.filter((n) => n.kind === 'tool_result' && n.name === 'read_page');
    const checkpoints = nodes.filter((n) => n.kind === 'compaction');
    assert.equal(results.length, STEPS);
    assert.ok(checkpoints.length >= 2);
    // The panel shows where the conversation was compacted.
    const shown = await session.panel.locator('[data-kind="compaction"]').count();
    assert.ok(shown >= 2, `the panel shows ${shown} compaction notices`);
  } catch (error) {
    if (session) await saveArtifacts(session, 'long_task_compacts_at_least_twice_and_finishes', error);
    throw error;
  } finally {
    if (session) await session.close();
  }
});
