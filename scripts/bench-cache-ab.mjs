// Cold start from the snapshot cache when many threads are cached: this
// build against another one, side by side in one browser.
//
// Usage: node scripts/bench-cache-ab.mjs --baseline DIR [--reps N]
//          [--threads N] [--result-bytes N] [--history RUNS]
//   DIR  another build's dist/extension (see bench-cold-ab.mjs)
//
// Each build's database gets `--threads` (default 9) threads of ~60 nodes
// whose page outlines are `--result-bytes` (default 8,000) characters long,
// the size of a real page's; with `--history RUNS`, also 200 threads, RUNS
// finished runs and three receipts per run, a day old (a long-used
// profile within the 7-day retention, which every start reads). A client
// opens every one of the cached threads, so the
// engine caches all their snapshots at rest (as a panel that visited them
// within a rest leaves it). Then each repetition kills each build's worker
// and cold-connects with `initialize` for the most recent thread (what a
// panel reconnects to, or a fresh one opens), then for another cached
// thread, alternating the builds' order. Both are answered from the cache
// in both builds; what differs is what a start reads. Prints the medians,
// the median per-repetition difference and its range, and when (ms since
// the worker was created) its script started, the first port connected,
// its first message arrived, the snapshot was sent and the prefetch
// arrived (a build without a mark prints -). Measures only; exits
// non-zero only when something is broken (a start not answered from the
// cache, a cache not written).

import { DEFAULT_EXTENSION_PATH } from '../tests/support/browser.mjs';
import { launchBench } from './bench/browser.mjs';
import { prepareColdStarts } from './bench/cold.mjs';
import { pageColdConnect, swSeed, swSeedHistory, swTiming, swWaitForEngine } from './bench/inpage.mjs';
import { ENGINE_DB, seededThread } from './bench/seed.mjs';
import { median } from './bench/stats.mjs';
import { option } from './bench/args.mjs';

// The worker's own marks (ms since it was created; sw.js, __swAgent).
const MARKS = {
  script: 'script body started',
  connect: 'first connect',
  message: 'first message',
  served: 'snapshot sent',
  prefetch: 'prefetch arrived',
};

const baselinePath = option('--baseline', null);
const reps = Number(option('--reps', 11));
const threadCount = Number(option('--threads', 9));
const resultBytes = Number(option('--result-bytes', 8000));
const historyRuns = Number(option('--history', 0));
if (!baselinePath || !(reps > 0) || !(threadCount > 1) || !(resultBytes > 0) || !(historyRuns >= 0)) {
  process.stderr.write('usage: node scripts/bench-cache-ab.mjs --baseline DIR [--reps N] [--threads N] [--result-bytes N] [--history RUNS]\n');
  process.exit(2);
}

/** `count` threads of ~60 nodes with page outlines of `bytes` characters; the first is the most recent. */
function cachedThreads(count, bytes) {
  const stamp = Date.now().toString(36);
  return Array.from({ length: count }, (_, i) => {
    const seeded = seededThread(`cache-${stamp}-${i}`, 60, { createdAt: Date.now() - 3600000 - i * 60000 });
    for (const node of seeded.nodes) {
      if (node.kind === 'tool_result') node.content = `${node.content}\n${'[e9] text "Lorem ipsum dolor sit amet" '.repeat(Math.ceil(bytes / 40))}`.slice(0, bytes);
    }
    seeded.thread.updatedAt = Date.now() - 60000 - i * 1000;
    return seeded;
  });
}

/** From an extension page: opens every thread on a port of its own and keeps the ports open. */
async function pageOpenThreads({ threadIds }) {
  const b = globalThis.__bench;
  globalThis.__openPorts = [];
  for (const threadId of threadIds) {
    const conn = b.connect('panel');
    b.send(conn, 'initialize', { threadId });
    await b.wait(conn, (m) => m.type === 'initialized', { what: 'initialized', timeoutMs: 60000 });
    globalThis.__openPorts.push(conn);
  }
  return threadIds.length;
}

function pageClosePorts() {
  for (const conn of globalThis.__openPorts ?? []) conn.port.disconnect();
  globalThis.__openPorts = [];
}

