// Browser side of the benchmark harness: headless Chromium with the real
// extension and, next to it, a bare JS extension (the floor), plus the CDP
// plumbing the figures need (kill a worker, heap usage, wasm memory).
//
// Owns: the bare extension (written to a temp dir), launching Chromium with
// both, finding each extension's worker again after a kill, and CDP sessions
// on service-worker targets. Reuses tests/support/browser.mjs for the rest.
// Must not: download anything, or leave a browser or temp dir behind after close().

import { chromium } from 'playwright-core';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  CHROMIUM_PATH,
  assertExtensionBuilt,
  browserCdp,
  killServiceWorker,
  serviceWorkerTargets,
  waitFor,
} from '../../tests/support/browser.mjs';

/**
 * The bare extension: a module service worker in plain JS that answers the
 * same Port connect the engine answers, with nothing else in between.
 * `initialize` without a thread is answered at once; with a `threadId` it
 * reads that thread's nodes from its own IndexedDB (seeded like the
 * engine's) and sends them back, the floor for a cold start with history.
 * `ping` is answered with `pong` (the bare Port round trip).
 */
const BARE_SW = `
let db = null;
function openDb() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open('bare', 1);
    request.onupgradeneeded = () => request.result.createObjectStore('nodes', { keyPath: 'id' }).createIndex('threadId', 'threadId');
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}
async function threadNodes(threadId) {
  db ??= await openDb();
  return new Promise((resolve, reject) => {
    const request = db.transaction('nodes', 'readonly').objectStore('nodes').index('threadId').getAll(IDBKeyRange.only(threadId));
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}
chrome.runtime.onConnect.addListener((port) => {
  port.onMessage.addListener(async (message) => {
    if (message.type === 'ping') {
      port.postMessage({ type: 'pong', seq: message.seq });
    } else if (message.type === 'initialize') {
      const nodes = message.threadId ? await threadNodes(message.threadId) : [];
      port.postMessage({ type: 'initialized', snapshot: { threads: [], thread: message.threadId ? { id: message.threadId, nodes } : null } });
    }
  });
});
`;

export function writeBareExtension() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-bare-ext-'));
  writeFileSync(
    path.join(dir, 'manifest.json'),
    JSON.stringify({
      manifest_version: 3,
      name: 'bench bare worker',
      version: '1.0.0',
      background: { service_worker: 'sw.js', type: 'module' },
    }, null, 2),
  );
  writeFileSync(path.join(dir, 'sw.js'), BARE_SW);
  return dir;
}

const BASELINE_SUFFIX = ' (baseline)';

/** A copy of another build of the extension, told apart by its manifest name. */
function copyAsBaseline(extensionPath) {
  assertExtensionBuilt(extensionPath);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-baseline-ext-'));
  cpSync(extensionPath, dir, { recursive: true });
  const manifestPath = path.join(dir, 'manifest.json');
  const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'));
  manifest.name = `${manifest.name}${BASELINE_SUFFIX}`;
  writeFileSync(manifestPath, JSON.stringify(manifest, null, 2));
  return dir;
}

/**
 * Launches Chromium with the built extension and the bare one (and, when
 * `baselinePath` is given, another build of the extension to compare with).
 * @returns {Promise<{ context, browserVersion, real: ExtensionHandle, bare: ExtensionHandle, close }>}
 */
