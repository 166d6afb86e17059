// Cold start, this build against another one, side by side in one browser.
//
// Usage: node scripts/bench-cold-ab.mjs --baseline DIR [--reps N] [--nodes N]
//          [--history RUNS]
//   DIR  a built extension to compare with (for example another commit's
//        dist/extension: `git worktree add /tmp/base REV && (cd /tmp/base &&
//        bash scripts/build.sh)`, then --baseline /tmp/base/dist/extension)
//
// Both builds and the bare JS worker are loaded into one headless Chromium;
// each repetition kills and cold-connects all three in turn (the order
// alternates), so the machine's load moves all of them alike. Prints the
// medians, each build's ratio to the bare worker's first reply, and the
// median of the per-repetition difference. `--history RUNS` adds a
// long-used profile to both builds' databases (200 threads, RUNS finished
// runs and three receipts each, a day old, which every start reads).
// Measures only; exits non-zero only when something is broken.

import { DEFAULT_EXTENSION_PATH } from '../tests/support/browser.mjs';
import { launchBench, openClientPage } from './bench/browser.mjs';
import { prepareColdStarts } from './bench/cold.mjs';
import { installClient, pageBareSeed, pageColdConnect, swMetrics, swSeedHistory, swTiming, swWaitForEngine } from './bench/inpage.mjs';
import { ENGINE_DB, seededThread } from './bench/seed.mjs';
import { median } from './bench/stats.mjs';
import { option } from './bench/args.mjs';

const baselinePath = option('--baseline', null);
const reps = Number(option('--reps', 15));
const nodes = Number(option('--nodes', 1000));
const historyRuns = Number(option('--history', 0));
if (!baselinePath || !(reps > 0) || !(nodes > 0) || !(historyRuns >= 0)) {
  process.stderr.write('usage: node scripts/bench-cold-ab.mjs --baseline DIR [--reps N] [--nodes N] [--history RUNS]\n');
  process.exit(2);
}

const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH, baselinePath });
try {
  const { context, real, baseline, bare } = b;
  const seeded = seededThread(`ab-${Date.now().toString(36)}`, nodes);
  const sides = { current: real, baseline };
  const pages = {};
  for (const [name, handle] of Object.entries(sides)) {
    pages[name] = await prepareColdStarts(context, handle, seeded);
    if (historyRuns > 0) await handle.evaluate(swSeedHistory, { dbName: ENGINE_DB, threads: 200, runs: historyRuns, receiptsPerRun: 3, ageDays: 1 });
  }
  const barePage = await openClientPage(context, bare);
  await barePage.evaluate(installClient);
  await barePage.evaluate(pageBareSeed, { nodes: seeded.nodes });

  const samples = { current: [], baseline: [], bare: [], diff: [] };
  const parts = { current: {}, baseline: {} };
  const warmUp = 2;
  for (let rep = 0; rep < reps + warmUp; rep += 1) {
    const order = rep % 2 ? ['baseline', 'current'] : ['current', 'baseline'];
    const got = {};
    for (const name of order) {
      const handle = sides[name];
      await handle.kill();
      const result = await pages[name].evaluate(pageColdConnect, { threadId: seeded.thread.id });
      if (result.nodes !== seeded.nodes.length) throw new Error(`${name}: snapshot of ${result.nodes} nodes, ${seeded.nodes.length} seeded`);
      await handle.evaluate(swWaitForEngine);
      const timing = await handle.evaluate(swTiming);
      const metrics = await handle.evaluate(swMetrics);
      got[name] = result.ms;
      if (rep >= warmUp) {
        const row = {
          'connect → engine ready': timing.timeOrigin + timing.readyAt - result.connectEpoch,
          'engine ready → initialized': result.initializedEpoch - (timing.timeOrigin + timing.readyAt),
          'wasm instantiated (since worker start)': timing.wasmAt,
          'prefetch arrived (since worker start)': timing.prefetchAt,
          'Engine.start()': timing.startMs,
          'thread read': metrics.threadRead.totalMs,
          'thread decode': metrics.threadDecode.totalMs,
          'thread build + post': metrics.threadBuild.totalMs,
        };
        for (const [key, value] of Object.entries(row)) (parts[name][key] ??= []).push(value);
      }
    }
    await bare.kill();
    const bareResult = await barePage.evaluate(pageColdConnect, { threadId: null });
    if (rep < warmUp) continue;
    samples.current.push(got.current);
    samples.baseline.push(got.baseline);
    samples.bare.push(bareResult.ms);
    samples.diff.push(got.current - got.baseline);
  }
  const f = (x) => (x === null || Number.isNaN(x) ? '-' : x.toFixed(1));
  const m = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, median(v)]));
  const history = historyRuns > 0 ? `, a long-used profile (200 threads, ${historyRuns} runs, ${historyRuns * 3} receipts)` : '';
  console.log(`cold start, ${nodes}-node thread${history}, ${reps} repetitions (medians, ms)`);
  console.log(`  current  ${f(m.current)}  (${f(m.current / m.bare)}× bare first reply)`);
  console.log(`  baseline ${f(m.baseline)}  (${f(m.baseline / m.bare)}× bare first reply)`);
  console.log(`  bare JS first reply ${f(m.bare)}`);
  console.log(`  current − baseline, per repetition: median ${f(m.diff)}, range ${f(Math.min(...samples.diff))} … ${f(Math.max(...samples.diff))}`);
  for (const key of Object.keys(parts.current)) {
    console.log(`  ${key.padEnd(40)} current ${f(median(parts.current[key]))}  baseline ${f(median(parts.baseline[key] ?? [NaN]))}`);
  }
} finally {
  await b.close();
}
