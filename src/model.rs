//! Durable data model: threads, the append-only node tree, runs, pending
//! steers, queued turns and command receipts.
//!
//! Owns: the record shapes persisted in the store and sent in snapshots, and
//! small pure helpers over them (rebuilding the active path).
//!
//! Must not: do IO, read clocks, know the loop.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::protocol::ErrorInfo;

mod records;
pub use records::FromRecord;

/// Store schema version; bump with a migration when a record shape changes.
pub const SCHEMA_VERSION: u32 = 1;

/// Maximum number of queued turns per thread.
pub const MAX_QUEUE: usize = 8;

/// A conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    pub id: String,
    pub title: String,
    /// Last node of the active path (None for an empty thread).
    pub leaf_id: Option<String>,
    pub created_at: u64,
    pub updated_at: u64,
    /// Increases with every write that changes the thread record.
    pub revision: u64,
    /// Thread this one was forked from.
    #[serde(default)]
    pub parent_thread_id: Option<String>,
    /// Accumulated token usage of all runs.
    #[serde(default)]
    pub usage: Usage,
    /// Number of nodes on the active path (root to leaf), stamped by the
    /// engine on every write of the record. Lets a cold start show the tail
    /// of a long thread without reading all of it. None in records written
    /// before it existed: such a thread is read whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_len: Option<u64>,
}

impl Thread {
    pub fn summary(&self) -> ThreadSummary {
        ThreadSummary {
            id: self.id.clone(),
            title: self.title.clone(),
            updated_at: self.updated_at,
        }
    }
}

/// The thread list entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    pub id: String,
    pub title: String,
    pub updated_at: u64,
}

/// Token usage as reported by a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Every prompt token, cached ones included (`cache_read` and
    /// `cache_write` are parts of it): OpenAI's `prompt_tokens`, Anthropic's
    /// `input_tokens` plus its two cache counts (replies recorded before
    /// 2026-12-06 kept Anthropic's uncached count alone).
    pub input: u64,
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
    #[serde(default)]
    pub reasoning: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.reasoning += other.reasoning;
    }
}

/// Why the provider stopped one response, or why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    End,
    /// The model wants tools to run (only for an assistant message).
    ToolUse,
    MaxTokens,
    ContentFilter,
    Interrupted,
    BudgetPause,
    Error,
    /// The failure breaker disabled tools and the model gave its final reply.
    ToolsDisabled,
}

/// Outcome of a tool call as the model and the UI see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Ok,
    Error,
    /// Dispatched, then cut off by an interrupt.
    Interrupted,
    /// Never dispatched (interrupt or failure before it started).
    Aborted,
    /// The user or a policy declined it.
    Denied,
}

impl ToolStatus {
    /// Whether the call was dispatched (it may have taken effect).
    pub fn ran(self) -> bool {
        matches!(
            self,
            ToolStatus::Ok | ToolStatus::Error | ToolStatus::Interrupted
        )
    }
}

/// Severity of a display-only notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeLevel {
    Info,
    Warning,
    Error,
}

/// One node of the append-only conversation tree.
// Serialized flat (`id`, `threadId`, `parentId`, `createdAt`, `kind` and the
// body's fields side by side). Decoding is hand-written (`node_de` below):
// the derived decoder of a flattened, internally tagged enum buffers every
// record twice, which made reading a long thread at cold start slow.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    pub thread_id: String,
    pub parent_id: Option<String>,
    pub created_at: u64,
    #[serde(flatten)]
    pub body: NodeBody,
}

/// What a node holds.
// Decoded only as part of a `Node` (see `node_de`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum NodeBody {
    /// Start of a turn.
    TurnContext {
        turn_id: String,
        model: String,
    },
    UserMessage {
        text: String,
        #[serde(default)]
        steered: bool,
        /// Files the user attached (images, text files), kept with the
        /// message and sent with it on every request.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<Attachment>,
    },
    AssistantMessage {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
        stop_reason: StopReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        /// A prefix kept after an interrupt or an error.
        #[serde(default)]
        interrupted: bool,
        model: String,
        /// Provider-private data (e.g. thinking signatures), replayed only to
        /// the provider that produced it; never shown to the model otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider_private: Option<serde_json::Value>,
    },
    ToolCall {
        call_id: String,
        /// The assistant message that requested this call.
        assistant_id: String,
        name: String,
        label: String,
        arguments: serde_json::Value,
    },
    ToolResult {
        call_id: String,
        name: String,
        status: ToolStatus,
        /// What the model sees.
        content: String,
        /// UI-only details (highlight box, thumbnail); never sent to the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<serde_json::Value>,
        /// Images for the model (a screenshot); replaced by a placeholder
        /// for models without vision.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageData>,
        /// The user's answer when the call asked for approval (UI only,
        /// never sent to the model): the conversation keeps what the user
        /// authorized after the approval record's retention ends.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<ApprovalNote>,
    },
    Notice {
        level: NoticeLevel,
        text: String,
    },
    /// A compaction checkpoint: the model-written summary that replaces
    /// everything before it in the outbound view but the tail it keeps
    /// (`kept_nodes`, sent after the summary); the history itself stays.
    Compaction {
        /// Written by the model.
        summary: String,
        /// How many path nodes the summary stands for.
        compacted_nodes: u64,
        /// Copied by the engine, not the model: the user's messages of the
        /// task in progress that the summary stands for, delimited and
        /// size-bounded (empty in checkpoints written before it existed;
        /// older checkpoints also copied the queued messages here).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        verbatim: String,
        /// How many path nodes right before this checkpoint it does not
        /// summarize: the model's latest message with its tool calls, their
        /// results and the messages after it, sent as they are after the
        /// summary. 0 in checkpoints written before it existed (they
        /// summarize everything before them).
        #[serde(default, skip_serializing_if = "is_zero")]
        kept_nodes: u64,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Node {
    pub fn kind_name(&self) -> &'static str {
        match self.body {
            NodeBody::TurnContext { .. } => "turn_context",
            NodeBody::UserMessage { .. } => "user_message",
            NodeBody::AssistantMessage { .. } => "assistant_message",
            NodeBody::ToolCall { .. } => "tool_call",
            NodeBody::ToolResult { .. } => "tool_result",
            NodeBody::Notice { .. } => "notice",
            NodeBody::Compaction { .. } => "compaction",
        }
    }
}

/// Run states (DESIGN.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Queued,
    StreamingModel,
    ExecutingTools,
    WaitingApproval,
    WaitingInteraction,
    Completed,
    Interrupted,
    Failed,
    BudgetPaused,
    PausedUncertain,
}

impl RunState {
    /// The terminal states, as stored (`state` of a run record), in key
    /// order: a start reads the runs whose state is none of these through
    /// the runs' `state` index (`store::unfinished_run_states`).
    pub const TERMINAL_NAMES: [&'static str; 4] =
        ["budget_paused", "completed", "failed", "interrupted"];

    /// Terminal states never change again (a later `run.resume` starts a new run).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Completed | RunState::Interrupted | RunState::Failed | RunState::BudgetPaused
        )
    }
}

