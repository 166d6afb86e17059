#!/usr/bin/env node
// `make bench`: measures the engine against the browser's own floor and
// publishes the numbers (issue 9, BENCHMARKS.md).
//
// Runs the native criterion benches, then, in headless Chromium with the
// built extension (dist/extension), a bare JS extension beside it and the
// local mock LLM (instant responses): per-step overhead, growth with
// history, cold start, steer ACK latency, streaming, size and memory. Every
// engine figure is measured next to its floor in the same browser, the same
// worker and the same run; the floors are re-measured before each
// repetition. Writes target/bench/results.json (every figure with units,
// machine, date, commit), target/bench/plot.svg and table.md, prints a
// table, and refreshes the results block of BENCHMARKS.md and
// benches/plot.svg (unless --no-docs).
//
// It reports; it does not judge speed. It exits non-zero only when something
// is broken: a step did not run, a tool failed, a delta was lost, a turn
// did not end as scripted.
//
// Usage: node scripts/bench.mjs [--quick] [--no-native] [--no-docs]
//   --quick      fewer repetitions, criterion --quick (a smoke run)
//   --no-native  skip cargo bench (the browser part only)
//   --no-docs    leave BENCHMARKS.md and benches/plot.svg untouched

import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { startMockLlm } from '../tests/mock-llm/server.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { DEFAULT_EXTENSION_PATH, REPO_ROOT } from '../tests/support/browser.mjs';
import { launchBench, openClientPage, profileWorker, wasmMemoryBytes } from './bench/browser.mjs';
import {
  installClient,
  pageBareSeed,
  pageColdConnect,
  pageConfigure,
  pageEchoRoundTrips,
  pageOpen,
  pageRunTurn,
  pageSnapshotCache,
  pageSteerAcks,
  pageStreamTurn,
  swBareCheckpointCommits,
  swStartBareCommitLoop,
  swStopBareCommitLoop,
  swBareCommits,
  swBareFetches,
  swInstantiateOnly,
  swMetrics,
  swResetMetrics,
  swCountHistory,
  swSeed,
  swSeedHistory,
  swTiming,
  swWaitForEngine,
} from './bench/inpage.mjs';
import { nativeFigures, readCriterion, runCriterion } from './bench/native.mjs';
import { consoleTable, markdownBlock, plotSvg, replaceBlock } from './bench/report.mjs';
import { ENGINE_DB, seededThread, snapshotStepsScript } from './bench/seed.mjs';
import { gzipByOwner, sizeByCrate } from './bench/wasm-size.mjs';
import { measureNoMcp } from './bench/variant-size.mjs';
import { median, perStepOf, round, summarize } from './bench/stats.mjs';

const argv = new Set(process.argv.slice(2));
for (const arg of argv) {
  if (!['--quick', '--no-native', '--no-docs'].includes(arg)) {
    process.stderr.write(`bench: unknown argument ${arg}\nusage: node scripts/bench.mjs [--quick] [--no-native] [--no-docs]\n`);
    process.exit(2);
  }
}
const QUICK = argv.has('--quick');
const CONFIG = {
  quick: QUICK,
  stepCounts: [20, 200],
  stepReps: QUICK ? { 20: 2, 200: 1 } : { 20: 5, 200: 3 },
  historyLengths: [10, 1000, 10000],
  historySteps: QUICK ? 5 : 10,
  historyReps: QUICK ? 1 : 5,
  coldReps: QUICK ? 2 : 11,
  floorSamples: QUICK ? 15 : 30,
  steerCount: QUICK ? 10 : 25,
  steerReps: QUICK ? 1 : 3,
  streamTokens: 5000,
  streamReps: QUICK ? 1 : 3,
  pacedStreamReps: QUICK ? 1 : 2,
  pacedChunkDelayMs: 1,
  instantiateReps: 5,
  warmInitReps: QUICK ? 2 : 5,
  frameMs: 1000 / 60,
  // 8. A long-used profile: what months of turns leave in the stores a
  // start reads whole (30 days old, so past the 7-day retention).
  usedProfile: { threads: 200, runs: 1000, receiptsPerRun: 3, ageDays: 30 },
  usedReps: QUICK ? 3 : 7,
};
const OUT_DIR = path.join(REPO_ROOT, 'target', 'bench');
const EXTENSION = DEFAULT_EXTENSION_PATH;
const WASM = path.join(EXTENSION, 'pkg', 'sw_agent_bg.wasm');
const GLUE = path.join(EXTENSION, 'pkg', 'sw_agent.js');

const log = (message) => process.stderr.write(`bench: ${message}\n`);
const figures = [];
const problems = [];
const raw = {};

/** Adds a figure from repeated samples (median and spread) or one value. */
function figure(group, id, label, unit, samplesOrValue, extra = {}) {
  const samples = Array.isArray(samplesOrValue) ? samplesOrValue : [samplesOrValue];
  const s = summarize(samples);
  const entry = { group, id, label, unit, median: s.median, min: s.min, max: s.max, n: s.n, samples: samples.map(round), ...extra };
  figures.push(entry);
  return entry;
}

function problem(message) {
  problems.push(message);
  log(`PROBLEM: ${message}`);
}

/** Polls `check` (async, truthy when done) every 50 ms for up to `ms`; its last value. */
async function waitUntil(check, ms) {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value || Date.now() >= until) return value;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function git(...args) {
  try {
    return execFileSync('git', args, { cwd: REPO_ROOT, encoding: 'utf8' }).trim();
  } catch {
    return '';
  }
}

// ------------------------------------------------------------- native

function native() {
  if (argv.has('--no-native')) return;
  const since = Date.now() - 1000;
  runCriterion(REPO_ROOT, QUICK ? ['--quick'] : []);
  const results = readCriterion(REPO_ROOT, since);
  if (results.length === 0) problem('cargo bench wrote no criterion results');
  raw.criterion = results;
  figures.push(...nativeFigures(results));
}

// --------------------------------------------------------------- sizes

function sizes() {
  const group = 'size';
  const wasm = readFileSync(WASM);
  const glue = readFileSync(GLUE);
  const sw = readFileSync(path.join(EXTENSION, 'sw.js'));
  figure(group, 'size.wasm_raw', '.wasm raw', 'bytes', wasm.length);
  figure(group, 'size.wasm_gzip', '.wasm gzip -9', 'bytes', gzipSync(wasm, { level: 9 }).length);
  figure(group, 'size.glue_raw', 'JS glue (pkg/sw_agent.js) raw', 'bytes', glue.length);
  figure(group, 'size.glue_gzip', 'JS glue gzip -9', 'bytes', gzipSync(glue, { level: 9 }).length);
  figure(group, 'size.sw_js_raw', 'sw.js raw', 'bytes', sw.length);
  const byCrate = sizeByCrate(path.join(REPO_ROOT, 'target', 'wasm32-unknown-unknown', 'release', 'sw_agent.wasm'));
  if (byCrate) {
    raw.sizeByCrate = byCrate;
    const crateGroup = 'size: code bytes by crate (cargo output before wasm-bindgen/wasm-opt)';
    figure(crateGroup, 'size.crates.code', 'all code', 'bytes', byCrate.codeBytes);
    figure(crateGroup, 'size.crates.data', 'data section (strings, tables)', 'bytes', byCrate.dataBytes);
    for (const o of byCrate.owners.slice(0, 12)) {
      figure(crateGroup, `size.crates.${o.owner}`, `${o.owner} (${(o.share * 100).toFixed(1)}% of code)`, 'bytes', o.bytes, { share: o.share });
    }
    const serde = byCrate.owners.filter((o) => /^serde/.test(o.owner)).reduce((a, o) => a + o.bytes, 0);
    figure(crateGroup, 'size.crates.serde_family', `serde + serde_core + serde_json + serde_wasm_bindgen (${((serde / byCrate.codeBytes) * 100).toFixed(1)}% of code)`, 'bytes', serde, { share: serde / byCrate.codeBytes });
  }
  shippedGzipByOwner();
  noMcpSize();
}

