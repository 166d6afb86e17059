//! MCP servers over Streamable HTTP (spec 000 §4, the `mcp` level): the half
//! without IO.
//!
//! Owns: reading the embedding extension's server list (`MCP_SERVERS` of
//! `extension/mcp-servers.js`), the JSON-RPC messages the client sends,
//! reading a server's answer (one JSON message, a batch, or an SSE stream of
//! them), turning a `tools/list` into registry descriptors (and the names
//! the model sees into the server's own), and a `tools/call` result into a
//! tool outcome.
//!
//! Must not: do IO (`platform::mcp` sends and receives), or decide whether a
//! call may run (the gatekeeper asks the user before every `mcp` call).
//!
//! Decisions:
//! - A server's tool `search` of server `docs` is `docs__search` to the
//!   model (any character outside `a-z A-Z 0-9 _ -` becomes `_`); a name
//!   that would be longer than 64 characters, or that two tools share after
//!   that, is left out and named in the console.
//! - What a server says of its tools is a hint from a party the user does
//!   not control: `readOnlyHint: true` makes a tool a read (its recovery
//!   retry-safe), anything else a write (never-retry: if the worker dies
//!   during a call, the user is asked whether it happened). Every call asks
//!   the user first either way (`gatekeeper::verdict`), and its result is
//!   marked as untrusted data for the model.
//! - The binding names the server, its URL and the names of the headers it
//!   is sent (never their values), so a run that started with one server is
//!   not resumed against another (`environment_drift`); a rotated token is
//!   the same server.

use serde_json::{json, Map, Value};

use crate::engine::ToolOutcome;
use crate::model::ImageData;
use crate::provider::sse::SseParser;
use crate::tools::{Binding, Effects, Level, ToolDescriptor, TOOL_TIME_LIMIT_MS};

/// The protocol revision this client speaks first (a server may answer with
/// an earlier one it supports; [`SUPPORTED_VERSIONS`]).
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// Revisions whose Streamable HTTP transport this client speaks.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["2025-06-18", "2025-03-26"];

/// At most this many servers are connected; the rest are named in the console.
pub const MAX_SERVERS: usize = 8;

/// At most this many tools of one server are offered (in the server's
/// order): every tool is in every request, and the run's catalog is bounded
/// (`EnvironmentLimits::max_entries`).
pub const MAX_TOOLS_PER_SERVER: usize = 32;

/// A tool's description the model reads, at most (characters; longer ones
/// are cut with "…").
pub const MAX_DESCRIPTION_CHARS: usize = 2_000;

/// What a call's result may carry as text for the model (characters); more
/// is cut with a note saying how much.
pub const MAX_RESULT_CHARS: usize = 100_000;

/// What joins the server's name and its tool's name.
pub const SEPARATOR: &str = "__";

/// Headers the client sets itself; a server's configuration may not.
const CLIENT_HEADERS: [&str; 5] = [
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// One server as the embedding extension configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// 1-24 characters of `a-z 0-9 -`: the prefix of its tools' names.
    pub name: String,
    /// The MCP endpoint (http or https).
    pub url: String,
    /// Sent with every request (an `Authorization` header, an API key).
    pub headers: Vec<(String, String)>,
    /// How long one call may take (ms).
    pub time_limit_ms: u32,
    /// How this extension names itself to the server's sign-in server
    /// when that registers no clients on request (`oauth`).
    pub oauth: crate::oauth::ClientConfig,
}

impl ServerConfig {
    /// The binding of its tools: the server, its endpoint and the names of
    /// the headers it is sent (not their values).
    pub fn binding(&self) -> Binding {
        let mut names: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| k.to_ascii_lowercase())
            .collect();
        crate::sorting::sort(&mut names);
        Binding::Mcp {
            server: self.name.clone(),
            endpoint: self.url.clone(),
            auth: names.join(","),
        }
    }
}

/// The error of a call to a server whose name now stands for another
/// address than the one the run was given (and the user was shown, when
/// asked): nothing is sent to either.
pub fn moved_server_message(name: &str, was: &str, now: &str) -> String {
    format!(
        "The MCP server \"{name}\" is now at {now}, not at {was} where this call was meant to go \
(and approved, if it was asked): nothing was sent. Call the tool again if it still makes sense \
(a call that changes something is asked again)."
    )
}

