mod approvals;
mod attachments;
pub mod bad_input;
mod commit_races;
mod compaction;
mod details;
mod elicitation;
mod environment;
mod host_tools;
mod interactions;
mod mcp;
mod op_races;
mod parallel;
mod protocol;
#[cfg(not(target_arch = "wasm32"))]
mod protocol_ts;
mod recovery;
mod retention;
mod retry;
mod settings;
mod simulation;
mod snapshot_cache;
mod steering;
pub mod support;
mod threads;
// tiktoken-rs is a native-only dev-dependency.
#[cfg(not(target_arch = "wasm32"))]
mod token_estimate;
mod turn;