/// The frozen provider settings of a run (never the API key).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderProfile {
    /// `openai` or `anthropic`.
    pub kind: String,
    pub base_url: String,
    pub model: String,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Temperature ×100, kept integral so the profile stays `Eq` and digestible.
    #[serde(default)]
    pub temperature_centi: Option<u32>,
    /// The model accepts images (screenshots are offered and sent).
    #[serde(default)]
    pub vision: bool,
    /// The model can call tools; without it no tool schema is sent.
    #[serde(default = "yes")]
    pub tool_use: bool,
    /// Tokens (input + output) a run may spend before it pauses with
    /// `budget_pause` at the next safe boundary; None: no budget.
    #[serde(default)]
    pub token_budget: Option<u64>,
    /// The model's context window in tokens; when the outbound request is
    /// estimated above 80% of it, or above what leaves room for the answer
    /// (`engine::compaction::compaction_threshold`), the conversation is
    /// compacted first.
    /// None: compaction happens only when the provider reports an overflow.
    #[serde(default)]
    pub context_window: Option<u64>,
}

fn yes() -> bool {
    true
}

impl ProviderProfile {
    pub fn is_configured(&self) -> bool {
        !self.base_url.trim().is_empty() && !self.model.trim().is_empty()
    }
}

/// A tool call that was dispatched and may have had an effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlightTool {
    pub call_id: String,
    pub name: String,
}

/// One turn's execution, persisted with its cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// Also the turn id.
    pub id: String,
    pub thread_id: String,
    pub state: RunState,
    pub created_at: u64,
    pub updated_at: u64,
    pub revision: u64,
    /// Number of provider requests made so far.
    pub step: u32,
    pub profile: ProviderProfile,
    /// Consecutive tool failures (the failure breaker).
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Set when the breaker disabled tools for the final reply.
    #[serde(default)]
    pub tools_disabled: bool,
    /// A never-retry tool that was dispatched and has no result yet.
    #[serde(default)]
    pub in_flight_tool: Option<InFlightTool>,
    /// The approval the run waits for (state `waiting_approval`).
    #[serde(default)]
    pub pending_approval: Option<String>,
    /// The question the run waits for (state `waiting_interaction`).
    #[serde(default)]
    pub pending_interaction: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    #[serde(default)]
    pub error: Option<ErrorInfo>,
    /// Usage of this run so far.
    #[serde(default)]
    pub usage: Usage,
    /// The environment frozen when the run started (None for runs written
    /// before environments existed: they resume without a drift check).
    /// Held in memory with the run but stored once, in its own
    /// [`EnvironmentRecord`], so step checkpoints do not rewrite it; never
    /// serialized with the run (records written before the split still
    /// carry it and are read as before).
    #[serde(default, skip_serializing)]
    pub environment: Option<EnvironmentSnapshot>,
}

impl Run {
    /// A run that starts now: streaming its first request, nothing counted yet.
    pub fn new(
        id: String,
        thread_id: String,
        profile: ProviderProfile,
        environment: Option<EnvironmentSnapshot>,
        now: u64,
    ) -> Run {
        Run {
            id,
            thread_id,
            state: RunState::StreamingModel,
            created_at: now,
            updated_at: now,
            revision: 1,
            step: 0,
            profile,
            consecutive_failures: 0,
            tools_disabled: false,
            in_flight_tool: None,
            pending_approval: None,
            pending_interaction: None,
            stop_reason: None,
            error: None,
            usage: Usage::default(),
            environment,
        }
    }
}

/// A run's frozen environment as stored: written once, with the checkpoint
/// that starts the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentRecord {
    pub run_id: String,
    pub thread_id: String,
    pub environment: EnvironmentSnapshot,
}

/// Version of [`EnvironmentSnapshot`]'s shape.
pub const ENVIRONMENT_VERSION: u32 = 1;

/// One tool of a run's catalog: what the model was offered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    pub name: String,
    /// SHA-256 over schema, security metadata and binding.
    pub digest: String,
}

/// What a started run must find again to resume: the full system prompt,
/// the provider transport and credential reference shape (never the secret),
/// and the tool catalog with digests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSnapshot {
    pub version: u32,
    pub system_prompt: String,
    /// `openai` or `anthropic`.
    pub transport: String,
    /// Where the credential comes from, e.g. `chrome.storage.local:settings.apiKey`.
    pub credential_ref: String,
    pub tools: Vec<CatalogEntry>,
}

/// User input of a turn, a steer or a queued turn: what the user typed and
/// the files attached to it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInput {
    /// The text the user typed.
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// At most this many files go with one message.
pub const MAX_ATTACHMENTS: usize = 4;
/// The most base64 characters of one attached image (1 MiB, about 750 KB
/// of image). The side panel scales and compresses images below it.
pub const MAX_ATTACHMENT_IMAGE_CHARS: usize = 1024 * 1024;
/// The most characters of one attached text file (about 50,000 tokens).
pub const MAX_ATTACHMENT_TEXT_CHARS: usize = 200_000;
/// The most base64 characters of one attached PDF (4 MiB, about 3 MB).
pub const MAX_ATTACHMENT_PDF_CHARS: usize = 4 * 1024 * 1024;
/// The most characters of all the files of one message together (6 MiB).
pub const MAX_ATTACHMENTS_CHARS: usize = 6 * 1024 * 1024;
/// The most characters of an attachment's file name.
pub const MAX_ATTACHMENT_NAME_CHARS: usize = 200;
/// The image types both providers take.
pub const ATTACHMENT_IMAGE_TYPES: [&str; 4] =
    ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// A file attached to a user message (spec 000 §3, 004 §2.1). It lives in
/// the message's node (and in the steer or queued turn before that), so it
/// is written in the same transaction as the message it belongs to.
///
/// Images and PDFs reach vision models as image and document blocks (both
/// providers read PDFs through their vision models); other models get a
/// placeholder, decided per request (a later switch to a vision model sees
/// them again). Text files reach the model as a delimited block after the
/// message's text.
// Read through `RawAttachment`: a flat struct costs far less code in the
// module than serde's internally tagged enum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase",
    try_from = "RawAttachment"
)]
pub enum Attachment {
    Image {
        name: String,
        /// One of [`ATTACHMENT_IMAGE_TYPES`].
        media_type: String,
        /// Base64 without the `data:` prefix.
        data: String,
    },
    Text {
        name: String,
        /// As the file said (`text/plain`, `text/csv`, `application/json`…).
        media_type: String,
        text: String,
    },
    Pdf {
        name: String,
        /// `application/pdf`.
        media_type: String,
        /// Base64 without the `data:` prefix.
        data: String,
    },
    /// A file as a client is shown it without its content
    /// ([`Attachment::omitted`]): what it is and how large. `attachment.get`
    /// fetches the file itself. Only views carry one: the engine takes
    /// none in an input (the file itself must be sent) and stores none.
    Omitted {
        name: String,
        media_type: String,
        /// The kind of the file left out.
        of: FileKind,
        /// Its size as [`Attachment::size`] counts it.
        size: u64,
    },
}

