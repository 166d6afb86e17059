//! How typed values cross the JS boundary.
//!
//! Decision (measured side by side, BENCHMARKS.md item 15): values the
//! engine sends out (events to the panel, records to IndexedDB, requests to
//! content scripts) are encoded by serde_json as JSON text and parsed by the
//! browser's `JSON.parse`; values coming in are decoded from the JS objects
//! directly by serde-wasm-bindgen. Encoding through text replaced
//! serde-wasm-bindgen's serializer (one call across the boundary per field):
//! a cold start's snapshot encodes and posts in 4.3 instead of 7.0 ms, and
//! the module is 22 KB smaller. Decoding through text (`JSON.stringify`, then
//! serde_json) measured no faster than decoding the objects directly and
//! made the module larger, and decoding records through a
//! `serde_json::Value` was slower (a tree built and then taken apart: a cold
//! start's 196 nodes 9.6 instead of 5.7 ms), so nodes decode directly;
//! messages, one at a time, come in as a `Value`, and so do the other
//! stored records, which are then decoded by hand (`model::FromRecord`: a
//! smaller module than a derived visitor per record type, BENCHMARKS.md
//! item 28). Exception: a store read of many such records (a long-used
//! profile's thousands of receipts at start) comes in as one JSON text,
//! `JSON.stringify` of them all parsed once by serde_json, because there
//! the boundary calls per field were the cost (`platform::idb::decode_all`,
//! item 31).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::JsValue;

/// Encode a value as a JS value: JSON text, parsed by the browser.
pub fn to_js<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, String> {
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    js_sys::JSON::parse(&text).map_err(|_| "the JSON text was not parsed".to_string())
}

/// Decode a stored value from its JS form: a node (`model::node_de`), or
/// another record's JSON data as a `Value` for its hand-written decoder
/// (`model::FromRecord`; an error if it is not JSON data).
pub fn from_js<T: DeserializeOwned>(value: JsValue) -> Result<T, String> {
    serde_wasm_bindgen::from_value(value).map_err(|e| e.to_string())
}

/// Read a value from outside the engine (a panel's or a content script's
/// message, the settings) as JSON data, for the typed decode that names what
/// is wrong (`Op::from_value`, serde_json); anything that is not JSON data (a
/// function, a symbol) is null. One message per op or tool call: the
/// intermediate tree costs microseconds, and it keeps serde-wasm-bindgen's
/// decoder out of every message type.
pub fn from_js_value(value: JsValue) -> Value {
    serde_wasm_bindgen::from_value(value).unwrap_or(Value::Null)
}
