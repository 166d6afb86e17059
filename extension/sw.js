// Service worker entry: a deliberately thin shim around the wasm engine.
//
// Every decision (which port to trust, what a message means, how to resume a
// run after Chrome killed this worker) is made in Rust. This file only
// registers Chrome's listeners and forwards each event, in arrival order, and
// starts the IO a start needs while the module compiles (store-prefetch.js,
// the settings, the MCP servers' tools as the last worker kept them): IO
// without decisions, checked by Engine.start(). The module
// itself comes from Cache Storage when this build's copy is there
// (wasm-cache.js).
//
// One exception, made for the panel's reconnect after a kill and for a
// fresh panel: an extension page's first message, an `initialize` of a
// thread whose snapshot the engine cached at rest
// (src/engine/snapshot_cache.rs), is answered here from the snapshot as the
// prefetch read it, under the epoch this file hands the engine (seq 0):
// before the engine runs, or once it runs if it says that snapshot is still
// current. The engine then adopts the port, or sends the current snapshot if
// its start changed the thread. The check of the sender here is at least as
// strict as the engine's (src/protocol.rs classify_sender); anything else
// goes to the engine as before.
//
// Listeners must be registered synchronously during the first evaluation of
// the script: Chrome wakes a stopped worker for an event and dispatches it only
// to listeners that exist once the script has run. The wasm module needs a few
// milliseconds to instantiate, so events that arrive earlier are queued, never
// dropped. There is no top-level await: service worker modules may not use it
// (registration fails), and awaiting before addListener would lose the very
// event that woke the worker.
import init, { Engine } from "./pkg/sw_agent.js";
// The embedding extension's own files, as namespaces: a file without one
// of the exports (written for an earlier version, or a typo in the name)
// still loads, where a missing named import would stop the worker. A syntax
// error still does; `scripts/build.sh` checks for one before it builds.
import * as hostTools from "./host-tools.js";
import * as instructions from "./instructions.js";
import * as mcpServers from "./mcp-servers.js";
import * as settingsDefaults from "./settings-defaults.js";
import { prefetchStore, readCachedSnapshot } from "./store-prefetch.js";
import { buildId, instantiateModule, rememberModule } from "./wasm-cache.js";

let engine = null;
let nextPortId = 1;
const pending = [];
let servedFromCache = 0;
// What the prefetch found in the snapshot cache: the prefetched connection,
// the threads this build cached (their records are read when asked for),
// and the one record it read, the most recent thread's (dropped 30 s after
// the engine runs: the reconnects it serves come right after a start).
let startCache = null;
// For `make bench` and the e2e tests (globalThis.__swAgent): when this
// script's body started, when the first port connected and its first
// message arrived, when Engine.start() was called and when the first
// snapshot was sent from the cache (ms since the worker started).
let firstMessageAt = null;
let firstConnectAt = null;
const scriptAt = performance.now();
let startCalledAt = null;
let servedAt = null;
// This worker's event epoch (src/protocol.rs EventEnvelope), chosen here so
// a snapshot sent from the cache and the engine's events share it.
const epoch = `e${Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("")}`;

function deliver(call) {
  if (engine === null) {
    pending.push(call);
    return;
  }
  try {
    const result = call(engine);
    if (result && typeof result.then === "function") {
      result.then(undefined, (err) => console.error("[sw-agent] engine call failed", err));
    }
  } catch (err) {
    console.error("[sw-agent] engine call failed", err);
  }
}

// While the module is fetched and compiled, the database is opened and the
// start image read (store-prefetch.js), and the settings too: IO that needs
// no wasm. Engine.start() checks and decodes what arrived and reads itself
// whatever did not.
let wasmAt = 0;
let prefetchAt = 0;
// Neither may throw here (an exception at the top level fails the worker's
// registration): every failure becomes "not prefetched".
// The build id comes first: the prefetch reads this build's cached snapshot.
const build = buildId(chrome.runtime.getManifest());
// The most recent thread's cached record as soon as the prefetch read it
// (first, before the start image), and the record of another thread a panel
// asked for before the prefetch read the cache's keys (read next, still
// before the image); null when there is none or no prefetch.
let resolveRecent = () => {};
const recentRead = new Promise((resolve) => {
  resolveRecent = resolve;
});
let wantedThread = null;
let resolveWanted = () => {};
const wantedRead = new Promise((resolve) => {
  resolveWanted = resolve;
});
const storePrefetched = prefetchStore(undefined, build, {
  onRecent: resolveRecent,
  wanted: () => wantedThread,
  onWanted: (threadId, record) => resolveWanted({ threadId, record }),
}).catch(() => null);
storePrefetched.then((store) => {
  resolveRecent(null);
  resolveWanted(null);
  if (!store || !Array.isArray(store.snapshots)) return;
  startCache = {
    db: store.db,
    ours: new Set(store.snapshots.filter((k) => k.build === build).map((k) => k.threadId)),
    recent: store.recent ?? null,
  };
});
const prefetched = Promise.all([
  storePrefetched,
  Promise.resolve()
    .then(() => chrome.storage.local.get(["settings", "mcpCatalog", "mcpUserServers"]))
    .catch(() => null),
]).then(([store, storage]) => {
  prefetchAt = performance.now();
  return { store, storage };
});
// The module comes from Cache Storage when this build's copy is there
// (wasm-cache.js), else from the package; it is cached once the engine runs.
const wasmUrl = chrome.runtime.getURL("pkg/sw_agent_bg.wasm");
let wasmFrom = null;
let wasmCopy = null;
const instantiated = instantiateModule(init, wasmUrl, build).then(({ from, copy }) => {
  wasmAt = performance.now();
  wasmFrom = from;
  wasmCopy = copy;
});

