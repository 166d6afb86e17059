//! Provider-neutral request/response types and the adapters that turn them
//! into wire requests and parse wire streams back.
//!
//! Owns: the outbound request shape the engine builds (`ProviderRequest`), the
//! events a stream yields (`StreamEvent`), the assembled response
//! (`ProviderResponse`), typed provider errors, and the SSE parser.
//!
//! Must not: fetch, await, or read clocks (the platform driver does IO and
//! feeds bytes in).

pub mod anthropic;
pub mod body;
pub mod openai;
pub mod sse;

use serde::{Deserialize, Serialize};

use crate::model::{ProviderProfile, StopReason, Usage};
use crate::protocol::{ErrorInfo, ErrorKind};

/// One message of the outbound view sent to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ChatMessage {
    User {
        text: String,
        /// Images the user attached (only for models with vision; others
        /// get a placeholder in the text, decided per request).
        images: Vec<crate::model::ImageData>,
        /// PDFs the user attached (as the images).
        documents: Vec<crate::model::DocumentData>,
    },
    Assistant {
        text: String,
        tool_calls: Vec<OutboundToolCall>,
        /// Provider-private data of this message (e.g. Anthropic thinking
        /// signatures), keyed by provider; each adapter reads only its own key.
        private: Option<serde_json::Value>,
    },
    ToolResult {
        call_id: String,
        /// Shared: the body cache keeps each message and compares it with
        /// the next request's, and results are most of a long thread's
        /// bytes; the same `Rc` compares equal without reading them.
        content: std::rc::Rc<str>,
        is_error: bool,
        /// Images returned by the tool (only for models with vision).
        images: Vec<crate::model::ImageData>,
    },
}

impl ChatMessage {
    /// A user message of text only.
    pub fn user(text: impl Into<String>) -> ChatMessage {
        ChatMessage::User {
            text: text.into(),
            images: Vec::new(),
            documents: Vec::new(),
        }
    }
}

/// The conversation with its tool calls and results written as text, for a
/// request that offers the model no tools (tools disabled by the failure
/// breaker, a profile without tool use): Anthropic, and gateways in front
/// of Bedrock, refuse a request whose history holds tool blocks but that
/// defines no tools. What the model did stays readable; nothing it
/// could mistake for a callable tool is left. A result's images stay with
/// it (as a user message's).
pub fn tool_history_as_text(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut names: Vec<(&str, &str)> = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        match message {
            ChatMessage::Assistant {
                text,
                tool_calls,
                private,
            } if !tool_calls.is_empty() => {
                let mut text = text.clone();
                for call in tool_calls {
                    names.push((&call.id, &call.name));
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!(
                        "[Called the tool {} with {}]",
                        call.name, call.arguments
                    ));
                }
                out.push(ChatMessage::Assistant {
                    text,
                    tool_calls: Vec::new(),
                    private: private.clone(),
                });
            }
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
                images,
            } => {
                let name = names
                    .iter()
                    .rev()
                    .find(|(id, _)| id == call_id)
                    .map_or("a tool", |(_, name)| name);
                let what = if *is_error { "failed" } else { "returned" };
                out.push(ChatMessage::User {
                    text: format!("[The call of {name} {what}:]\n{content}"),
                    images: images.clone(),
                    documents: Vec::new(),
                });
            }
            other => out.push(other.clone()),
        }
    }
    out
}

/// A tool call as replayed to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboundToolCall {
    pub id: String,
    pub name: String,
    /// JSON arguments as an object.
    pub arguments: serde_json::Value,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the parameters.
    pub parameters: serde_json::Value,
}

/// Everything needed to make one provider request, minus the API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderRequest {
    pub profile: ProviderProfile,
    /// Shared, like `tools`: the engine builds both once, every step's
    /// request points at them, and the body cache reuses the body's text
    /// around the messages while they are the same (`provider::body`).
    pub system: std::rc::Rc<str>,
    /// Shared with the engine's outbound view: a step's request does not
    /// copy the conversation (copy-on-write when a request adds a note).
    pub messages: std::rc::Rc<Vec<ChatMessage>>,
    /// Empty when tools are disabled.
    pub tools: std::rc::Rc<[ToolSpec]>,
    /// Where `messages` come from, if from an outbound view that only
    /// appends (`engine::context::OutboundView`): the body cache keeps one
    /// cache per view and trusts the messages a request shares with the
    /// view's previous one without comparing them. None: compared.
    #[serde(skip)]
    pub lineage: Option<Lineage>,
}

