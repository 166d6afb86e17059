// Service worker entry: a deliberately thin shim around the wasm engine.
//
// Every decision (which port to trust, what a message means, how to resume a
// run after Chrome killed this worker) is made in Rust. This file only
// registers Chrome's listeners and forwards each event, in arrival order, and
// starts the IO a start needs while the module compiles (store-prefetch.js,
// the settings): IO without decisions, checked by Engine.start(). The module
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
import { prefetchStore } from "./store-prefetch.js";
import { buildId, instantiateModule, rememberModule } from "./wasm-cache.js";

let engine = null;
let nextPortId = 1;
const pending = [];
let servedFromCache = 0;
// The cached snapshots the prefetch read (dropped 30 s after the engine
// runs: the reconnects they serve come right after a start).
let startSnapshots = null;
// For `make bench` and the e2e tests (globalThis.__swAgent): when the first
// port message arrived, when Engine.start() was called and when the first
// snapshot was sent from the cache (ms since the worker started).
let firstMessageAt = null;
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
const storePrefetched = prefetchStore().catch(() => null);
storePrefetched.then((store) => {
  startSnapshots = Array.isArray(store?.snapshots) ? store.snapshots : null;
});
const prefetched = Promise.all([
  storePrefetched,
  Promise.resolve()
    .then(() => chrome.storage.local.get("settings"))
    .catch(() => null),
]).then(([store, storage]) => {
  prefetchAt = performance.now();
  return { store, storage };
});
// The module comes from Cache Storage when this build's copy is there
// (wasm-cache.js), else from the package; it is cached once the engine runs.
const wasmUrl = chrome.runtime.getURL("pkg/sw_agent_bg.wasm");
const build = buildId(chrome.runtime.getManifest());
let wasmFrom = null;
let wasmCopy = null;
const instantiated = instantiateModule(init, wasmUrl, build).then(({ from, copy }) => {
  wasmAt = performance.now();
  wasmFrom = from;
  wasmCopy = copy;
});

// Settles once the engine runs (or startup failed and was logged once).
const ready = Promise.all([prefetched, instantiated])
  .then(([early]) => {
    startCalledAt = performance.now();
    return Engine.start({ ...early, build, epoch });
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
      startSnapshots = null;
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
 * most recent one, which the engine marks `recent`): before the engine runs,
 * as soon as the prefetch arrived; once it runs, if it says that snapshot is
 * still current. Returns a function telling, when the engine gets the
 * message, which thread was served (null: none, the engine answers).
 */
function answerFromCache(port, msg) {
  let served = null;
  const asked = msg !== null && typeof msg === "object" && msg.type === "initialize" ? (msg.threadId ?? null) : undefined;
  if (build === null || (asked !== null && typeof asked !== "string") || !ownPage(port)) return () => served;
  const serve = (record) => {
    try {
      port.postMessage({ type: "initialized", seq: 0, epoch, snapshot: record.snapshot });
      served = record.threadId;
      servedFromCache += 1;
      servedAt ??= performance.now();
    } catch {
      // The port closed: the engine handles the message as usual.
    }
  };
  const ours = (r) => r?.build === build && typeof r.threadId === "string";
  if (engine !== null) {
    const thread = engine.start_snapshot_for(asked ?? undefined);
    const record = typeof thread === "string" ? startSnapshots?.find((r) => ours(r) && r.threadId === thread) : null;
    if (record) serve(record);
    return () => served;
  }
  // Runs before the engine gets the message: the pending calls are flushed
  // only after Engine.start(), which waits for this promise too.
  storePrefetched.then(() => {
    if (engine !== null) return;
    const record = startSnapshots?.find((r) => ours(r) && (asked === null ? r.recent === true : r.threadId === asked));
    if (record) serve(record);
  });
  return () => served;
}

chrome.runtime.onConnect.addListener((port) => {
  const id = nextPortId++;
  let first = true;
  // No message can arrive before this callback returns, so on_connect is
  // always delivered before the port's first message.
  port.onMessage.addListener((msg) => {
    if (!first) {
      deliver((e) => e.on_message(id, msg));
      return;
    }
    first = false;
    firstMessageAt ??= performance.now();
    const served = answerFromCache(port, msg);
    deliver((e) => {
      const thread = served();
      return thread === null ? e.on_message(id, msg) : e.on_cached_initialize(id, msg, thread);
    });
  });
  port.onDisconnect.addListener(() => deliver((e) => e.on_disconnect(id)));
  deliver((e) => e.on_connect(id, port));
});
chrome.alarms.onAlarm.addListener((alarm) => deliver((e) => e.on_alarm(alarm.name)));
chrome.runtime.onInstalled.addListener(() => deliver((e) => e.on_installed()));
chrome.runtime.onStartup.addListener(() => deliver((e) => e.on_startup()));