/// The kinds of file a message can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    Image,
    Text,
    Pdf,
}

/// An attached PDF as the model receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentData {
    pub name: String,
    /// Base64 of the PDF.
    pub data: String,
}

/// An attachment as read, before its kind's fields are checked.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAttachment {
    kind: AttachmentKind,
    name: String,
    media_type: String,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    of: Option<FileKind>,
    #[serde(default)]
    size: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum AttachmentKind {
    Image,
    Text,
    Pdf,
    Omitted,
}

impl TryFrom<RawAttachment> for Attachment {
    type Error = &'static str;

    fn try_from(raw: RawAttachment) -> Result<Self, Self::Error> {
        let RawAttachment {
            kind,
            name,
            media_type,
            data,
            text,
            of,
            size,
        } = raw;
        Ok(match kind {
            AttachmentKind::Image => Attachment::Image {
                name,
                media_type,
                data: data.ok_or("missing field `data`")?,
            },
            AttachmentKind::Text => Attachment::Text {
                name,
                media_type,
                text: text.ok_or("missing field `text`")?,
            },
            AttachmentKind::Pdf => Attachment::Pdf {
                name,
                media_type,
                data: data.ok_or("missing field `data`")?,
            },
            AttachmentKind::Omitted => Attachment::Omitted {
                name,
                media_type,
                of: of.ok_or("missing field `of`")?,
                size: size.ok_or("missing field `size`")?,
            },
        })
    }
}

impl Attachment {
    pub fn name(&self) -> &str {
        match self {
            Attachment::Image { name, .. }
            | Attachment::Text { name, .. }
            | Attachment::Pdf { name, .. }
            | Attachment::Omitted { name, .. } => name,
        }
    }

    /// How many characters it holds (what the per-message bound counts).
    pub fn size(&self) -> usize {
        match self {
            Attachment::Image { data, .. } | Attachment::Pdf { data, .. } => data.len(),
            Attachment::Text { text, .. } => text.len(),
            Attachment::Omitted { size, .. } => *size as usize,
        }
    }

    /// The kind of file it is (of the one left out, for an omitted one).
    pub fn file_kind(&self) -> FileKind {
        match self {
            Attachment::Image { .. } => FileKind::Image,
            Attachment::Text { .. } => FileKind::Text,
            Attachment::Pdf { .. } => FileKind::Pdf,
            Attachment::Omitted { of, .. } => *of,
        }
    }

    /// The same file without its content, as views show it beyond their
    /// budget (`engine::views`).
    pub fn omitted(&self) -> Attachment {
        match self {
            Attachment::Image {
                name, media_type, ..
            }
            | Attachment::Text {
                name, media_type, ..
            }
            | Attachment::Pdf {
                name, media_type, ..
            }
            | Attachment::Omitted {
                name, media_type, ..
            } => Attachment::Omitted {
                name: name.clone(),
                media_type: media_type.clone(),
                of: self.file_kind(),
                size: self.size() as u64,
            },
        }
    }

    /// Why the engine does not take it, if it does not.
    pub fn problem(&self) -> Option<String> {
        let name = self.name();
        if name.trim().is_empty() {
            return Some("An attachment has no file name.".into());
        }
        if name.chars().count() > MAX_ATTACHMENT_NAME_CHARS || name.chars().any(char::is_control) {
            return Some(format!(
                "An attachment's file name is longer than {MAX_ATTACHMENT_NAME_CHARS} characters or holds control characters."
            ));
        }
        match self {
            Attachment::Image {
                media_type, data, ..
            } => {
                if !ATTACHMENT_IMAGE_TYPES.contains(&media_type.as_str()) {
                    return Some(format!(
                        "{name}: images must be PNG, JPEG, GIF or WebP (this one is {media_type:?})."
                    ));
                }
                if let Some(problem) = too_large(name, "image", data, MAX_ATTACHMENT_IMAGE_CHARS) {
                    return Some(problem);
                }
                if !is_base64(data) {
                    return Some(format!("{name}: the image data is not base64."));
                }
                None
            }
            Attachment::Pdf {
                media_type, data, ..
            } => {
                if media_type != "application/pdf" {
                    return Some(format!(
                        "{name}: a PDF's media type is application/pdf (this one is {media_type:?})."
                    ));
                }
                if let Some(problem) = too_large(name, "PDF", data, MAX_ATTACHMENT_PDF_CHARS) {
                    return Some(problem);
                }
                // Every PDF starts with `%PDF-`, which is `JVBERi0` in base64.
                if !is_base64(data) || !data.starts_with("JVBERi0") {
                    return Some(format!("{name}: the data is not a PDF in base64."));
                }
                None
            }
            Attachment::Text {
                media_type, text, ..
            } => {
                if media_type.len() > 100 || media_type.chars().any(char::is_control) {
                    return Some(format!("{name}: the file type is not a media type."));
                }
                let chars = text.chars().count();
                (chars > MAX_ATTACHMENT_TEXT_CHARS).then(|| {
                    format!(
                        "{name}: the file holds {chars} characters; at most {MAX_ATTACHMENT_TEXT_CHARS} fit in a message."
                    )
                })
            }
            Attachment::Omitted { .. } => Some(format!(
                "{name} was shown without its content; fetch it with attachment.get and send the file itself."
            )),
        }
    }
}

/// Why a file's base64 `data` does not fit in a message, if it does not.
fn too_large(name: &str, what: &str, data: &str, max: usize) -> Option<String> {
    (data.len() > max).then(|| {
        format!(
            "{name}: the {what} is {} KiB of base64; at most {} KiB fit in a message.",
            data.len() / 1024,
            max / 1024
        )
    })
}

/// Whether `data` is standard base64 with its padding.
fn is_base64(data: &str) -> bool {
    let digit = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    !data.is_empty() && data.len() % 4 == 0 && data.bytes().all(digit)
}

impl UserInput {
    pub fn text(text: impl Into<String>) -> UserInput {
        UserInput {
            text: text.into(),
            attachments: Vec::new(),
        }
    }

    /// Why the engine does not take this input, if it does not: empty (no
    /// text and no file), too many files, or a file it cannot send.
    pub fn problem(&self) -> Option<String> {
        if self.text.trim().is_empty() && self.attachments.is_empty() {
            return Some("The message is empty.".into());
        }
        if self.attachments.len() > MAX_ATTACHMENTS {
            return Some(format!(
                "{} files are attached; at most {MAX_ATTACHMENTS} go with one message.",
                self.attachments.len()
            ));
        }
        if let Some(problem) = self.attachments.iter().find_map(Attachment::problem) {
            return Some(problem);
        }
        let total: usize = self.attachments.iter().map(Attachment::size).sum();
        (total > MAX_ATTACHMENTS_CHARS).then(|| {
            format!(
                "The files hold {} KiB together; at most {} KiB go with one message.",
                total / 1024,
                MAX_ATTACHMENTS_CHARS / 1024
            )
        })
    }
}