export async function launchBench({ extensionPath, baselinePath = null }) {
  assertExtensionBuilt(extensionPath);
  const bareDir = writeBareExtension();
  const baselineDir = baselinePath ? copyAsBaseline(baselinePath) : null;
  const userDataDir = mkdtempSync(path.join(os.tmpdir(), 'bench-profile-'));
  const both = [extensionPath, bareDir, ...(baselineDir ? [baselineDir] : [])].join(',');
  let context;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: CHROMIUM_PATH,
      headless: true,
      ignoreDefaultArgs: ['--disable-extensions'],
      viewport: { width: 1000, height: 800 },
      args: [
        '--no-sandbox',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
        `--disable-extensions-except=${both}`,
        `--load-extension=${both}`,
        // Experiments only (e.g. BENCH_JS_FLAGS=--no-wasm-lazy-compilation):
        // V8 flags for the whole browser, so compare runs, not extensions.
        ...(process.env.BENCH_JS_FLAGS ? [`--js-flags=${process.env.BENCH_JS_FLAGS}`] : []),
      ],
    });
    const workers = await waitFor(
      async () => {
        const found = context.serviceWorkers().filter((w) => w.url().startsWith('chrome-extension://'));
        return found.length >= (baselineDir ? 3 : 2) ? found : null;
      },
      { timeout: 60000, message: 'every extension service worker' },
    );
    const named = {};
    for (const worker of workers) {
      const name = await worker.evaluate(() => chrome.runtime.getManifest().name);
      const role = name === 'bench bare worker' ? 'bare' : name.endsWith(BASELINE_SUFFIX) ? 'baseline' : 'real';
      named[role] = new URL(worker.url()).host;
    }
    if (!named.real || !named.bare) throw new Error(`could not tell the extensions apart: ${JSON.stringify(named)}`);
    const browserVersion = context.browser()?.version() ?? 'unknown';
    const close = async () => {
      await context.close().catch(() => {});
      rmSync(userDataDir, { recursive: true, force: true });
      rmSync(bareDir, { recursive: true, force: true });
      if (baselineDir) rmSync(baselineDir, { recursive: true, force: true });
    };
    return {
      context,
      browserVersion,
      real: extensionHandle(context, named.real),
      bare: extensionHandle(context, named.bare),
      baseline: baselineDir ? extensionHandle(context, named.baseline) : null,
      close,
    };
  } catch (error) {
    await context?.close().catch(() => {});
    rmSync(userDataDir, { recursive: true, force: true });
    rmSync(bareDir, { recursive: true, force: true });
    throw error;
  }
}

/** One extension: its id, its current worker (found again after a kill), a kill, CDP on its worker. */
function extensionHandle(context, id) {
  const prefix = `chrome-extension://${id}/`;
  const handle = {
    id,
    prefix,
    /** The page the harness drives this extension from (set by openClientPage). */
    page: null,
    /** Evaluates `fn(arg)` in the extension's running worker (retrying while a restarted worker attaches). */
    async evaluate(fn, arg) {
      let lastError = null;
      const deadline = Date.now() + 30000;
      while (Date.now() < deadline) {
        const workers = context.serviceWorkers().filter((w) => w.url().startsWith(prefix));
        for (const worker of workers.reverse()) {
          try {
            return await worker.evaluate(fn, arg);
          } catch (error) {
            lastError = error;
            if (!/closed|destroyed|detached|context was|Target/i.test(String(error.message))) throw error;
          }
        }
        await context.waitForEvent('serviceworker', { timeout: 1000 }).catch(() => {});
      }
      throw new Error(`could not evaluate in the worker of ${id}: ${lastError?.message ?? 'no worker'}`);
    },
    async kill() {
      await killServiceWorker(context, id, { page: handle.page ?? undefined });
    },
    /** Runs `fn(call, on)` with a raw CDP session attached to this extension's worker target. */
    async withWorkerSession(fn) {
      const cdp = await browserCdp(context);
      const [target] = await waitFor(
        async () => {
          const found = await serviceWorkerTargets(context, id);
          return found.length ? found : null;
        },
        { timeout: 30000, message: `a worker target of ${id}` },
      );
      const { sessionId } = await cdp.send('Target.attachToTarget', { targetId: target.targetId, flatten: false });
      let nextId = 0;
      const pending = new Map();
      const listeners = new Map();
      const onMessage = (event) => {
        if (event.sessionId !== sessionId) return;
        const message = JSON.parse(event.message);
        if (message.id !== undefined && pending.has(message.id)) {
          const { resolve, reject } = pending.get(message.id);
          pending.delete(message.id);
          if (message.error) reject(new Error(`${message.error.message} (${message.error.code})`));
          else resolve(message.result);
        } else if (message.method && listeners.has(message.method)) {
          for (const listener of listeners.get(message.method)) listener(message.params);
        }
      };
      cdp.session.on('Target.receivedMessageFromTarget', onMessage);
      const call = (method, params = {}) =>
        new Promise((resolve, reject) => {
          nextId += 1;
          pending.set(nextId, { resolve, reject });
          cdp.send('Target.sendMessageToTarget', { sessionId, message: JSON.stringify({ id: nextId, method, params }) }).catch(reject);
        });
      const on = (method, listener) => {
        if (!listeners.has(method)) listeners.set(method, []);
        listeners.get(method).push(listener);
      };
      try {
        return await fn(call, on);
      } finally {
        cdp.session.off('Target.receivedMessageFromTarget', onMessage);
        await cdp.send('Target.detachFromTarget', { sessionId }).catch(() => {});
      }
    },
  };
  return handle;
}