/// The outbound view a request's messages come from (`view`, unique per
/// view and per rebuild of it) and how many of them it held (`len`): two
/// requests of one view share their first `len - 1` messages, the shorter
/// one's `len` counting (the last may still gain tool calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lineage {
    pub view: u64,
    pub len: usize,
}

/// A tool call as the provider sent it (ids not yet normalized).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawToolCall {
    pub id: String,
    pub name: String,
    /// The raw JSON argument text; may be invalid JSON.
    pub arguments: String,
}

/// The assembled result of one streamed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderResponse {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<RawToolCall>,
    pub stop_reason: StopReason,
    pub usage: Option<Usage>,
    pub model: String,
    /// Provider-private data to replay to the same provider only.
    #[serde(default)]
    pub private: Option<serde_json::Value>,
}

/// What an adapter yields while a stream is running.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    TextDelta(String),
    ReasoningDelta(String),
}

/// A typed provider failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub message: String,
    /// Whether trying again later may succeed.
    pub retryable: bool,
    /// Server-suggested delay (Retry-After / retry-after-ms).
    pub retry_after_ms: Option<u64>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, message: impl Into<String>, retryable: bool) -> Self {
        ProviderError {
            kind,
            message: message.into(),
            retryable,
            retry_after_ms: None,
        }
    }

    pub fn info(&self) -> ErrorInfo {
        ErrorInfo::new(self.kind, self.message.clone())
    }
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ProviderError {}

/// The error words (an error object's `type` or string `code`, both
/// providers) that say the account has no credit or quota left: asking
/// again does not help, whatever the status.
const QUOTA_WORDS: [&str; 3] = [
    "insufficient_quota",
    "billing_error",
    "billing_hard_limit_reached",
];

/// The status an error sent inside a stream stands for, from its words
/// (a stream's errors carry no status of their own).
pub fn status_of_error_words(words: &[&str]) -> Option<u16> {
    words.iter().find_map(|w| {
        Some(match *w {
            "invalid_request_error" | "context_length_exceeded" => 400,
            "authentication_error" | "invalid_api_key" => 401,
            "billing_error" => 402,
            "permission_error" => 403,
            "not_found_error" | "model_not_found" => 404,
            "request_too_large" => 413,
            "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" => 429,
            "api_error" | "server_error" => 500,
            "timeout_error" => 504,
            "overloaded_error" => 529,
            _ => return None,
        })
    })
}

/// An error object's string `code` and its `type` (the code, more
/// specific, first: `invalid_api_key` before `invalid_request_error`).
pub fn error_words(err: &serde_json::Value) -> Vec<&str> {
    ["code", "type"]
        .iter()
        .filter_map(|key| err.get(*key).and_then(serde_json::Value::as_str))
        .collect()
}

/// The status an error object that came without one stands for (inside a
/// stream, or in a 2xx body): its numeric `code` when that is an HTTP
/// error status (OpenRouter), else what its words say, else 500.
pub fn status_of_error_object(err: &serde_json::Value) -> u16 {
    match err.get("code").and_then(serde_json::Value::as_u64) {
        Some(code) if (400..600).contains(&code) => code as u16,
        _ => status_of_error_words(&error_words(err)).unwrap_or(500),
    }
}

/// Whether a refusal's message says the request is longer than the
/// model's context window. Not a refusal of the output limit itself
/// (Anthropic: "max_tokens: 100000 > 64000, which is the maximum allowed
/// number of output tokens"): compacting cannot help that one.
fn says_context_overflow(lower: &str, words: &[&str]) -> bool {
    words.contains(&"context_length_exceeded")
        || lower.contains("context")
        || lower.contains("too long")
        || (lower.contains("maximum")
            && lower.contains("token")
            && !lower.contains("max_tokens")
            && !lower.contains("output token"))
}