/// A durable steer waiting for the next provider request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingSteer {
    pub id: String,
    pub thread_id: String,
    pub run_id: String,
    /// Admission order; materialization follows it.
    pub admission_seq: u64,
    pub text: String,
    /// Written in the same transaction as the steer (spec 000 §3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    pub created_at: u64,
}

/// A queued next turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueItem {
    pub id: String,
    pub thread_id: String,
    /// Position key: lower runs first.
    pub position: u64,
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    pub created_at: u64,
}

/// Durable outcome of a command, keyed by client and submission id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// `clientId + "\u{1f}" + submissionId`.
    pub key: String,
    pub op_type: String,
    /// SHA-256 of the canonical payload (transport fields excluded).
    pub fingerprint: String,
    /// The ACK result that was sent.
    pub result: serde_json::Value,
    pub created_at: u64,
}

/// Rebuild the active path (root first) ending at `leaf_id` from a node set.
///
/// Stops at a missing parent or a cycle instead of looping, so a damaged store
/// yields the intact suffix rather than hanging the worker.
pub fn path_to_leaf(nodes: &[Node], leaf_id: Option<&str>) -> Vec<Node> {
    let by_id: HashMap<&str, &Node> = nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut path = Vec::new();
    let mut cursor = leaf_id;
    while let Some(id) = cursor {
        let Some(node) = by_id.get(id) else { break };
        if path.len() > nodes.len() {
            break;
        }
        path.push((*node).clone());
        cursor = node.parent_id.as_deref();
    }
    path.reverse();
    path
}

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    AcceptedOnce,
    AcceptedForSite,
    Declined,
    /// The run ended (interrupt) before anyone answered.
    Cancelled,
}

/// How the user answered a call's approval request, kept on its
/// `tool_result` node: `accepted_once`, `accepted_for_site`, `declined`,
/// or `cancelled` (the turn ended before an answer); or, for a call that
/// needed approval and ran without being asked, the site rule that let it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalNote {
    pub status: ApprovalStatus,
    /// The origin the user was asked about.
    pub origin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
    /// The call was not asked about: the user's rule for the site
    /// ("Allow on this site", made at `decided_at`) let it run
    /// (`status` is then `accepted_for_site`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_rule: bool,
}

impl ApprovalNote {
    /// The note of an answered approval (a pending one has no answer yet).
    pub fn of(approval: &ApprovalRecord) -> Self {
        ApprovalNote {
            status: approval.status,
            origin: approval.origin.clone(),
            decided_at: approval.decided_at,
            by_rule: false,
        }
    }
}

/// One element of a page as the content script describes it: its ref, its
/// role, its accessible name (whitespace collapsed, at most
/// [`TargetElement::MAX_NAME`] characters) and its state words
/// (`value="…" checked (disabled)`, for the user's eyes only).
///
/// An approved write carries the element the user was shown; the content
/// script acts only when the element it finds is that one (the same ref,
/// role and name, letter case aside), so what the card said is what is
/// clicked, or nothing is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetElement {
    #[serde(rename = "ref")]
    pub reference: String,
    pub role: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
}

impl TargetElement {
    /// The longest name kept, in characters (the content script's own bound).
    pub const MAX_NAME: usize = 1000;
    const MAX_ROLE: usize = 40;
    const MAX_STATE: usize = 300;

    /// The element the content script described in `details`, or why it
    /// is not one: a ref like `e12` or `f3:e12`, a role of letters, a
    /// name and state of bounded length (the page writes them).
    pub fn from_details(details: &serde_json::Value) -> Result<Self, String> {
        let text = |key: &str| details.get(key).and_then(serde_json::Value::as_str);
        let reference = text("ref").ok_or("no ref")?;
        if !is_ref(reference) {
            return Err(format!("{reference:?} is not a ref"));
        }
        let role = text("role").ok_or("no role")?;
        if role.is_empty()
            || role.chars().count() > Self::MAX_ROLE
            || !role.chars().all(|c| c.is_ascii_alphabetic() || c == '-')
        {
            return Err(format!("{role:?} is not a role"));
        }
        let name = text("name").ok_or("no name")?;
        if name.chars().count() > Self::MAX_NAME {
            return Err("the name is too long".into());
        }
        let state = text("state").unwrap_or("");
        Ok(TargetElement {
            reference: reference.to_string(),
            role: role.to_string(),
            name: name.to_string(),
            state: state.chars().take(Self::MAX_STATE).collect(),
        })
    }

    /// Whether `other` is the same element as far as the user can tell:
    /// the same ref, role and name (letter case aside: a control
    /// re-rendered as "Sign In" for "Sign in" is the same one). Decision:
    /// only ASCII letters fold here (`str::to_lowercase` would pull
    /// Unicode's case tables into the module, ~9 KB gzip); a name that
    /// differs only in the case of other letters counts as another, which
    /// refuses (the content script, folding all letters, is the looser
    /// check at the moment of the write).
    pub fn same_as(&self, other: &TargetElement) -> bool {
        self.reference == other.reference
            && self.role == other.role
            && self.name.eq_ignore_ascii_case(&other.name)
    }

    /// `button "Archive" (e5)`, the name cut at 80 characters.
    pub fn summary(&self) -> String {
        let name: String = self.name.chars().take(80).collect();
        let cut = if name.len() < self.name.len() {
            "…"
        } else {
            ""
        };
        format!(
            "{} {:?} ({})",
            self.role,
            format!("{name}{cut}"),
            self.reference
        )
    }
}

/// `e12`, or `f3:e12` inside a frame (the content script's refs).
fn is_ref(text: &str) -> bool {
    let local = match text.split_once(':') {
        Some((frame, local)) => {
            let Some(digits) = frame.strip_prefix('f') else {
                return false;
            };
            if !is_positive_number(digits) {
                return false;
            }
            local
        }
        None => text,
    };
    local.strip_prefix('e').is_some_and(is_positive_number)
}

fn is_positive_number(digits: &str) -> bool {
    !digits.is_empty()
        && digits.len() <= 12
        && !digits.starts_with('0')
        && digits.chars().all(|c| c.is_ascii_digit())
}