/// Read `MCP_SERVERS` (its JSON data; null: none). A wrong entry is left out
/// and named with what to fix; the others are kept.
pub fn parse_servers(value: &Value) -> (Vec<ServerConfig>, Vec<String>) {
    let mut servers: Vec<ServerConfig> = Vec::new();
    let mut errors = Vec::new();
    let list = match value {
        Value::Null => return (servers, errors),
        Value::Array(list) => list,
        _ => {
            errors.push("MCP_SERVERS must be an array of servers".to_string());
            return (servers, errors);
        }
    };
    for (i, entry) in list.iter().enumerate() {
        match parse_server(entry) {
            Ok(server) if servers.iter().any(|s| s.name == server.name) => {
                errors.push(format!(
                    "MCP server {:?}: another server has that name",
                    server.name
                ));
            }
            Ok(_) if servers.len() >= MAX_SERVERS => {
                errors.push(format!(
                    "MCP server #{i}: at most {MAX_SERVERS} servers are connected"
                ));
            }
            Ok(server) => servers.push(server),
            Err(e) => errors.push(e),
        }
    }
    (servers, errors)
}

/// An entry of the user's servers that cannot be used, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedServer {
    /// Its `name` if that is text, else "".
    pub name: String,
    /// Its `url` if that is text, else "".
    pub url: String,
    pub problem: String,
}

/// Read the user's servers (`chrome.storage.local.mcpUserServers`, JSON
/// data; null: none), checked like `MCP_SERVERS` entries: each is a server
/// or refused with what to fix. `taken`: the names of the extension's
/// servers, which a user's server may not have; `room`: how many more
/// servers may connect ([`MAX_SERVERS`] in all).
pub fn parse_user_servers(
    value: &Value,
    taken: &[&str],
    room: usize,
) -> Vec<Result<ServerConfig, RefusedServer>> {
    let list = match value {
        Value::Null => return Vec::new(),
        Value::Array(list) => list.as_slice(),
        other => std::slice::from_ref(other),
    };
    let mut names: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let text = |key: &str| {
            entry
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let refuse = |problem: String| RefusedServer {
            name: text("name"),
            url: text("url"),
            problem,
        };
        let checked = match parse_server(entry) {
            Err(problem) => Err(refuse(problem)),
            Ok(server) if taken.contains(&server.name.as_str()) => Err(refuse(format!(
                "MCP server {:?}: the extension has a server of that name",
                server.name
            ))),
            Ok(server) if names.contains(&server.name) => Err(refuse(format!(
                "MCP server {:?}: another of your servers has that name",
                server.name
            ))),
            Ok(server) if names.len() >= room => Err(refuse(format!(
                "MCP server {:?}: at most {MAX_SERVERS} servers are connected",
                server.name
            ))),
            Ok(server) => {
                names.push(server.name.clone());
                Ok(server)
            }
        };
        out.push(checked);
    }
    out
}

/// The user's servers that can be used and the entries refused
/// ([`parse_user_servers`], with room for [`MAX_SERVERS`] in all next to
/// the extension's `taken` ones).
pub fn split_user_servers(
    value: &Value,
    taken: &[&str],
) -> (Vec<ServerConfig>, Vec<RefusedServer>) {
    let room = MAX_SERVERS.saturating_sub(taken.len());
    let mut servers = Vec::new();
    let mut refused = Vec::new();
    for checked in parse_user_servers(value, taken, room) {
        match checked {
            Ok(server) => servers.push(server),
            Err(refusal) => refused.push(refusal),
        }
    }
    (servers, refused)
}

