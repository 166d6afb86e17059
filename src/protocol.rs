//! Wire protocol between clients (the side panel, embedders) and the engine.
//!
//! Owns: the `Op` (client → engine) and `Event` (engine → client) enums, the
//! page-channel messages (engine ⇄ content script) and the serializable
//! `ErrorInfo`. Every type here is plain data with serde derives; the wire
//! form is JSON with `type` tags and camelCase fields (see `docs/protocol.md`).
//!
//! Must not: contain engine logic, touch JS, read a clock.

use serde::{Deserialize, Serialize};

use crate::model::{
    ApprovalRecord, ApprovalStatus, ElicitationAction, InteractionRecord, InteractionStatus,
    McpServerSummary, Node, QueueItem, Run, SiteRuleSummary, StopReason, ThreadSummary, Usage,
};

/// Protocol version announced in `initialized`; bump on breaking changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// Identity of a command: who sent it and which user action it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Submission {
    /// Stable per client instance (one side panel load).
    pub client_id: String,
    /// Unique per user action; a repeated id is a retry of the same action.
    pub submission_id: String,
}

pub use crate::model::UserInput;

/// A client operation. Each variant documents the events it causes.
// Decoded by hand (`Op::from_value`), see there.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
#[non_exhaustive]
pub enum Op {
    /// Subscribe to a thread (null: the most recent one) → `initialized`.
    #[serde(rename = "initialize")]
    Initialize {
        #[serde(flatten)]
        submission: Submission,
        #[serde(default)]
        thread_id: Option<String>,
    },
    /// Create an empty thread → `command.ack{threadId}`, `threads.updated`, `initialized`.
    #[serde(rename = "thread.create")]
    ThreadCreate {
        #[serde(flatten)]
        submission: Submission,
    },
    /// Copy a thread's conversation up to a message into a new thread →
    /// `command.ack{threadId}`, `threads.updated`, `initialized` (the client
    /// is subscribed to the fork). `nodeId` null: up to the current end.
    #[serde(rename = "thread.fork")]
    ThreadFork {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        #[serde(default)]
        node_id: Option<String>,
    },
    /// Make another branch of a thread the active one → `command.ack{leafId}`,
    /// `initialized` to every client subscribed to the thread. `nodeId` is any
    /// message of the thread; the branch's newest tip under it becomes the leaf.
    /// Refused while a turn runs or waits for an answer on the thread.
    #[serde(rename = "thread.selectBranch")]
    ThreadSelectBranch {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        node_id: String,
    },
    /// Give a thread the title the user chose → `command.ack{threadId,
    /// title}` once saved, then `threads.updated`. The title is trimmed, its
    /// runs of white space made one space; empty or longer than
    /// `engine::MAX_TITLE_CHARS` (80) is `invalid_command`. Taken while
    /// the thread's turn runs too; sent while a change of the thread is
    /// being saved, it waits for that save. From then on no model title
    /// replaces it.
    #[serde(rename = "thread.rename")]
    ThreadRename {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        title: String,
    },
    /// Delete a thread and everything in it → `command.ack`, `threads.updated`.
    /// While the thread's turn runs it is refused (`invalid_command`), unless
    /// `stopTurn` is true: then the turn is stopped as by `turn.interrupt`
    /// (its end is saved and announced with `turn.complete`) and the thread
    /// is deleted after that. Sent while a change of the thread is being
    /// saved, it waits for that save.
    #[serde(rename = "thread.delete")]
    ThreadDelete {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stop_turn: bool,
    },
    /// Start a turn (or queue it when one is running) → `command.ack`, `turn.start`, items…, `turn.complete`.
    /// With `replaces` (the id of a message that started a turn on the active
    /// path) the new turn starts a sibling branch in its place ("edit and
    /// resend"): the old branch stays in the thread, subscribers get a fresh
    /// `initialized`; refused (not queued) while a turn runs.
    #[serde(rename = "turn.submit")]
    TurnSubmit {
        #[serde(flatten)]
        submission: Submission,
        #[serde(default)]
        thread_id: Option<String>,
        input: UserInput,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<String>,
    },
    /// Add input to the running turn → `command.ack{steerId}` after the steer is durable.
    #[serde(rename = "turn.steer")]
    TurnSteer {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        expected_turn_id: String,
        input: UserInput,
    },
    /// Queue a next turn → `command.ack{queueItemId}`, `queue.updated`.
    #[serde(rename = "turn.enqueue")]
    TurnEnqueue {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        input: UserInput,
    },
    /// Remove a queued turn → `command.ack`, `queue.updated`.
    #[serde(rename = "queue.remove")]
    QueueRemove {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        item_id: String,
    },
    /// Change the text of a queued turn that has not started →
    /// `command.ack{itemId}`, `queue.updated`.
    #[serde(rename = "queue.update")]
    QueueUpdate {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        item_id: String,
        input: UserInput,
    },
    /// Stop the running turn now → `command.ack`, `turn.complete{interrupted}`.
    #[serde(rename = "turn.interrupt")]
    TurnInterrupt {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
    },
    /// Continue a thread whose last run was interrupted or failed → `command.ack`, `turn.start`, …
    /// `input` defaults to "Continue." (the model sees it as the user's message).
    #[serde(rename = "run.resume")]
    RunResume {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        #[serde(default)]
        input: Option<UserInput>,
    },
    /// Answer an approval request → `command.ack` once the decision is
    /// durable, `approval.resolved`, then the run continues.
    #[serde(rename = "approval.response")]
    ApprovalResponse {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        approval_id: String,
        decision: ApprovalDecision,
    },
    /// Answer the model's question (`ask_user`) → `command.ack` once the
    /// answer is durable, `interaction.resolved`, then the run continues.
    #[serde(rename = "interaction.response")]
    InteractionResponse {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        interaction_id: String,
        answer: String,
    },
    /// Answer an MCP server's request for input (an `interaction.request`
    /// whose record names a `server`) → `command.ack{interactionId, status,
    /// action}` once the answer is durable, `interaction.resolved`, then the
    /// answer goes to the server, whose call goes on. `content` (the values,
    /// by field name) only with `accept`; checked against the record's
    /// `form` (`invalid_command` names the field that does not fit).
    #[serde(rename = "elicitation.response")]
    ElicitationResponse {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        interaction_id: String,
        action: ElicitationAction,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<serde_json::Value>,
    },
    /// The part of the active path before `beforeNodeId` (at most `limit`
    /// nodes, default and maximum as for snapshots) → `command.ack{nodes,
    /// olderNodes}`: a page of earlier history for a client that got the
    /// tail in `initialized`. Reads only; no receipt.
    #[serde(rename = "thread.history")]
    ThreadHistory {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        before_node_id: String,
        #[serde(default)]
        limit: Option<u32>,
    },
    /// One file a view showed without its content (`kind: "omitted"`):
    /// the `index`th attachment of `ownerId`, a message on the active path,
    /// a queued turn or a pending steer → `command.ack{ownerId, index,
    /// attachment}`. Reads only; no receipt.
    #[serde(rename = "attachment.get")]
    AttachmentGet {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        owner_id: String,
        index: u32,
    },
    /// A tiny real request with these settings (the API key is the stored
    /// one) → `command.ack{ok: true, model, reply, latencyMs}` or
    /// `command.reject` with the provider's typed error. Changes nothing.
    #[serde(rename = "provider.test")]
    ProviderTest {
        #[serde(flatten)]
        submission: Submission,
        profile: crate::model::ProviderProfile,
    },
    /// The embedding extension's provider settings defaults, as the engine
    /// checked them (`extension/settings-defaults.js`; never an `apiKey`)
    /// → `command.ack{defaults}`: what a settings form shows for the fields
    /// the user has not set. Reads only; no receipt.
    #[serde(rename = "settings.defaults")]
    SettingsDefaults {
        #[serde(flatten)]
        submission: Submission,
    },
    /// The sites where write tools run without asking (rules made by
    /// `acceptForSite`) → `command.ack{rules: [{origin, allowWrites,
    /// createdAt}]}`, by origin. Reads only; no receipt.
    #[serde(rename = "siteRules.list")]
    SiteRulesList {
        #[serde(flatten)]
        submission: Submission,
    },
    /// The embedding extension's MCP servers, each with its state and the
    /// tools of it the agent is offered → `command.ack{servers:
    /// McpServerSummary[]}`, in the order of `extension/mcp-servers.js`.
    /// Reads only; no receipt.
    #[serde(rename = "mcpServers.list")]
    McpServersList {
        #[serde(flatten)]
        submission: Submission,
    },
    /// Ask MCP servers for their tools again (Settings' "Check again": one
    /// was unreachable, or its tools changed) → `command.ack{servers}` with
    /// those asked in state `listing`; `mcpServers.updated` follows with
    /// each outcome. `name`: that server; none: every server that can be
    /// used. Reads only; no receipt.
    #[serde(rename = "mcpServers.refresh")]
    McpServersRefresh {
        #[serde(flatten)]
        submission: Submission,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Sign in to the MCP server `name`, which asks for it (Settings'
    /// "Sign in"): the worker opens the server's sign-in window →
    /// `command.ack{servers}` at once; `mcpServers.updated` follows with
    /// the outcome (`ready` with its tools, or `sign_in_needed` with why).
    /// No receipt: sent again, it opens the window again.
    #[serde(rename = "mcpServers.signIn")]
    McpServersSignIn {
        #[serde(flatten)]
        submission: Submission,
        name: String,
    },
    /// Forget the user's sign-in to the MCP server `name` →
    /// `command.ack{servers}`; it is asked for its tools again (a server
    /// that needs a sign-in then says so). No receipt.
    #[serde(rename = "mcpServers.signOut")]
    McpServersSignOut {
        #[serde(flatten)]
        submission: Submission,
        name: String,
    },
    /// Remove a site's rule → `command.ack{origin}` once the removal is
    /// saved: from then on every write tool on that origin asks again.
    /// `not_found` when the site has no rule.
    #[serde(rename = "siteRule.revoke")]
    SiteRuleRevoke {
        #[serde(flatten)]
        submission: Submission,
        origin: String,
    },
    /// Decide a `paused_uncertain` write → `command.ack`, then the run continues.
    #[serde(rename = "run.resolveUncertain")]
    RunResolveUncertain {
        #[serde(flatten)]
        submission: Submission,
        thread_id: String,
        choice: UncertainChoice,
    },
}

/// The user's answer to an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalDecision {
    AcceptOnce,
    /// Accept, and allow this tool's kind of action on this site from now on.
    AcceptForSite,
    Decline,
}

impl ApprovalDecision {
    pub fn status(self) -> ApprovalStatus {
        match self {
            ApprovalDecision::AcceptOnce => ApprovalStatus::AcceptedOnce,
            ApprovalDecision::AcceptForSite => ApprovalStatus::AcceptedForSite,
            ApprovalDecision::Decline => ApprovalStatus::Declined,
        }
    }
}

/// What to do with a write whose outcome is unknown after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UncertainChoice {
    /// Dispatch it again (the user accepts a possible repeat).
    Retry,
    /// The user saw that it happened: record success.
    MarkDone,
    /// Record failure; the model decides what next.
    Fail,
}