/** From an extension page: the cached snapshots' thread ids and total JSON size. */
async function pageCachedRecords({ dbName }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(dbName);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  try {
    const all = await new Promise((resolve, reject) => {
      const request = db.transaction('snapshots').objectStore('snapshots').getAll();
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
    return { threads: all.map((r) => r.threadId), bytes: all.reduce((sum, r) => sum + JSON.stringify(r).length, 0) };
  } finally {
    db.close();
  }
}

const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH, baselinePath });
try {
  const { context, real, baseline } = b;
  const threads = cachedThreads(threadCount, resultBytes);
  const ids = threads.map((t) => t.thread.id);
  const sides = { current: real, baseline };
  const pages = {};
  let cachedBytes = null;
  for (const [name, handle] of Object.entries(sides)) {
    const page = await prepareColdStarts(context, handle, threads[0]);
    await handle.evaluate(swSeed, { dbName: ENGINE_DB, threads: threads.slice(1) });
    // A long-used profile within the retention: every start reads it.
    if (historyRuns > 0) await handle.evaluate(swSeedHistory, { dbName: ENGINE_DB, threads: 200, runs: historyRuns, receiptsPerRun: 3, ageDays: 1 });
    // A fresh engine knows the seeded threads; a client opens each.
    await handle.kill();
    await page.evaluate(pageOpenThreads, { threadIds: ids });
    await handle.evaluate(swWaitForEngine);
    const deadline = Date.now() + 30000;
    let cached = await page.evaluate(pageCachedRecords, { dbName: ENGINE_DB });
    while (cached.threads.length < ids.length && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      cached = await page.evaluate(pageCachedRecords, { dbName: ENGINE_DB });
    }
    if (cached.threads.length < ids.length) throw new Error(`${name}: ${cached.threads.length} of ${ids.length} threads cached`);
    cachedBytes = cached.bytes;
    await page.evaluate(pageClosePorts);
    pages[name] = page;
  }

  const asked = { recent: ids[0], other: ids[ids.length - 1] };
  const samples = {};
  const warmUp = 2;
  for (let rep = 0; rep < reps + warmUp; rep += 1) {
    const order = rep % 2 ? ['baseline', 'current'] : ['current', 'baseline'];
    for (const [which, threadId] of Object.entries(asked)) {
      const got = {};
      for (const name of order) {
        const handle = sides[name];
        await handle.kill();
        const result = await pages[name].evaluate(pageColdConnect, { threadId });
        await handle.evaluate(swWaitForEngine);
        const timing = await handle.evaluate(swTiming);
        if (timing.servedFromCache !== 1) throw new Error(`${name}: the ${which} thread's cold start was not answered from the cache`);
        got[name] = {
          ms: result.ms,
          script: timing.scriptAt,
          connect: timing.firstConnectAt,
          message: timing.firstMessageAt,
          served: timing.servedAt,
          prefetch: timing.prefetchAt,
        };
      }
      if (rep < warmUp) continue;
      const s = (samples[which] ??= { current: [], baseline: [], diff: [], marks: {} });
      s.current.push(got.current.ms);
      s.baseline.push(got.baseline.ms);
      s.diff.push(got.current.ms - got.baseline.ms);
      for (const mark of Object.keys(MARKS)) {
        for (const name of ['current', 'baseline']) ((s.marks[mark] ??= { current: [], baseline: [] })[name]).push(got[name][mark]);
      }
    }
  }
  const f = (x) => (x === null || Number.isNaN(x) ? '-' : x.toFixed(1));
  const history = historyRuns > 0 ? `, a long-used profile (200 threads, ${historyRuns} runs, ${historyRuns * 3} receipts)` : '';
  console.log(`cold start from the snapshot cache, ${threadCount} threads cached (${(cachedBytes / 1024).toFixed(0)} KiB of snapshots)${history}, ${reps} repetitions (medians, ms)`);
  for (const [which, s] of Object.entries(samples)) {
    console.log(`  asking for ${which === 'recent' ? 'the most recent thread' : 'another cached thread'}:`);
    console.log(`    connect → initialized   current ${f(median(s.current))}  baseline ${f(median(s.baseline))}`);
    console.log(`    current − baseline, per repetition: median ${f(median(s.diff))}, range ${f(Math.min(...s.diff))} … ${f(Math.max(...s.diff))}`);
    for (const [mark, label] of Object.entries(MARKS)) {
      const m = s.marks[mark];
      const of = (values) => {
        const known = values.filter((x) => typeof x === 'number');
        return known.length ? median(known) : null;
      };
      console.log(`    worker created → ${label.padEnd(19)} current ${f(of(m.current))}  baseline ${f(of(m.baseline))}`);
    }
  }
} finally {
  await b.close();
}
