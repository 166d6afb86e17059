//! Counters and timings of the driver, for benchmarks and diagnostics.
//! Recording is a few additions per event; nothing here changes behaviour.

use serde::Serialize;

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// `performance.now()`, called directly: the driver reads the clock
    /// twice around every engine call, and looking `performance` and `now`
    /// up by name each time (two strings out of wasm memory, two property
    /// reads) cost more than the engine call it timed on a small step.
    /// Decision: no `catch` wrapper (a try/catch in the glue per call):
    /// every worker and window global of Chrome and Firefox has
    /// `performance`, where the module runs.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

/// High-resolution time in ms (`performance.now()`).
pub fn precise_now() -> f64 {
    performance_now()
}

/// A running sum with a count and a maximum (ms).
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timing {
    pub count: u64,
    pub total_ms: f64,
    pub max_ms: f64,
}

impl Timing {
    pub fn add(&mut self, ms: f64) {
        self.count += 1;
        self.total_ms += ms;
        self.max_ms = self.max_ms.max(ms);
    }
}

/// What the driver measured since start (or the last reset).
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Time inside the engine (inputs and effect polling), without IO.
    pub engine: Timing,
    /// IndexedDB transactions (one per checkpoint), from encoding the
    /// records to the transaction's `complete`.
    pub commits: Timing,
    /// The encoding part of `commits` (records to JS values).
    pub encode: Timing,
    /// Provider requests, from fetch to the last byte.
    pub provider: Timing,
    /// Tool executions, from dispatch to result.
    pub tools: Timing,
    /// Content-script injections page tools made (`Driver::frame_call`:
    /// a read reuses the script already in the frame).
    pub injections: u64,
    /// Messages posted to clients, and how many were deltas.
    pub events_sent: u64,
    pub deltas_sent: u64,
    /// How `Engine.start()` went (kept by `reset_metrics`); its fields
    /// appear at the top level (`startMs`, `startOpenMs`, …).
    #[serde(flatten)]
    pub start: StartTimes,
    /// Thread loads: the IndexedDB read, decoding the records, and the
    /// engine building the thread from them.
    pub thread_read: Timing,
    pub thread_decode: Timing,
    pub thread_build: Timing,
    /// Node records those loads read.
    pub thread_records: u64,
    /// Provider request bodies: their bytes, and the bytes copied out of
    /// wasm memory for them (the rest went by reference, as kept `Blob`s).
    pub body_bytes: u64,
    pub body_copied: u64,
    /// Making each request's body (the plan, and the `Blob`s or bytes), and
    /// of that the `Blob`s.
    pub body_build: Timing,
    pub body_blobs: Timing,
}

/// `Engine.start()`, measured once per worker.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartTimes {
    /// Time from `Engine.start()` to the engine being ready (ms), and its
    /// parts: opening the database, reading the start image, settings.
    pub start_ms: f64,
    pub start_open_ms: f64,
    pub start_image_ms: f64,
    pub start_settings_ms: f64,
    /// Whether the start image and the settings came from sw.js's prefetch
    /// (read while the module compiled) rather than from `Engine.start()`.
    pub start_prefetched: bool,
}