/// A durable question to the user: may this tool call run on this site?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord {
    pub id: String,
    pub thread_id: String,
    pub run_id: String,
    pub call_id: String,
    pub tool_name: String,
    pub label: String,
    /// The full parameters the tool would run with.
    pub params: serde_json::Value,
    /// The page the call would act on (the frame's, when it acts in a
    /// child frame: that is the origin the user approves).
    pub origin: String,
    pub url: String,
    pub tab_id: i64,
    /// Chrome's frame id when the call acts in a child frame of the tab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_id: Option<i64>,
    /// The tab's own URL when the call acts in a child frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// Chrome's id of the document the user was asked about: an approved
    /// write runs on that document only (a reload or another page of the
    /// same site meanwhile ends the call with an error, nothing done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_id: Option<String>,
    /// The element the call acts on as the page described it when the user
    /// was asked (`TargetElement`): the card shows it, and the approved
    /// write acts only on that element (the same ref, role and name), or
    /// ends with an error, nothing done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<TargetElement>,
    /// The MCP server the call would be sent to (its name in
    /// `extension/mcp-servers.js`), for a tool of such a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// That server's endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_url: Option<String>,
    pub status: ApprovalStatus,
    pub created_at: u64,
    #[serde(default)]
    pub decided_at: Option<u64>,
}

/// Where a question to the user stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionStatus {
    Pending,
    /// Answered (a server's request: accepted, declined or cancelled, `action`).
    Answered,
    /// The run ended before the user answered (or, for a server's request,
    /// its call ended or the worker restarted: the call cannot go on).
    Cancelled,
}

/// A durable question to the user: the model's (the `ask_user` tool), or
/// an MCP server's request for input during one of its tool calls
/// (`elicitation/create`; `server` is set, and `form` says what it asks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InteractionRecord {
    pub id: String,
    pub thread_id: String,
    pub run_id: String,
    pub call_id: String,
    /// The model's question, or the server's message.
    pub question: String,
    /// Suggested answers (the user may also type another).
    #[serde(default)]
    pub options: Vec<String>,
    pub status: InteractionStatus,
    /// The user's answer to a question of the model's.
    #[serde(default)]
    pub answer: Option<String>,
    pub created_at: u64,
    #[serde(default)]
    pub answered_at: Option<u64>,
    /// The MCP server asking (its name in `extension/mcp-servers.js`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// That server's endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_url: Option<String>,
    /// The fields the server asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<ElicitationForm>,
    /// How the user answered the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<ElicitationAction>,
    /// The values the user gave the server (with `accept`), by field name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<serde_json::Value>,
}

/// How the user answered an MCP server's request for input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    /// Sent the values filled in.
    Accept,
    /// Refused to give them.
    Decline,
    /// Dismissed the request without deciding.
    Cancel,
}

impl ElicitationAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ElicitationAction::Accept => "accept",
            ElicitationAction::Decline => "decline",
            ElicitationAction::Cancel => "cancel",
        }
    }
}

/// What an MCP server asks the user for (its `requestedSchema`, checked
/// and flattened into fields in the server's order: `crate::elicitation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationForm {
    pub fields: Vec<FormField>,
}

/// The kind of value a form field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    String,
    Number,
    Integer,
    Boolean,
}

/// The shape a string field's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StringFormat {
    #[serde(rename = "email")]
    Email,
    #[serde(rename = "uri")]
    Uri,
    #[serde(rename = "date")]
    Date,
    #[serde(rename = "date-time")]
    DateTime,
}

/// One value an MCP server asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FormField {
    /// The key of the value in the answer.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FieldKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub required: bool,
    /// The only values allowed (a string field's `enum`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// What to show for each option (`enumNames`), same length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub option_labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<StringFormat>,
    /// In characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<f64>,
    /// Filled in to begin with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
}

/// A persisted per-site permission, created by "accept for this site".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteRule {
    /// Also the key.
    pub origin: String,
    pub allow_writes: bool,
    /// Increases with every change of the rule.
    pub version: u64,
    pub created_at: u64,
}

/// Where the engine stands with an MCP server of the embedding extension's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// Its tools are being asked for (those it listed for an earlier
    /// worker, if any, are offered meanwhile).
    Listing,
    /// It listed its tools to this worker.
    Ready,
    /// Asking failed (`problem` says why); the tools it listed for an
    /// earlier worker, if any, are offered, and their calls fail with the
    /// reason while it stays so.
    Unreachable,
    /// An entry of the user's that cannot be used (`problem` says why: a
    /// wrong field, a name another server has, one server too many); not
    /// connected, no tools.
    Refused,
    /// It asks for a sign-in (HTTP 401) and no kept one works: the user
    /// signs in from Settings (`mcpServers.signIn`; `problem` says why
    /// when a sign-in failed). The tools it listed before, if any, are
    /// offered, and their calls fail saying so.
    SignInNeeded,
}

/// Who named an MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerOrigin {
    /// The embedding extension (`extension/mcp-servers.js`).
    Extension,
    /// The user, in the side panel's Settings
    /// (`chrome.storage.local.mcpUserServers`).
    User,
}

/// A tool of an MCP server as a client lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpToolSummary {
    /// The model's name of it (`server__tool`).
    pub name: String,
    pub label: String,
    /// The server marks it read-only (it is run again after a crash; it
    /// asks like every other tool of a server).
    pub read_only: bool,
}

/// An MCP server as a client lists it (`mcpServers.list`,
/// `mcpServers.updated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerSummary {
    /// Its name in `extension/mcp-servers.js` (or as the user wrote it).
    pub name: String,
    pub url: String,
    pub added_by: McpServerOrigin,
    pub state: McpServerState,
    /// The tools of it the agent is offered now.
    pub tools: Vec<McpToolSummary>,
    /// Why it is unreachable, or which of its tools were left out and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// When its state last changed (ms since the epoch).
    pub since: u64,
    /// The user is signed in to it (a sign-in this extension keeps).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signed_in: bool,
    /// Its sign-in window is open (`mcpServers.signIn`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signing_in: bool,
}

/// A site rule as a client lists it (`siteRules.list`, `siteRules.updated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteRuleSummary {
    pub origin: String,
    pub allow_writes: bool,
    pub created_at: u64,
}

impl From<&SiteRule> for SiteRuleSummary {
    fn from(rule: &SiteRule) -> Self {
        SiteRuleSummary {
            origin: rule.origin.clone(),
            allow_writes: rule.allow_writes,
            created_at: rule.created_at,
        }
    }
}

/// The most image data one `tool_result` node keeps: base64 characters over
/// all its images (400 KiB, about 300 KB of JPEG). The screenshot tool scales
/// and compresses below it; the engine drops anything larger with a note.
pub const MAX_RESULT_IMAGE_CHARS: usize = 400 * 1024;

/// An image as the model receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageData {
    /// `image/png` or `image/jpeg` (a screenshot), or one of
    /// [`ATTACHMENT_IMAGE_TYPES`] (an attached image).
    pub media_type: String,
    /// Base64 without the `data:` prefix.
    pub data: String,
}