// Reads of cached snapshots (answerFromCache) issued before the engine
// starts: the start waits for them (one record each), else their results
// would wait behind the whole start on this thread.
const cacheReads = new Set();
const CACHE_READ_MAX_MS = 1000;

// Settles once the engine runs (or startup failed and was logged once).
const ready = Promise.all([prefetched, instantiated])
  .then(([early]) => Promise.all([...cacheReads]).then(() => early))
  .then((early) => {
    startCalledAt = performance.now();
    return Engine.start({
      ...early,
      build,
      epoch,
      tools: hostTools.HOST_TOOLS,
      builtInTools: hostTools.BUILT_IN_TOOLS ?? null,
      maxParallelReads: hostTools.MAX_PARALLEL_READS ?? null,
      settingsDefaults: settingsDefaults.SETTINGS_DEFAULTS ?? null,
      instructions: instructions.INSTRUCTIONS ?? null,
      mcpServers: mcpServers.MCP_SERVERS ?? null,
    });
  })
  .then((started) => {
    engine = started;
    // For `make bench` only: lets the harness (CDP evaluate in this worker)
    // read `engine.metrics()`, when the wasm module was instantiated and
    // where it came from, when the prefetch arrived and when the engine
    // became ready (ms since the worker started). Nothing in the extension
    // reads it.
    globalThis.__swAgent = {
      engine: started,
      wasmAt,
      wasmFrom,
      prefetchAt,
      readyAt: performance.now(),
      get servedFromCache() {
        return servedFromCache;
      },
      scriptAt,
      get firstConnectAt() {
        return firstConnectAt;
      },
      get firstMessageAt() {
        return firstMessageAt;
      },
      get servedAt() {
        return servedAt;
      },
      startCalledAt,
    };
    for (const call of pending.splice(0)) deliver(call);
    setTimeout(() => {
      startCache = null;
    }, 30000);
    if (wasmCopy) rememberModule(build, wasmCopy);
    wasmCopy = null;
  })
  .catch((err) => console.error("[sw-agent] engine failed to start; events stay queued", err));

// The extension's own origin, as src/protocol.rs classify_sender compares it.
const ownOrigin = new URL(chrome.runtime.getURL("")).origin;

/** An extension page of this extension (never a content script or a web page). */
function ownPage(port) {
  const sender = port.sender ?? {};
  const url = typeof sender.url === "string" ? sender.url : "";
  return (
    url.startsWith(`${ownOrigin}/`) &&
    (sender.origin === undefined || sender.origin === ownOrigin) &&
    sender.id === chrome.runtime.id
  );
}

/**
 * Answer a port's first message from the snapshot cache when the port is an
 * extension page, the message is an `initialize`, and this build cached the
 * snapshot of the thread it opens (the one named, or for no thread id the
 * most recent one, which the engine marks `recentOf`): before the engine
 * runs, or once it runs if it says the copy read at start is still current.
 * Returns `served`, which the engine's delivery calls (it tells which
 * thread was served; null: none, the engine answers; from then on nothing
 * is sent here), and `settled`, a promise to deliver after (null: at once).
 */