impl Op {
    /// The user input the op carries, if it carries one.
    pub fn input(&self) -> Option<&UserInput> {
        match self {
            Op::TurnSubmit { input, .. }
            | Op::TurnSteer { input, .. }
            | Op::TurnEnqueue { input, .. }
            | Op::QueueUpdate { input, .. } => Some(input),
            Op::RunResume { input, .. } => input.as_ref(),
            _ => None,
        }
    }

    /// The submission identity every op carries.
    pub fn submission(&self) -> &Submission {
        match self {
            Op::Initialize { submission, .. }
            | Op::ThreadCreate { submission }
            | Op::ThreadFork { submission, .. }
            | Op::ThreadSelectBranch { submission, .. }
            | Op::QueueUpdate { submission, .. }
            | Op::ProviderTest { submission, .. }
            | Op::ThreadHistory { submission, .. }
            | Op::AttachmentGet { submission, .. }
            | Op::ThreadDelete { submission, .. }
            | Op::ThreadRename { submission, .. }
            | Op::TurnSubmit { submission, .. }
            | Op::TurnSteer { submission, .. }
            | Op::TurnEnqueue { submission, .. }
            | Op::QueueRemove { submission, .. }
            | Op::TurnInterrupt { submission, .. }
            | Op::RunResume { submission, .. }
            | Op::ApprovalResponse { submission, .. }
            | Op::InteractionResponse { submission, .. }
            | Op::ElicitationResponse { submission, .. }
            | Op::SiteRulesList { submission }
            | Op::McpServersList { submission }
            | Op::McpServersRefresh { submission, .. }
            | Op::McpServersSignIn { submission, .. }
            | Op::McpServersSignOut { submission, .. }
            | Op::SettingsDefaults { submission }
            | Op::SiteRuleRevoke { submission, .. }
            | Op::RunResolveUncertain { submission, .. } => submission,
        }
    }

