// The demo run by `make demo`: headless Chromium with the built extension
// (dist/extension), the local test page and the mock LLM. The agent is asked,
// through the real side panel UI, to subscribe to the newsletter. The click
// needs the user's approval: the demo waits for the approval card, saves it as
// target/demo/approval.png and clicks "Allow once" like a user. It prints the
// transcript (with the approval), writes target/demo/transcript.txt and
// target/demo/sidepanel.png, and exits 0 only if the run completed, exactly one
// approval was asked and accepted once, and the page registered exactly one
// Subscribe click.

import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  REPO_ROOT,
  DEFAULT_EXTENSION_PATH,
  assertExtensionBuilt,
  readPanel,
  submitTask,
  transcriptLines,
  waitForApprovalCard,
  approvalHistory,
  approvalLine,
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
    await session.panel.setViewportSize({ width: 420, height: 800 });
    await submitTask(session.panel, TASK);

    let final;
    try {
      // The agent read the page and wants to click: the side panel asks first.
      const card = await waitForApprovalCard(session.panel, { timeout: 180000 });
      process.stdout.write(
        `demo: approval asked: ${card.label} ${JSON.stringify(card.params)} on ${card.url}${card.element ? `; element: ${card.element}` : ''}\n`,
      );
      const clicksBefore = await subscribeClicks(session.shop);
      if (clicksBefore !== 0) fail(`the page was clicked before the user answered (${clicksBefore})`);
      await session.panel.screenshot({ path: path.join(OUT_DIR, 'approval.png') });
      process.stdout.write('demo: clicking "Allow once" in the side panel\n');
      await session.panel.getByRole('button', { name: 'Allow once', exact: true }).click();
      final = await waitForSettledTurn(session.panel, { timeout: 180000 });
    } catch (error) {
      final = await readPanel(session.panel);
      fail(`the run did not settle: ${error.message} (panel state: ${final.state})`);
    }
    const clicks = await subscribeClicks(session.shop);
    const approvals = await approvalHistory(session.panel);

    const lines = [
      `Task: ${TASK}`,
      `Page: ${session.shop.url()}`,
      `Run state: ${final.state}`,
      `Subscribe clicks on the page: ${clicks}`,
      `Provider requests served by the mock: ${session.mock.requests().length}`,
      `Approvals: ${approvals.length ? approvals.map(approvalLine).join('; ') : 'none'}`,
      '',
      'Transcript (from the side panel):',
      ...transcriptLines(final, { approvals }),
    ];
    const transcript = `${lines.join('\n')}\n`;
    process.stdout.write(`\n${transcript}\n`);
    writeFileSync(path.join(OUT_DIR, 'transcript.txt'), transcript);

    await session.panel.bringToFront();
    await session.panel.screenshot({ path: path.join(OUT_DIR, 'sidepanel.png') });
    process.stdout.write(
      `demo: wrote ${path.join(OUT_DIR, 'transcript.txt')}, ${path.join(OUT_DIR, 'approval.png')} and ${path.join(OUT_DIR, 'sidepanel.png')}\n`,
    );

    const accepted = approvals.filter((a) => a.toolName === 'click' && a.status === 'accepted_once');
    if (final.state !== 'completed') fail(`the run ended in state "${final.state}"${final.error ? `: ${final.error}` : ''}`);
    else if (clicks !== 1) fail(`expected exactly 1 Subscribe click on the page, saw ${clicks}`);
    else if (approvals.length !== 1 || accepted.length !== 1) fail(`expected one click approval, accepted once; saw ${JSON.stringify(approvals.map((a) => [a.toolName, a.status]))}`);
    else process.stdout.write('demo: OK: the agent read the page, the user allowed the click once, and "Subscribe" was clicked exactly once\n');
  } catch (error) {
    fail(error.stack ?? String(error));
  } finally {
    if (session) await session.close();
  }
}

await main();
