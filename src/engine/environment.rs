//! Run environment snapshots: frozen when a run starts, checked on resume.
//!
//! A started run resumes only in the environment it started in: the same
//! system prompt, provider transport, credential reference shape, and tool
//! catalog (each entry's digest covers schema, security metadata and
//! binding). The API key value itself may rotate: only where it comes from
//! is part of the snapshot.

use serde_json::Value;

use super::EngineConfig;
use crate::model::{CatalogEntry, EnvironmentSnapshot, ProviderProfile, ENVIRONMENT_VERSION};
use crate::protocol::{ErrorInfo, ErrorKind};
use crate::provider::Transport;

/// Size limits of a snapshot; exceeding one is an error, never a truncation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentLimits {
    pub max_total_bytes: usize,
    pub max_entries: usize,
    pub max_entry_bytes: usize,
    pub max_depth: usize,
}

impl Default for EnvironmentLimits {
    fn default() -> Self {
        EnvironmentLimits {
            max_total_bytes: 256 * 1024,
            max_entries: 128,
            max_entry_bytes: 32 * 1024,
            max_depth: 32,
        }
    }
}

/// How deeply a JSON value nests (a schema's depth, for the limits).
pub fn schema_depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(schema_depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(schema_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn too_large(message: String) -> ErrorInfo {
    ErrorInfo::new(ErrorKind::EnvironmentTooLarge, message)
}

/// Where the credential of a transport comes from (its shape, not its value).
pub fn credential_ref(transport: Transport) -> &'static str {
    match transport {
        Transport::OpenAi => "bearer:chrome.storage.local/settings.apiKey",
        Transport::Anthropic => "x-api-key:chrome.storage.local/settings.apiKey",
    }
}

/// Freeze the environment a run starts in, enforcing the size limits.
pub fn build_environment(
    config: &EngineConfig,
    profile: &ProviderProfile,
    limits: &EnvironmentLimits,
) -> Result<EnvironmentSnapshot, ErrorInfo> {
    let tools = config.registry.for_model(profile.tool_use, profile.vision);
    if tools.len() > limits.max_entries {
        return Err(too_large(format!(
            "The tool catalog has {} tools; at most {} are allowed.",
            tools.len(),
            limits.max_entries
        )));
    }
    let mut total = config.system_prompt.len();
    let mut entries = Vec::with_capacity(tools.len());
    for tool in tools {
        let size = serde_json::to_string(tool)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        if size > limits.max_entry_bytes {
            return Err(too_large(format!(
                "The tool {} is described by {size} bytes; at most {} are allowed per tool.",
                tool.name, limits.max_entry_bytes
            )));
        }
        let d = schema_depth(&tool.parameters);
        if d > limits.max_depth {
            return Err(too_large(format!(
                "The parameter schema of tool {} is nested {d} levels deep; at most {} are allowed.",
                tool.name, limits.max_depth
            )));
        }
        total += size;
        entries.push(CatalogEntry {
            name: tool.name.clone(),
            digest: tool.digest(),
        });
    }
    if total > limits.max_total_bytes {
        return Err(too_large(format!(
            "The run environment (prompt and tools) is {total} bytes; at most {} are allowed.",
            limits.max_total_bytes
        )));
    }
    let transport = Transport::from_kind(&profile.kind);
    Ok(EnvironmentSnapshot {
        version: ENVIRONMENT_VERSION,
        system_prompt: config.system_prompt.clone(),
        transport: profile.kind.clone(),
        credential_ref: credential_ref(transport).to_string(),
        tools: entries,
    })
}

/// What differs between a run's frozen environment and the current one, in
/// words (empty: the run may resume).
pub fn environment_drift(
    frozen: &EnvironmentSnapshot,
    current: &EnvironmentSnapshot,
) -> Vec<String> {
    let mut drift = Vec::new();
    if frozen.version != current.version {
        drift.push(format!(
            "the environment format changed (v{} → v{})",
            frozen.version, current.version
        ));
    }
    if frozen.system_prompt != current.system_prompt {
        drift.push("the system prompt changed".to_string());
    }
    if frozen.transport != current.transport {
        drift.push(format!(
            "the provider transport changed ({} → {})",
            frozen.transport, current.transport
        ));
    }
    if frozen.credential_ref != current.credential_ref {
        drift.push("the credential reference changed".to_string());
    }
    for entry in &frozen.tools {
        match current.tools.iter().find(|t| t.name == entry.name) {
            None => drift.push(format!("the tool {} is no longer available", entry.name)),
            Some(now) if now.digest != entry.digest => drift.push(format!(
                "the tool {} changed (schema, security metadata or binding)",
                entry.name
            )),
            Some(_) => {}
        }
    }
    for entry in &current.tools {
        if !frozen.tools.iter().any(|t| t.name == entry.name) {
            drift.push(format!("the tool {} was added", entry.name));
        }
    }
    drift
}