/// Map an HTTP status, the error's message and its words (an error
/// object's `type` and string `code`, which tell apart what one status
/// covers: a 429 for an empty account, `insufficient_quota`, from one for
/// too many requests) to a typed error, in user words.
pub fn error_from_status(
    status: u16,
    provider_message: &str,
    words: &[&str],
    retry_after_ms: Option<u64>,
) -> ProviderError {
    let detail = if provider_message.is_empty() {
        String::new()
    } else {
        format!(" (provider said: {provider_message})")
    };
    let lower = provider_message.to_ascii_lowercase();
    let quota = words.iter().any(|w| QUOTA_WORDS.contains(w));
    let (kind, message, retryable) = match status {
        402 | 429 if status == 402 || quota => (
            ErrorKind::QuotaExceeded,
            format!("The provider account has no credit or quota left (HTTP {status}). Check your plan and billing with the provider.{detail}"),
            false,
        ),
        401 | 403 => (
            ErrorKind::Auth,
            format!("The provider rejected the API key (HTTP {status}). Check the key in Settings.{detail}"),
            false,
        ),
        404 => (
            ErrorKind::ModelNotFound,
            format!("The model or endpoint was not found (HTTP 404). Check the base URL and model name in Settings.{detail}"),
            false,
        ),
        400 | 413 if says_context_overflow(&lower, words) => (
            ErrorKind::ContextOverflow,
            format!("The conversation is too long for the model's context window.{detail}"),
            false,
        ),
        // Larger than the provider takes (bytes, not tokens: Anthropic's
        // request_too_large): the same cure, a shorter conversation.
        413 => (
            ErrorKind::ContextOverflow,
            format!("The request is larger than the provider accepts (HTTP 413).{detail}"),
            false,
        ),
        429 => (
            ErrorKind::RateLimited,
            format!("The provider is rate limiting requests (HTTP 429); retrying later may work.{detail}"),
            true,
        ),
        408 | 409 => (
            ErrorKind::ProviderUnavailable,
            format!("The provider timed out (HTTP {status}).{detail}"),
            true,
        ),
        529 => (
            ErrorKind::ProviderUnavailable,
            format!("The provider is overloaded (HTTP 529); try again shortly.{detail}"),
            true,
        ),
        500..=599 => (
            ErrorKind::ProviderUnavailable,
            format!("The provider failed (HTTP {status}); try again shortly.{detail}"),
            true,
        ),
        _ => (
            ErrorKind::InvalidCommand,
            format!("The provider refused the request (HTTP {status}).{detail}"),
            false,
        ),
    };
    ProviderError {
        kind,
        message,
        retryable,
        retry_after_ms,
    }
}

/// Parse `Retry-After` (seconds or HTTP date is not supported: seconds only)
/// and `retry-after-ms` headers into milliseconds.
pub fn parse_retry_after(retry_after: Option<&str>, retry_after_ms: Option<&str>) -> Option<u64> {
    if let Some(ms) = retry_after_ms.and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(ms as u64);
        }
    }
    retry_after
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| (s * 1000.0) as u64)
}

/// Assembles one streamed response from SSE events (one per wire format).
pub trait Assembler: Default {
    /// Feed one event; returns deltas to show.
    fn on_event(&mut self, event: &sse::SseEvent) -> Result<Vec<StreamEvent>, ProviderError>;
    /// The stream ended: the response, or why it is incomplete.
    fn finish(self) -> Result<ProviderResponse, ProviderError>;
}

/// SSE parsing plus an [`Assembler`]: what the driver feeds response bytes to.
#[derive(Debug, Default)]
pub struct SseDecoder<A> {
    parser: sse::SseParser,
    stream: A,
}