fn parse_server(entry: &Value) -> Result<ServerConfig, String> {
    const FIELDS: [&str; 5] = ["name", "url", "headers", "timeoutMs", "oauth"];
    let object = entry
        .as_object()
        .ok_or("an MCP server must be an object { name, url, headers?, timeoutMs?, oauth? }")?;
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .ok_or("an MCP server needs a string `name`")?
        .to_string();
    let fail = |what: String| format!("MCP server {name:?}: {what}");
    let name_ok = (1..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !name_ok {
        return Err(fail(
            "`name` must be 1-24 characters of a-z, 0-9 or - (it prefixes its tools' names)"
                .to_string(),
        ));
    }
    if let Some(key) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(fail(format!(
            "unknown field `{key}` (known: {})",
            FIELDS.join(", ")
        )));
    }
    let url = object
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| fail("needs a string `url`".to_string()))?
        .to_string();
    let host = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .unwrap_or("");
    if host.is_empty() || host.contains('@') || url.chars().any(char::is_whitespace) {
        return Err(fail(format!(
            "`url` must be an http or https URL with a host and no user name ({url:?})"
        )));
    }
    let mut headers = Vec::new();
    match object.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                let token_ok = !key.is_empty()
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token_ok {
                    return Err(fail(format!("header name {key:?} is not a valid name")));
                }
                if CLIENT_HEADERS.contains(&key.to_ascii_lowercase().as_str()) {
                    return Err(fail(format!("header {key:?} is set by the client itself")));
                }
                let value = value
                    .as_str()
                    .filter(|v| !v.chars().any(|c| c.is_control()))
                    .ok_or_else(|| fail(format!("header {key:?} must be text on one line")))?;
                headers.push((key.clone(), value.to_string()));
            }
        }
        Some(_) => {
            return Err(fail(
                "`headers` must be an object of header names to text".to_string(),
            ))
        }
    }
    let time_limit_ms = match object.get("timeoutMs") {
        None | Some(Value::Null) => TOOL_TIME_LIMIT_MS,
        Some(n) => n
            .as_u64()
            .filter(|ms| (1..=u64::from(crate::tools::HOST_TOOL_MAX_TIME_LIMIT_MS)).contains(ms))
            .map(|ms| ms as u32)
            .ok_or_else(|| {
                fail(format!(
                    "`timeoutMs` must be a whole number of milliseconds from 1 to {}",
                    crate::tools::HOST_TOOL_MAX_TIME_LIMIT_MS
                ))
            })?,
    };
    let oauth = crate::oauth::ClientConfig::parse(object.get("oauth")).map_err(fail)?;
    if oauth.is_set()
        && headers
            .iter()
            .any(|(key, _)| key.eq_ignore_ascii_case("authorization"))
    {
        return Err(fail(
            "`oauth` is for a server that signs in, and this entry sends its own Authorization header"
                .to_string(),
        ));
    }
    Ok(ServerConfig {
        name,
        url,
        headers,
        time_limit_ms,
        oauth,
    })
}

/// A server's tool as the registry holds it, and its name on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTool {
    pub descriptor: ToolDescriptor,
    pub remote: String,
}

/// The name the model sees for tool `remote` of `server`, if it fits.
pub fn exposed_name(server: &str, remote: &str) -> Option<String> {
    let cleaned: String = remote
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{server}{SEPARATOR}{cleaned}");
    (!remote.is_empty() && name.len() <= 64).then_some(name)
}

/// The registry's descriptors of a server's listed tools (the `tools` of
/// its `tools/list` answers, in order), and what was left out and why.
pub fn remote_tools(server: &ServerConfig, listed: &[Value]) -> (Vec<RemoteTool>, Vec<String>) {
    let limits = crate::engine::EnvironmentLimits::default();
    let mut tools: Vec<RemoteTool> = Vec::new();
    let mut problems = Vec::new();
    for (i, tool) in listed.iter().enumerate() {
        let remote = tool.get("name").and_then(Value::as_str).unwrap_or("");
        let what = if remote.is_empty() {
            format!("MCP server {:?}, tool #{i}", server.name)
        } else {
            format!("MCP server {:?}, tool {remote:?}", server.name)
        };
        match remote_tool(server, tool, &limits) {
            Ok(_) if tools.len() >= MAX_TOOLS_PER_SERVER => {
                problems.push(format!(
                    "{what}: left out, at most {MAX_TOOLS_PER_SERVER} tools of one server are offered"
                ));
            }
            Ok(t) if tools.iter().any(|o| o.descriptor.name == t.descriptor.name) => {
                problems.push(format!(
                    "{what}: left out, another of its tools is also called {}",
                    t.descriptor.name
                ));
            }
            Ok(t) => tools.push(t),
            Err(e) => problems.push(format!("{what}: left out, {e}")),
        }
    }
    (tools, problems)
}

