// Code the benchmark harness runs inside the browser: in an extension page
// (the client side of the Port, as the side panel would be) and inside the
// service worker (the floor measurements, seeding, metrics).
//
// Every export here is passed to Playwright's `evaluate`, so each function
// must be self-contained (no closures over module scope) and must not use
// eval/new Function (extension CSP). Client code is event-driven: the client
// tab is in the background, so it never polls with timers.

// --------------------------------------------------------------- page side

/** Installs `globalThis.__bench` in an extension page: Ports with timestamped event logs. */
export function installClient() {
  if (globalThis.__bench) return 'already installed';
  const clientId = `bench-${crypto.randomUUID()}`;
  function connect(name = 'panel') {
    const conn = { events: [], waiters: [], connectedAt: performance.now(), closed: null };
    conn.port = chrome.runtime.connect({ name });
    conn.port.onMessage.addListener((msg) => {
      const entry = { t: performance.now(), msg };
      conn.events.push(entry);
      for (let i = 0; i < conn.waiters.length; ) {
        const waiter = conn.waiters[i];
        if (waiter.pred(msg)) {
          conn.waiters.splice(i, 1);
          waiter.resolve(entry);
        } else {
          i += 1;
        }
      }
    });
    conn.port.onDisconnect.addListener(() => {
      conn.closed = performance.now();
      for (const waiter of conn.waiters.splice(0)) waiter.reject(new Error(`the Port closed while waiting for ${waiter.what}`));
    });
    return conn;
  }
  function send(conn, type, fields = {}) {
    const msg = { type, clientId, submissionId: crypto.randomUUID(), ...fields };
    const t = performance.now();
    conn.port.postMessage(msg);
    return { msg, t };
  }
  function wait(conn, pred, { from = 0, what = 'an event', timeoutMs = 300000 } = {}) {
    for (let i = from; i < conn.events.length; i += 1) {
      if (pred(conn.events[i].msg)) return Promise.resolve(conn.events[i]);
    }
    if (conn.closed !== null) return Promise.reject(new Error(`the Port is closed; cannot wait for ${what}`));
    return new Promise((resolve, reject) => {
      const waiter = {
        pred,
        what,
        resolve: (entry) => {
          clearTimeout(timer);
          resolve(entry);
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
      const timer = setTimeout(() => {
        const index = conn.waiters.indexOf(waiter);
        if (index >= 0) conn.waiters.splice(index, 1);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
      }, timeoutMs);
      conn.waiters.push(waiter);
    });
  }
  const replyTo = (submissionId) => (m) => (m.type === 'command.ack' || m.type === 'command.reject') && m.submissionId === submissionId;
  globalThis.__bench = { clientId, connect, send, wait, replyTo, conns: {} };
  return 'installed';
}

/** Opens (or reopens) the Port `key` and initializes it on `threadId`; returns the round trip. */
export async function pageOpen({ key, threadId = null }) {
  const b = globalThis.__bench;
  if (b.conns[key] && b.conns[key].closed === null) b.conns[key].port.disconnect();
  const t0 = performance.now();
  const conn = b.connect('panel');
  b.conns[key] = conn;
  b.send(conn, 'initialize', { threadId });
  const init = await b.wait(conn, (m) => m.type === 'initialized', { what: 'initialized' });
  // The thread's length: the snapshot carries its tail, `olderNodes` the rest.
  const nodes = (init.msg.snapshot?.thread?.nodes?.length ?? 0) + (init.msg.snapshot?.thread?.olderNodes ?? 0);
  const bytes = JSON.stringify(init.msg).length;
  conn.events.length = 0;
  return { ms: init.t - t0, nodes, bytes, threadId: init.msg.snapshot?.thread?.id ?? null };
}

/** Cold connect: a new Port, `initialize`, time until `initialized`; the Port is closed after. */
export async function pageColdConnect({ threadId = null, name = 'panel' }) {
  const b = globalThis.__bench;
  const t0 = performance.now();
  const conn = b.connect(name);
  b.send(conn, 'initialize', { threadId });
  const init = await b.wait(conn, (m) => m.type === 'initialized', { what: 'initialized', timeoutMs: 120000 });
  const ms = init.t - t0;
  // The thread's length: the snapshot carries its tail, `olderNodes` the rest.
  const nodes = (init.msg.snapshot?.thread?.nodes?.length ?? 0) + (init.msg.snapshot?.thread?.olderNodes ?? 0);
  const bytes = JSON.stringify(init.msg).length;
  conn.port.disconnect();
  // Epoch times (timeOrigin-based) to line up with the worker's own clock.
  return { ms, nodes, bytes, connectEpoch: performance.timeOrigin + t0, initializedEpoch: performance.timeOrigin + init.t };
}

/**
 * The engine's snapshot cache (src/engine/snapshot_cache.rs), from an
 * extension page: `clear` empties it (run while the worker is dead, so the
 * next start finds no cached snapshot), otherwise whether `threadId` has one
 * (null: whether the most recent thread has one, the record with `recentOf`).
 */
export async function pageSnapshotCache({ dbName, threadId = null, clear = false }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(dbName);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  try {
    if (!db.objectStoreNames.contains('snapshots')) return false;
    const tx = db.transaction('snapshots', clear ? 'readwrite' : 'readonly');
    const store = tx.objectStore('snapshots');
    const request = clear ? store.clear() : threadId === null ? store.getAll() : store.getKey(threadId);
    const result = await new Promise((resolve, reject) => {
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
    await new Promise((resolve, reject) => {
      tx.oncomplete = resolve;
      tx.onabort = () => reject(tx.error);
    });
    if (clear) return true;
    return threadId === null ? result.some((record) => typeof record?.recentOf === 'string') : result !== undefined;
  } finally {
    db.close();
  }
}

/**
 * Submits one turn on Port `key` and waits for its `turn.complete`.
 * Returns the wall time (submit posted → turn.complete received), the ACK
 * latency, event counts and the statuses of the tool results.
 */
export async function pageRunTurn({ key, threadId = null, text }) {
  const b = globalThis.__bench;
  const conn = b.conns[key];
  conn.events.length = 0;
  const { msg, t } = b.send(conn, 'turn.submit', { threadId, input: { text } });
  const ack = await b.wait(conn, b.replyTo(msg.submissionId), { what: 'the submit ACK' });
  if (ack.msg.type !== 'command.ack') throw new Error(`turn.submit rejected: ${JSON.stringify(ack.msg.error)}`);
  const { turnId } = ack.msg.result;
  const done = await b.wait(conn, (m) => m.type === 'turn.complete' && m.turnId === turnId, { what: 'turn.complete', timeoutMs: 180000 });
  const events = conn.events.slice();
  conn.events.length = 0;
  const counts = {};
  for (const e of events) counts[e.msg.type] = (counts[e.msg.type] ?? 0) + 1;
  const toolResults = events
    .filter((e) => e.msg.type === 'item.complete' && e.msg.node?.kind === 'tool_result')
    .map((e) => e.msg.node.status);
  return {
    wallMs: done.t - t,
    ackMs: ack.t - t,
    turnId,
    threadId: ack.msg.result.threadId,
    stopReason: done.msg.stopReason,
    error: done.msg.error ?? null,
    counts,
    toolResults,
    // The order of what arrived, when a tool call has no announced result (diagnostics).
    sequence: counts['item.complete'] && toolResults.length * 2 !== events.filter((e) => e.msg.type === 'item.complete' && /^tool_/.test(e.msg.node?.kind ?? '')).length
      ? events.map((e) => `${e.msg.type}${e.msg.node ? `:${e.msg.node.kind}` : ''}`).slice(0, 40)
      : null,
  };
}

/**
 * Submits a turn whose answer streams, and records every `item.delta` of
 * the assistant text: when it arrived, how many Port messages carried it,
 * and the concatenated text (to check that nothing was lost).
 */
export async function pageStreamTurn({ key, threadId = null, text, frameMs = 1000 / 60 }) {
  const b = globalThis.__bench;
  const conn = b.conns[key];
  conn.events.length = 0;
  const { msg, t } = b.send(conn, 'turn.submit', { threadId, input: { text } });
  const ack = await b.wait(conn, b.replyTo(msg.submissionId), { what: 'the submit ACK' });
  if (ack.msg.type !== 'command.ack') throw new Error(`turn.submit rejected: ${JSON.stringify(ack.msg.error)}`);
  const { turnId } = ack.msg.result;
  let done;
  try {
    done = await b.wait(conn, (m) => m.type === 'turn.complete' && m.turnId === turnId, { what: 'turn.complete', timeoutMs: 120000 });
  } catch (error) {
    const tail = conn.events.slice(-8).map((e) => `${e.msg.type}${e.msg.state ? `:${e.msg.state}` : ''}`).join(', ');
    throw new Error(`${error.message}; ${conn.events.length} events so far, the last: ${tail}`);
  }
  const events = conn.events.slice();
  conn.events.length = 0;
  const deltas = events.filter((e) => e.msg.type === 'item.delta' && e.msg.turnId === turnId && e.msg.delta?.kind === 'text');
  const streamed = deltas.map((e) => e.msg.delta.text).join('');
  const completed = events.find((e) => e.msg.type === 'item.complete' && e.msg.node?.kind === 'assistant_message' && e.msg.turnId === turnId);
  const times = deltas.map((e) => e.t);
  // The most delta messages that arrived within any one frame-long window.
  let maxPerFrame = 0;
  for (let i = 0, j = 0; i < times.length; i += 1) {
    while (times[i] - times[j] >= frameMs) j += 1;
    maxPerFrame = Math.max(maxPerFrame, i - j + 1);
  }
  const first = times[0] ?? NaN;
  const last = times.at(-1) ?? NaN;
  const frames = Math.max(1, Math.ceil((last - first) / frameMs));
  return {
    submitToFirstDeltaMs: first - t,
    submitToLastDeltaMs: last - t,
    submitToCompleteMs: done.t - t,
    firstToLastDeltaMs: last - first,
    deltaMessages: deltas.length,
    messagesAfterFirstPerFrame: (deltas.length - 1) / frames,
    maxMessagesPerFrame: maxPerFrame,
    streamedText: streamed,
    completedText: completed?.msg.node?.text ?? null,
    stopReason: done.msg.stopReason,
    error: done.msg.error ?? null,
    eventMessages: events.length,
  };
}

/**
 * Starts a turn whose provider stalls while streaming (admission open), sends
 * `count` steers one after another and times each from post to its ACK, then
 * interrupts the turn.
 */
export async function pageSteerAcks({ key, threadId = null, count }) {
  const b = globalThis.__bench;
  const conn = b.conns[key];
  conn.events.length = 0;
  const submit = b.send(conn, 'turn.submit', { threadId, input: { text: 'Think for a while.' } });
  const ack = await b.wait(conn, b.replyTo(submit.msg.submissionId), { what: 'the submit ACK' });
  if (ack.msg.type !== 'command.ack') throw new Error(`turn.submit rejected: ${JSON.stringify(ack.msg.error)}`);
  const { turnId, threadId: tid } = ack.msg.result;
  await b.wait(conn, (m) => m.type === 'item.delta' && m.turnId === turnId, { what: 'the first delta (streaming)' });
  const latencies = [];
  let downgraded = 0;
  let rejected = 0;
  for (let i = 0; i < count; i += 1) {
    const from = conn.events.length;
    const steer = b.send(conn, 'turn.steer', { threadId: tid, expectedTurnId: turnId, input: { text: `Also check item ${i}.` } });
    const reply = await b.wait(conn, b.replyTo(steer.msg.submissionId), { from, what: `the ACK of steer ${i}` });
    latencies.push(reply.t - steer.t);
    if (reply.msg.type !== 'command.ack') rejected += 1;
    else if (reply.msg.result?.downgraded) downgraded += 1;
  }
  const from = conn.events.length;
  const stop = b.send(conn, 'turn.interrupt', { threadId: tid });
  await b.wait(conn, b.replyTo(stop.msg.submissionId), { from, what: 'the interrupt ACK' });
  await b.wait(conn, (m) => m.type === 'turn.complete' && m.turnId === turnId, { what: 'turn.complete after the interrupt' });
  conn.events.length = 0;
  return { latencies, downgraded, rejected, threadId: tid, turnId };
}

/** Port round trips to the bare extension's echo worker (run in the bare extension's page). */
export async function pageEchoRoundTrips({ count }) {
  const b = globalThis.__bench;
  const conn = b.connect('echo');
  const samples = [];
  for (let i = -3; i < count; i += 1) {
    const from = conn.events.length;
    const t = performance.now();
    conn.port.postMessage({ type: 'ping', seq: i });
    const reply = await b.wait(conn, (m) => m.type === 'pong' && m.seq === i, { from, what: `pong ${i}` });
    if (i >= 0) samples.push(reply.t - t); // the first three warm the path up
  }
  conn.port.disconnect();
  return samples;
}

/** Writes `nodes` into the bare extension's own database (run in its page). */
export async function pageBareSeed({ nodes }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open('bare', 1);
    request.onupgradeneeded = () => request.result.createObjectStore('nodes', { keyPath: 'id' }).createIndex('threadId', 'threadId');
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  await new Promise((resolve, reject) => {
    const tx = db.transaction('nodes', 'readwrite');
    for (const node of nodes) tx.objectStore('nodes').put(node);
    tx.oncomplete = resolve;
    tx.onerror = () => reject(tx.error);
  });
  db.close();
  return nodes.length;
}

/** Stores the provider settings the way the side panel does. */
export async function pageConfigure({ baseUrl, model, apiKey }) {
  await chrome.storage.local.set({ settings: { provider: 'openai', baseUrl, model, apiKey } });
  return (await chrome.storage.local.get('settings')).settings;
}

// ---------------------------------------------------------- worker side

/** Waits (inside the service worker) until sw.js exposed the started engine. */
export async function swWaitForEngine() {
  for (let i = 0; i < 600 && !globalThis.__swAgent; i += 1) await new Promise((r) => setTimeout(r, 25));
  if (!globalThis.__swAgent) throw new Error('the engine did not start (globalThis.__swAgent missing; is sw.js current?)');
  return globalThis.__swAgent.engine.metrics();
}

/** The worker's clock: when it started (epoch ms), when the engine was ready, how long Engine.start() took. */
export function swTiming() {
  const agent = globalThis.__swAgent;
  return {
    timeOrigin: performance.timeOrigin,
    readyAt: agent?.readyAt ?? null,
    wasmAt: agent?.wasmAt ?? null,
    wasmFrom: agent?.wasmFrom ?? null,
    prefetchAt: agent?.prefetchAt ?? null,
    startPrefetched: agent ? agent.engine.metrics().startPrefetched : null,
    startMs: agent ? agent.engine.metrics().startMs : null,
    startOpenMs: agent ? agent.engine.metrics().startOpenMs : null,
    startImageMs: agent ? agent.engine.metrics().startImageMs : null,
    startSettingsMs: agent ? agent.engine.metrics().startSettingsMs : null,
    servedFromCache: agent?.servedFromCache ?? null,
    scriptAt: agent?.scriptAt ?? null,
    firstConnectAt: agent?.firstConnectAt ?? null,
    firstMessageAt: agent?.firstMessageAt ?? null,
    servedAt: agent?.servedAt ?? null,
  };
}

/** The floor of a provider request: a bare fetch round trip from this worker to the mock server. */
export async function swBareFetches({ url, count }) {
  const samples = [];
  for (let i = -2; i < count; i += 1) {
    const t = performance.now();
    const response = await fetch(url, { cache: 'no-store' });
    await response.text();
    if (i >= 0) samples.push(performance.now() - t);
  }
  return samples;
}

export function swMetrics() {
  return globalThis.__swAgent.engine.metrics();
}

export function swResetMetrics() {
  globalThis.__swAgent.engine.reset_metrics();
  return true;
}

/**
 * The floor under load: starts a loop in this worker that commits one
 * ~200-byte record (relaxed) into the floor database, waits `everyMs`, and
 * again, until `swStopBareCommitLoop`, recording each commit's duration.
 * Run while the engine works a turn, it shows what a bare commit costs in
 * the same minutes, on the same busy cores.
 */
export async function swStartBareCommitLoop({ everyMs }) {
  // Opened by swBareCommits (the floor measured first; Playwright's evaluate
  // sends a function's source alone, so no shared helper).
  const db = globalThis.__benchFloorDb;
  if (!db) throw new Error('the floor database is opened by swBareCommits: run it first');
  const state = { samples: [], stop: false, done: null };
  globalThis.__benchCommitLoop = state;
  const payload = 'x'.repeat(200);
  state.done = (async () => {
    for (let i = 0; !state.stop; i += 1) {
      const t = performance.now();
      await new Promise((resolve, reject) => {
        const tx = db.transaction('kv', 'readwrite', { durability: 'relaxed' });
        tx.objectStore('kv').put({ id: `loop-${i % 8}`, payload, at: Date.now() });
        tx.oncomplete = resolve;
        tx.onerror = () => reject(tx.error);
        tx.onabort = () => reject(tx.error);
      });
      state.samples.push(performance.now() - t);
      await new Promise((resolve) => setTimeout(resolve, everyMs));
    }
  })();
  return true;
}

/** Stops the loop `swStartBareCommitLoop` started; returns its commits' durations (ms). */
export async function swStopBareCommitLoop() {
  const state = globalThis.__benchCommitLoop;
  state.stop = true;
  await state.done;
  return state.samples;
}

/**
 * The floor: `count` bare IndexedDB readwrite transactions in this worker,
 * each putting one small record into a separate database and awaiting
 * `complete`. Returns each commit's duration (ms).
 */
export async function swBareCommits({ count, durability = 'relaxed', bytes = 200 }) {
  if (!globalThis.__benchFloorDb) {
    globalThis.__benchFloorDb = await new Promise((resolve, reject) => {
      const request = indexedDB.open('bench-floor', 1);
      request.onupgradeneeded = () => request.result.createObjectStore('kv', { keyPath: 'id' });
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  }
  const db = globalThis.__benchFloorDb;
  const payload = 'x'.repeat(bytes);
  const samples = [];
  for (let i = 0; i < count; i += 1) {
    const t = performance.now();
    await new Promise((resolve, reject) => {
      const tx = db.transaction('kv', 'readwrite', { durability });
      tx.objectStore('kv').put({ id: i % 8, payload, at: Date.now() });
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
    samples.push(performance.now() - t);
  }
  return samples;
}

/**
 * The floor of one engine checkpoint's payload: copies the engine's latest
 * run record, its thread and two of its nodes (what a step checkpoint puts)
 * as plain JS objects, then times `count` bare readwrite commits putting
 * exactly those records into the floor database. Empty when no run exists.
 */
export async function swBareCheckpointCommits({ dbName, count }) {
  const request = (req) => new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
  const engineDb = await request(indexedDB.open(dbName));
  const runs = await request(engineDb.transaction('runs', 'readonly').objectStore('runs').getAll());
  if (runs.length === 0) {
    engineDb.close();
    return { samples: [], bytes: 0 };
  }
  const run = runs.reduce((a, b) => ((b.updatedAt ?? 0) > (a.updatedAt ?? 0) ? b : a));
  const thread = await request(engineDb.transaction('threads', 'readonly').objectStore('threads').get(run.threadId));
  const nodes = await request(engineDb.transaction('nodes', 'readonly').objectStore('nodes').index('threadId').getAll(IDBKeyRange.only(run.threadId), 2));
  engineDb.close();
  const records = [run, thread, ...nodes].filter(Boolean);
  // Opened by swBareCommits (the floor measured first; Playwright's evaluate
  // sends a function's source alone, so no shared helper).
  const db = globalThis.__benchFloorDb;
  if (!db) throw new Error('the floor database is opened by swBareCommits: run it first');
  const samples = [];
  for (let i = 0; i < count; i += 1) {
    const t = performance.now();
    await new Promise((resolve, reject) => {
      const tx = db.transaction('kv', 'readwrite');
      for (const record of records) tx.objectStore('kv').put(record);
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
    samples.push(performance.now() - t);
  }
  return { samples, bytes: JSON.stringify(records).length, runBytes: JSON.stringify(run).length };
}

/** Seeds threads (records in the engine's schema) into the engine's database, in one transaction. */
export async function swSeed({ dbName, threads }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(dbName);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  const written = await new Promise((resolve, reject) => {
    const tx = db.transaction(['threads', 'nodes'], 'readwrite');
    let count = 0;
    for (const { thread, nodes } of threads) {
      tx.objectStore('threads').put(thread);
      for (const node of nodes) {
        tx.objectStore('nodes').put(node);
        count += 1;
      }
    }
    tx.oncomplete = () => resolve(count);
    tx.onerror = () => reject(tx.error);
  });
  db.close();
  return written;
}

/**
 * Seeds what months of use leave behind: `threads` threads (no nodes), and
 * `runs` finished runs spread over them with `receiptsPerRun` command
 * receipts each, all `ageDays` old (engine schema, one transaction). Returns
 * how many records were written.
 */
export async function swSeedHistory({ dbName, threads, runs, receiptsPerRun, ageDays }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(dbName);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  const at = Date.now() - ageDays * 24 * 60 * 60 * 1000;
  const written = await new Promise((resolve, reject) => {
    const tx = db.transaction(['threads', 'runs', 'receipts'], 'readwrite');
    let count = 0;
    for (let t = 0; t < threads; t += 1) {
      tx.objectStore('threads').put({ id: `used-t${t}`, title: `Used thread ${t}`, leafId: null, createdAt: at, updatedAt: at + t, revision: 3, parentThreadId: null, usage: { input: 120000, output: 8000 } });
      count += 1;
    }
    for (let r = 0; r < runs; r += 1) {
      const threadId = `used-t${r % threads}`;
      tx.objectStore('runs').put({
        id: `used-r${r}`, threadId, state: 'completed', createdAt: at + r, updatedAt: at + r, revision: 9, step: 4,
        profile: { kind: 'openai', baseUrl: 'https://api.openai.com/v1', model: 'gpt-4o', maxOutputTokens: null, temperatureCenti: null, vision: true, toolUse: true, tokenBudget: null, contextWindow: 128000 },
        consecutiveFailures: 0, toolsDisabled: false, inFlightTool: null, pendingApproval: null, pendingInteraction: null, stopReason: 'end', error: null, usage: { input: 12000, output: 800 },
      });
      count += 1;
      for (let k = 0; k < receiptsPerRun; k += 1) {
        tx.objectStore('receipts').put({ key: `used-client\u001fs${r}-${k}`, opType: 'turn.submit', fingerprint: 'a'.repeat(64), result: { threadId, turnId: `used-r${r}` }, createdAt: at + r });
        count += 1;
      }
    }
    tx.oncomplete = () => resolve(count);
    tx.onerror = () => reject(tx.error);
  });
  db.close();
  return written;
}

/** How many of swSeedHistory's runs and receipts the engine's database still holds. */
export async function swCountHistory({ dbName }) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(dbName);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  const count = (store, prefix) =>
    new Promise((resolve, reject) => {
      const request = db.transaction(store).objectStore(store).count(IDBKeyRange.bound(prefix, `${prefix}\uffff`));
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  const result = { runs: await count('runs', 'used-r'), receipts: await count('receipts', 'used-client') };
  db.close();
  return result;
}

/**
 * The wasm module alone: fetch the shipped .wasm, then compile and
 * instantiate it with stub imports (no glue, no engine start). Returns
 * [{ compileMs, instantiateMs }] per repetition. V8 may reuse compiled code
 * across repetitions in one process, so the first one is the coldest.
 */
export async function swInstantiateOnly({ path, reps }) {
  const bytes = await (await fetch(chrome.runtime.getURL(path))).arrayBuffer();
  const out = [];
  for (let i = 0; i < reps; i += 1) {
    const t0 = performance.now();
    const module = await WebAssembly.compile(bytes);
    const t1 = performance.now();
    const imports = {};
    for (const entry of WebAssembly.Module.imports(module)) {
      imports[entry.module] ??= {};
      if (entry.kind === 'function') imports[entry.module][entry.name] = () => { throw new Error('stub'); };
      else if (entry.kind === 'table') imports[entry.module][entry.name] = new WebAssembly.Table({ initial: 4096, element: 'externref' });
      else if (entry.kind === 'memory') imports[entry.module][entry.name] = new WebAssembly.Memory({ initial: 17 });
      else if (entry.kind === 'global') imports[entry.module][entry.name] = new WebAssembly.Global({ value: 'i32', mutable: true }, 0);
    }
    await WebAssembly.instantiate(module, imports);
    const t2 = performance.now();
    out.push({ compileMs: t1 - t0, instantiateMs: t2 - t1, bytes: bytes.byteLength });
  }
  return out;
}