impl<A: Assembler> SseDecoder<A> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that assembles with `stream` (one told where the request went).
    pub fn with(stream: A) -> Self {
        Self {
            parser: sse::SseParser::default(),
            stream,
        }
    }

    /// Feed response bytes; returns deltas to show. On an error, deltas
    /// decoded from the same bytes before it are dropped: drivers use
    /// [`Self::push_with`].
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<StreamEvent>, ProviderError> {
        let mut out = Vec::new();
        self.push_with(bytes, &mut |d| out.push(d))?;
        Ok(out)
    }

    /// Feed response bytes, handing each delta to `on_delta` as soon as it is
    /// decoded, so the deltas before an error (even one in the same bytes)
    /// are delivered.
    pub fn push_with(
        &mut self,
        bytes: &[u8],
        on_delta: &mut dyn FnMut(StreamEvent),
    ) -> Result<(), ProviderError> {
        for event in self.parser.push(bytes) {
            for delta in self.stream.on_event(&event)? {
                on_delta(delta);
            }
        }
        Ok(())
    }

    /// The body ended. An unterminated last event that does not parse means
    /// the body was cut off: a retryable network error, not a protocol one.
    pub fn finish(mut self) -> Result<ProviderResponse, ProviderError> {
        for event in self.parser.finish() {
            if let Err(e) = self.stream.on_event(&event) {
                if e.kind == ErrorKind::ProviderProtocol {
                    return Err(ProviderError::new(
                        ErrorKind::Network,
                        "The provider's stream was cut off in the middle of a message.",
                        true,
                    ));
                }
                return Err(e);
            }
        }
        self.stream.finish()
    }
}

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// OpenAI chat completions (and every compatible server).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl Transport {
    /// The transport for a profile's `kind` (`openai` is the default).
    pub fn from_kind(kind: &str) -> Self {
        match kind {
            "anthropic" => Transport::Anthropic,
            _ => Transport::OpenAi,
        }
    }
}

/// An HTTP request ready to be sent by the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Build the wire request. The API key goes into a header and nowhere else.
/// (The driver builds bodies through a kept `body::BodyCache` and sends
/// them with [`http_target`]'s url and headers.)
pub fn http_request(request: &ProviderRequest, api_key: &str) -> HttpRequest {
    let body = body::BodyCache::new().body(request);
    let (url, headers) = http_target(request, api_key);
    HttpRequest { url, headers, body }
}

/// Where a request goes and its headers (the API key in one of them, and
/// nowhere else), without its body.
pub fn http_target(request: &ProviderRequest, api_key: &str) -> (String, Vec<(String, String)>) {
    match Transport::from_kind(&request.profile.kind) {
        Transport::OpenAi => {
            let mut headers = Vec::new();
            if !api_key.is_empty() {
                headers.push(("authorization".to_string(), format!("Bearer {api_key}")));
            }
            (openai::endpoint(&request.profile.base_url), headers)
        }
        Transport::Anthropic => (
            anthropic::endpoint(&request.profile.base_url),
            anthropic::headers(api_key),
        ),
    }
}

/// A typed error from an HTTP error response, in the provider's own format.
pub fn error_from_http(
    transport: Transport,
    status: u16,
    body: &str,
    retry_after_ms: Option<u64>,
) -> ProviderError {
    match transport {
        Transport::OpenAi => openai::error_from_http(status, body, retry_after_ms),
        Transport::Anthropic => anthropic::error_from_http(status, body, retry_after_ms),
    }
}

/// A success status whose body is one JSON document, not an event stream:
/// a server or proxy that ignores `stream: true`, or one that reports an
/// error with status 200. An error object is typed as its words say; any
/// other document is a protocol error (not retried: asking again gets the
/// same), never "the stream ended early", which would be retried for nothing.
pub fn json_instead_of_stream(transport: Transport, body: &str) -> ProviderError {
    let parsed = serde_json::from_str::<serde_json::Value>(body).ok();
    if let Some(err) = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .filter(|e| e.is_object())
    {
        return error_from_http(transport, status_of_error_object(err), body, None);
    }
    ProviderError::new(
        ErrorKind::ProviderProtocol,
        "The provider answered with one JSON document instead of a stream of events: it may not \
support streaming replies. Check the base URL and the provider type in Settings.",
        false,
    )
}

/// Turns response bytes into deltas and, at the end, a response.
#[derive(Debug)]
pub enum Decoder {
    OpenAi(openai::OpenAiDecoder),
    Anthropic(anthropic::AnthropicDecoder),
}