impl ImageData {
    /// Parse a `data:<type>;base64,<data>` URL.
    pub fn from_data_url(url: &str) -> Option<ImageData> {
        let rest = url.strip_prefix("data:")?;
        let (meta, data) = rest.split_once(',')?;
        let media_type = meta.strip_suffix(";base64")?;
        if !media_type.starts_with("image/") || data.is_empty() {
            return None;
        }
        Some(ImageData {
            media_type: media_type.to_string(),
            data: data.to_string(),
        })
    }

    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.media_type, self.data)
    }

    /// An image from encoded bytes (PNG or JPEG).
    pub fn from_bytes(media_type: &str, bytes: &[u8]) -> ImageData {
        ImageData {
            media_type: media_type.to_string(),
            data: base64_encode(bytes),
        }
    }
}

/// The longest side, in pixels, of the screenshot the model gets.
pub const SCREENSHOT_MAX_SIDE: u32 = 1280;
/// The longest side, in pixels, of the thumbnail in a screenshot's details.
pub const THUMBNAIL_MAX_SIDE: u32 = 240;
/// The largest thumbnail data URL a screenshot's details keep (characters);
/// a larger one is left out.
pub const MAX_THUMBNAIL_CHARS: usize = 24 * 1024;

/// `width` × `height` scaled down (never up) so the longer side is at most
/// `max_side`, keeping the aspect ratio; each side at least 1.
pub fn fit_within(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let longest = width.max(height);
    if longest <= max_side || longest == 0 {
        return (width.max(1), height.max(1));
    }
    let scale = |side: u32| {
        ((u64::from(side) * u64::from(max_side) + u64::from(longest) / 2) / u64::from(longest))
            .max(1) as u32
    };
    (scale(width), scale(height))
}

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `Node`'s decoder: one pass over the record's fields, no buffering.
/// Accepts exactly what the derived flat shape wrote (unknown fields are
/// ignored, defaults as declared on `NodeBody`).
mod node_de {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

    use super::{
        ApprovalNote, Attachment, ImageData, Node, NodeBody, NoticeLevel, StopReason, ToolStatus,
        Usage,
    };

    const KINDS: &[&str] = &[
        "turn_context",
        "user_message",
        "assistant_message",
        "tool_call",
        "tool_result",
        "notice",
        "compaction",
    ];

    enum Field {
        Id,
        ThreadId,
        ParentId,
        CreatedAt,
        Kind,
        TurnId,
        Model,
        Text,
        Steered,
        Reasoning,
        StopReason,
        Usage,
        Interrupted,
        ProviderPrivate,
        CallId,
        AssistantId,
        Name,
        Label,
        Arguments,
        Status,
        Content,
        Details,
        Images,
        Attachments,
        Approval,
        Level,
        Summary,
        CompactedNodes,
        Verbatim,
        KeptNodes,
        Other,
    }

    impl Field {
        fn of(key: &str) -> Field {
            match key {
                "id" => Field::Id,
                "threadId" => Field::ThreadId,
                "parentId" => Field::ParentId,
                "createdAt" => Field::CreatedAt,
                "kind" => Field::Kind,
                "turnId" => Field::TurnId,
                "model" => Field::Model,
                "text" => Field::Text,
                "steered" => Field::Steered,
                "reasoning" => Field::Reasoning,
                "stopReason" => Field::StopReason,
                "usage" => Field::Usage,
                "interrupted" => Field::Interrupted,
                "providerPrivate" => Field::ProviderPrivate,
                "callId" => Field::CallId,
                "assistantId" => Field::AssistantId,
                "name" => Field::Name,
                "label" => Field::Label,
                "arguments" => Field::Arguments,
                "status" => Field::Status,
                "content" => Field::Content,
                "details" => Field::Details,
                "images" => Field::Images,
                "attachments" => Field::Attachments,
                "approval" => Field::Approval,
                "level" => Field::Level,
                "summary" => Field::Summary,
                "compactedNodes" => Field::CompactedNodes,
                "verbatim" => Field::Verbatim,
                "keptNodes" => Field::KeptNodes,
                _ => Field::Other,
            }
        }
    }