    /// The wire name of the op (`turn.submit`, …).
    pub fn op_type(&self) -> &'static str {
        match self {
            Op::Initialize { .. } => "initialize",
            Op::ThreadCreate { .. } => "thread.create",
            Op::ThreadFork { .. } => "thread.fork",
            Op::ThreadSelectBranch { .. } => "thread.selectBranch",
            Op::QueueUpdate { .. } => "queue.update",
            Op::ProviderTest { .. } => "provider.test",
            Op::ThreadHistory { .. } => "thread.history",
            Op::AttachmentGet { .. } => "attachment.get",
            Op::ThreadDelete { .. } => "thread.delete",
            Op::ThreadRename { .. } => "thread.rename",
            Op::TurnSubmit { .. } => "turn.submit",
            Op::TurnSteer { .. } => "turn.steer",
            Op::TurnEnqueue { .. } => "turn.enqueue",
            Op::QueueRemove { .. } => "queue.remove",
            Op::TurnInterrupt { .. } => "turn.interrupt",
            Op::RunResume { .. } => "run.resume",
            Op::RunResolveUncertain { .. } => "run.resolveUncertain",
            Op::ApprovalResponse { .. } => "approval.response",
            Op::InteractionResponse { .. } => "interaction.response",
            Op::ElicitationResponse { .. } => "elicitation.response",
            Op::SiteRulesList { .. } => "siteRules.list",
            Op::McpServersList { .. } => "mcpServers.list",
            Op::McpServersRefresh { .. } => "mcpServers.refresh",
            Op::McpServersSignIn { .. } => "mcpServers.signIn",
            Op::McpServersSignOut { .. } => "mcpServers.signOut",
            Op::SettingsDefaults { .. } => "settings.defaults",
            Op::SiteRuleRevoke { .. } => "siteRule.revoke",
        }
    }
}

/// Every op type, as `Op::op_type` names it.
pub const OP_TYPES: [&str; 27] = [
    "initialize",
    "thread.create",
    "thread.fork",
    "thread.selectBranch",
    "thread.delete",
    "thread.rename",
    "thread.history",
    "attachment.get",
    "turn.submit",
    "turn.steer",
    "turn.enqueue",
    "turn.interrupt",
    "queue.remove",
    "queue.update",
    "run.resume",
    "run.resolveUncertain",
    "approval.response",
    "interaction.response",
    "elicitation.response",
    "provider.test",
    "siteRules.list",
    "siteRule.revoke",
    "mcpServers.list",
    "mcpServers.refresh",
    "mcpServers.signIn",
    "mcpServers.signOut",
    "settings.defaults",
];

/// The ops that write nothing to the store (reads, and what only the
/// driver does: asking MCP servers again, signing in to one or out): they
/// keep no receipt, so a retry runs again (every other ACKed op replays
/// its first answer).
pub const READ_OP_TYPES: [&str; 10] = [
    "initialize",
    "thread.history",
    "attachment.get",
    "provider.test",
    "siteRules.list",
    "mcpServers.list",
    "mcpServers.refresh",
    "mcpServers.signIn",
    "mcpServers.signOut",
    "settings.defaults",
];