/**
 * The module built without MCP (wasm-pack.toml [variant.no-mcp]:
 * --no-default-features), built by scripts/build.sh --variant into its own
 * out_dir and cargo target directory (dist/extension and the default
 * build's files stay as they are): its size, and that no function of the
 * MCP client is left in it (BENCHMARKS.md item 52).
 */
function noMcpSize() {
  let m;
  try {
    m = measureNoMcp(REPO_ROOT, path.resolve(REPO_ROOT, process.env.CARGO_TARGET_DIR || 'target', 'wasm32-unknown-unknown', 'release', 'sw_agent.wasm'));
  } catch (error) {
    problem(`the build without MCP (scripts/build.sh --variant no-mcp) failed: ${error.message}`);
    return;
  }
  raw.noMcp = m;
  const group = 'size: built without MCP (wasm-pack.toml [variant.no-mcp], cargo --no-default-features)';
  figure(group, 'size.no_mcp.wasm_raw', '.wasm raw', 'bytes', m.raw);
  figure(group, 'size.no_mcp.wasm_gzip', '.wasm gzip -9', 'bytes', m.gzip);
  const full = get('size.wasm_gzip');
  if (full) figure(group, 'size.no_mcp.saved_gzip', 'gzip -9 bytes the MCP client costs (the default build minus this one)', 'bytes', full.median - m.gzip);
  figure(group, 'size.no_mcp.client_functions', `functions of the MCP client (src/platform/mcp.rs, oauth.rs) its cargo output names (the default build's: ${m.defaultClientFunctions ?? 'no name section'})`, 'count', m.clientFunctions ?? NaN);
  if (m.clientFunctions !== 0) problem(`the build without MCP still has ${m.clientFunctions ?? 'unknown (no name section)'} functions of the MCP client`);
  if (!(m.defaultClientFunctions > 0)) problem(`the default build's cargo output names no function of the MCP client (${m.defaultClientFunctions}): the check of the build without MCP proves nothing`);
}

/**
 * The shipped module in the target's measure (gzip -9), per owner: a copy of
 * the same build with its function names (scripts/bench-named-wasm.sh --out)
 * names the shipped code, which it must match byte for byte.
 */