    impl<'de> Deserialize<'de> for Field {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct FieldVisitor;
            impl Visitor<'_> for FieldVisitor {
                type Value = Field;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a node field name")
                }
                fn visit_str<E: de::Error>(self, key: &str) -> Result<Field, E> {
                    Ok(Field::of(key))
                }
            }
            deserializer.deserialize_identifier(FieldVisitor)
        }
    }

    /// Every field any kind of node has, as read.
    #[derive(Default)]
    struct Fields {
        id: Option<String>,
        thread_id: Option<String>,
        parent_id: Option<String>,
        created_at: Option<u64>,
        kind: Option<String>,
        turn_id: Option<String>,
        model: Option<String>,
        text: Option<String>,
        steered: Option<bool>,
        reasoning: Option<String>,
        stop_reason: Option<StopReason>,
        usage: Option<Usage>,
        interrupted: Option<bool>,
        provider_private: Option<serde_json::Value>,
        call_id: Option<String>,
        assistant_id: Option<String>,
        name: Option<String>,
        label: Option<String>,
        arguments: Option<serde_json::Value>,
        status: Option<ToolStatus>,
        content: Option<String>,
        details: Option<serde_json::Value>,
        images: Option<Vec<ImageData>>,
        attachments: Option<Vec<Attachment>>,
        approval: Option<ApprovalNote>,
        level: Option<NoticeLevel>,
        summary: Option<String>,
        compacted_nodes: Option<u64>,
        verbatim: Option<String>,
        kept_nodes: Option<u64>,
    }

    fn need<T, E: de::Error>(value: Option<T>, field: &'static str) -> Result<T, E> {
        value.ok_or_else(|| E::missing_field(field))
    }

    impl Fields {
        fn into_node<E: de::Error>(self) -> Result<Node, E> {
            let kind = need(self.kind, "kind")?;
            let body = match kind.as_str() {
                "turn_context" => NodeBody::TurnContext {
                    turn_id: need(self.turn_id, "turnId")?,
                    model: need(self.model, "model")?,
                },
                "user_message" => NodeBody::UserMessage {
                    text: need(self.text, "text")?,
                    steered: self.steered.unwrap_or(false),
                    attachments: self.attachments.unwrap_or_default(),
                },
                "assistant_message" => NodeBody::AssistantMessage {
                    text: need(self.text, "text")?,
                    reasoning: self.reasoning,
                    stop_reason: need(self.stop_reason, "stopReason")?,
                    usage: self.usage,
                    interrupted: self.interrupted.unwrap_or(false),
                    model: need(self.model, "model")?,
                    provider_private: self.provider_private,
                },
                "tool_call" => NodeBody::ToolCall {
                    call_id: need(self.call_id, "callId")?,
                    assistant_id: need(self.assistant_id, "assistantId")?,
                    name: need(self.name, "name")?,
                    label: need(self.label, "label")?,
                    arguments: need(self.arguments, "arguments")?,
                },
                "tool_result" => NodeBody::ToolResult {
                    call_id: need(self.call_id, "callId")?,
                    name: need(self.name, "name")?,
                    status: need(self.status, "status")?,
                    content: need(self.content, "content")?,
                    details: self.details,
                    images: self.images.unwrap_or_default(),
                    approval: self.approval,
                },
                "notice" => NodeBody::Notice {
                    level: need(self.level, "level")?,
                    text: need(self.text, "text")?,
                },
                "compaction" => NodeBody::Compaction {
                    summary: need(self.summary, "summary")?,
                    compacted_nodes: need(self.compacted_nodes, "compactedNodes")?,
                    verbatim: self.verbatim.unwrap_or_default(),
                    kept_nodes: self.kept_nodes.unwrap_or(0),
                },
                other => return Err(E::unknown_variant(other, KINDS)),
            };
            Ok(Node {
                id: need(self.id, "id")?,
                thread_id: need(self.thread_id, "threadId")?,
                parent_id: self.parent_id,
                created_at: need(self.created_at, "createdAt")?,
                body,
            })
        }
    }

    struct NodeVisitor;

    impl<'de> Visitor<'de> for NodeVisitor {
        type Value = Node;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a node record")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
            let mut f = Fields::default();
            while let Some(key) = map.next_key::<Field>()? {
                match key {
                    Field::Id => f.id = Some(map.next_value()?),
                    Field::ThreadId => f.thread_id = Some(map.next_value()?),
                    Field::ParentId => f.parent_id = map.next_value()?,
                    Field::CreatedAt => f.created_at = Some(map.next_value()?),
                    Field::Kind => f.kind = Some(map.next_value()?),
                    Field::TurnId => f.turn_id = Some(map.next_value()?),
                    Field::Model => f.model = Some(map.next_value()?),
                    Field::Text => f.text = Some(map.next_value()?),
                    Field::Steered => f.steered = Some(map.next_value()?),
                    Field::Reasoning => f.reasoning = map.next_value()?,
                    Field::StopReason => f.stop_reason = Some(map.next_value()?),
                    Field::Usage => f.usage = map.next_value()?,
                    Field::Interrupted => f.interrupted = Some(map.next_value()?),
                    Field::ProviderPrivate => f.provider_private = map.next_value()?,
                    Field::CallId => f.call_id = Some(map.next_value()?),
                    Field::AssistantId => f.assistant_id = Some(map.next_value()?),
                    Field::Name => f.name = Some(map.next_value()?),
                    Field::Label => f.label = Some(map.next_value()?),
                    Field::Arguments => f.arguments = Some(map.next_value()?),
                    Field::Status => f.status = Some(map.next_value()?),
                    Field::Content => f.content = Some(map.next_value()?),
                    Field::Details => f.details = map.next_value()?,
                    Field::Images => f.images = Some(map.next_value()?),
                    Field::Attachments => f.attachments = Some(map.next_value()?),
                    // UI only: a value that does not read back is dropped,
                    // not the result (its call would be left without one).
                    Field::Approval => {
                        let value: serde_json::Value = map.next_value()?;
                        f.approval = serde_json::from_value(value).ok();
                    }
                    Field::Level => f.level = Some(map.next_value()?),
                    Field::Summary => f.summary = Some(map.next_value()?),
                    Field::CompactedNodes => f.compacted_nodes = Some(map.next_value()?),
                    Field::Verbatim => f.verbatim = Some(map.next_value()?),
                    Field::KeptNodes => f.kept_nodes = Some(map.next_value()?),
                    Field::Other => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            f.into_node()
        }
    }

    impl<'de> Deserialize<'de> for Node {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
            deserializer.deserialize_map(NodeVisitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start's `state` index ranges (`store::unfinished_run_states`)
    /// hold exactly the states that are not terminal.
    #[test]
    fn unfinished_run_state_ranges_hold_every_state_but_the_terminal_ones() {
        use RunState::*;
        let all = [
            Queued,
            StreamingModel,
            ExecutingTools,
            WaitingApproval,
            WaitingInteraction,
            Completed,
            Interrupted,
            Failed,
            BudgetPaused,
            PausedUncertain,
        ];
        let name = |s: RunState| {
            serde_json::to_value(s)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        };
        let mut terminal: Vec<String> = all
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| name(*s))
            .collect();
        crate::sorting::sort(&mut terminal);
        assert_eq!(terminal, RunState::TERMINAL_NAMES);
        let ranges = crate::store::unfinished_run_states();
        let in_ranges = |key: &str| {
            ranges
                .iter()
                .any(|(lo, hi)| lo.is_none_or(|lo| key > lo) && hi.is_none_or(|hi| key < hi))
        };
        for state in all {
            assert_eq!(in_ranges(&name(state)), !state.is_terminal(), "{state:?}");
        }
        // A damaged record's state is read too (then reported).
        assert!(in_ranges("") && in_ranges("zzz") && in_ranges("completed "));
    }

    #[test]
    fn data_urls_parse_and_round_trip() {
        let image = ImageData::from_data_url("data:image/png;base64,iVBORw0K").unwrap();
        assert_eq!(image.media_type, "image/png");
        assert_eq!(image.data_url(), "data:image/png;base64,iVBORw0K");
        assert!(ImageData::from_data_url("data:text/html;base64,PHA+").is_none());
        assert!(ImageData::from_data_url("data:image/png,raw").is_none());
        assert!(ImageData::from_data_url("https://x/y.png").is_none());
    }

    #[test]
    fn base64_and_image_sizes() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\xfe\xfd\x00", "//79AA=="),
        ] {
            assert_eq!(base64_encode(bytes), text);
        }
        assert_eq!(
            ImageData::from_bytes("image/png", b"foo").data_url(),
            "data:image/png;base64,Zm9v"
        );
        assert_eq!(fit_within(1000, 800, 1280), (1000, 800), "never scaled up");
        assert_eq!(fit_within(2560, 1600, 1280), (1280, 800));
        assert_eq!(fit_within(1000, 800, 240), (240, 192));
        assert_eq!(fit_within(800, 3000, 240), (64, 240));
        assert_eq!(fit_within(5000, 1, 240), (240, 1));
        assert_eq!(fit_within(0, 0, 240), (1, 1));
    }

    fn node(parent: Option<&str>, body: NodeBody) -> Node {
        Node {
            id: "n1".into(),
            thread_id: "t1".into(),
            parent_id: parent.map(String::from),
            created_at: 1_700_000_000_123,
            body,
        }
    }

    /// One node of every kind, with every optional field set and unset.
    fn every_kind() -> Vec<Node> {
        let full_usage = Usage {
            input: 10,
            output: 5,
            cache_read: 1,
            cache_write: 2,
            reasoning: 3,
        };
        vec![
            node(
                None,
                NodeBody::TurnContext {
                    turn_id: "r1".into(),
                    model: "m".into(),
                },
            ),
            node(
                Some("n0"),
                NodeBody::UserMessage {
                    text: "hi".into(),
                    steered: true,
                    attachments: vec![
                        Attachment::Image {
                            name: "cart.png".into(),
                            media_type: "image/png".into(),
                            data: "aGk=".into(),
                        },
                        Attachment::Text {
                            name: "list.csv".into(),
                            media_type: "text/csv".into(),
                            text: "a,b\n1,2".into(),
                        },
                    ],
                },
            ),
            node(
                Some("n0"),
                NodeBody::UserMessage {
                    text: String::new(),
                    steered: false,
                    attachments: vec![],
                },
            ),
            node(
                Some("n0"),
                NodeBody::AssistantMessage {
                    text: "done".into(),
                    reasoning: Some("because".into()),
                    stop_reason: StopReason::ToolUse,
                    usage: Some(full_usage),
                    interrupted: true,
                    model: "m".into(),
                    provider_private: Some(serde_json::json!({"signature": "s", "n": [1, 2.5]})),
                },
            ),
            node(
                Some("n0"),
                NodeBody::AssistantMessage {
                    text: String::new(),
                    reasoning: None,
                    stop_reason: StopReason::End,
                    usage: None,
                    interrupted: false,
                    model: "m".into(),
                    provider_private: None,
                },
            ),
            node(
                Some("n0"),
                NodeBody::ToolCall {
                    call_id: "c1".into(),
                    assistant_id: "a1".into(),
                    name: "click".into(),
                    label: "Click".into(),
                    arguments: serde_json::json!({"ref": "e1", "deep": {"x": null}}),
                },
            ),
            node(
                Some("n0"),
                NodeBody::ToolResult {
                    call_id: "c1".into(),
                    name: "screenshot".into(),
                    status: ToolStatus::Denied,
                    content: "no".into(),
                    details: Some(serde_json::json!({"box": [1, 2, 3, 4]})),
                    images: vec![ImageData::from_bytes("image/png", b"png")],
                    approval: Some(ApprovalNote {
                        status: ApprovalStatus::Declined,
                        origin: "https://shop.example".into(),
                        decided_at: Some(7),
                        by_rule: false,
                    }),
                },
            ),
            node(
                Some("n0"),
                NodeBody::ToolResult {
                    call_id: "c1".into(),
                    name: "read_page".into(),
                    status: ToolStatus::Ok,
                    content: "text".into(),
                    details: None,
                    images: Vec::new(),
                    approval: None,
                },
            ),
            node(
                Some("n0"),
                NodeBody::Notice {
                    level: NoticeLevel::Warning,
                    text: "model switched".into(),
                },
            ),
            node(
                Some("n0"),
                NodeBody::Compaction {
                    summary: "so far".into(),
                    compacted_nodes: 42,
                    verbatim: "plan".into(),
                    kept_nodes: 3,
                },
            ),
            node(
                Some("n0"),
                NodeBody::Compaction {
                    summary: "so far".into(),
                    compacted_nodes: 0,
                    verbatim: String::new(),
                    kept_nodes: 0,
                },
            ),
        ]
    }

    #[test]
    fn nodes_of_every_kind_decode_to_what_was_encoded() {
        for original in every_kind() {
            let value = serde_json::to_value(&original).unwrap();
            let decoded: Node = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(decoded, original, "{value}");
            let text = serde_json::to_string(&original).unwrap();
            assert_eq!(
                serde_json::from_str::<Node>(&text).unwrap(),
                original,
                "{text}"
            );
        }
    }

    #[test]
    fn node_decoding_accepts_older_and_extra_fields_and_names_what_is_missing() {
        // Defaults as declared: omitted optional fields, explicit nulls, unknown fields.
        let older: Node = serde_json::from_value(serde_json::json!({
            "id": "n1", "threadId": "t1", "createdAt": 5, "kind": "assistant_message",
            "text": "x", "stopReason": "end", "model": "m", "reasoning": null, "usage": null,
            "futureField": {"nested": [1]},
        }))
        .unwrap();
        assert_eq!(older.parent_id, None);
        assert!(matches!(
            older.body,
            NodeBody::AssistantMessage {
                interrupted: false,
                reasoning: None,
                usage: None,
                provider_private: None,
                ..
            }
        ));
        // A result's approval note is for the UI only: one that does not
        // read back is dropped, the result (and its call's pairing) stays.
        for bad in [
            serde_json::json!({"status": "maybe", "origin": "https://a.example"}),
            serde_json::json!("accepted_once"),
            serde_json::json!({"status": "declined"}),
        ] {
            let result: Node = serde_json::from_value(serde_json::json!({
                "id": "n2", "threadId": "t1", "createdAt": 5, "kind": "tool_result",
                "callId": "c", "name": "click", "status": "ok", "content": "done",
                "approval": bad,
            }))
            .unwrap();
            assert!(matches!(
                result.body,
                NodeBody::ToolResult { approval: None, .. }
            ));
        }
        // A checkpoint written before `keptNodes` existed summarizes
        // everything before it (nothing kept).
        let checkpoint: Node = serde_json::from_value(serde_json::json!({
            "id": "n3", "threadId": "t1", "createdAt": 5, "kind": "compaction",
            "summary": "so far", "compactedNodes": 7,
        }))
        .unwrap();
        assert_eq!(
            checkpoint.body,
            NodeBody::Compaction {
                summary: "so far".into(),
                compacted_nodes: 7,
                verbatim: String::new(),
                kept_nodes: 0,
            }
        );
        let missing = serde_json::from_value::<Node>(serde_json::json!({
            "id": "n1", "threadId": "t1", "createdAt": 5, "kind": "tool_call",
            "callId": "c", "name": "click", "label": "Click", "arguments": {},
        }))
        .unwrap_err()
        .to_string();
        assert!(missing.contains("assistantId"), "{missing}");
        let no_kind = serde_json::from_value::<Node>(
            serde_json::json!({"id": "n1", "threadId": "t1", "createdAt": 5}),
        )
        .unwrap_err()
        .to_string();
        assert!(no_kind.contains("kind"), "{no_kind}");
        let unknown = serde_json::from_value::<Node>(serde_json::json!({
            "id": "n1", "threadId": "t1", "createdAt": 5, "kind": "hologram",
        }))
        .unwrap_err()
        .to_string();
        assert!(
            unknown.contains("hologram") && unknown.contains("user_message"),
            "{unknown}"
        );
        let wrong_type = serde_json::from_value::<Node>(serde_json::json!({
            "id": "n1", "threadId": "t1", "createdAt": "yesterday", "kind": "notice", "level": "info", "text": "x",
        }));
        assert!(wrong_type.is_err());
        assert!(
            serde_json::from_value::<Node>(serde_json::json!(["n1"])).is_err(),
            "not a record"
        );
    }

    #[test]
    fn node_decodes_inside_tagged_protocol_events() {
        // Through serde's buffered path too (a node nested in an internally tagged enum).
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        enum Event {
            Added { node: Node },
        }
        for original in every_kind() {
            let event = Event::Added { node: original };
            let text = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), event);
        }
    }
}
