// Per-step overhead on a short and a long thread, this build against another
// one, side by side in one browser.
//
// Usage: node scripts/bench-growth-ab.mjs --baseline DIR [--reps N] [--steps N] [--nodes N] [--keep-bodies]
//   DIR  a built extension to compare with (see bench-cold-ab.mjs)
//   --keep-bodies  the mock LLM keeps every request body, as tests need (the
//                  benchmarks do not: BENCHMARKS.md item 26)
//
// Both builds are loaded into one headless Chromium with the mock LLM and the
// shop page; the same ~10-node and --nodes-node (default 10,000) threads are
// seeded into each. Every repetition runs a turn of --steps page_snapshot
// steps on both threads in both builds (the order alternates), so the
// machine's load moves all four alike. Prints, per build and thread, the
// medians of engine + commit time per step (the per-step overhead of issue
// 9) and its two parts, provider time per step and wall time per step, and each build's growth
// (long / short thread, median of the per-repetition pairs). The first
// repetition warms up and is not counted. Measures only; exits non-zero only
// when something is broken.

import { startMockLlm } from '../tests/mock-llm/server.mjs';
import { DEFAULT_EXTENSION_PATH } from '../tests/support/browser.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { launchBench } from './bench/browser.mjs';
import { prepareTurns } from './bench/cold.mjs';
import { pageOpen, pageRunTurn, swMetrics, swResetMetrics } from './bench/inpage.mjs';
import { seededThread, snapshotStepsScript } from './bench/seed.mjs';
import { median, perStepOf } from './bench/stats.mjs';
import { option } from './bench/args.mjs';

const baselinePath = option('--baseline', null);
const reps = Number(option('--reps', 6));
const steps = Number(option('--steps', 10));
const longNodes = Number(option('--nodes', 10000));
if (!baselinePath || !(reps > 0) || !(steps > 0) || !(longNodes > 10)) {
  process.stderr.write('usage: node scripts/bench-growth-ab.mjs --baseline DIR [--reps N] [--steps N] [--nodes N] [--keep-bodies]\n');
  process.exit(2);
}

const mock = await startMockLlm({ quiet: true, keepBodies: process.argv.includes('--keep-bodies') });
const pages = await startStaticServer();
const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH, baselinePath });
try {
  const { context } = b;
  const shop = context.pages()[0] ?? (await context.newPage());
  await shop.goto(pages.url('shop.html'));
  const sides = { current: b.real, baseline: b.baseline };
  const tag = Date.now().toString(36);
  const threads = [10, longNodes].map((length) => ({ length, ...seededThread(`growth-${length}-${tag}`, length) }));
  const clients = {};
  for (const [name, handle] of Object.entries(sides)) {
    clients[name] = await prepareTurns(context, handle, { baseUrl: mock.url, threads: threads.map(({ thread, nodes }) => ({ thread, nodes })) });
  }
  // Page tools act on the active tab: the shop page.
  await shop.bringToFront();

  const rows = {};
  for (let rep = 0; rep <= reps; rep += 1) {
    const order = rep % 2 ? ['baseline', 'current'] : ['current', 'baseline'];
    for (const name of order) {
      const handle = sides[name];
      const page = clients[name];
      const perStep = {};
      for (const t of rep % 2 ? [...threads].reverse() : threads) {
        await page.evaluate(pageOpen, { key: 'main', threadId: t.thread.id }); // loads the thread
        mock.reset();
        mock.setScript(snapshotStepsScript(steps));
        await handle.evaluate(swResetMetrics);
        const turn = await page.evaluate(pageRunTurn, { key: 'main', threadId: t.thread.id, text: `Take ${steps} page outlines.` });
        if (turn.stopReason !== 'end') throw new Error(`${name}, ${t.length} nodes: the turn ended with ${turn.stopReason}`);
        const metrics = await handle.evaluate(swMetrics);
        const step = perStepOf(metrics, turn.wallMs);
        perStep[t.length] = {
          overhead: step.engineAndCommit,
          engine: metrics.engine.totalMs / step.steps,
          commit: metrics.commits.totalMs / step.steps,
          provider: step.provider,
          tool: metrics.tools.count ? metrics.tools.totalMs / metrics.tools.count : 0,
          wall: step.wallPerStep,
        };
      }
      if (rep === 0) continue;
      const side = (rows[name] ??= { growth: [] });
      for (const [length, figures] of Object.entries(perStep)) {
        const row = (side[length] ??= { overhead: [], engine: [], commit: [], provider: [], tool: [], wall: [] });
        for (const [key, value] of Object.entries(figures)) row[key].push(value);
      }
      side.growth.push(perStep[longNodes].overhead / perStep[10].overhead);
    }
  }
  const f = (x) => x.toFixed(2);
  console.log(`per-step figures, ${steps} page_snapshot steps, ${reps} repetitions (medians, ms per step)`);
  for (const name of Object.keys(sides)) {
    for (const t of threads) {
      const row = rows[name][t.length];
      console.log(`  ${name.padEnd(8)} ~${String(t.length).padEnd(6)} nodes: engine + commit ${f(median(row.overhead))} (engine ${f(median(row.engine))}, commit ${f(median(row.commit))})  provider ${f(median(row.provider))}  tool ${f(median(row.tool))} per call  wall ${f(median(row.wall))}`);
    }
    const growth = rows[name].growth;
    console.log(`  ${name.padEnd(8)} growth (long / short, per repetition): median ${f(median(growth))}, range ${f(Math.min(...growth))} … ${f(Math.max(...growth))}`);
  }
} finally {
  await b.close();
  await mock.close();
  await pages.close();
}
process.exit(0);