impl Decoder {
    /// A decoder that does not know where the request went: a response
    /// keeps nothing for replay (see [`Decoder::for_url`]).
    pub fn new(transport: Transport) -> Self {
        match transport {
            Transport::OpenAi => Decoder::OpenAi(openai::OpenAiDecoder::new()),
            Transport::Anthropic => Decoder::Anthropic(anthropic::AnthropicDecoder::new()),
        }
    }

    /// A decoder for the response to a request sent to `url`: what a
    /// response keeps for replay (an OpenAI-compatible server's Gemini
    /// thought signatures, DeepSeek's and Kimi's `reasoning_content`;
    /// Anthropic's thinking blocks) is bound to the URL's host and
    /// replayed to that host only.
    pub fn for_url(transport: Transport, url: &str) -> Self {
        match transport {
            Transport::OpenAi => Decoder::OpenAi(openai::OpenAiDecoder::with(
                openai::OpenAiStream::for_endpoint(url),
            )),
            Transport::Anthropic => Decoder::Anthropic(anthropic::AnthropicDecoder::with(
                anthropic::AnthropicStream::for_endpoint(url),
            )),
        }
    }

    /// Feed response bytes; returns deltas to show (dropped on an error, see
    /// [`Self::push_with`]).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<StreamEvent>, ProviderError> {
        match self {
            Decoder::OpenAi(d) => d.push(bytes),
            Decoder::Anthropic(d) => d.push(bytes),
        }
    }

    /// Feed response bytes, handing each delta to `on_delta` as it is decoded:
    /// when the bytes end in an error (a mid-stream error event), the deltas
    /// before it were still delivered.
    pub fn push_with(
        &mut self,
        bytes: &[u8],
        on_delta: &mut dyn FnMut(StreamEvent),
    ) -> Result<(), ProviderError> {
        match self {
            Decoder::OpenAi(d) => d.push_with(bytes, on_delta),
            Decoder::Anthropic(d) => d.push_with(bytes, on_delta),
        }
    }

    pub fn finish(self) -> Result<ProviderResponse, ProviderError> {
        match self {
            Decoder::OpenAi(d) => d.finish(),
            Decoder::Anthropic(d) => d.finish(),
        }
    }
}

/// The host (and port) of an endpoint or base URL, lowercased: what an
/// adapter's private data is bound to, and how a provider's own API is
/// told from a compatible server. Empty for a URL without one.
pub fn endpoint_host(url: &str) -> String {
    let url = url.trim();
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    crate::gatekeeper::authority_of(rest).to_ascii_lowercase()
}

/// Whether the API key saved in Settings may go with a request to
/// `target`, the base URL a run (or its title, or its compaction) started
/// with: only when Settings still name the same scheme, host and port
/// (`saved`). A run keeps the address it started with while the key is read
/// fresh for each request (keys rotate), so after the user saves another
/// provider's address and its key mid-run, the new key would otherwise go
/// to the old address. Not retryable: Continue starts a turn with the
/// current settings.
pub fn key_may_go_to(saved: &str, target: &str) -> Result<(), ProviderError> {
    let scheme = |url: &str| {
        url.trim()
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default()
    };
    if scheme(saved) == scheme(target) && endpoint_host(saved) == endpoint_host(target) {
        return Ok(());
    }
    Err(ProviderError::new(
        ErrorKind::EnvironmentDrift,
        format!(
            "Settings now name another provider address ({}) than the one this turn started with \
({}), so the saved API key was not sent there. Press Continue to go on with the current settings.",
            saved.trim(),
            target.trim()
        ),
        false,
    ))
}

/// What stands for the API key in an error's words ([`without_key`]).
pub const KEY_PLACEHOLDER: &str = "[your API key]";

/// The shortest key [`without_key`] looks for: a shorter one could be an
/// ordinary word of the message, and no provider issues one.
pub const MIN_HIDDEN_KEY_CHARS: usize = 8;