/** Opens a page of the extension (its manifest.json: an extension-origin document, no UI of its own). */
export async function openClientPage(context, handle) {
  const page = await context.newPage();
  await page.goto(`${handle.prefix}manifest.json`);
  const ok = await page.evaluate(() => typeof chrome?.runtime?.connect === 'function');
  if (!ok) throw new Error(`chrome.runtime.connect is not available in ${handle.prefix}manifest.json`);
  handle.page = page;
  return page;
}

/** JS heap of the extension's worker (CDP Runtime.getHeapUsage): { usedSize, totalSize, … } bytes. */
export async function workerHeap(handle) {
  return handle.withWorkerSession((call) => call('Runtime.getHeapUsage'));
}

/**
 * The wasm linear memory of the engine (bytes). The glue module keeps the
 * instance private, so this pauses the worker once at a known line of the
 * glue (inside `Engine.metrics()`, which it calls) and reads
 * `wasm.memory.buffer.byteLength` in that scope, then resumes.
 */
export async function wasmMemoryBytes(handle, gluePath) {
  const lines = readFileSync(gluePath, 'utf8').split('\n');
  const lineNumber = lines.findIndex((line) => line.includes('wasm.engine_metrics('));
  if (lineNumber < 0) return null;
  return handle.withWorkerSession(async (call, on) => {
    await call('Debugger.enable');
    const paused = new Promise((resolve) => on('Debugger.paused', resolve));
    const { breakpointId } = await call('Debugger.setBreakpointByUrl', { urlRegex: 'pkg/sw_agent\\.js$', lineNumber });
    const evaluated = call('Runtime.evaluate', { expression: 'globalThis.__swAgent.engine.metrics(); 1' });
    const event = await Promise.race([
      paused,
      new Promise((_, reject) => setTimeout(() => reject(new Error('the breakpoint in the glue was not hit')), 10000)),
    ]);
    let bytes = null;
    try {
      const result = await call('Debugger.evaluateOnCallFrame', {
        callFrameId: event.callFrames[0].callFrameId,
        expression: 'wasm.memory.buffer.byteLength',
        returnByValue: true,
      });
      bytes = result.result?.value ?? null;
    } finally {
      await call('Debugger.removeBreakpoint', { breakpointId }).catch(() => {});
      await call('Debugger.resume').catch(() => {});
      await evaluated.catch(() => {});
      await call('Debugger.disable').catch(() => {});
    }
    return bytes;
  });
}

/**
 * Runs `run()` while the V8 sampling profiler records the extension's worker
 * (CDP Profiler on its target) and returns `{ result, profile }`, the
 * profile summarized by where the worker spent its time.
 */
export async function profileWorker(handle, run, { intervalUs = 100, top = 15, callers = 0 } = {}) {
  return handle.withWorkerSession(async (call) => {
    await call('Profiler.enable');
    await call('Profiler.setSamplingInterval', { interval: intervalUs });
    await call('Profiler.start');
    let result;
    let profile;
    try {
      result = await run();
    } finally {
      ({ profile } = await call('Profiler.stop'));
      await call('Profiler.disable').catch(() => {});
    }
    return { result, profile: summarizeProfile(profile, { top, callers }) };
  });
}