fn remote_tool(
    server: &ServerConfig,
    tool: &Value,
    limits: &crate::engine::EnvironmentLimits,
) -> Result<RemoteTool, String> {
    let remote = tool
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("it has no name")?;
    let name = exposed_name(&server.name, remote).ok_or_else(|| {
        format!(
            "its name as the model sees it ({}{SEPARATOR}…) would be longer than 64 characters",
            server.name
        )
    })?;
    let text = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    };
    let annotations = tool.get("annotations");
    // The schema's display-name precedence: title, annotations.title, name.
    let label = text(tool.get("title"))
        .or_else(|| text(annotations.and_then(|a| a.get("title"))))
        .unwrap_or_else(|| remote.to_string());
    let label: String = label.chars().take(80).collect();
    let description = text(tool.get("description")).unwrap_or_else(|| label.clone());
    let description = format!(
        "[Tool of the MCP server \"{}\"; described by that server, not by the user] {}",
        server.name,
        cut(&description, MAX_DESCRIPTION_CHARS)
    );
    let parameters = match tool.get("inputSchema") {
        None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
        Some(schema) if schema.get("type").and_then(Value::as_str) == Some("object") => {
            schema.clone()
        }
        Some(_) => return Err("its inputSchema is not a JSON Schema of type object".to_string()),
    };
    let read_only = annotations
        .and_then(|a| a.get("readOnlyHint"))
        .and_then(Value::as_bool)
        == Some(true);
    let descriptor = ToolDescriptor::new(
        &name,
        &label,
        &description,
        parameters,
        Level::Mcp,
        if read_only {
            Effects::Read
        } else {
            Effects::Write
        },
        server.binding(),
    );
    let size = serde_json::to_string(&descriptor).map_or(usize::MAX, |s| s.len());
    if size > limits.max_entry_bytes {
        return Err(format!(
            "it is described by {size} bytes, at most {} are allowed per tool",
            limits.max_entry_bytes
        ));
    }
    if crate::engine::schema_depth(&descriptor.parameters) > limits.max_depth {
        return Err(format!(
            "its inputSchema is nested more than {} levels deep",
            limits.max_depth
        ));
    }
    Ok(RemoteTool {
        descriptor,
        remote: remote.to_string(),
    })
}

/// `text` cut to at most `max` characters, ending with "…" when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

// ------------------------------------------------------------ the messages

/// A JSON-RPC request.
pub fn request(id: u64, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

/// A JSON-RPC notification.
pub fn notification(method: &str, params: Option<Value>) -> String {
    let mut message = json!({ "jsonrpc": "2.0", "method": method });
    if let Some(params) = params {
        message["params"] = params;
    }
    message.to_string()
}

/// The `initialize` request's params.
pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        // Requests for the user's input during a tool call are shown in the
        // side panel (`crate::elicitation`).
        "capabilities": { "elicitation": {} },
        "clientInfo": { "name": "sw-agent", "version": env!("CARGO_PKG_VERSION") },
    })
}

/// The `tools/call` request's params; `progress_token` asks the server for
/// progress notifications.
pub fn call_params(remote: &str, arguments: &Value, progress_token: &str) -> Value {
    json!({
        "name": remote,
        "arguments": arguments,
        "_meta": { "progressToken": progress_token },
    })
}

/// The notification a server sends when its list of tools changed
/// (it declared `capabilities.tools.listChanged`).
pub const LIST_CHANGED: &str = "notifications/tools/list_changed";

/// Whether the server's `initialize` result says it announces changes of
/// its tool list (`capabilities.tools.listChanged: true`).
pub fn lists_changes(initialize_result: &Value) -> bool {
    initialize_result
        .pointer("/capabilities/tools/listChanged")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// How long to wait before opening a server's event stream again after
/// `failures` attempts in a row that did not get it open (0: it was open
/// and ended): 1 s, doubling to at most 60 s; `None` after 8 failures in a
/// row (the stream is given up until the server's tools are listed again).
pub fn stream_retry_ms(failures: u32) -> Option<u32> {
    (failures < 8).then(|| 1_000u32.saturating_mul(1 << failures.min(6)).min(60_000))
}

/// The answer to a request the server sent us: `ping` is answered (an
/// empty result, as the protocol asks); sampling, roots and anything else
/// this client does not offer are refused as "method not found".
pub fn answer_request(id: &Value, method: &str) -> String {
    if method == "ping" {
        return json!({ "jsonrpc": "2.0", "id": id, "result": {} }).to_string();
    }
    refusal(id, method)
}

/// The JSON-RPC answer to a request the server sent us (sampling,
/// elicitation, roots): this client offers none of those.
pub fn refusal(id: &Value, method: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32601, "message": format!("{method} is not supported by this client") },
    })
    .to_string()
}