function shippedGzipByOwner() {
  const dir = path.join(OUT_DIR, 'named');
  try {
    execFileSync('bash', [path.join(REPO_ROOT, 'scripts', 'bench-named-wasm.sh'), '--out', dir], { cwd: REPO_ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  } catch (error) {
    problem(`the named copy of the module was not built: ${error.message}`);
    return;
  }
  const by = gzipByOwner(path.join(dir, 'sw_agent_bg.wasm'), WASM);
  if (!by) {
    problem('the named copy of the module does not match the shipped one (rebuild with scripts/build.sh)');
    return;
  }
  raw.gzipByOwner = by;
  const group = 'size: the shipped .wasm in gzip -9 bytes, by owner (each owner compressed alone)';
  const kib = (bytes) => `${(bytes / 1024).toFixed(0)} KiB`;
  figure(group, 'size.gzip.code', 'code section (all functions at once)', 'bytes', by.codeGzip);
  figure(group, 'size.gzip.data', `data section (strings, tables, panic locations; ${by.dataRaw.toLocaleString('en-US')} bytes raw)`, 'bytes', by.dataGzip);
  figure(group, 'size.gzip.other', 'the other sections (imports, types, exports, table, …)', 'bytes', by.otherGzip);
  figure(group, 'size.gzip.own', "sw_agent's own functions (all modules at once)", 'bytes', by.ownGzip);
  figure(
    group,
    'size.gzip.without_own',
    `the module without any of sw_agent's own functions: the other code, the data and the other sections (${kib(by.withoutOwn)} vs the 150 KiB target)`,
    'bytes',
    by.withoutOwn,
  );
  for (const o of by.owners.slice(0, 14)) {
    figure(group, `size.gzip.${o.owner}`, `${o.owner} (${o.functions} functions, ${o.raw.toLocaleString('en-US')} bytes raw)`, 'bytes', o.gzip);
  }
}

// ------------------------------------------------------------- browser

async function browser() {
  const mock = await startMockLlm({ quiet: true, keepBodies: false });
  const pages = await startStaticServer();
  let b;
  try {
    b = await launchBench({ extensionPath: EXTENSION });
    raw.browser = b.browserVersion;
    const { context, real, bare } = b;
    const shop = context.pages()[0] ?? (await context.newPage());
    await shop.goto(pages.url('shop.html'));
    const realPage = await openClientPage(context, real);
    const barePage = await openClientPage(context, bare);
    await realPage.evaluate(installClient);
    await barePage.evaluate(installClient);
    await realPage.evaluate(pageConfigure, { baseUrl: mock.url, model: 'mock-1', apiKey: 'sk-bench-not-a-secret' });
    // Page tools act on the active tab: the shop page, not the client pages.
    await shop.bringToFront();
    await real.evaluate(swWaitForEngine);

    const floors = { relaxed: [], strict: [], rtt: [], fetch: [], checkpoint: [], checkpointBytes: [], runBytes: [] };
    /** The floor, measured right now in the engine's own worker and through a bare Port. */
    const measureFloor = async () => {
      const relaxed = await real.evaluate(swBareCommits, { count: CONFIG.floorSamples, durability: 'relaxed' });
      const strict = await real.evaluate(swBareCommits, { count: CONFIG.floorSamples, durability: 'strict' });
      const rtt = await barePage.evaluate(pageEchoRoundTrips, { count: CONFIG.floorSamples });
      const fetches = await real.evaluate(swBareFetches, { url: `${mock.origin}/__control/state`, count: 10 });
      const checkpoint = await real.evaluate(swBareCheckpointCommits, { dbName: ENGINE_DB, count: CONFIG.floorSamples });
      floors.checkpoint.push(...checkpoint.samples);
      if (checkpoint.bytes) floors.checkpointBytes.push(checkpoint.bytes);
      if (checkpoint.runBytes) floors.runBytes.push(checkpoint.runBytes);
      floors.relaxed.push(...relaxed);
      floors.strict.push(...strict);
      floors.rtt.push(...rtt);
      floors.fetch.push(...fetches);
      return { relaxed: median(relaxed), strict: median(strict), rtt: median(rtt), fetch: median(fetches), checkpoint: median(checkpoint.samples) };
    };

    /** One scripted turn of `steps` page_snapshot steps and a final answer; metrics from the worker. */
    const stepRun = async ({ steps, threadId = null, label }) => {
      mock.reset();
      mock.setScript(snapshotStepsScript(steps));
      await real.evaluate(swResetMetrics);
      const turn = await realPage.evaluate(pageRunTurn, { key: 'main', threadId, text: `Take ${steps} page outlines.` });
      const metrics = await real.evaluate(swMetrics);
      const requests = mock.requests().length;
      const bodyBytes = mock.requests().at(-1)?.bodyBytes ?? 0;
      const okTools = turn.toolResults.filter((s) => s === 'ok').length;
      if (turn.stopReason !== 'end' || requests !== steps + 1 || okTools !== steps) {
        problem(`${label}: expected ${steps} ok tool steps and ${steps + 1} provider requests ending with "end"; got ${okTools} ok of ${turn.toolResults.length} (${[...new Set(turn.toolResults)].join(',')}), ${requests} requests, stop ${turn.stopReason} ${turn.error ? JSON.stringify(turn.error) : ''}${turn.sequence ? `; events: ${turn.sequence.join(' ')}` : ''}`);
      }
      mock.reset();
      return { turn, metrics, bodyBytes };
    };

    /** Per-step figures of one run next to the floor measured just before it. */
    const perStep = ({ turn, metrics, bodyBytes }, floor) => {
      const { steps, engineAndCommit, provider, wallPerStep } = perStepOf(metrics, turn.wallMs);
      const wallOverhead = (turn.wallMs - metrics.provider.totalMs - metrics.tools.totalMs) / steps;
      const checkpoints = metrics.commits.count / steps;
      const floorPerStep = checkpoints * floor.relaxed;
      return {
        steps,
        engineAndCommit,
        engine: metrics.engine.totalMs / steps,
        commitPerCheckpoint: metrics.commits.totalMs / metrics.commits.count,
        encodePerCheckpoint: metrics.encode.totalMs / metrics.commits.count,
        wallOverhead,
        wallPerStep,
        provider,
        providerOverFetch: metrics.provider.totalMs / steps / floor.fetch,
        tool: metrics.tools.totalMs / Math.max(1, steps - 1),
        checkpoints,
        floorPerStep,
        ratio: engineAndCommit / floorPerStep,
        ratioWall: wallOverhead / floorPerStep,
        commitInflation: metrics.commits.totalMs / metrics.commits.count / floor.relaxed,
        commitOverPayload: metrics.commits.totalMs / metrics.commits.count / floor.checkpoint,
        eventsPerStep: metrics.eventsSent / steps,
        bodyBytes,
        // Of the request bodies: what was copied out of wasm memory (the
        // rest went as kept Blobs), and building them (plan and Blobs).
        bodyCopiedShare: metrics.bodyBytes > 0 ? metrics.bodyCopied / metrics.bodyBytes : null,
        bodyBuild: metrics.bodyBuild.totalMs / steps,
      };
    };

    // Warm up: JIT, content script injection, the first IndexedDB open.
    log('warm-up');
    await realPage.evaluate(pageOpen, { key: 'main', threadId: null });
    await measureFloor();
    await stepRun({ steps: 3, label: 'warm-up' });

    // 1. Per-step overhead, N = 20 and 200, each on a fresh thread.
    const stepResults = {};
    for (const n of CONFIG.stepCounts) {
      stepResults[n] = [];
      for (let rep = 0; rep < CONFIG.stepReps[n]; rep += 1) {
        log(`per-step N=${n} rep ${rep + 1}/${CONFIG.stepReps[n]}`);
        const floor = await measureFloor();
        const run = await stepRun({ steps: n, label: `per-step N=${n}` });
        stepResults[n].push(perStep(run, floor));
      }
    }
    raw.perStep = stepResults;

    // The floor under load: one more N=20 turn (not one of the measured
    // repetitions) with a bare commit every 15 ms in the same worker.
    log('per-step N=20 with bare commits alongside');
    const idleFloor = await measureFloor();
    await real.evaluate(swStartBareCommitLoop, { everyMs: 15 });
    const loaded = await stepRun({ steps: 20, label: 'per-step N=20, bare commits alongside' });
    const loadedSamples = await real.evaluate(swStopBareCommitLoop);
    const underLoad = { samples: loadedSamples, idle: idleFloor.relaxed, run: perStep(loaded, idleFloor) };
    raw.floorUnderLoad = underLoad;

    // 2 + 3. Seed threads of ~10, 1,000, 10,000 nodes (engine schema) and the same nodes for the bare worker.
    log('seeding threads');
    const seeded = CONFIG.historyLengths.map((length) => ({ length, ...seededThread(`bench-h${length}-${Date.now().toString(36)}`, length) }));
    await real.evaluate(swSeed, { dbName: ENGINE_DB, threads: seeded.map(({ thread, nodes }) => ({ thread, nodes })) });
    await barePage.evaluate(pageBareSeed, { nodes: seeded.flatMap((s) => s.nodes) });
    // The engine learns of the seeded threads when a fresh worker starts: the
    // first kill below does that (both workers are running at this point).

    // 3. Cold start: worker killed, then Port connect → initialized.
    const cold = { engine: {}, cached: {}, cachedWorker: {}, cachedMessage: {}, cachedPrefetch: {}, cachedServed: {}, bareData: {}, startMs: {}, workerStart: {}, toReady: {}, afterReady: {}, threadRead: {}, threadDecode: {}, threadBuild: {}, wasmAt: {}, wasmCached: {}, prefetchAt: {}, prefetched: {}, startOpen: {}, startImage: {}, startSettings: {}, records: {}, bareEmpty: [], bareWorkerStart: [], nodes: {}, bytes: {} };
    for (const s of seeded) {
      for (const key of ['engine', 'cached', 'cachedWorker', 'cachedMessage', 'cachedPrefetch', 'cachedServed', 'bareData', 'startMs', 'workerStart', 'toReady', 'afterReady', 'threadRead', 'threadDecode', 'threadBuild', 'wasmAt', 'wasmCached', 'prefetchAt', 'prefetched', 'startOpen', 'startImage', 'startSettings', 'records']) cold[key][s.length] = [];
    }
    const memory = {};
    for (let rep = 0; rep < CONFIG.coldReps; rep += 1) {
      log(`cold start rep ${rep + 1}/${CONFIG.coldReps}`);
      const order = rep % 2 ? [...seeded].reverse() : seeded;
      for (const s of order) {
        // Without a cached snapshot (the store's cache emptied while the
        // worker is dead): the engine starts and answers.
        await real.kill();
        await realPage.evaluate(pageSnapshotCache, { dbName: ENGINE_DB, clear: true });
        const result = await realPage.evaluate(pageColdConnect, { threadId: s.thread.id });
        cold.engine[s.length].push(result.ms);
        cold.nodes[s.length] = result.nodes;
        cold.bytes[s.length] = result.bytes;
        if (result.nodes !== s.nodes.length) problem(`cold start: the snapshot of ${s.thread.id} has ${result.nodes} nodes, ${s.nodes.length} were seeded`);
        await real.evaluate(swWaitForEngine);
        const timing = await real.evaluate(swTiming);
        // connect → worker global created → engine ready → initialized received
        cold.startMs[s.length].push(timing.startMs);
        cold.workerStart[s.length].push(timing.timeOrigin - result.connectEpoch);
        cold.toReady[s.length].push(timing.readyAt);
        cold.wasmAt[s.length].push(timing.wasmAt);
        cold.wasmCached[s.length].push(timing.wasmFrom === 'cache');
        if (timing.wasmFrom !== 'cache') problem(`cold start of ${s.thread.id}: the wasm module came from ${timing.wasmFrom}, not from Cache Storage`);
        cold.prefetchAt[s.length].push(timing.prefetchAt);
        cold.prefetched[s.length].push(timing.startPrefetched);
        if (!timing.startPrefetched) problem(`cold start of ${s.thread.id}: Engine.start() did not use sw.js's prefetch (it read the database itself)`);
        cold.startOpen[s.length].push(timing.startOpenMs);
        cold.startImage[s.length].push(timing.startImageMs);
        cold.startSettings[s.length].push(timing.startSettingsMs);
        cold.afterReady[s.length].push(result.initializedEpoch - (timing.timeOrigin + timing.readyAt));
        if (timing.servedFromCache !== 0) problem(`cold start of ${s.thread.id} without a cached snapshot: sw.js answered ${timing.servedFromCache} initialize from the cache`);
        const loads = await real.evaluate(swMetrics);
        cold.threadRead[s.length].push(loads.threadRead.totalMs);
        cold.threadDecode[s.length].push(loads.threadDecode.totalMs);
        cold.threadBuild[s.length].push(loads.threadBuild.totalMs);
        cold.records[s.length].push(loads.threadRecords);
        if (rep === 0 && (s.length === 10 || s.length === 10000)) {
          // The thread stays loaded in this fresh worker: its memory now.
          const heap = await real.withWorkerSession(async (call) => {
            await call('HeapProfiler.collectGarbage').catch(() => {});
            return call('Runtime.getHeapUsage');
          });
          const wasmBytes = await wasmMemoryBytes(real, GLUE).catch((error) => {
            log(`wasm memory not read: ${error.message}`);
            return null;
          });
          memory[s.length] = { heap, wasmBytes };
        }
        // The engine cached the thread's snapshot at rest after answering:
        // the panel's reconnect after the next kill is answered from it.
        const cachedNow = await waitUntil(() => realPage.evaluate(pageSnapshotCache, { dbName: ENGINE_DB, threadId: s.thread.id }), 10000);
        if (!cachedNow) problem(`cold start of ${s.thread.id}: no snapshot cached after the engine answered`);
        await real.kill();
        const fromCache = await realPage.evaluate(pageColdConnect, { threadId: s.thread.id });
        cold.cached[s.length].push(fromCache.ms);
        if (fromCache.nodes !== s.nodes.length) problem(`cold start from the cache: the snapshot of ${s.thread.id} has ${fromCache.nodes} nodes, ${s.nodes.length} were seeded`);
        await real.evaluate(swWaitForEngine);
        const cachedTiming = await real.evaluate(swTiming);
        const served = cachedTiming.servedFromCache;
        cold.cachedWorker[s.length].push(cachedTiming.timeOrigin - fromCache.connectEpoch);
        cold.cachedMessage[s.length].push(cachedTiming.firstMessageAt);
        cold.cachedPrefetch[s.length].push(cachedTiming.prefetchAt);
        cold.cachedServed[s.length].push(cachedTiming.servedAt);
        if (served !== 1) problem(`cold start of ${s.thread.id} with a cached snapshot: sw.js answered ${served} initialize from the cache, not 1`);
        await bare.kill();
        const bareResult = await barePage.evaluate(pageColdConnect, { threadId: s.thread.id });
        cold.bareData[s.length].push(bareResult.ms);
        if (bareResult.nodes !== s.nodes.length) problem(`bare cold start read ${bareResult.nodes} of ${s.nodes.length} nodes`);
      }
      await bare.kill();
      const bareEmpty = await barePage.evaluate(pageColdConnect, { threadId: null });
      cold.bareEmpty.push(bareEmpty.ms);
      cold.bareWorkerStart.push((await bare.evaluate(swTiming)).timeOrigin - bareEmpty.connectEpoch);
    }
    const instantiate = await real.evaluate(swInstantiateOnly, { path: 'pkg/sw_agent_bg.wasm', reps: CONFIG.instantiateReps });
    raw.cold = cold;
    raw.memory = memory;
    raw.instantiate = instantiate;

    // 2. Growth with history: per-step overhead on the seeded threads.
    const history = {};
    for (const s of seeded) history[s.length] = [];
    for (let rep = 0; rep < CONFIG.historyReps; rep += 1) {
      for (const s of rep % 2 ? [...seeded].reverse() : seeded) {
        log(`history ${s.length} nodes rep ${rep + 1}/${CONFIG.historyReps}`);
        await realPage.evaluate(pageOpen, { key: 'main', threadId: s.thread.id }); // loads the thread
        const floor = await measureFloor();
        const run = await stepRun({ steps: CONFIG.historySteps, threadId: s.thread.id, label: `history ${s.length}` });
        history[s.length].push(perStep(run, floor));
      }
    }
    raw.history = history;

    // Warm initialize: the thread is in memory; snapshot, serialization and Port only.
    const warmInit = {};
    for (const s of seeded) {
      await realPage.evaluate(pageOpen, { key: 'main', threadId: s.thread.id });
      warmInit[s.length] = [];
      for (let rep = 0; rep < CONFIG.warmInitReps; rep += 1) {
        warmInit[s.length].push((await realPage.evaluate(pageOpen, { key: 'main', threadId: s.thread.id })).ms);
      }
    }
    raw.warmInit = warmInit;

    // Where the worker's time goes: one profiled run of each kind (not timed).
    log('profiles');
    const profiles = {};
    await realPage.evaluate(pageOpen, { key: 'main', threadId: null });
    profiles.steps20 = (await profileWorker(real, () => stepRun({ steps: 20, label: 'profiled N=20' }))).profile;
    const longest = seeded[seeded.length - 1];
    await realPage.evaluate(pageOpen, { key: 'main', threadId: longest.thread.id });
    profiles.history10k = (await profileWorker(real, () => stepRun({ steps: CONFIG.historySteps, threadId: longest.thread.id, label: 'profiled history' }))).profile;
    profiles.warmInit10k = (await profileWorker(real, () => realPage.evaluate(pageOpen, { key: 'main', threadId: longest.thread.id }))).profile;
    raw.profiles = profiles;

    // 4. Steer ACK latency while a turn streams (the provider stalls mid-stream).
    await realPage.evaluate(pageOpen, { key: 'main', threadId: null });
    const steer = [];
    for (let rep = 0; rep < CONFIG.steerReps; rep += 1) {
      log(`steer rep ${rep + 1}/${CONFIG.steerReps}`);
      const floor = await measureFloor();
      mock.reset();
      mock.setScript([{ stallMs: 60000, text: 'Thinking' }]);
      await real.evaluate(swResetMetrics);
      const result = await realPage.evaluate(pageSteerAcks, { key: 'main', threadId: null, count: CONFIG.steerCount });
      const metrics = await real.evaluate(swMetrics);
      result.commitMs = metrics.commits.count ? metrics.commits.totalMs / metrics.commits.count : null;
      result.engineMs = metrics.engine.totalMs / CONFIG.steerCount;
      mock.reset();
      if (result.rejected || result.downgraded) problem(`steer: ${result.rejected} rejected, ${result.downgraded} downgraded of ${CONFIG.steerCount}`);
      steer.push({ ...result, floor });
    }
    raw.steer = steer;

    // 5. Streaming 5,000 tokens as fast as the mock can, and paced at 1 ms per token.
    const tokens = Array.from({ length: CONFIG.streamTokens }, (_, i) => (i % 7 === 6 ? 'naïve✓ ' : `tok${i} `));
    const streamText = tokens.join('');
    const streams = { fast: [], paced: [] };
    for (const [kind, reps, delay] of [['fast', CONFIG.streamReps, 0], ['paced', CONFIG.pacedStreamReps, CONFIG.pacedChunkDelayMs]]) {
      for (let rep = 0; rep < reps; rep += 1) {
        log(`stream ${kind} rep ${rep + 1}/${reps}`);
        mock.reset();
        mock.setScript([{ text: streamText, chunkDelayMs: delay }]);
        await real.evaluate(swResetMetrics);
        const result = await realPage.evaluate(pageStreamTurn, { key: 'main', threadId: null, text: 'Write a long answer.', frameMs: CONFIG.frameMs });
        const metrics = await real.evaluate(swMetrics);
        mock.reset();
        const lost = result.streamedText !== streamText;
        if (lost) problem(`stream ${kind}: the deltas (${result.streamedText.length} chars) differ from what the mock sent (${streamText.length} chars)`);
        if (result.completedText !== streamText) problem(`stream ${kind}: the completed assistant node differs from what the mock sent`);
        if (result.stopReason !== 'end') problem(`stream ${kind}: turn ended with ${result.stopReason} ${JSON.stringify(result.error)}`);
        const { streamedText, completedText, ...rest } = result;
        streams[kind].push({ ...rest, lost, deltasSent: metrics.deltasSent, eventsSent: metrics.eventsSent, providerMs: metrics.provider.totalMs });
      }
    }
    raw.streams = streams;

    // 8. A long-used profile (last: it leaves 200 more threads behind).
    // The first start after seeding reads everything (decoding the receipts
    // and threads; of the runs only their state) and deletes a batch of
    // expired receipts (a bounded batch per start); later starts read what
    // is left. Finished runs stay stored until their thread opens (none of
    // these does here). Compared with the bare worker's first reply.
    log('long-used profile');
    const seededHistory = await real.evaluate(swSeedHistory, { dbName: ENGINE_DB, ...CONFIG.usedProfile });
    const used = { seededRecords: seededHistory, first: null, firstStart: null, startsToSettle: 0, left: null, steady: [], steadyStart: [], steadyCached: [], bare: [] };
    await real.kill();
    used.first = (await realPage.evaluate(pageColdConnect, { threadId: null })).ms;
    await real.evaluate(swWaitForEngine);
    used.firstStart = (await real.evaluate(swTiming)).startMs;
    for (let start = 1; start <= 20; start += 1) {
      used.left = await real.evaluate(swCountHistory, { dbName: ENGINE_DB });
      used.startsToSettle = start;
      if (used.left.receipts === 0) break;
      await real.kill();
      await realPage.evaluate(pageColdConnect, { threadId: null });
      await real.evaluate(swWaitForEngine);
    }
    for (let rep = 0; rep < CONFIG.usedReps; rep += 1) {
      // The engine answers (no cached snapshot)...
      await real.kill();
      await realPage.evaluate(pageSnapshotCache, { dbName: ENGINE_DB, clear: true });
      used.steady.push((await realPage.evaluate(pageColdConnect, { threadId: null })).ms);
      await real.evaluate(swWaitForEngine);
      used.steadyStart.push((await real.evaluate(swTiming)).startMs);
      // ...then, once it cached the most recent thread at rest, the cache does.
      await waitUntil(() => realPage.evaluate(pageSnapshotCache, { dbName: ENGINE_DB, threadId: null }), 5000);
      await real.kill();
      used.steadyCached.push((await realPage.evaluate(pageColdConnect, { threadId: null })).ms);
      await real.evaluate(swWaitForEngine);
      if ((await real.evaluate(swTiming)).servedFromCache !== 1) problem('long-used profile: a fresh connect was not answered from the snapshot cache');
      await bare.kill();
      used.bare.push((await barePage.evaluate(pageColdConnect, { threadId: null })).ms);
    }
    if (used.left.receipts !== 0) problem(`long-used profile: ${used.left.receipts} expired receipts left after ${used.startsToSettle} starts`);
    raw.used = used;

    return { stepResults, underLoad, cold, memory, instantiate, history, warmInit, profiles, steer, streams, floors, seeded, used };
  } finally {
    await b?.close();
    await pages.close().catch(() => {});
    await mock.close().catch(() => {});
  }
}

// ------------------------------------------------------------- figures

function browserFigures(m) {
  const floorGroup = 'floor (same browser, same run)';
  figure(floorGroup, 'floor.commit_relaxed', 'bare IndexedDB readwrite commit (relaxed, in the engine\'s worker)', 'ms', m.floors.relaxed);
  figure(floorGroup, 'floor.commit_strict', 'bare IndexedDB readwrite commit (strict durability)', 'ms', m.floors.strict);
  figure(floorGroup, 'floor.port_rtt', 'bare Port round trip (page ⇄ bare JS worker)', 'ms', m.floors.rtt);
  figure(floorGroup, 'floor.commit_checkpoint', 'bare commit of a step checkpoint\'s records (run + thread + 2 nodes, copied from the engine\'s DB)', 'ms', m.floors.checkpoint, { payloadBytes: median(m.floors.checkpointBytes), runRecordBytes: median(m.floors.runBytes) });
  figure(floorGroup, 'floor.checkpoint_bytes', 'size of those records as JSON (the run record alone: ' + round(median(m.floors.runBytes)) + ' bytes)', 'bytes', median(m.floors.checkpointBytes));
  figure(floorGroup, 'floor.fetch', 'bare fetch round trip, worker → mock server (GET, tiny body)', 'ms', m.floors.fetch);

  if (m.underLoad?.samples.length) {
    const { samples, run } = m.underLoad;
    const loadedFloor = median(samples);
    figure(floorGroup, 'floor.commit_relaxed_under_load', 'bare commit (relaxed, same worker) every 15 ms while an N=20 turn runs (one extra turn)', 'ms', samples);
    figure(floorGroup, 'floor.under_load_over_idle', 'that bare commit / the same commit measured just before, idle', 'ratio', loadedFloor / m.underLoad.idle);
    figure(floorGroup, 'floor.under_load_engine_commit', 'that turn: engine commit per checkpoint / bare commit alongside', 'ratio', run.commitPerCheckpoint / loadedFloor);
    figure(floorGroup, 'floor.under_load_ratio', 'that turn: engine+commit / (checkpoints × bare commit alongside)', 'ratio', run.engineAndCommit / (run.checkpoints * loadedFloor));
  }

  const stepGroup = 'per-step overhead (mock LLM, page_snapshot steps)';
  const pick = (runs, key) => runs.map((r) => r[key]);
  for (const [n, runs] of Object.entries(m.stepResults)) {
    figure(stepGroup, `step.n${n}.engine_commit_ms`, `N=${n}: engine + commit time per step`, 'ms', pick(runs, 'engineAndCommit'));
    figure(stepGroup, `step.n${n}.engine_ms`, `N=${n}: engine time per step (no IO)`, 'ms', pick(runs, 'engine'));
    figure(stepGroup, `step.n${n}.commit_per_checkpoint_ms`, `N=${n}: engine commit, per checkpoint`, 'ms', pick(runs, 'commitPerCheckpoint'));
    figure(stepGroup, `step.n${n}.encode_per_checkpoint_ms`, `N=${n}:   of which encoding the records`, 'ms', pick(runs, 'encodePerCheckpoint'));
    figure(stepGroup, `step.n${n}.commit_over_payload`, `N=${n}: engine commit / bare commit of the same records`, 'ratio', pick(runs, 'commitOverPayload'));
    figure(stepGroup, `step.n${n}.checkpoints_per_step`, `N=${n}: checkpoints per step`, 'count', pick(runs, 'checkpoints'));
    figure(stepGroup, `step.n${n}.wall_overhead_ms`, `N=${n}: wall time per step minus provider and tool time`, 'ms', pick(runs, 'wallOverhead'));
    figure(stepGroup, `step.n${n}.wall_ms`, `N=${n}: wall time per step (all included)`, 'ms', pick(runs, 'wallPerStep'));
    figure(stepGroup, `step.n${n}.provider_ms`, `N=${n}: provider time per step (settings, tab, body, fetch, stream)`, 'ms', pick(runs, 'provider'));
    figure(stepGroup, `step.n${n}.provider_over_fetch`, `N=${n}: provider time per step / bare fetch`, 'ratio', pick(runs, 'providerOverFetch'));
    figure(stepGroup, `step.n${n}.tool_ms`, `N=${n}: tool time per call (page_snapshot via content script)`, 'ms', pick(runs, 'tool'));
    figure(stepGroup, `step.n${n}.ratio`, `N=${n}: engine+commit / (checkpoints × bare commit)`, 'ratio', pick(runs, 'ratio'));
    figure(stepGroup, `step.n${n}.ratio_wall`, `N=${n}: wall overhead / (checkpoints × bare commit)`, 'ratio', pick(runs, 'ratioWall'));
  }

  const historyGroup = `growth with history (${CONFIG.historySteps} steps on a seeded thread)`;
  for (const [len, runs] of Object.entries(m.history)) {
    figure(historyGroup, `history.${len}.engine_commit_ms`, `~${len} nodes: engine + commit per step`, 'ms', pick(runs, 'engineAndCommit'));
    figure(historyGroup, `history.${len}.engine_ms`, `~${len} nodes: engine time per step (no IO)`, 'ms', pick(runs, 'engine'));
    figure(historyGroup, `history.${len}.wall_overhead_ms`, `~${len} nodes: wall per step minus provider and tool`, 'ms', pick(runs, 'wallOverhead'));
    figure(historyGroup, `history.${len}.provider_ms`, `~${len} nodes: provider time per step (settings, tab, request body, fetch, stream)`, 'ms', pick(runs, 'provider'));
    figure(historyGroup, `history.${len}.provider_over_fetch`, `~${len} nodes: provider time per step / bare fetch`, 'ratio', pick(runs, 'providerOverFetch'));
    figure(historyGroup, `history.${len}.body_bytes`, `~${len} nodes: provider request body of the last step`, 'bytes', pick(runs, 'bodyBytes'));
    figure(historyGroup, `history.${len}.body_copied_share`, `~${len} nodes: share of the request bodies copied out of wasm memory (the rest: kept Blobs)`, 'ratio', pick(runs, 'bodyCopiedShare'));
    figure(historyGroup, `history.${len}.body_build_ms`, `~${len} nodes: building the request body per step (plan, Blobs or bytes)`, 'ms', pick(runs, 'bodyBuild'));
    figure(historyGroup, `history.${len}.ratio`, `~${len} nodes: engine+commit / (checkpoints × bare commit)`, 'ratio', pick(runs, 'ratio'));
  }
  // Each repetition runs the ~10 and the ~10,000-node turns back to back
  // (in alternating order): their ratio per repetition is the side-by-side
  // reading of growth; the ratio of the two medians mixes repetitions.
  const small = m.history[10];
  const large = m.history[10000];
  if (small?.length && large?.length === small.length) {
    figure(historyGroup, 'history.growth_paired', '~10,000 / ~10 nodes, engine + commit per step, each repetition\'s pair measured back to back', 'ratio', large.map((r, i) => r.engineAndCommit / small[i].engineAndCommit));
  }

  const coldGroup = 'cold start (worker killed via CDP, then Port connect → initialized)';
  for (const len of Object.keys(m.cold.engine)) {
    figure(coldGroup, `cold.${len}.cached_ms`, `engine, thread of ${m.cold.nodes[len]} nodes, answered from the snapshot cache (the panel's reconnect)`, 'ms', m.cold.cached[len], { snapshotBytes: m.cold.bytes[len] });
    figure(coldGroup, `cold.${len}.cached_worker_ms`, `  ├ connect → worker global created`, 'ms', m.cold.cachedWorker[len]);
    figure(coldGroup, `cold.${len}.cached_message_ms`, `  ├ worker created → the port's initialize arrived in sw.js`, 'ms', m.cold.cachedMessage[len]);
    figure(coldGroup, `cold.${len}.cached_prefetch_ms`, `  ├ worker created → the prefetch (database open, start image, the cache's keys and most recent snapshot) arrived`, 'ms', m.cold.cachedPrefetch[len]);
    figure(coldGroup, `cold.${len}.cached_served_ms`, `  └ worker created → the cached snapshot posted`, 'ms', m.cold.cachedServed[len]);
    figure(coldGroup, `cold.${len}.engine_ms`, `engine, thread of ${m.cold.nodes[len]} nodes, no cached snapshot (the engine starts and answers)`, 'ms', m.cold.engine[len], { snapshotBytes: m.cold.bytes[len] });
    figure(coldGroup, `cold.${len}.start_ms`, `engine: Engine.start() (decode the prefetched image, or open + read it), ${m.cold.nodes[len]}-node thread present`, 'ms', m.cold.startMs[len]);
    figure(coldGroup, `cold.${len}.bare_data_ms`, `bare JS worker reading and sending the same ${m.cold.nodes[len]} nodes`, 'ms', m.cold.bareData[len]);
    figure(coldGroup, `cold.${len}.worker_start_ms`, `  ├ connect → worker global created (${m.cold.nodes[len]} nodes)`, 'ms', m.cold.workerStart[len]);
    figure(coldGroup, `cold.${len}.to_ready_ms`, `  ├ worker created → engine ready (script, wasm fetch/compile/instantiate, Engine.start)`, 'ms', m.cold.toReady[len]);
    figure(coldGroup, `cold.${len}.wasm_at_ms`, `      ├ worker created → wasm instantiated (scripts, wasm fetch/compile/instantiate)`, 'ms', m.cold.wasmAt[len]);
    figure(coldGroup, `cold.${len}.wasm_cached`, `      ├ starts whose module came from Cache Storage (of ${m.cold.wasmCached[len].length})`, 'count', [m.cold.wasmCached[len].filter(Boolean).length]);
    figure(coldGroup, `cold.${len}.prefetch_at_ms`, `      ├ worker created → sw.js's prefetch (database open, start image, settings) arrived`, 'ms', m.cold.prefetchAt[len]);
    figure(coldGroup, `cold.${len}.prefetched`, `      ├ starts that used the prefetch (of ${m.cold.prefetched[len].length})`, 'count', [m.cold.prefetched[len].filter(Boolean).length]);
    figure(coldGroup, `cold.${len}.start_open_ms`, `      ├ Engine.start(): open the database (0 when prefetched)`, 'ms', m.cold.startOpen[len]);
    figure(coldGroup, `cold.${len}.start_image_ms`, `      ├ Engine.start(): read (unless prefetched) and decode the start image`, 'ms', m.cold.startImage[len]);
    figure(coldGroup, `cold.${len}.start_settings_ms`, `      └ Engine.start(): read the settings (0 when prefetched)`, 'ms', m.cold.startSettings[len]);
    figure(coldGroup, `cold.${len}.after_ready_ms`, `  └ engine ready → initialized received (load thread, snapshot, Port)`, 'ms', m.cold.afterReady[len]);
    figure(coldGroup, `cold.${len}.thread_read_ms`, `      ├ IndexedDB read of the thread's records (one getAllRecords for a tail)`, 'ms', m.cold.threadRead[len]);
    figure(coldGroup, `cold.${len}.thread_records`, `      ├ records read (the thread's tail when its record has pathLen)`, 'count', m.cold.records[len]);
    figure(coldGroup, `cold.${len}.thread_decode_ms`, `      ├ decoding them into nodes`, 'ms', m.cold.threadDecode[len]);
    figure(coldGroup, `cold.${len}.thread_build_ms`, `      └ engine: build the thread, snapshot, post`, 'ms', m.cold.threadBuild[len]);
    figure(coldGroup, `cold.${len}.warm_init_ms`, `  (warm initialize of the same thread: snapshot + Port only)`, 'ms', m.warmInit[len]);
  }
  figure(coldGroup, 'cold.bare_worker_start_ms', 'bare JS worker: connect → worker global created', 'ms', m.cold.bareWorkerStart);
  figure(coldGroup, 'cold.bare_empty_ms', 'bare JS worker, first reply (no data)', 'ms', m.cold.bareEmpty);
  figure(coldGroup, 'cold.wasm_compile_ms', 'wasm module alone: compile (same process; V8 may cache)', 'ms', m.instantiate.map((r) => r.compileMs));
  figure(coldGroup, 'cold.wasm_instantiate_ms', 'wasm module alone: instantiate with stub imports', 'ms', m.instantiate.map((r) => r.instantiateMs));

  const u = m.used;
  const p = CONFIG.usedProfile;
  const usedGroup = `long-used profile (${p.threads} threads, ${p.runs} finished runs, ${p.runs * p.receiptsPerRun} receipts, ${p.ageDays} days old)`;
  figure(usedGroup, 'used.first_ms', 'first cold start after seeding (reads everything, deletes a batch of receipts)', 'ms', u.first);
  figure(usedGroup, 'used.first_start_ms', '  Engine.start() of that start', 'ms', u.firstStart);
  figure(usedGroup, 'used.starts_to_settle', 'starts until the expired receipts are gone', 'count', u.startsToSettle);
  figure(usedGroup, 'used.runs_left', 'seeded runs still stored (a start decodes none; pruned when their thread opens)', 'count', u.left.runs);
  figure(usedGroup, 'used.receipts_left', 'seeded receipts left', 'count', u.left.receipts);
  figure(usedGroup, 'used.steady_ms', 'cold start after that (connect → initialized, no thread id), no cached snapshot', 'ms', u.steady);
  figure(usedGroup, 'used.steady_cached_ms', 'the same, answered from the snapshot cache (the most recent thread)', 'ms', u.steadyCached);
  figure(usedGroup, 'used.steady_start_ms', '  Engine.start() of those starts', 'ms', u.steadyStart);
  figure(usedGroup, 'used.bare_ms', 'bare JS worker, first reply (same repetitions)', 'ms', u.bare);

  const steerGroup = 'steer ACK (steer posted → command.ack, while streaming)';
  const steerLatencies = m.steer.flatMap((r) => r.latencies);
  figure(steerGroup, 'steer.ack_ms', 'steer ACK latency', 'ms', steerLatencies);
  figure(steerGroup, 'steer.ratio_strict', 'steer ACK / (strict commit + Port round trip)', 'ratio', m.steer.map((r) => median(r.latencies) / (r.floor.strict + r.floor.rtt)));
  figure(steerGroup, 'steer.commit_ms', 'engine commit per checkpoint during those steers (the submit, each steer, the interrupt)', 'ms', m.steer.map((r) => r.commitMs).filter((v) => v !== null && v !== undefined));
  figure(steerGroup, 'steer.engine_ms', 'engine time per steer (no IO; the submit and interrupt included)', 'ms', m.steer.map((r) => r.engineMs).filter((v) => v !== null && v !== undefined));
  figure(steerGroup, 'steer.floor_strict_ms', 'the floor of each repetition: strict commit', 'ms', m.steer.map((r) => r.floor.strict));
  figure(steerGroup, 'steer.floor_rtt_ms', 'the floor of each repetition: Port round trip', 'ms', m.steer.map((r) => r.floor.rtt));
  figure(steerGroup, 'steer.ratio_relaxed', 'steer ACK / (relaxed commit + Port round trip)', 'ratio', m.steer.map((r) => median(r.latencies) / (r.floor.relaxed + r.floor.rtt)));

  for (const [kind, runs] of Object.entries(m.streams)) {
    const group = kind === 'fast'
      ? `streaming ${CONFIG.streamTokens} tokens, as fast as the mock can`
      : `streaming ${CONFIG.streamTokens} tokens, paced ${CONFIG.pacedChunkDelayMs} ms per token`;
    figure(group, `stream.${kind}.first_delta_ms`, 'submit → first delta on the client', 'ms', pick(runs, 'submitToFirstDeltaMs'));
    figure(group, `stream.${kind}.last_delta_ms`, 'submit → last delta on the client', 'ms', pick(runs, 'submitToLastDeltaMs'));
    figure(group, `stream.${kind}.complete_ms`, 'submit → turn.complete', 'ms', pick(runs, 'submitToCompleteMs'));
    figure(group, `stream.${kind}.delta_messages`, 'item.delta Port messages received', 'count', pick(runs, 'deltaMessages'));
    figure(group, `stream.${kind}.per_frame`, 'delta messages per 16.7 ms frame after the first (average)', 'msgs/frame', pick(runs, 'messagesAfterFirstPerFrame'));
    figure(group, `stream.${kind}.max_per_frame`, 'most delta messages in any 16.7 ms window', 'count', pick(runs, 'maxMessagesPerFrame'));
    figure(group, `stream.${kind}.lost`, 'runs where a delta was lost', 'count', runs.filter((r) => r.lost).length);
  }

  const profileGroup = 'where the worker\'s CPU time goes (V8 sampling profile, one extra run each)';
  const profileLabels = { steps20: 'N=20 fresh thread', history10k: `${CONFIG.historySteps} steps on the ~10,000-node thread`, warmInit10k: 'warm initialize of the ~10,000-node thread' };
  for (const [key, profile] of Object.entries(m.profiles)) {
    const entries = Object.entries(profile.categories).filter(([cat]) => cat !== 'idle' && cat !== 'root').sort((a, b) => b[1] - a[1]);
    for (const [cat, ms] of entries) {
      figure(profileGroup, `profile.${key}.${cat.split(' ')[0].replace(/[^a-z-]/gi, '')}`, `${profileLabels[key]}: ${cat}`, 'ms', ms, { shareOfBusy: ms / profile.busyMs });
    }
    const steps = { steps20: 21, history10k: CONFIG.historySteps + 1 }[key];
    if (steps) {
      figure(profileGroup, `profile.${key}.busy_per_step`, `${profileLabels[key]}: worker CPU per step (all categories)`, 'ms', (profile.busyMs) / steps);
      figure(profileGroup, `profile.${key}.wasm_per_step`, `${profileLabels[key]}: wasm CPU per step`, 'ms', (profile.categories['wasm (engine, serde, rexie)'] ?? 0) / steps);
    }
  }

  const memGroup = 'memory (worker, after GC)';
  for (const [len, mem] of Object.entries(m.memory)) {
    figure(memGroup, `memory.${len}.js_heap_used`, `JS heap used, ${len === '10000' ? '~10,000' : '~10'}-node thread loaded`, 'bytes', mem.heap.usedSize);
    if (mem.wasmBytes !== null) figure(memGroup, `memory.${len}.wasm_memory`, `wasm linear memory, ${len === '10000' ? '~10,000' : '~10'}-node thread loaded`, 'bytes', mem.wasmBytes);
  }
}

function get(id) {
  return figures.find((f) => f.id === id);
}

function targets() {
  const out = [];
  const add = (name, measured, comparator, limit, unit, note) => {
    const met = Number.isFinite(measured) ? (comparator === '≤' ? measured <= limit : measured >= limit) : null;
    out.push({ name, measured, comparator, limit, unit, met, note });
  };
  for (const n of CONFIG.stepCounts) {
    const f = get(`step.n${n}.ratio`);
    if (f) add(`per-step overhead, N=${n}: engine+commit / (checkpoints per step × bare commit)`, f.median, '≤', 1.5, '×', `wall-clock variant: ${round(get(`step.n${n}.ratio_wall`)?.median)}×; ${round(get(`step.n${n}.checkpoints_per_step`)?.median)} checkpoints per step`);
  }
  const h10 = get('history.10.engine_commit_ms');
  const h10k = get('history.10000.engine_commit_ms');
  const paired = get('history.growth_paired');
  if (paired) add('per-step overhead at ~10,000 nodes / at ~10 nodes (median of back-to-back pairs)', paired.median, '≤', 1.2, '×', `medians ${round(h10.median)} → ${round(h10k.median)} ms per step; pairs ${round(paired.min)}–${round(paired.max)}`);
  else if (h10 && h10k) add('per-step overhead at ~10,000 nodes / at ~10 nodes', h10k.median / h10.median, '≤', 1.2, '×', `${round(h10.median)} → ${round(h10k.median)} ms per step`);
  const c1k = get('cold.1000.cached_ms');
  const c1kEngine = get('cold.1000.engine_ms');
  const bareEmpty = get('cold.bare_empty_ms');
  if (c1k && bareEmpty) add('cold start, 1,000-node thread / bare JS worker\'s first reply (the reconnect: answered from the snapshot cache)', c1k.median / bareEmpty.median, '≤', 3, '×', `${round(c1k.median)} ms vs ${round(bareEmpty.median)} ms`);
  if (c1kEngine && bareEmpty) add('the same without a cached snapshot (the engine starts and answers)', c1kEngine.median / bareEmpty.median, '≤', 3, '×', `${round(c1kEngine.median)} ms vs ${round(bareEmpty.median)} ms`);
  const steer = get('steer.ratio_strict');
  if (steer) add('steer ACK / (strict commit + Port round trip)', steer.median, '≤', 1.5, '×', `vs a relaxed commit (what the engine uses): ${round(get('steer.ratio_relaxed')?.median)}×`);
  const lost = (get('stream.fast.lost')?.median ?? 0) + (get('stream.paced.lost')?.median ?? 0);
  add('5,000-token stream: runs with a lost delta', lost, '≤', 0, 'runs');
  for (const kind of ['fast', 'paced']) {
    const f = get(`stream.${kind}.per_frame`);
    if (f) add(`5,000-token stream (${kind}): delta messages per frame after the first`, f.median, '≤', 1, 'msgs/frame', `max in any 16.7 ms window: ${round(get(`stream.${kind}.max_per_frame`)?.median)}`);
  }
  const gz = get('size.wasm_gzip');
  const noMcp = get('size.no_mcp.wasm_gzip');
  if (gz) add('.wasm gzip size', gz.median / 1024, '≤', 150, 'KiB', `${gz.median.toLocaleString('en-US')} bytes${noMcp ? `; built without MCP: ${noMcp.median.toLocaleString('en-US')} bytes, ${round(noMcp.median / 1024)} KiB` : ''}`);
  const c10 = get('cold.10.engine_ms');
  if (c10) add('cold start, ~10-node thread, no cached snapshot (reference: a JS agent stack ~65 ms on this kind of machine)', c10.median, '≤', 65, 'ms', `absolute, so noisier than the ratios; from the cache: ${round(get('cold.10.cached_ms')?.median)} ms`);
  return out;
}

// ------------------------------------------------------------------ main

async function main() {
  mkdirSync(OUT_DIR, { recursive: true });
  const startedAt = new Date();
  const loadStart = os.loadavg();
  native();
  sizes();
  const measured = await browser();
  browserFigures(measured);
  const results = {
    schema: 1,
    date: startedAt.toISOString(),
    durationS: round((Date.now() - startedAt.getTime()) / 1000),
    git: { commit: git('rev-parse', 'HEAD'), dirty: git('status', '--porcelain').length > 0 },
    machine: {
      cpuModel: os.cpus()[0]?.model ?? 'unknown',
      cores: os.cpus().length,
      memoryBytes: os.totalmem(),
      platform: `${os.type()} ${os.release()} ${os.arch()}`,
      node: process.versions.node,
      browser: raw.browser,
      loadAverage: { start: loadStart, end: os.loadavg() },
    },
    config: CONFIG,
    units: { ms: 'milliseconds', bytes: 'bytes', ratio: 'dimensionless', 'MB/s': '10^6 bytes per second', 'steps/s': 'provider steps per second' },
    targets: [],
    figures,
    problems,
    raw,
  };
  results.targets = targets();
  writeFileSync(path.join(OUT_DIR, 'results.json'), `${JSON.stringify(results, null, 2)}\n`);

  const lengths = Object.keys(measured.history).map(Number);
  const series = (idOf, name, color, dash) => ({
    name,
    color,
    dash,
    points: lengths.map((len) => ({ x: measured.cold.nodes[len] ?? len, ...pickStats(get(idOf(len))) })),
  });
  const svg = plotSvg({
    perStep: [
      series((l) => `history.${l}.engine_commit_ms`, 'engine + commit per step', '#c0392b'),
      series((l) => `history.${l}.wall_overhead_ms`, 'wall − provider − tool per step', '#e67e22'),
      series((l) => `history.${l}.engine_ms`, 'engine only (no IO)', '#8e44ad'),
      {
        name: 'floor: checkpoints × bare commit',
        color: '#27ae60',
        dash: true,
        points: lengths.map((len) => ({ x: measured.cold.nodes[len] ?? len, ...pickStats({ ...summarize(measured.history[len].map((r) => r.floorPerStep)) }) })),
      },
    ],
    coldStart: [
      series((l) => `cold.${l}.engine_ms`, 'engine (wasm), no cached snapshot', '#c0392b'),
      series((l) => `cold.${l}.cached_ms`, 'engine, from the snapshot cache', '#e67e22'),
      series((l) => `cold.${l}.bare_data_ms`, 'bare JS worker, same nodes', '#27ae60', true),
      {
        name: 'bare JS worker, no data',
        color: '#2980b9',
        dash: true,
        points: lengths.map((len) => ({ x: measured.cold.nodes[len] ?? len, ...pickStats(get('cold.bare_empty_ms')) })),
      },
    ],
    subtitle: `${results.date.slice(0, 10)} · ${results.git.commit.slice(0, 12)}${results.git.dirty ? '+dirty' : ''} · ${results.machine.cores} cores · ${results.machine.browser} · medians, bars = min–max`,
  });
  writeFileSync(path.join(OUT_DIR, 'plot.svg'), svg);
  const block = markdownBlock(results);
  writeFileSync(path.join(OUT_DIR, 'table.md'), `${block}\n`);

  process.stdout.write(`${consoleTable(figures, results.targets)}\n`);
  process.stdout.write(`\nwrote ${path.relative(REPO_ROOT, path.join(OUT_DIR, 'results.json'))}, plot.svg, table.md\n`);

  if (!argv.has('--no-docs')) {
    const docPath = path.join(REPO_ROOT, 'BENCHMARKS.md');
    if (existsSync(docPath)) {
      const updated = replaceBlock(readFileSync(docPath, 'utf8'), block);
      if (updated) {
        writeFileSync(docPath, updated);
        mkdirSync(path.join(REPO_ROOT, 'benches'), { recursive: true });
        writeFileSync(path.join(REPO_ROOT, 'benches', 'plot.svg'), svg);
        process.stdout.write('updated BENCHMARKS.md (results block) and benches/plot.svg\n');
      } else {
        log('BENCHMARKS.md has no bench:results markers; left untouched');
      }
    }
  }
  if (problems.length) {
    process.stderr.write(`\nbench: ${problems.length} problem(s): something is broken (not slow):\n${problems.map((p) => `  - ${p}`).join('\n')}\n`);
    process.exit(1);
  }
}

function pickStats(f) {
  if (!f) return { median: NaN, min: NaN, max: NaN };
  return { median: f.median, min: f.min, max: f.max };
}

main().catch((error) => {
  process.stderr.write(`bench: failed: ${error.stack ?? error}\n`);
  process.exit(1);
});