function answerFromCache(port, msg) {
  let served = null;
  let delivered = false;
  const answer = {
    served: () => {
      delivered = true;
      return served;
    },
    settled: null,
  };
  const asked = msg !== null && typeof msg === "object" && msg.type === "initialize" ? (msg.threadId ?? null) : undefined;
  if (build === null || (asked !== null && typeof asked !== "string") || !ownPage(port)) return answer;
  const serve = (record, thread) => {
    if (delivered || served !== null || record?.build !== build || record.threadId !== thread) return;
    try {
      port.postMessage({ type: "initialized", seq: 0, epoch, snapshot: record.snapshot });
      served = thread;
      servedFromCache += 1;
      servedAt ??= performance.now();
    } catch {
      // The port closed: the engine handles the message as usual.
    }
  };
  // The record of `thread` once the prefetch arrived: the most recent
  // thread's came with it; any other this build cached is read on the
  // prefetched connection, and the port's events wait for it. The read
  // sees every unit the engine issued before it (units delete cached
  // snapshots); the engine checks again at delivery that it issued none
  // since its start.
  const fromCache = (thread) => {
    const cache = startCache;
    if (cache === null || typeof thread !== "string" || !cache.ours.has(thread)) return null;
    if (cache.recent?.threadId === thread) {
      serve(cache.recent, thread);
      return null;
    }
    // Bounded: a read that never settled would hold the port (and the
    // start) for ever; after a second the engine answers instead.
    const read = Promise.race([
      readCachedSnapshot(cache.db, thread).then((record) => serve(record, thread)),
      new Promise((resolve) => setTimeout(resolve, CACHE_READ_MAX_MS)),
    ]);
    if (engine === null) {
      cacheReads.add(read);
      read.then(() => cacheReads.delete(read));
    }
    return read;
  };
  if (engine !== null) {
    const thread = engine.start_snapshot_for(asked ?? undefined);
    answer.settled = fromCache(thread);
    return answer;
  }
  // Before the engine runs, the pending calls are flushed only after
  // Engine.start(), which waits for the prefetch too: waiting for it here
  // delays nothing. Nor need the answer wait for the start image: the most
  // recent thread's record comes first (asked for, or no thread named, it
  // is sent as soon as it is read; it is the record the prefetch hands the
  // engine), and another thread's is read next if it was asked for by then
  // (else once the prefetch arrived, as any thread's after a start).
  if (typeof asked === "string") wantedThread ??= asked;
  answer.settled = recentRead.then((record) => {
    if (engine !== null) return null;
    if (record?.build === build && (asked === null || asked === record.threadId)) {
      serve(record, record.threadId);
      return null;
    }
    if (asked === null) return null;
    return wantedRead.then((early) => {
      if (engine !== null) return null;
      if (early?.threadId === asked) {
        serve(early.record, asked);
        return null;
      }
      return storePrefetched.then(() => (engine === null ? fromCache(asked) : null));
    });
  });
  return answer;
}

chrome.runtime.onConnect.addListener((port) => {
  firstConnectAt ??= performance.now();
  const id = nextPortId++;
  let first = true;
  // While the first message waits for a cached snapshot, the port's later
  // events wait behind it, in order.
  let gate = null;
  const forward = (call) => {
    if (gate === null) deliver(call);
    else gate = gate.then(() => deliver(call));
  };
  // No message can arrive before this callback returns, so on_connect is
  // always delivered before the port's first message.
  port.onMessage.addListener((msg) => {
    if (!first) {
      forward((e) => e.on_message(id, msg));
      return;
    }
    first = false;
    firstMessageAt ??= performance.now();
    const answer = answerFromCache(port, msg);
    const call = (e) => {
      const thread = answer.served();
      return thread === null ? e.on_message(id, msg) : e.on_cached_initialize(id, msg, thread);
    };
    if (answer.settled === null) deliver(call);
    else gate = answer.settled.then(() => deliver(call), () => deliver(call));
  });
  port.onDisconnect.addListener(() => forward((e) => e.on_disconnect(id)));
  deliver((e) => e.on_connect(id, port));
});
chrome.alarms.onAlarm.addListener((alarm) => deliver((e) => e.on_alarm(alarm.name)));
// Registered here, not by the engine once it runs: a change saved while the
// engine starts, after the prefetch read the settings, is queued for it.
// Applied in order after the start, the last one wins.
chrome.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && changes.settings) {
    const value = changes.settings.newValue;
    deliver((e) => e.on_settings(value));
  }
  // The MCP servers the user keeps in Settings.
  if (area === "local" && changes.mcpUserServers) {
    const value = changes.mcpUserServers.newValue;
    deliver((e) => e.on_mcp_user_servers(value));
  }
});
chrome.runtime.onInstalled.addListener(() => {
  keepStorageToTrustedContexts();
  deliver((e) => e.on_installed());
});

// chrome.storage.local holds the provider key and the MCP servers' sign-ins:
// only the extension's own pages and this worker may read it, not content
// scripts (which run inside web pages; ours never read storage). Chrome keeps
// the setting per extension, so installing or updating sets it; a Chrome too
// old to offer it for `local` keeps its default, and the console says so.
function keepStorageToTrustedContexts() {
  const local = chrome.storage.local;
  if (typeof local.setAccessLevel !== "function") return;
  local.setAccessLevel({ accessLevel: "TRUSTED_CONTEXTS" }).catch((error) => {
    console.warn("[sw-agent] chrome.storage.local stays readable by content scripts:", error?.message ?? error);
  });
}
chrome.runtime.onStartup.addListener(() => deliver((e) => e.on_startup()));
