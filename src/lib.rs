//! sw_agent: a durable LLM agent loop for Chrome MV3 extension service workers.
//!
//! The crate is split into a sans-IO core (`protocol`, `model`, `engine`,
//! `provider`, `tools`, `store`) that runs natively and deterministically, and
//! a thin wasm platform layer (`platform`, wasm32 only) that performs the IO:
//! IndexedDB through rexie, `fetch` streaming, chrome.runtime Ports, timers,
//! alarms. `sim` is the native driver used by tests and by embedders who want
//! to test their own tools.

pub mod diff;
pub mod elicitation;
pub mod engine;
pub mod frames;
pub mod gatekeeper;
pub mod mcp;
pub mod model;
pub mod oauth;
pub mod protocol;
pub mod provider;
pub mod settings;
pub mod sim;
pub mod sorting;
pub mod store;
pub mod tools;
pub mod vecmap;

#[cfg(target_arch = "wasm32")]
pub mod platform;