/// What went wrong talking to a server, in words for the model and the
/// console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpError {
    /// `fetch` failed (no connection, refused, CORS, aborted).
    Unreachable(String),
    /// A status other than 2xx.
    Http { status: u16, body: String },
    /// The session the client held is gone (404 with a session id).
    SessionExpired,
    /// Not JSON-RPC as the protocol says.
    Malformed(String),
    /// The server answered the request with an error.
    Rpc { code: i64, message: String },
    /// The answer ended without the response to the request.
    NoAnswer,
    /// The server accepted the request (a 2xx), then its answer broke off
    /// before the response (the connection dropped): like [`Self::NoAnswer`],
    /// the server may have done what was asked.
    AnswerBroke(String),
    /// The server speaks a protocol revision this client does not.
    Version(String),
    /// The server asks for a sign-in (HTTP 401) and no kept grant works:
    /// the user signs in from Settings. The challenge's
    /// `WWW-Authenticate`, if any.
    SignInNeeded(Option<String>),
    /// The server refused a request for want of a scope the sign-in did
    /// not grant (HTTP 403 `insufficient_scope`): the user signs in again
    /// for it. The challenge's `WWW-Authenticate`.
    MorePermissionNeeded(String),
    /// The server did not answer `request` (its method) within its time
    /// limit of `seconds`: the request was given up (aborted).
    TimedOut { request: String, seconds: u32 },
}

impl McpError {
    /// The error in words, naming the server.
    pub fn describe(&self, server: &str) -> String {
        match self {
            McpError::Unreachable(why) => {
                format!("The MCP server \"{server}\" could not be reached ({why}).")
            }
            McpError::Http { status, body } => {
                let hint = match status {
                    401 | 403 => " It refused the client's credentials (the headers of MCP_SERVERS).",
                    _ => "",
                };
                let body = cut(body.trim(), 300);
                if body.is_empty() {
                    format!("The MCP server \"{server}\" answered HTTP {status}.{hint}")
                } else {
                    format!("The MCP server \"{server}\" answered HTTP {status}: {body}{hint}")
                }
            }
            McpError::SessionExpired => {
                format!("The MCP server \"{server}\" no longer knows this client's session.")
            }
            McpError::Malformed(why) => {
                format!("The MCP server \"{server}\" sent an answer that is not MCP: {why}.")
            }
            McpError::Rpc { code, message } => {
                format!(
                    "The MCP server \"{server}\" answered with error {code}: {}",
                    cut(message, 500)
                )
            }
            McpError::NoAnswer => {
                format!("The MCP server \"{server}\" ended its answer without a result.")
            }
            McpError::AnswerBroke(why) => format!(
                "The MCP server \"{server}\" accepted the request, then its answer broke off ({why})."
            ),
            McpError::SignInNeeded(_) => format!(
                "The MCP server \"{server}\" needs you to sign in: open the side panel's Settings, MCP servers, and choose Sign in next to it."
            ),
            McpError::MorePermissionNeeded(challenge) => {
                let scopes = crate::oauth::challenge_scopes(Some(challenge))
                    .map(|s| format!(" ({})", s.join(" ")))
                    .unwrap_or_default();
                format!(
                    "The MCP server \"{server}\" needs more permission than your sign-in gave{scopes}: open the side panel's Settings, MCP servers, and choose Sign in next to it to grant it."
                )
            }
            McpError::Version(v) => format!(
                "The MCP server \"{server}\" speaks protocol revision {v:?}; this client speaks {}.",
                SUPPORTED_VERSIONS.join(" and ")
            ),
            McpError::TimedOut { request, seconds } => format!(
                "The MCP server \"{server}\" did not answer {request} within {seconds} s."
            ),
        }
    }
}

/// The words added to the error of a call that changes something (not
/// `readOnlyHint`) when the server had it and its answer never came: it may
/// have acted, so the model must look before calling again
/// (never_retry_at_most_once; a page write that times out is told the same).
pub const OUTCOME_UNKNOWN: &str = " Whether the call did anything is unknown: check (with one of the server's tools that reads, if it has one) before calling it again; do not repeat it blindly.";

/// A tool call's error in words: `describe`, and for a call that changes
/// something whose answer was lost after the server had it,
/// [`OUTCOME_UNKNOWN`].
pub fn call_error(error: &McpError, server: &str, changes_something: bool) -> String {
    let mut text = error.describe(server);
    let lost = match error {
        McpError::NoAnswer | McpError::AnswerBroke(_) => true,
        McpError::TimedOut { request, .. } => request == "tools/call",
        _ => false,
    };
    if lost && changes_something {
        text.push_str(OUTCOME_UNKNOWN);
    }
    text
}

