// A CPU profile of cold starts: where the worker's time goes between its
// creation and the `initialized` snapshot.
//
// Usage: node scripts/bench-cold-profile.mjs [--reps N] [--nodes N] [--top N] [--out FILE]
//          [--history RUNS]
//
// Loads dist/extension, seeds a thread, then per
// repetition kills the worker (CDP) and cold-connects while V8's sampling
// profiler runs in the new worker from its first instruction (auto-attach
// with the worker paused until the profiler started). Prints self time by
// function summed over the repetitions, and self time by category (wasm,
// JS, garbage collection, the rest), V8's compile events, and which wasm
// functions V8 compiled lazily (on first call) and how many code bytes: the
// part of a cold start that grows with the code a start runs, not with its
// data. Function names need a module with a name section (build.sh strips
// it; see BENCHMARKS.md "Cold-start profile" for a named copy). Measures
// only; `--out` writes the last trace (JSON, for chrome://tracing or DevTools).
// `--history RUNS` adds a long-used profile (200 threads, RUNS finished
// runs and three receipts each, a day old, which every start reads).

import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { DEFAULT_EXTENSION_PATH, browserCdp } from '../tests/support/browser.mjs';
import { launchBench } from './bench/browser.mjs';
import { prepareColdStarts } from './bench/cold.mjs';
import { pageColdConnect, swSeedHistory } from './bench/inpage.mjs';
import { ENGINE_DB, seededThread } from './bench/seed.mjs';
import { parseWasm } from './bench/wasm-size.mjs';
import { option } from './bench/args.mjs';

const reps = Number(option('--reps', 10));
const nodes = Number(option('--nodes', 1000));
const top = Number(option('--top', 40));
const out = option('--out', null);
const historyRuns = Number(option('--history', 0));


/** Body size (by V8's function index: imports first) and name of every function of a .wasm. */
function wasmFunctions(file) {
  const { importedFunctions, bodies, names } = parseWasm(readFileSync(file));
  const sizes = new Map(bodies.map((size, i) => [importedFunctions + i, size]));
  return { sizes, names, codeBytes: bodies.reduce((a, c) => a + c, 0) };
}