/** Where a worker's time went: ms per category, and the top functions of the wasm-bindgen glue and of wasm. */
export function summarizeProfile(profile, { top: count = 15, callers: callerCount = 0 } = {}) {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const parentOf = new Map();
  for (const node of profile.nodes) for (const child of node.children ?? []) parentOf.set(child, node.id);
  const selfUs = new Map();
  for (let i = 0; i < profile.samples.length; i += 1) {
    const dt = profile.timeDeltas[i + 1] ?? 0;
    selfUs.set(profile.samples[i], (selfUs.get(profile.samples[i]) ?? 0) + dt);
  }
  const category = (frame) => {
    const { functionName: name, url } = frame;
    if (name === '(idle)') return 'idle';
    if (name === '(garbage collector)') return 'garbage collector';
    if (name === '(program)') return 'browser/V8 internals ((program))';
    if (name === '(root)') return 'root';
    if (url.startsWith('wasm://') || /^\$|^wasm-function/.test(name)) return 'wasm (engine, serde, rexie)';
    if (url.endsWith('/pkg/sw_agent.js')) return 'wasm-bindgen glue JS (values across the boundary)';
    if (url.endsWith('/sw.js')) return 'sw.js';
    if (url === '') return 'built-ins (postMessage, IndexedDB, fetch, JSON, …)';
    return 'other JS';
  };
  const categories = {};
  const functions = {};
  const keyOf = (frame) => {
    const cat = category(frame);
    return `${cat === 'wasm (engine, serde, rexie)' ? 'wasm' : cat.startsWith('wasm-bindgen') ? 'glue' : cat.startsWith('built-ins') ? 'builtin' : 'other'}: ${frame.functionName || '(anonymous)'}`;
  };
  // Who a built-in's or the glue's time is spent for: the nearest caller of
  // the engine's own code (`sw_agent::`), else the nearest that is neither
  // a built-in nor glue (a wasm function of a library, the worker's JS).
  const callers = {};
  const callerOf = (id) => {
    let nearest;
    for (let at = parentOf.get(id); at !== undefined; at = parentOf.get(at)) {
      const frame = byId.get(at).callFrame;
      const cat = category(frame);
      if (cat.startsWith('built-ins') || cat.startsWith('wasm-bindgen') || cat === 'root') continue;
      if (frame.functionName.includes('sw_agent::')) return keyOf(frame);
      nearest ??= keyOf(frame);
    }
    return nearest ?? '(none)';
  };
  for (const [id, us] of selfUs) {
    const node = byId.get(id);
    if (!node || us === 0) continue;
    const cat = category(node.callFrame);
    categories[cat] = (categories[cat] ?? 0) + us / 1000;
    const key = keyOf(node.callFrame);
    functions[key] = (functions[key] ?? 0) + us / 1000;
    if (callerCount > 0 && !key.startsWith('wasm: ')) {
      const by = (callers[key] ??= {});
      const caller = callerOf(id);
      by[caller] = (by[caller] ?? 0) + us / 1000;
    }
  }
  const totalMs = (profile.endTime - profile.startTime) / 1000;
  const busyMs = totalMs - (categories.idle ?? 0);
  const top = Object.entries(functions)
    .filter(([name]) => !name.startsWith('other: (idle)'))
    .sort((a, b) => b[1] - a[1])
    .slice(0, count)
    .map(([name, ms]) => ({
      name,
      ms,
      ...(callers[name]
        ? {
            callers: Object.entries(callers[name])
              .sort((a, b) => b[1] - a[1])
              .slice(0, callerCount)
              .map(([caller, callerMs]) => ({ name: caller, ms: callerMs })),
          }
        : {}),
    }));
  return { totalMs, busyMs, categories, top };
}
