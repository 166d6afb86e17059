// The demo run by `make demo`: headless Chromium with the built extension
// (dist/extension), the local test page and the mock LLM. The agent is asked,
// through the real side panel UI, to subscribe to the newsletter; the demo
// prints the transcript, writes target/demo/transcript.txt and
// target/demo/sidepanel.png, and exits 0 only if the run completed and the
// page registered exactly one Subscribe click.

import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  REPO_ROOT,
  DEFAULT_EXTENSION_PATH,
  assertExtensionBuilt,
  readPanel,
  submitTask,
  transcriptLines,
} from '../tests/support/browser.mjs';
import { startSession, subscribeClicks, waitForSettledTurn } from '../tests/support/session.mjs';

const TASK = 'Subscribe to the newsletter on this page';
const OUT_DIR = path.join(REPO_ROOT, 'target', 'demo');

function fail(reason) {
  process.stderr.write(`demo: FAILED: ${reason}\n`);
  process.exitCode = 1;
}

async function main() {
  try {
    assertExtensionBuilt(DEFAULT_EXTENSION_PATH);
  } catch (error) {
    fail(error.message);
    return;
  }
  mkdirSync(OUT_DIR, { recursive: true });

  let session;
  try {
    process.stdout.write('demo: starting the mock LLM, the test page server and Chromium with dist/extension\n');
    session = await startSession();
    process.stdout.write(`demo: mock LLM at ${session.mock.url}, page ${session.shop.url()}, extension ${session.extensionId}\n`);
    process.stdout.write(`demo: task: ${TASK}\n`);
    await submitTask(session.panel, TASK);

    let final;
    try {
      final = await waitForSettledTurn(session.panel, { timeout: 180000 });
    } catch (error) {
      final = await readPanel(session.panel);
      fail(`the run did not settle: ${error.message} (panel state: ${final.state})`);
    }
    const clicks = await subscribeClicks(session.shop);

    const lines = [
      `Task: ${TASK}`,
      `Page: ${session.shop.url()}`,
      `Run state: ${final.state}`,
      `Subscribe clicks on the page: ${clicks}`,
      `Provider requests served by the mock: ${session.mock.requests().length}`,
      '',
      'Transcript (from the side panel):',
      ...transcriptLines(final),
    ];
    const transcript = `${lines.join('\n')}\n`;
    process.stdout.write(`\n${transcript}\n`);
    writeFileSync(path.join(OUT_DIR, 'transcript.txt'), transcript);

    await session.panel.setViewportSize({ width: 420, height: 800 });
    await session.panel.bringToFront();
    await session.panel.screenshot({ path: path.join(OUT_DIR, 'sidepanel.png') });
    process.stdout.write(`demo: wrote ${path.join(OUT_DIR, 'transcript.txt')} and ${path.join(OUT_DIR, 'sidepanel.png')}\n`);

    if (final.state !== 'completed') fail(`the run ended in state "${final.state}"${final.error ? `: ${final.error}` : ''}`);
    else if (clicks !== 1) fail(`expected exactly 1 Subscribe click on the page, saw ${clicks}`);
    else process.stdout.write('demo: OK: the agent read the page and clicked "Subscribe" exactly once\n');
  } catch (error) {
    fail(error.stack ?? String(error));
  } finally {
    if (session) await session.close();
  }
}

await main();