/// A message's `type` and its other fields: what every hand-written decoder
/// here starts with. `what` names the expected value in the error.
fn tagged_object(
    value: serde_json::Value,
    what: &str,
) -> Result<(String, serde_json::Map<String, serde_json::Value>), String> {
    let serde_json::Value::Object(mut map) = value else {
        return Err(format!("invalid type: {value}, expected {what}"));
    };
    match map.remove("type") {
        Some(serde_json::Value::String(t)) => Ok((t, map)),
        Some(other) => Err(format!(
            "field `type`: invalid type: {other}, expected a string"
        )),
        None => Err("missing field `type`".into()),
    }
}

/// The fields of a message (an op, a page message), taken one by one.
struct MessageFields(serde_json::Map<String, serde_json::Value>);

impl MessageFields {
    #[inline(never)]
    fn req<T: serde::de::DeserializeOwned>(&mut self, key: &'static str) -> Result<T, String> {
        let value = self
            .0
            .remove(key)
            .ok_or_else(|| format!("missing field `{key}`"))?;
        serde_json::from_value(value).map_err(|e| format!("field `{key}`: {e}"))
    }

    /// Absent and null are both None.
    #[inline(never)]
    fn opt<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &'static str,
    ) -> Result<Option<T>, String> {
        match self.0.remove(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value)
                .map(Some)
                .map_err(|e| format!("field `{key}`: {e}")),
        }
    }
}

impl Op {
    /// Decode a client message: an object with a `type` of [`OP_TYPES`],
    /// `clientId`, `submissionId` and the type's camelCase fields (others
    /// are ignored), exactly what the derived `Serialize` writes.
    ///
    /// Written by hand rather than derived: serde's internally tagged enum
    /// with a flattened `submission` buffers the message twice through its
    /// generic `Content` tree, and compiling and running that code is ~5 ms
    /// of a panel's first `initialize` after a cold start (measured with
    /// `scripts/bench-cold-ab.mjs`); this decodes each field once.
    pub fn from_value(value: serde_json::Value) -> Result<Op, String> {
        let (mut op_type, map) = tagged_object(value, "an op object")?;
        if op_type == "queue.edit" {
            // The name this op had before it took the one DESIGN.md §4b
            // gives it; a panel of an older build still sends it.
            op_type = "queue.update".into();
        }
        if !OP_TYPES.contains(&op_type.as_str()) {
            return Err(format!(
                "unknown variant `{op_type}`, expected one of {}",
                OP_TYPES.map(|t| format!("`{t}`")).join(", ")
            ));
        }
        let mut f = MessageFields(map);
        let submission = Submission {
            client_id: f.req("clientId")?,
            submission_id: f.req("submissionId")?,
        };
        Ok(match op_type.as_str() {
            "initialize" => Op::Initialize {
                submission,
                thread_id: f.opt("threadId")?,
            },
            "thread.create" => Op::ThreadCreate { submission },
            "thread.fork" => Op::ThreadFork {
                submission,
                thread_id: f.req("threadId")?,
                node_id: f.opt("nodeId")?,
            },
            "thread.selectBranch" => Op::ThreadSelectBranch {
                submission,
                thread_id: f.req("threadId")?,
                node_id: f.req("nodeId")?,
            },
            "thread.delete" => Op::ThreadDelete {
                submission,
                thread_id: f.req("threadId")?,
                stop_turn: f.opt("stopTurn")?.unwrap_or(false),
            },
            "thread.rename" => Op::ThreadRename {
                submission,
                thread_id: f.req("threadId")?,
                title: f.req("title")?,
            },
            "thread.history" => Op::ThreadHistory {
                submission,
                thread_id: f.req("threadId")?,
                before_node_id: f.req("beforeNodeId")?,
                limit: f.opt("limit")?,
            },
            "attachment.get" => Op::AttachmentGet {
                submission,
                thread_id: f.req("threadId")?,
                owner_id: f.req("ownerId")?,
                index: f.req("index")?,
            },
            "turn.submit" => Op::TurnSubmit {
                submission,
                thread_id: f.opt("threadId")?,
                input: f.req("input")?,
                replaces: f.opt("replaces")?,
            },
            "turn.steer" => Op::TurnSteer {
                submission,
                thread_id: f.req("threadId")?,
                expected_turn_id: f.req("expectedTurnId")?,
                input: f.req("input")?,
            },
            "turn.enqueue" => Op::TurnEnqueue {
                submission,
                thread_id: f.req("threadId")?,
                input: f.req("input")?,
            },
            "turn.interrupt" => Op::TurnInterrupt {
                submission,
                thread_id: f.req("threadId")?,
            },
            "queue.remove" => Op::QueueRemove {
                submission,
                thread_id: f.req("threadId")?,
                item_id: f.req("itemId")?,
            },
            "queue.update" => Op::QueueUpdate {
                submission,
                thread_id: f.req("threadId")?,
                item_id: f.req("itemId")?,
                input: f.req("input")?,
            },
            "run.resume" => Op::RunResume {
                submission,
                thread_id: f.req("threadId")?,
                input: f.opt("input")?,
            },
            "run.resolveUncertain" => Op::RunResolveUncertain {
                submission,
                thread_id: f.req("threadId")?,
                choice: f.req("choice")?,
            },
            "approval.response" => Op::ApprovalResponse {
                submission,
                thread_id: f.req("threadId")?,
                approval_id: f.req("approvalId")?,
                decision: f.req("decision")?,
            },
            "interaction.response" => Op::InteractionResponse {
                submission,
                thread_id: f.req("threadId")?,
                interaction_id: f.req("interactionId")?,
                answer: f.req("answer")?,
            },
            "elicitation.response" => Op::ElicitationResponse {
                submission,
                thread_id: f.req("threadId")?,
                interaction_id: f.req("interactionId")?,
                action: f.req("action")?,
                content: f.opt("content")?,
            },
            "provider.test" => Op::ProviderTest {
                submission,
                profile: f.req("profile")?,
            },
            "siteRules.list" => Op::SiteRulesList { submission },
            "mcpServers.list" => Op::McpServersList { submission },
            "mcpServers.refresh" => Op::McpServersRefresh {
                submission,
                name: f.opt("name")?,
            },
            "mcpServers.signIn" => Op::McpServersSignIn {
                submission,
                name: f.req("name")?,
            },
            "mcpServers.signOut" => Op::McpServersSignOut {
                submission,
                name: f.req("name")?,
            },
            "settings.defaults" => Op::SettingsDefaults { submission },
            "siteRule.revoke" => Op::SiteRuleRevoke {
                submission,
                origin: f.req("origin")?,
            },
            other => return Err(format!("unknown variant `{other}`")),
        })
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Op, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Op::from_value(value).map_err(serde::de::Error::custom)
    }
}

