//! The driver's MCP side in a build without the cargo feature `mcp`
//! (`--no-default-features`; BENCHMARKS.md item 52): no client, no
//! discovery, no sign-in, no requests for input. The engine is the same in
//! both builds; here it is never given a server's tools.
//!
//! Owns: saying so. Every server the embedding extension names
//! (`extension/mcp-servers.js`) or the user added in Settings
//! (`mcpUserServers`) is named in the worker's console and listed as not
//! used, with the reason (`mcpServers.list`, `mcpServers.updated`: state
//! `refused`), so Settings says it too and the engine refuses to ask or
//! sign in to it; a call of a server's tool (a run frozen with one by a
//! build with MCP) ends with that reason.
//!
//! Must not: connect to a server or send it anything.

use std::rc::Rc;

use serde_json::Value;
use wasm_bindgen::JsValue;

use super::{boundary, chrome, console_error, Driver};
use crate::engine::{EngineConfig, ToolOutcome};
use crate::mcp::RefusedServer;
use crate::model::{McpServerOrigin, McpServerState};

/// Why a server is not used: in the console and a tool's error.
const NO_MCP: &str =
    "this build of sw_agent has no MCP support (built without the cargo feature \"mcp\")";

/// The same in Settings (after "Not used: ").
const NOT_USED: &str =
    "This build of sw_agent has no MCP support (built without the cargo feature \"mcp\").";

/// What a start reads of the MCP servers (`Driver::mcp_at_start`): every
/// server named, none used.
pub(super) struct McpStart {
    pub(super) refused: Vec<(McpServerOrigin, RefusedServer)>,
}

/// Each entry of a server list (`MCP_SERVERS`, `mcpUserServers`) as not
/// used: its name and address when they are text. Not an array: none.
fn not_used(listed: &Value) -> Vec<RefusedServer> {
    let text = |entry: &Value, key: &str| {
        entry
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    listed
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|entry| RefusedServer {
                    name: text(entry, "name"),
                    url: text(entry, "url"),
                    problem: NOT_USED.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An effect only a server in use brings (asking one, signing in or out,
/// answering its request for input): the engine lists none as usable here.
pub(super) fn unsupported_effect() {
    console_error(&format!("an MCP server was asked for, but {NO_MCP}"));
}

impl Driver {
    /// The servers a start is given (`listed`: `extension/mcp-servers.js`;
    /// the user's in `storage`), each named in the console and, once the
    /// driver runs, listed as not used (`mcp_after_start`). The kept
    /// catalog of a build with MCP is not read: no server's tool is offered.
    pub(super) fn mcp_at_start(
        listed: &Value,
        storage: &JsValue,
        _config: &mut EngineConfig,
    ) -> McpStart {
        let extension = not_used(listed);
        if !extension.is_empty() {
            let names: Vec<&str> = extension.iter().map(|s| s.name.as_str()).collect();
            console_error(&format!(
                "extension/mcp-servers.js names {} MCP server(s) ({}), but {NO_MCP}: they are not used",
                names.len(),
                names.join(", ")
            ));
        } else if !listed.is_null() && !listed.as_array().is_some_and(Vec::is_empty) {
            console_error(&format!(
                "extension/mcp-servers.js: MCP_SERVERS is not used: {NO_MCP}"
            ));
        }
        let user = not_used(&boundary::from_js_value(chrome::get(
            storage,
            "mcpUserServers",
        )));
        if !user.is_empty() {
            console_error(&format!(
                "your MCP servers ({}) are not used: {NO_MCP}",
                user.len()
            ));
        }
        let refused = extension
            .into_iter()
            .map(|s| (McpServerOrigin::Extension, s))
            .chain(user.into_iter().map(|s| (McpServerOrigin::User, s)))
            .collect();
        McpStart { refused }
    }

    /// The driver runs: every server named is listed as not used.
    pub(super) fn mcp_after_start(self: &Rc<Self>, refused: Vec<(McpServerOrigin, RefusedServer)>) {
        if refused.is_empty() {
            return;
        }
        self.input(|e, now| {
            let mut user = Vec::new();
            for (added_by, server) in refused {
                match added_by {
                    McpServerOrigin::User => user.push(server),
                    McpServerOrigin::Extension => e.handle_mcp_status(
                        now,
                        &server.name,
                        &server.url,
                        added_by,
                        McpServerState::Refused,
                        Some(server.problem),
                    ),
                }
            }
            if !user.is_empty() {
                e.handle_mcp_refused(now, user);
            }
        });
    }

    /// The user's list of servers changed (`mcpUserServers`, its new
    /// value): listed as not used in its place.
    pub(super) fn apply_user_servers(&self, value: &Value) {
        let user = not_used(value);
        if !user.is_empty() {
            console_error(&format!(
                "your MCP servers ({}) are not used: {NO_MCP}",
                user.len()
            ));
        }
        self.input(|e, now| e.handle_mcp_refused(now, user));
    }

    /// A tool of an MCP server (`Binding::Mcp`): only a run frozen by a
    /// build with MCP names one; it fails, saying why.
    pub(super) async fn mcp_tool(
        &self,
        _dispatch_id: u64,
        (server, _endpoint): (&str, &str),
        _call_id: &str,
        _name: &str,
        _params: &Value,
        _changes_something: bool,
    ) -> Result<ToolOutcome, String> {
        Err(format!(
            "The MCP server \"{server}\" cannot be called: {NO_MCP}."
        ))
    }
}
