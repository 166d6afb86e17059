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
const prefetched = Promise.all([
  prefetchStore().catch(() => null),
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
  .then(([early]) => Engine.start(early))
  .then((started) => {
    engine = started;
    // For `make bench` only: lets the harness (CDP evaluate in this worker)
    // read `engine.metrics()`, when the wasm module was instantiated and
    // where it came from, when the prefetch arrived and when the engine
    // became ready (ms since the worker started). Nothing in the extension
    // reads it.
    globalThis.__swAgent = { engine: started, wasmAt, wasmFrom, prefetchAt, readyAt: performance.now() };
    for (const call of pending.splice(0)) deliver(call);
    if (wasmCopy) rememberModule(build, wasmCopy);
    wasmCopy = null;
  })
  .catch((err) => console.error("[sw-agent] engine failed to start; events stay queued", err));

chrome.runtime.onConnect.addListener((port) => {
  const id = nextPortId++;
  // No message can arrive before this callback returns, so on_connect is
  // always delivered before the port's first message.
  port.onMessage.addListener((msg) => deliver((e) => e.on_message(id, msg)));
  port.onDisconnect.addListener(() => deliver((e) => e.on_disconnect(id)));
  deliver((e) => e.on_connect(id, port));
});
chrome.alarms.onAlarm.addListener((alarm) => deliver((e) => e.on_alarm(alarm.name)));
chrome.runtime.onInstalled.addListener(() => deliver((e) => e.on_installed()));
chrome.runtime.onStartup.addListener(() => deliver((e) => e.on_startup()));