/// Kinds of errors that cross the wire. The UI maps each to plain words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The message could not be decoded as an op.
    InvalidOp,
    /// The op is well-formed but not allowed now (bad ids, wrong state).
    InvalidCommand,
    /// The sender may not issue ops (a content script, a web page).
    Forbidden,
    /// No such thread / item.
    NotFound,
    /// The queue already holds its maximum number of turns.
    QueueFull,
    /// No provider is configured.
    NotConfigured,
    /// A started run cannot resume: its environment (tools, prompt,
    /// transport) changed since it started.
    EnvironmentDrift,
    /// The run environment exceeds a size limit.
    EnvironmentTooLarge,
    /// The provider rejected the API key.
    Auth,
    /// The provider does not know the model.
    ModelNotFound,
    /// The request was larger than the model's context window.
    ContextOverflow,
    /// The provider is rate limiting.
    RateLimited,
    /// The provider account has no credit or quota left (not retried).
    QuotaExceeded,
    /// The provider is overloaded or failing (5xx, 529).
    ProviderUnavailable,
    /// The provider sent something we cannot parse.
    ProviderProtocol,
    /// The network failed.
    Network,
    /// The local store failed.
    Storage,
    /// A tool failed in a way that ends the run.
    Tool,
    /// An internal invariant failed.
    Internal,
}

/// A serializable error: what happened, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorInfo {
    pub kind: ErrorKind,
    pub message: String,
}

impl ErrorInfo {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorInfo {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

/// Kind of a streaming item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    AssistantMessage,
    ToolCall,
}

/// One increment of a streaming item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delta {
    pub kind: DeltaKind,
    pub text: String,
}

/// What a delta adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeltaKind {
    Text,
    Reasoning,
    ToolProgress,
}

/// The thread a client sees after `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadView {
    pub id: String,
    pub title: String,
    /// The tail of the active path, root side first: its last
    /// `EngineConfig::snapshot_nodes` nodes, cut where no tool call is
    /// separated from its result.
    pub nodes: Vec<Node>,
    /// How many nodes of the active path come before `nodes[0]`
    /// (`thread.history` pages them in).
    #[serde(default)]
    pub older_nodes: u64,
    /// The latest run of the thread, if any.
    pub run: Option<Run>,
    pub queue: Vec<QueueItem>,
    pub pending_steers: Vec<PendingSteerView>,
    /// The approval the run waits for, re-presented after a restart.
    #[serde(default)]
    pub pending_approval: Option<ApprovalRecord>,
    /// The question the run waits for, re-presented after a restart.
    #[serde(default)]
    pub pending_interaction: Option<InteractionRecord>,
    /// Where the active path meets other branches of this thread, root first.
    #[serde(default)]
    pub branches: Vec<BranchPoint>,
}

/// A place where the conversation has alternatives: `nodeIds` are siblings
/// (same parent, oldest first) and `active` indexes the one on the active path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BranchPoint {
    pub node_ids: Vec<String>,
    pub active: usize,
}

/// A steer that is durable but not yet part of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingSteerView {
    pub id: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::model::Attachment>,
}

/// Everything a (re)connecting client needs to render.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub protocol_version: u32,
    pub threads: Vec<ThreadSummary>,
    pub thread: Option<ThreadView>,
}

/// Token usage totals reported with `token.usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    pub input: u64,
    pub output: u64,
}