/// What a request sent with a time limit of `limit_ms` came to, `expired`
/// telling whether the limit passed (and aborted it): an error then is
/// [`McpError::TimedOut`] naming `request`, since the abort's own error
/// ("the operation was aborted", an answer cut short) says nothing of
/// why. Errors an abort does not cause (an HTTP status, a sign-in
/// wanted), and any answer, are kept as they are.
pub fn within_time_limit<T>(
    result: Result<T, McpError>,
    expired: bool,
    request: &str,
    limit_ms: u32,
) -> Result<T, McpError> {
    match result {
        Err(McpError::Unreachable(_) | McpError::NoAnswer | McpError::AnswerBroke(_))
            if expired =>
        {
            Err(McpError::TimedOut {
                request: request.to_string(),
                seconds: limit_ms.div_ceil(1000),
            })
        }
        other => other,
    }
}

/// One message from the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The answer to one of our requests.
    Response {
        id: Value,
        answer: Result<Value, McpError>,
    },
    /// A request of the server's: `elicitation/create` during a tool call
    /// is shown to the user (`crate::elicitation`); others are answered
    /// [`refusal`]. `order`: the names of the requested fields in the
    /// message's own order ([`crate::elicitation::property_order`]).
    Request {
        id: Value,
        method: String,
        params: Value,
        order: Vec<String>,
    },
    /// A notification (`notifications/progress`, `notifications/message`…).
    Notification { method: String, params: Value },
}

fn classify(message: Value) -> Result<Incoming, McpError> {
    let Value::Object(mut object) = message else {
        return Err(McpError::Malformed(
            "a message is not a JSON object".to_string(),
        ));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(McpError::Malformed(
            "a message does not say \"jsonrpc\": \"2.0\"".to_string(),
        ));
    }
    let method = object
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string);
    let id = object.remove("id");
    match (method, id) {
        (Some(method), Some(id)) => Ok(Incoming::Request {
            id,
            method,
            params: object.remove("params").unwrap_or(Value::Null),
            order: Vec::new(),
        }),
        (Some(method), None) => Ok(Incoming::Notification {
            method,
            params: object.remove("params").unwrap_or(Value::Null),
        }),
        (None, Some(id)) => {
            let answer = match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Ok(result),
                (None, Some(error)) => Err(McpError::Rpc {
                    code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("(no message)")
                        .to_string(),
                }),
                _ => Err(McpError::Malformed(
                    "a response has neither a result nor an error, or both".to_string(),
                )),
            };
            Ok(Incoming::Response { id, answer })
        }
        (None, None) => Err(McpError::Malformed(
            "a message is neither a request, a notification nor a response".to_string(),
        )),
    }
}

/// The most bytes of one answer read (a JSON body, or one SSE event).
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// Reads a server's answer to one POST as its bytes arrive: one JSON-RPC
/// message or a batch (`application/json`), or a stream of them
/// (`text/event-stream`).
#[derive(Debug)]
pub struct AnswerReader {
    sse: Option<SseParser>,
    json: Vec<u8>,
    /// The last event id of this answer's stream, carried over from the
    /// stream it resumes (see `resumed`).
    last_event_id: Option<String>,
    /// How long the server asked a client to wait before reconnecting
    /// (`retry:`).
    retry_ms: Option<u64>,
}

impl AnswerReader {
    /// For a response of this `Content-Type`: SSE or JSON (anything else
    /// is read as JSON and refused if it is not).
    pub fn new(content_type: &str) -> Self {
        let sse = content_type
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"));
        AnswerReader {
            sse: sse.then(SseParser::new),
            json: Vec::new(),
            last_event_id: None,
            retry_ms: None,
        }
    }

    /// The reader for the stream that resumes this one (a GET with
    /// `Last-Event-ID`, answered with this `Content-Type`): what the
    /// server said of ids and reconnecting carries over until the new
    /// stream says otherwise.
    pub fn resumed(&self, content_type: &str) -> Self {
        AnswerReader {
            last_event_id: self.last_event_id(),
            retry_ms: self.retry_ms,
            ..AnswerReader::new(content_type)
        }
    }