/// `error` with each occurrence of `api_key` in its message replaced by
/// [`KEY_PLACEHOLDER`]. A provider or a proxy in front of one may echo the
/// key it was sent (`401 {"error":{"message":"Invalid key sk-live-…"}}`),
/// and the message goes on into the run's events, IndexedDB and the
/// panel, where the key must never be. An empty key, or one shorter than
/// [`MIN_HIDDEN_KEY_CHARS`], is not looked for.
pub fn without_key(mut error: ProviderError, api_key: &str) -> ProviderError {
    let key = api_key.trim();
    if key.chars().count() >= MIN_HIDDEN_KEY_CHARS && error.message.contains(key) {
        error.message = error.message.replace(key, KEY_PLACEHOLDER);
    }
    error
}

/// [`endpoint_host`] without the port.
pub fn endpoint_hostname(url: &str) -> String {
    let host = endpoint_host(url);
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name.to_string(),
        _ => host,
    }
}

/// Per-request context that is true only at send time (never persisted).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DynamicContext {
    /// Milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The tab page tools would act on, if any: (title, url).
    pub tab: Option<(String, String)>,
}

/// `YYYY-MM-DD HH:MM UTC` for a Unix time in milliseconds.
pub fn format_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// Append the send-time context to the last user message of the outbound
/// view. The stored history never contains it.
pub fn add_dynamic_context(request: &mut ProviderRequest, context: &DynamicContext) {
    if let Some(text) = std::rc::Rc::make_mut(&mut request.messages)
        .iter_mut()
        .rev()
        .find_map(|m| match m {
            ChatMessage::User { text, .. } => Some(text),
            _ => None,
        })
    {
        text.push_str(&dynamic_note(context));
    }
}

/// What [`add_dynamic_context`] appends to the last user message.
pub fn dynamic_note(context: &DynamicContext) -> String {
    let mut note = format!("\n\n[Context at send time: {}", format_utc(context.now_ms));
    if let Some((title, url)) = &context.tab {
        // The title is written by the page: short, quoted, and labelled as such.
        let title: String = title.chars().filter(|c| !c.is_control()).take(80).collect();
        let title = title.replace('"', "'");
        note.push_str(&format!(
            "; current tab: {url} (page title, untrusted: \"{title}\")"
        ));
    }
    note.push(']');
    note
}

/// The text that stands in for the files of a user message a model without
/// vision cannot read (empty without such files).
pub fn attachment_placeholder(images: usize, documents: &[crate::model::DocumentData]) -> String {
    let mut left_out = Vec::new();
    if images > 0 {
        left_out.push(format!("{images} attached image(s)"));
    }
    if !documents.is_empty() {
        let names: Vec<&str> = documents.iter().map(|d| d.name.as_str()).collect();
        left_out.push(format!("the attached PDF(s) {}", names.join(", ")));
    }
    if left_out.is_empty() {
        return String::new();
    }
    format!(
        "\n[{} left out: this model has no vision, so it cannot see them.]",
        left_out.join(" and ")
    )
}

/// The text that stands in for images a model cannot see.
pub fn image_placeholder(count: usize) -> String {
    format!("\n[{count} image(s) omitted: this model has no vision. Use page_snapshot or read_page instead.]")
}