/// An engine event. `seq` and `epoch` are added by [`EventEnvelope`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
#[non_exhaustive]
pub enum Event {
    #[serde(rename = "initialized")]
    Initialized { snapshot: Box<Snapshot> },
    #[serde(rename = "command.ack")]
    CommandAck {
        submission_id: String,
        op_type: String,
        result: serde_json::Value,
    },
    #[serde(rename = "command.reject")]
    CommandReject {
        submission_id: String,
        op_type: String,
        error: ErrorInfo,
    },
    #[serde(rename = "threads.updated")]
    ThreadsUpdated { threads: Vec<ThreadSummary> },
    /// The sites where write tools run without asking, by origin, sent to
    /// every extension page once a change of them is saved (a rule made by
    /// `acceptForSite`, one removed by `siteRule.revoke`).
    #[serde(rename = "siteRules.updated")]
    SiteRulesUpdated { rules: Vec<SiteRuleSummary> },
    /// The MCP servers as `mcpServers.list` answers, sent to every
    /// extension page when one's state changes (its tools listed, asking
    /// failed).
    #[serde(rename = "mcpServers.updated")]
    McpServersUpdated { servers: Vec<McpServerSummary> },
    #[serde(rename = "turn.start")]
    TurnStart { thread_id: String, turn_id: String },
    #[serde(rename = "item.start")]
    ItemStart {
        thread_id: String,
        turn_id: String,
        item_id: String,
        kind: ItemKind,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        label: Option<String>,
    },
    #[serde(rename = "item.delta")]
    ItemDelta {
        thread_id: String,
        turn_id: String,
        item_id: String,
        delta: Delta,
    },
    #[serde(rename = "item.complete")]
    ItemComplete {
        thread_id: String,
        turn_id: String,
        node: Node,
    },
    #[serde(rename = "token.usage")]
    TokenUsage {
        thread_id: String,
        turn_id: String,
        usage: Usage,
        turn_total: UsageTotals,
        thread_total: UsageTotals,
    },
    #[serde(rename = "queue.updated")]
    QueueUpdated {
        thread_id: String,
        queue: Vec<QueueItem>,
    },
    /// A provider request failed with a retryable error before any text was
    /// shown; it is sent again after `delayMs`, at `retryAt` (ms since the
    /// epoch by the worker's clock, which is the browser's: a panel that
    /// gets the event late still counts down to the right moment).
    #[serde(rename = "run.retry")]
    RunRetry {
        thread_id: String,
        turn_id: String,
        attempt: u32,
        max_attempts: u32,
        delay_ms: u64,
        retry_at: u64,
        error: ErrorInfo,
    },
    /// The run waits for the user to approve a tool call.
    #[serde(rename = "approval.request")]
    ApprovalRequest {
        thread_id: String,
        turn_id: String,
        approval: ApprovalRecord,
    },
    /// An approval was decided (or cancelled) durably.
    #[serde(rename = "approval.resolved")]
    ApprovalResolved {
        thread_id: String,
        turn_id: String,
        approval_id: String,
        status: ApprovalStatus,
    },
    /// The model asks the user a question; the run waits.
    #[serde(rename = "interaction.request")]
    InteractionRequest {
        thread_id: String,
        turn_id: String,
        interaction: InteractionRecord,
    },
    /// A question was answered (or withdrawn) durably.
    #[serde(rename = "interaction.resolved")]
    InteractionResolved {
        thread_id: String,
        turn_id: String,
        interaction_id: String,
        status: InteractionStatus,
        /// How the user answered an MCP server's request for input.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        action: Option<ElicitationAction>,
    },
    #[serde(rename = "run.status")]
    RunStatus {
        thread_id: String,
        turn_id: String,
        state: crate::model::RunState,
    },
    #[serde(rename = "turn.complete")]
    TurnComplete {
        thread_id: String,
        turn_id: String,
        stop_reason: StopReason,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<ErrorInfo>,
    },
}

impl Event {
    /// The thread an event belongs to, if it is thread-scoped.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            Event::TurnStart { thread_id, .. }
            | Event::ItemStart { thread_id, .. }
            | Event::ItemDelta { thread_id, .. }
            | Event::ItemComplete { thread_id, .. }
            | Event::TokenUsage { thread_id, .. }
            | Event::QueueUpdated { thread_id, .. }
            | Event::RunStatus { thread_id, .. }
            | Event::RunRetry { thread_id, .. }
            | Event::ApprovalRequest { thread_id, .. }
            | Event::ApprovalResolved { thread_id, .. }
            | Event::InteractionRequest { thread_id, .. }
            | Event::InteractionResolved { thread_id, .. }
            | Event::TurnComplete { thread_id, .. } => Some(thread_id),
            _ => None,
        }
    }
}

/// An event as sent on the wire: the event plus ordering metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope {
    /// Increases by one per event of this engine instance, from 1; 0 is
    /// the `initialized` that sw.js sent from the snapshot cache before the
    /// engine started (`engine/snapshot_cache.rs`).
    pub seq: u64,
    /// Random per engine instance; a new epoch means the SW restarted.
    pub epoch: String,
    #[serde(flatten)]
    pub event: Event,
}

/// Engine → content script (page channel). Never carries a client op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
pub enum PageRequest {
    #[serde(rename = "tool.execute")]
    ToolExecute {
        call_id: String,
        name: String,
        params: serde_json::Value,
        /// Chrome's id of the frame the script runs in (0: the tab's top
        /// document). In a child frame refs carry it (`f7:e12`).
        #[serde(default)]
        frame_id: u32,
        /// A write through a ref (or by text) acts only on this element
        /// (the same ref, role and name, letter case aside): the one the
        /// user approved, or the page described when the call was
        /// resolved. The content script refuses otherwise, nothing done.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<crate::model::TargetElement>,
    },
}

/// Content script → engine (page channel).
// Decoded by hand (`PageMessage::from_value`), see there.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
pub enum PageMessage {
    #[serde(rename = "tool.progress")]
    ToolProgress { call_id: String, text: String },
    #[serde(rename = "tool.result")]
    ToolResult {
        call_id: String,
        ok: bool,
        content: String,
        #[serde(default)]
        details: Option<serde_json::Value>,
    },
}