const wasm = wasmFunctions(path.join(DEFAULT_EXTENSION_PATH, 'pkg', 'sw_agent_bg.wasm'));
const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH });
try {
  const { context, real } = b;
  const seeded = seededThread(`prof-${Date.now().toString(36)}`, nodes);
  const page = await prepareColdStarts(context, real, seeded);
  if (historyRuns > 0) await real.evaluate(swSeedHistory, { dbName: ENGINE_DB, threads: 200, runs: historyRuns, receiptsPerRun: 3, ageDays: 1 });

  const cdp = await browserCdp(context);
  // Browser-wide tracing with V8's sampling profiler: it covers a worker
  // from its first instruction (a worker started after the trace began is
  // profiled too) and records V8's compile events next to the samples.
  const categories = ['disabled-by-default-v8.cpu_profiler', 'v8.wasm', 'disabled-by-default-v8.compile', 'v8'];
  const readStream = async (handle) => {
    let text = '';
    for (;;) {
      const chunk = await cdp.send('IO.read', { handle, size: 1 << 20 });
      text += chunk.base64Encoded ? Buffer.from(chunk.data, 'base64').toString('utf8') : chunk.data;
      if (chunk.eof) break;
    }
    await cdp.send('IO.close', { handle });
    return text;
  };
  const traceOnce = async (fn) => {
    await cdp.send('Tracing.start', {
      transferMode: 'ReturnAsStream',
      traceConfig: { includedCategories: categories, excludedCategories: ['*'] },
    });
    const result = await fn();
    const done = new Promise((resolve) => cdp.session.once('Tracing.tracingComplete', resolve));
    await cdp.send('Tracing.end');
    const { stream } = await done;
    return { result, events: JSON.parse(await readStream(stream)).traceEvents ?? [] };
  };

  const selfByName = new Map();
  const selfByCategory = new Map();
  const compileByName = new Map();
  const lazyBytes = new Map();
  let lazyCount = 0;
  let lazyTotal = 0;
  let totalMs = 0;
  let lastEvents = null;
  for (let rep = 0; rep < reps + 1; rep += 1) {
    await real.kill();
    const { result, events } = await traceOnce(() => page.evaluate(pageColdConnect, { threadId: seeded.thread.id }));
    if (rep === 0) continue;
    lastEvents = events;
    // The worker's thread: the one whose profile samples wasm or sw.js.
    const profiles = new Map();
    for (const e of events) {
      if (e.name === 'Profile') profiles.set(e.id, { pid: e.pid, tid: e.tid, nodes: new Map(), samples: [], deltas: [] });
      if (e.name === 'ProfileChunk') {
        const p = profiles.get(e.id);
        if (!p) continue;
        const data = e.args?.data ?? {};
        for (const n of data.cpuProfile?.nodes ?? []) p.nodes.set(n.id, n);
        p.samples.push(...(data.cpuProfile?.samples ?? []));
        p.deltas.push(...(data.timeDeltas ?? []));
      }
    }
    let worker = null;
    for (const p of profiles.values()) {
      if ([...p.nodes.values()].some((n) => (n.callFrame?.url ?? '').includes(real.prefix))) worker = p;
    }
    if (!worker) {
      process.stdout.write(`rep ${rep}: no profile of the worker in the trace\n`);
      continue;
    }
    let sampled = 0;
    for (let i = 0; i < worker.samples.length; i += 1) {
      const node = worker.nodes.get(worker.samples[i]);
      const ms = (worker.deltas[i + 1] ?? 0) / 1000;
      const frame = { functionName: '(unknown)', url: '', ...(node?.callFrame ?? {}) };
      const name = frame.functionName || `(anonymous ${frame.url.split('/').pop()}:${frame.lineNumber})`;
      const category = frame.codeType === 'wasm' || frame.url.startsWith('wasm://') || frame.url.endsWith('.wasm')
        ? 'wasm'
        : name.startsWith('(')
          ? name
          : 'JS';
      selfByName.set(name, (selfByName.get(name) ?? 0) + ms);
      selfByCategory.set(category, (selfByCategory.get(category) ?? 0) + ms);
      totalMs += ms;
      sampled += ms;
    }
    // V8's compile events on the worker's thread (lazy wasm compilation among them).
    for (const e of events) {
      if (e.pid !== worker.pid || e.ph !== 'X' || !/compile|Compile/.test(e.name)) continue;
      const ms = (e.dur ?? 0) / 1000;
      const key = `${e.name}${e.tid === worker.tid ? '' : ' (other thread)'}`;
      compileByName.set(key, (compileByName.get(key) ?? 0) + ms);
      if (e.name === 'wasm.CompileLazy') {
        const index = e.args?.func_index;
        const size = wasm.sizes.get(index) ?? 0;
        const name = wasm.names.get(index) ?? `function ${index}`;
        lazyBytes.set(name, (lazyBytes.get(name) ?? 0) + size);
        lazyCount += 1;
        lazyTotal += size;
      }
    }
    process.stdout.write(`rep ${rep}: cold start ${result.ms.toFixed(1)} ms, worker samples ${sampled.toFixed(1)} ms\n`);
  }
  const perRep = (ms) => (ms / reps).toFixed(2).padStart(7);
  process.stdout.write(`\nself time per start (ms), mean over ${reps} cold starts of a ${nodes}-node thread\n`);
  for (const [category, ms] of [...selfByCategory].sort((a, c) => c[1] - a[1])) process.stdout.write(`${perRep(ms)}  ${category}\n`);
  process.stdout.write(`${perRep(totalMs)}  total sampled\n\ncompile events in the worker's process (ms per start)\n`);
  for (const [name, ms] of [...compileByName].sort((a, c) => c[1] - a[1]).slice(0, 15)) process.stdout.write(`${perRep(ms)}  ${name}\n`);
  process.stdout.write(`\nwasm functions compiled lazily per start: ${(lazyCount / reps).toFixed(0)}, ${Math.round(lazyTotal / reps)} of ${wasm.codeBytes} code bytes\n`);
  for (const [name, bytes] of [...lazyBytes].sort((a, c) => c[1] - a[1]).slice(0, 25)) process.stdout.write(`${String(Math.round(bytes / reps)).padStart(7)}  ${name.slice(0, 140)}\n`);
  process.stdout.write('\ntop functions by self time\n');
  for (const [name, ms] of [...selfByName].sort((a, c) => c[1] - a[1]).slice(0, top)) process.stdout.write(`${perRep(ms)}  ${name.slice(0, 140)}\n`);
  if (out && lastEvents) writeFileSync(out, JSON.stringify({ traceEvents: lastEvents }));
} finally {
  await b.close();
}