    /// The id of the last event received on the stream, if the server
    /// numbers its events: a stream that broke can be resumed after it.
    pub fn last_event_id(&self) -> Option<String> {
        match self.stream_event_id() {
            // An empty `id:` resets it: not the one resumed after either.
            Some(id) => (!id.is_empty()).then(|| id.to_string()),
            None => self.last_event_id.clone(),
        }
    }

    /// The id this stream's events last set (not one it was resumed
    /// after): None before any `id:`, "" after an empty one (a reset).
    pub fn stream_event_id(&self) -> Option<&str> {
        self.sse.as_ref().and_then(|p| p.last_event_id())
    }

    /// How long to wait before resuming, as the server asked (`retry:`).
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// Whether the answer is an event stream.
    pub fn is_stream(&self) -> bool {
        self.sse.is_some()
    }

    /// The messages completed by `bytes`.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Incoming>, McpError> {
        match &mut self.sse {
            Some(parser) => {
                let events = parser.push(bytes);
                if events.is_empty() && parser_backlog(parser) > MAX_MESSAGE_BYTES {
                    return Err(too_big());
                }
                if let Some(retry) = parser.reconnection_time() {
                    self.retry_ms = Some(retry);
                }
                sse_messages(events.into_iter().map(|e| e.data))
            }
            None => {
                if self.json.len() + bytes.len() > MAX_MESSAGE_BYTES {
                    return Err(too_big());
                }
                self.json.extend_from_slice(bytes);
                Ok(Vec::new())
            }
        }
    }

    /// The messages left at the end of the body.
    pub fn finish(&mut self) -> Result<Vec<Incoming>, McpError> {
        match &mut self.sse {
            Some(parser) => {
                let events = parser.finish();
                if let Some(retry) = parser.reconnection_time() {
                    self.retry_ms = Some(retry);
                }
                sse_messages(events.into_iter().map(|e| e.data))
            }
            None => {
                let text = std::mem::take(&mut self.json);
                if text.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Vec::new());
                }
                let value: Value = serde_json::from_slice(&text)
                    .map_err(|e| McpError::Malformed(format!("the body is not JSON ({e})")))?;
                match value {
                    Value::Array(batch) => batch.into_iter().map(classify).collect(),
                    one => Ok(vec![with_order(
                        classify(one)?,
                        &String::from_utf8_lossy(&text),
                    )]),
                }
            }
        }
    }
}

/// How many times, in all, the answer stream of one request is resumed
/// (`Last-Event-ID`) before the request is given up as unanswered.
pub const MAX_RESUMES: u32 = 3;

/// How long to wait before resuming a broken answer stream the
/// `attempt`-th time (0 first): what the server asked (`retry:`, at least
/// 100 ms), else 500 ms, doubling, at most 10 s; None once `MAX_RESUMES`
/// were made.
pub fn resume_delay_ms(attempt: u32, asked: Option<u64>) -> Option<u32> {
    if attempt >= MAX_RESUMES {
        return None;
    }
    let base = asked.unwrap_or(500).clamp(100, 10_000);
    Some(base.saturating_mul(1 << attempt).min(10_000) as u32)
}

fn parser_backlog(parser: &SseParser) -> usize {
    parser.pending_len()
}

fn too_big() -> McpError {
    McpError::Malformed(format!(
        "a message is larger than {} MiB",
        MAX_MESSAGE_BYTES / (1024 * 1024)
    ))
}

fn sse_messages(data: impl Iterator<Item = String>) -> Result<Vec<Incoming>, McpError> {
    let mut out = Vec::new();
    for data in data {
        // An event without data (a priming event with only an id) carries
        // no message.
        if data.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&data)
            .map_err(|e| McpError::Malformed(format!("an event's data is not JSON ({e})")))?;
        match value {
            Value::Array(batch) => {
                for message in batch {
                    out.push(classify(message)?);
                }
            }
            one => out.push(with_order(classify(one)?, &data)),
        }
    }
    Ok(out)
}

/// A request for input keeps the order its text gives the fields (a
/// batch's requests keep none: their fields come by name).
fn with_order(message: Incoming, text: &str) -> Incoming {
    match message {
        Incoming::Request {
            id, method, params, ..
        } if method == crate::elicitation::METHOD => Incoming::Request {
            id,
            method,
            params,
            order: crate::elicitation::property_order(text),
        },
        other => other,
    }
}