/// The `type`s of [`PageMessage`], as on the wire.
pub const PAGE_MESSAGE_TYPES: [&str; 2] = ["tool.progress", "tool.result"];

impl PageMessage {
    /// Decode a content script's message: an object with a `type` of
    /// [`PAGE_MESSAGE_TYPES`] and that type's camelCase fields (others are
    /// ignored), exactly what the derived `Serialize` writes.
    ///
    /// Written by hand, like [`Op::from_value`]: serde's internally tagged
    /// enum buffers the message through its generic `Content` tree, and this
    /// type was the module's last user of that code (68 functions, 14 KB;
    /// BENCHMARKS.md item 22).
    pub fn from_value(value: serde_json::Value) -> Result<PageMessage, String> {
        let (message_type, map) = tagged_object(value, "a page message object")?;
        let mut f = MessageFields(map);
        match message_type.as_str() {
            "tool.progress" => Ok(PageMessage::ToolProgress {
                call_id: f.req("callId")?,
                text: f.req("text")?,
            }),
            "tool.result" => Ok(PageMessage::ToolResult {
                call_id: f.req("callId")?,
                ok: f.req("ok")?,
                content: f.req("content")?,
                details: f.opt("details")?,
            }),
            other => Err(format!(
                "unknown variant `{other}`, expected one of {}",
                PAGE_MESSAGE_TYPES.map(|t| format!("`{t}`")).join(", ")
            )),
        }
    }
}

impl<'de> Deserialize<'de> for PageMessage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<PageMessage, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        PageMessage::from_value(value).map_err(serde::de::Error::custom)
    }
}

/// Who sent a message on the panel channel, as classified from the Port's sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// An extension page of this extension (side panel, options): may issue ops.
    ExtensionPage,
    /// Code in the worker itself (`Engine.connectClient`: a context-menu
    /// command, a keyboard shortcut): may issue ops like a page, but does
    /// not keep the worker awake (it dies with the worker).
    Worker,
    /// A content script or any web page: may never issue ops.
    Untrusted,
}

impl ClientKind {
    /// May send ops and receive a thread's events.
    pub fn trusted(self) -> bool {
        matches!(self, ClientKind::ExtensionPage | ClientKind::Worker)
    }
}

