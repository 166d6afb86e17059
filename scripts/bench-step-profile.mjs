// Where a step's worker time goes, on a short and a long thread.
//
// Usage: node scripts/bench-step-profile.mjs [--nodes N] [--steps N] [--top N] [--callers N]
//
// Seeds a ~10-node and an --nodes-node (default 10,000) thread, then runs a
// turn of --steps (10) page_snapshot steps on each, twice (the first round
// warms up), under the V8 sampling profiler of the extension's worker, and
// prints each turn's busy time by category and its --top (40) functions by
// self time; with --callers N, under each built-in and glue function the N
// wasm or worker functions it ran for (its nearest such caller). Run
// `bash scripts/bench-named-wasm.sh` first for wasm function names (and
// `bash scripts/build.sh` afterwards for the shipped module). Measures only.

import { startMockLlm } from '../tests/mock-llm/server.mjs';
import { DEFAULT_EXTENSION_PATH } from '../tests/support/browser.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { launchBench, profileWorker } from './bench/browser.mjs';
import { prepareTurns } from './bench/cold.mjs';
import { pageOpen, pageRunTurn, swMetrics, swResetMetrics } from './bench/inpage.mjs';
import { seededThread, snapshotStepsScript } from './bench/seed.mjs';
import { option } from './bench/args.mjs';

const longNodes = Number(option('--nodes', 10000));
const steps = Number(option('--steps', 10));
const top = Number(option('--top', 40));
const callers = Number(option('--callers', 0));
if (!(longNodes > 10) || !(steps > 0) || !(top > 0) || !(callers >= 0)) {
  process.stderr.write('usage: node scripts/bench-step-profile.mjs [--nodes N] [--steps N] [--top N] [--callers N]\n');
  process.exit(2);
}

const mock = await startMockLlm({ quiet: true, keepBodies: false });
const pages = await startStaticServer();
const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH });
try {
  const { context } = b;
  const shop = context.pages()[0] ?? (await context.newPage());
  await shop.goto(pages.url('shop.html'));
  const tag = Date.now().toString(36);
  const threads = [10, longNodes].map((length) => ({ length, ...seededThread(`profile-${length}-${tag}`, length) }));
  const handle = b.real;
  const page = await prepareTurns(context, handle, { baseUrl: mock.url, threads: threads.map(({ thread, nodes }) => ({ thread, nodes })) });
  // Page tools act on the active tab: the shop page.
  await shop.bringToFront();
  for (const [round, t] of [...threads, ...threads].entries()) {
    await page.evaluate(pageOpen, { key: 'main', threadId: t.thread.id });
    mock.reset();
    mock.setScript(snapshotStepsScript(steps));
    const { result, profile } = await profileWorker(
      handle,
      () => page.evaluate(pageRunTurn, { key: 'main', threadId: t.thread.id, text: `Take ${steps} page outlines.` }),
      { top, callers },
    );
    if (result.stopReason !== 'end') throw new Error(`${t.length} nodes: the turn ended with ${result.stopReason}`);
    const metrics = await handle.evaluate(swMetrics);
    await handle.evaluate(swResetMetrics);
    if (round < threads.length) continue;
    const requests = metrics.provider.count;
    console.log(`request bodies: ${(metrics.bodyBytes / requests / 1024).toFixed(1)} KiB per step, ${(metrics.bodyCopied / requests / 1024).toFixed(1)} KiB of it copied out of wasm memory; building it ${(metrics.bodyBuild.totalMs / requests).toFixed(2)} ms per step (the longest ${metrics.bodyBuild.maxMs.toFixed(2)} ms), of which Blobs ${(metrics.bodyBlobs.totalMs / requests).toFixed(2)} ms (the longest ${metrics.bodyBlobs.maxMs.toFixed(2)} ms)`);
    const categories = Object.entries(profile.categories)
      .filter(([cat]) => cat !== 'idle' && cat !== 'root')
      .sort((x, y) => y[1] - x[1])
      .map(([cat, ms]) => `${cat} ${ms.toFixed(1)}`)
      .join(', ');
    console.log(`${steps} steps on the ~${t.length}-node thread: busy ${profile.busyMs.toFixed(1)} ms (${categories})`);
    for (const f of profile.top) {
      console.log(`  ${f.ms.toFixed(2).padStart(8)} ms  ${f.name.slice(0, 160)}`);
      for (const c of f.callers ?? []) console.log(`  ${''.padStart(8)}    ${c.ms.toFixed(2).padStart(6)} ms for ${c.name.slice(0, 150)}`);
    }
  }
} finally {
  await b.close();
  await mock.close?.();
  await pages.close?.();
}