/// Whether `id` is the id we sent as `ours`.
pub fn is_ours(id: &Value, ours: u64) -> bool {
    id.as_u64() == Some(ours) || id.as_str() == Some(ours.to_string().as_str())
}

/// The protocol revision an `initialize` result agreed on, or why none.
pub fn agreed_version(result: &Value) -> Result<String, McpError> {
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| McpError::Malformed("initialize did not name a protocolVersion".into()))?;
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(version.to_string())
    } else {
        Err(McpError::Version(version.to_string()))
    }
}

/// One page of a `tools/list` result: its tools and the next page's cursor.
pub fn tools_page(result: &Value) -> Result<(Vec<Value>, Option<String>), McpError> {
    let tools = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or_else(|| McpError::Malformed("tools/list answered without a tools array".into()))?
        .clone();
    let next = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok((tools, next))
}

/// The text of a progress notification about our call (`progress_token`),
/// for the side panel.
pub fn progress_text(params: &Value, progress_token: &str) -> Option<String> {
    if params.get("progressToken").and_then(Value::as_str) != Some(progress_token) {
        return None;
    }
    if let Some(message) = params.get("message").and_then(Value::as_str) {
        return Some(cut(message, 200));
    }
    let progress = params.get("progress").and_then(Value::as_f64)?;
    Some(match params.get("total").and_then(Value::as_f64) {
        Some(total) if total > 0.0 => format!("{progress} of {total}"),
        _ => format!("{progress}"),
    })
}

/// The tool outcome of a `tools/call` result: its text (and text
/// resources) for the model, its images when they are of a kind a model
/// takes, and what cannot be shown named. `isError` makes it an error the
/// model can act on.
pub fn call_outcome(server: &str, remote: &str, result: &Value) -> ToolOutcome {
    let Some(content) = result.get("content").and_then(Value::as_array) else {
        return ToolOutcome::text(
            false,
            McpError::Malformed(format!("the result of {remote} has no content array"))
                .describe(server),
        );
    };
    let mut texts: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for block in content {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let str_of = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => texts.push(str_of("text").to_string()),
            "image" => {
                let media_type = str_of("mimeType");
                let data = str_of("data");
                if crate::model::ATTACHMENT_IMAGE_TYPES.contains(&media_type) && !data.is_empty() {
                    images.push(ImageData {
                        media_type: media_type.to_string(),
                        data: data.to_string(),
                    });
                } else {
                    texts.push(format!(
                        "[an image of type {media_type:?} that is not shown]"
                    ));
                }
            }
            "resource" => {
                let resource = block.get("resource").cloned().unwrap_or(Value::Null);
                let uri = resource.get("uri").and_then(Value::as_str).unwrap_or("");
                match resource.get("text").and_then(Value::as_str) {
                    Some(text) => texts.push(format!("[resource {uri}]\n{text}")),
                    None => texts.push(format!("[a binary resource {uri} that is not shown]")),
                }
            }
            "resource_link" => {
                let name = str_of("name");
                texts.push(format!("[link to resource {name:?}: {}]", str_of("uri")));
            }
            "audio" => texts.push("[audio that is not shown]".to_string()),
            other => texts.push(format!("[content of type {other:?} that is not shown]")),
        }
    }
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    if texts.is_empty() && images.is_empty() {
        if let Some(structured) = structured {
            texts.push(structured.to_string());
        }
    }
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let mut text = texts.join("\n\n");
    if text.is_empty() && images.is_empty() {
        text = if is_error {
            format!("{remote} failed and said nothing more.")
        } else {
            "(The tool returned nothing.)".to_string()
        };
    }
    let total = text.chars().count();
    if total > MAX_RESULT_CHARS {
        text = format!(
            "{}\n[The result was cut: {MAX_RESULT_CHARS} of its {total} characters are shown.]",
            cut(&text, MAX_RESULT_CHARS).trim_end_matches('…')
        );
    }
    let mut details = Map::new();
    details.insert("mcpServer".into(), Value::from(server));
    details.insert("mcpTool".into(), Value::from(remote));
    if let Some(structured) = structured {
        details.insert("structuredContent".into(), structured.clone());
    }
    ToolOutcome {
        ok: !is_error,
        content: text,
        details: Some(Value::Object(details)),
        images,
    }
}

#[cfg(test)]
#[path = "mcp_tests.rs"]
mod tests;