/// Classify a Port sender. `own_origin` is `chrome-extension://<id>`.
///
/// A sender is trusted only if it has no tab context... unless it is an
/// extension page opened as a tab, which has a tab but whose URL is ours.
/// Content scripts report the *page's* URL, so the URL check is what matters.
pub fn classify_sender(
    own_origin: &str,
    sender_url: Option<&str>,
    sender_origin: Option<&str>,
) -> ClientKind {
    let Some(url) = sender_url else {
        return ClientKind::Untrusted;
    };
    let prefix = format!("{}/", own_origin.trim_end_matches('/'));
    let url_ok = url.starts_with(&prefix);
    // When Chrome reports an origin it must agree with the URL.
    let origin_ok =
        sender_origin.is_none_or(|o| o.trim_end_matches('/') == own_origin.trim_end_matches('/'));
    if url_ok && origin_ok && !own_origin.is_empty() {
        ClientKind::ExtensionPage
    } else {
        ClientKind::Untrusted
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sub() -> Submission {
        Submission {
            client_id: "c".into(),
            submission_id: "s".into(),
        }
    }

    fn input(text: &str) -> UserInput {
        UserInput::text(text)
    }

    /// One op of every type (with its optional fields set and unset).
    fn every_op() -> Vec<Op> {
        let submission = sub;
        let t = || "t1".to_string();
        vec![
            Op::Initialize {
                submission: submission(),
                thread_id: None,
            },
            Op::Initialize {
                submission: submission(),
                thread_id: Some(t()),
            },
            Op::ThreadCreate {
                submission: submission(),
            },
            Op::ThreadFork {
                submission: submission(),
                thread_id: t(),
                node_id: None,
            },
            Op::ThreadFork {
                submission: submission(),
                thread_id: t(),
                node_id: Some("n".into()),
            },
            Op::ThreadSelectBranch {
                submission: submission(),
                thread_id: t(),
                node_id: "n".into(),
            },
            Op::ThreadDelete {
                submission: submission(),
                thread_id: t(),
                stop_turn: false,
            },
            Op::ThreadDelete {
                submission: submission(),
                thread_id: t(),
                stop_turn: true,
            },
            Op::ThreadHistory {
                submission: submission(),
                thread_id: t(),
                before_node_id: "n".into(),
                limit: Some(5),
            },
            Op::ThreadHistory {
                submission: submission(),
                thread_id: t(),
                before_node_id: "n".into(),
                limit: None,
            },
            Op::AttachmentGet {
                submission: submission(),
                thread_id: t(),
                owner_id: "n".into(),
                index: 1,
            },
            Op::TurnSubmit {
                submission: submission(),
                thread_id: None,
                input: input("hi"),
                replaces: None,
            },
            Op::TurnSubmit {
                submission: submission(),
                thread_id: Some(t()),
                input: input("hi"),
                replaces: Some("n".into()),
            },
            Op::TurnSteer {
                submission: submission(),
                thread_id: t(),
                expected_turn_id: "u".into(),
                input: input("also"),
            },
            Op::TurnEnqueue {
                submission: submission(),
                thread_id: t(),
                input: input("next"),
            },
            Op::TurnInterrupt {
                submission: submission(),
                thread_id: t(),
            },
            Op::QueueRemove {
                submission: submission(),
                thread_id: t(),
                item_id: "q".into(),
            },
            Op::QueueUpdate {
                submission: submission(),
                thread_id: t(),
                item_id: "q".into(),
                input: input("edited"),
            },
            Op::RunResume {
                submission: submission(),
                thread_id: t(),
                input: None,
            },
            Op::RunResume {
                submission: submission(),
                thread_id: t(),
                input: Some(input("go on")),
            },
            Op::RunResolveUncertain {
                submission: submission(),
                thread_id: t(),
                choice: UncertainChoice::MarkDone,
            },
            Op::ApprovalResponse {
                submission: submission(),
                thread_id: t(),
                approval_id: "a".into(),
                decision: ApprovalDecision::AcceptForSite,
            },
            Op::InteractionResponse {
                submission: submission(),
                thread_id: t(),
                interaction_id: "i".into(),
                answer: "yes".into(),
            },
            Op::ElicitationResponse {
                submission: submission(),
                thread_id: t(),
                interaction_id: "i".into(),
                action: crate::model::ElicitationAction::Accept,
                content: Some(serde_json::json!({ "seats": 4 })),
            },
            Op::ElicitationResponse {
                submission: submission(),
                thread_id: t(),
                interaction_id: "i".into(),
                action: crate::model::ElicitationAction::Decline,
                content: None,
            },
            Op::ProviderTest {
                submission: submission(),
                profile: crate::model::ProviderProfile {
                    kind: "anthropic".into(),
                    model: "m".into(),
                    ..Default::default()
                },
            },
            Op::ThreadRename {
                submission: submission(),
                thread_id: t(),
                title: "Groceries".into(),
            },
            Op::SiteRulesList {
                submission: submission(),
            },
            Op::McpServersList {
                submission: submission(),
            },
            Op::McpServersRefresh {
                submission: submission(),
                name: Some("docs".into()),
            },
            Op::McpServersRefresh {
                submission: submission(),
                name: None,
            },
            Op::McpServersSignIn {
                submission: submission(),
                name: "docs".into(),
            },
            Op::McpServersSignOut {
                submission: submission(),
                name: "docs".into(),
            },
            Op::SiteRuleRevoke {
                submission: submission(),
                origin: "https://shop.example".into(),
            },
            Op::SettingsDefaults {
                submission: submission(),
            },
        ]
    }

    #[test]
    fn every_op_type_decodes_what_serialize_writes() {
        let ops = every_op();
        let mut types: Vec<&str> = ops.iter().map(Op::op_type).collect();
        types.dedup();
        let mut listed = OP_TYPES.to_vec();
        crate::sorting::sort(&mut listed);
        crate::sorting::sort(&mut types);
        types.dedup();
        assert_eq!(types, listed, "every op type is listed and sampled");
        for op in ops {
            let value = serde_json::to_value(&op).unwrap();
            assert_eq!(Op::from_value(value.clone()).as_ref(), Ok(&op), "{value}");
            assert_eq!(serde_json::from_value::<Op>(value).unwrap(), op);
        }
    }

    #[test]
    fn op_fields_null_absent_and_extra_are_read_like_serde_does() {
        let base = json!({"type": "turn.submit", "clientId": "c", "submissionId": "s", "input": {"text": "x"}});
        let mut with = base.clone();
        with["threadId"] = json!(null);
        with["replaces"] = json!(null);
        with["somethingNew"] = json!([1, 2]);
        let expected = Op::TurnSubmit {
            submission: sub(),
            thread_id: None,
            input: input("x"),
            replaces: None,
        };
        assert_eq!(Op::from_value(base), Ok(expected.clone()));
        assert_eq!(Op::from_value(with), Ok(expected));
    }

    #[test]
    fn malformed_ops_are_refused_with_the_field_named() {
        let refused = |value: serde_json::Value| Op::from_value(value).unwrap_err();
        assert_eq!(refused(json!({"clientId": "c"})), "missing field `type`");
        assert!(refused(json!("initialize")).contains("expected an op object"));
        assert!(refused(json!({"type": 7})).contains("field `type`"));
        let unknown =
            refused(json!({"type": "turn.explode", "clientId": "c", "submissionId": "s"}));
        assert!(
            unknown.starts_with("unknown variant `turn.explode`, expected one of `initialize`"),
            "{unknown}"
        );
        assert_eq!(
            refused(json!({"type": "initialize", "clientId": "c"})),
            "missing field `submissionId`"
        );
        assert_eq!(
            refused(
                json!({"type": "turn.steer", "clientId": "c", "submissionId": "s", "threadId": "t", "input": {"text": "x"}})
            ),
            "missing field `expectedTurnId`"
        );
        let wrong = refused(
            json!({"type": "thread.delete", "clientId": "c", "submissionId": "s", "threadId": 12}),
        );
        assert!(
            wrong.starts_with("field `threadId`: invalid type: integer `12`, expected a string"),
            "{wrong}"
        );
        let decision = refused(
            json!({"type": "approval.response", "clientId": "c", "submissionId": "s",
            "threadId": "t", "approvalId": "a", "decision": "maybe"}),
        );
        assert!(
            decision.starts_with("field `decision`: unknown variant `maybe`"),
            "{decision}"
        );
        // Through serde too (the error is the same text).
        let via_serde = serde_json::from_value::<Op>(json!({"type": "initialize"})).unwrap_err();
        assert_eq!(via_serde.to_string(), "missing field `clientId`");
    }
}