/// A decoded response's tool calls as `(id, name, arguments)`, for the
/// decoders' tests.
#[cfg(test)]
pub(crate) fn call_triples(
    response: Result<ProviderResponse, ProviderError>,
) -> Vec<(String, String, String)> {
    response
        .expect("the stream decodes")
        .tool_calls
        .into_iter()
        .map(|c| (c.id, c.name, c.arguments))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_key_goes_only_to_the_address_it_is_saved_for() {
        let ok = |saved: &str, target: &str| key_may_go_to(saved, target).is_ok();
        assert!(ok("https://api.openai.com/v1", "https://api.openai.com/v1"));
        // The path and letter case of the host do not move the key elsewhere.
        assert!(ok(
            "https://API.openai.com/v1/",
            " https://api.openai.com/v2"
        ));
        // Another host, port or scheme does.
        assert!(!ok(
            "https://api.openai.com/v1",
            "https://gateway.example/v1"
        ));
        assert!(!ok("http://127.0.0.1:8080/v1", "http://127.0.0.1:9090/v1"));
        assert!(!ok("https://llm.example/v1", "http://llm.example/v1"));
        let err =
            key_may_go_to("https://api.openai.com/v1", "https://gateway.example/v1").unwrap_err();
        assert_eq!(
            (err.kind, err.retryable),
            (ErrorKind::EnvironmentDrift, false)
        );
        assert!(
            err.message.contains("https://gateway.example/v1"),
            "{}",
            err.message
        );
        assert!(err.message.contains("was not sent"), "{}", err.message);
    }

    #[test]
    fn an_api_key_echoed_in_an_error_message_is_replaced_before_it_goes_on() {
        let key = "sk-live-0123456789abcdef";
        let echoed = |message: &str| ProviderError::new(ErrorKind::Auth, message, false);
        // A proxy's 401 that quotes the key it was sent, twice.
        let error = without_key(
            echoed(&format!(
                "HTTP 401: Invalid key {key}. The key {key} is not valid."
            )),
            key,
        );
        assert_eq!(
            error,
            ProviderError::new(
                ErrorKind::Auth,
                "HTTP 401: Invalid key [your API key]. The key [your API key] is not valid.",
                false
            )
        );
        // The key as saved with blanks around it is looked for without them.
        let error = without_key(
            echoed(&format!("Bearer {key} refused")),
            &format!(" {key}\n"),
        );
        assert_eq!(error.message, "Bearer [your API key] refused");
        // Everything else about the error is kept.
        let mut limited =
            ProviderError::new(ErrorKind::RateLimited, format!("slow down, {key}"), true);
        limited.retry_after_ms = Some(1500);
        let error = without_key(limited, key);
        assert_eq!(
            (
                error.kind,
                error.retryable,
                error.retry_after_ms,
                error.message.as_str()
            ),
            (
                ErrorKind::RateLimited,
                true,
                Some(1500),
                "slow down, [your API key]"
            )
        );
        // No key, or one too short to tell from a word, is not looked for.
        for short in ["", "key", "sk-1234"] {
            let message = "the key sk-1234 is wrong";
            assert_eq!(
                without_key(echoed(message), short).message,
                message,
                "{short:?}"
            );
        }
        assert_eq!(
            without_key(echoed("Invalid key"), key).message,
            "Invalid key"
        );
    }

    #[test]
    fn deltas_before_an_error_in_the_same_bytes_are_delivered() {
        let openai = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Partial\"},\"finish_reason\":null}]}\n\n",
            "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
        );
        let anthropic = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Partial\"}}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        );
        for (transport, bytes) in [
            (Transport::OpenAi, openai),
            (Transport::Anthropic, anthropic),
        ] {
            let mut decoder = Decoder::new(transport);
            let mut deltas = Vec::new();
            let err = decoder
                .push_with(bytes.as_bytes(), &mut |d| deltas.push(d))
                .unwrap_err();
            assert_eq!(
                deltas,
                vec![StreamEvent::TextDelta("Partial".into())],
                "{transport:?}"
            );
            assert_eq!(err.kind, ErrorKind::ProviderUnavailable, "{transport:?}");
            assert!(err.retryable);
        }
    }

    #[test]
    fn utc_formatting_matches_known_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00 UTC");
        assert_eq!(format_utc(1_796_016_600_000), "2026-11-30 05:30 UTC");
    }

    #[test]
    fn dynamic_context_goes_to_the_last_user_message_only() {
        let mut request = ProviderRequest {
            lineage: None,
            profile: Default::default(),
            system: Default::default(),
            messages: vec![
                ChatMessage::user("first"),
                ChatMessage::user("second"),
                ChatMessage::ToolResult {
                    call_id: "c".into(),
                    content: "r".into(),
                    is_error: false,
                    images: vec![],
                },
            ]
            .into(),
            tools: Default::default(),
        };
        add_dynamic_context(
            &mut request,
            &DynamicContext {
                now_ms: 0,
                tab: Some(("Shop".into(), "https://shop.example/".into())),
            },
        );
        assert_eq!(request.messages[0], ChatMessage::user("first"));
        match &request.messages[1] {
            ChatMessage::User { text, .. } => {
                assert!(text.starts_with("second\n\n[Context at send time: 1970-01-01 00:00 UTC"));
                assert!(
                    text.contains(
                        "current tab: https://shop.example/ (page title, untrusted: \"Shop\")"
                    ),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
