//! Anthropic Messages adapter (`POST /v1/messages`, `stream: true`).
//!
//! Owns: the request body (system prompt and tools in Anthropic's shape,
//! tool results as `tool_result` blocks in user turns, alternating roles),
//! assembling a streamed response from `message_start`,
//! `content_block_start/delta/stop`, `message_delta`, `message_stop`, `ping`
//! and mid-stream `error` events, and parsing error bodies.
//!
//! Thinking blocks and their signatures are provider-private: they are kept
//! in `ProviderResponse::private` under the `"anthropic"` key, bound to the
//! endpoint's host, replayed only to that host (see [`build_body`]), and
//! never shown to other providers.
//!
//! Must not: do IO.

use serde_json::{json, Map, Value};

use super::sse::SseEvent;
use super::{
    error_from_status, ChatMessage, ProviderError, ProviderRequest, ProviderResponse, RawToolCall,
    StreamEvent,
};
use crate::model::{StopReason, Usage};
use crate::protocol::ErrorKind;
use crate::vecmap::VecMap;

/// API version header value.
pub const API_VERSION: &str = "2023-06-01";
/// Anthropic requires `max_tokens`; used when the settings leave it empty.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The key under which this adapter keeps provider-private data.
pub const PRIVATE_KEY: &str = "anthropic";

/// `…/messages` under the base URL (usually `https://api.anthropic.com/v1`).
pub fn endpoint(base_url: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    if base.ends_with("/messages") {
        base.to_string()
    } else {
        format!("{base}/messages")
    }
}

/// Request headers, including the one that allows calls from a browser context.
pub fn headers(api_key: &str) -> Vec<(String, String)> {
    let mut h = vec![
        ("anthropic-version".to_string(), API_VERSION.to_string()),
        (
            "anthropic-dangerous-direct-browser-access".to_string(),
            "true".to_string(),
        ),
    ];
    if !api_key.is_empty() {
        h.push(("x-api-key".to_string(), api_key.to_string()));
    }
    h
}

/// Push content blocks into the last message if it has `role`, else start one
/// (Anthropic requires user and assistant turns to alternate).
fn push_blocks(messages: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = messages.last_mut() {
        if last["role"] == role {
            if let Some(content) = last["content"].as_array_mut() {
                content.extend(blocks);
                return;
            }
        }
    }
    messages.push(json!({ "role": role, "content": blocks }));
}

/// A tool call's id as Anthropic takes it (`^[a-zA-Z0-9_-]+$`, at most 64
/// characters here). Ids another provider
/// chose earlier in the thread (Kimi's `functions.click:0`, a server's
/// dotted ids) would make every later request a 400 after a switch to
/// Anthropic: such an id is sent as `id_` and a digest of it, the same for
/// the call and its result, different for different ids.
fn wire_id(id: &str) -> std::borrow::Cow<'_, str> {
    let fits = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if fits {
        return std::borrow::Cow::Borrowed(id);
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    std::borrow::Cow::Owned(format!("id_{}", crate::tools::hex(&digest[..12])))
}

/// An image as a content block.
fn image_block(image: &crate::model::ImageData) -> Value {
    json!({ "type": "image", "source": { "type": "base64", "media_type": image.media_type, "data": image.data } })
}

/// The JSON body of a streaming Messages request. An assistant message's
/// thinking blocks go back only to the host that streamed them (see
/// [`own_thinking`]); to any other the message goes without them, as a
/// turn another provider wrote does.
pub fn build_body(request: &ProviderRequest) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    let host = super::endpoint_host(&request.profile.base_url);
    for message in request.messages.iter() {
        match message {
            ChatMessage::User {
                text,
                images,
                documents,
            } => {
                let mut blocks = Vec::with_capacity(images.len() + documents.len() + 1);
                let mut text = std::borrow::Cow::Borrowed(text.as_str());
                if request.profile.vision {
                    // Files first, then the text about them (Anthropic's advice).
                    blocks.extend(documents.iter().map(|d| {
                        json!({ "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": d.data }, "title": d.name })
                    }));
                    blocks.extend(images.iter().map(image_block));
                } else {
                    let note = super::attachment_placeholder(images.len(), documents);
                    if !note.is_empty() {
                        text = std::borrow::Cow::Owned(format!("{text}{note}"));
                    }
                }
                // A message of files only has no (blank) text block:
                // Anthropic refuses one.
                if !text.trim().is_empty() || blocks.is_empty() {
                    blocks.push(json!({ "type": "text", "text": text }));
                }
                push_blocks(&mut messages, "user", blocks);
            }
            ChatMessage::Assistant {
                text,
                tool_calls,
                private,
            } => {
                let mut blocks = Vec::new();
                if let Some(thinking) = own_thinking(private.as_ref(), &host) {
                    blocks.extend(thinking.iter().cloned());
                }
                // Anthropic refuses a blank text block (an interrupted
                // reply may have streamed only line breaks).
                if !text.trim().is_empty() {
                    blocks.push(json!({ "type": "text", "text": text }));
                }
                for call in tool_calls {
                    let input = if call.arguments.is_object() {
                        call.arguments.clone()
                    } else {
                        json!({})
                    };
                    blocks.push(json!({ "type": "tool_use", "id": wire_id(&call.id), "name": call.name, "input": input }));
                }
                if blocks.is_empty() {
                    // An empty assistant turn is invalid; keep the alternation explicit.
                    blocks.push(json!({ "type": "text", "text": "(no text)" }));
                }
                push_blocks(&mut messages, "assistant", blocks);
            }
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
                images,
            } => {
                let content = if images.is_empty() {
                    json!(content)
                } else if request.profile.vision {
                    // A tool that returned only an image has no (blank)
                    // text block: Anthropic refuses one, and the refusal
                    // would stay in the thread's every later request.
                    let mut parts = Vec::with_capacity(images.len() + 1);
                    if !content.trim().is_empty() {
                        parts.push(json!({ "type": "text", "text": content }));
                    }
                    parts.extend(images.iter().map(image_block));
                    Value::Array(parts)
                } else {
                    json!(format!(
                        "{content}{}",
                        super::image_placeholder(images.len())
                    ))
                };
                push_blocks(
                    &mut messages,
                    "user",
                    vec![
                        json!({ "type": "tool_result", "tool_use_id": wire_id(call_id), "content": content, "is_error": is_error }),
                    ],
                )
            }
        }
    }
    let mut body = json!({
        "model": request.profile.model,
        "max_tokens": request.profile.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
        "stream": true,
    });
    if !request.system.is_empty() {
        body["system"] = json!(request.system);
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.parameters }))
            .collect();
    }
    if let Some(t) = request.profile.temperature_centi {
        body["temperature"] = json!((f64::from(t) / 100.0).min(1.0));
    }
    if caches_prompt(request) {
        body["cache_control"] = json!({ "type": "ephemeral" });
    }
    body
}

/// The thinking blocks of an assistant message, if the endpoint `host`
/// streamed them. Decisions:
/// - Another host's are never sent: a user may point the profile at
///   another server (a gateway, a proxy) in the middle of a thread, and
///   the thinking is that conversation's own text; its signatures would
///   not check there either. Anthropic takes an assistant turn without
///   its thinking (this adapter does not turn thinking on; with it on,
///   only the turn in progress, a tool use awaiting its results, would
///   need its own), so the request stays valid: the turn reads as one
///   another provider wrote.
/// - Blocks kept before the host was recorded (no `endpoint`) are not
///   sent to any host: where they came from cannot be told, and leaving
///   them out is always accepted, so the safe choice costs nothing but
///   the model's view of its earlier reasoning in old threads.
fn own_thinking<'a>(private: Option<&'a Value>, host: &str) -> Option<&'a Vec<Value>> {
    let own = private.and_then(|p| p.get(PRIVATE_KEY))?;
    let bound = own.get("endpoint").and_then(Value::as_str);
    if host.is_empty() || bound != Some(host) {
        return None;
    }
    own.get("thinking").and_then(Value::as_array)
}

/// Whether a request asks for Anthropic's automatic prompt caching (one
/// `cache_control` at the top: the cache breakpoint goes on the last
/// block and moves forward as the conversation grows), so each step of a
/// run reads the steps before it from the cache (a tenth of the price)
/// instead of paying for the whole conversation again. Decisions:
/// - Anthropic's own API only (`api.anthropic.com`): a server that merely
///   speaks the format may refuse the unknown field.
/// - Requests that offer tools only: a run's steps, whose next step
///   extends this one. A request without tools (a title, a compaction's
///   summary, the failure breaker's last step) is not extended by another,
///   and writing it to the cache costs a quarter more than reading it.
/// - A prompt shorter than the model's minimum (1,024 tokens or more) is
///   simply not cached.
pub fn caches_prompt(request: &ProviderRequest) -> bool {
    !request.tools.is_empty()
        && super::endpoint_hostname(&request.profile.base_url) == "api.anthropic.com"
}

#[derive(Debug)]
enum Block {
    Text,
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(Value),
    Other,
}

/// Assembles one streamed Messages response.
#[derive(Debug, Default)]
pub struct AnthropicStream {
    text: String,
    reasoning: String,
    /// Content blocks by index, in the order they started (a handful per
    /// response).
    blocks: VecMap<u64, Block>,
    stop_reason: Option<String>,
    usage: Usage,
    saw_usage: bool,
    model: String,
    stopped: bool,
    /// The host the request went to ([`super::endpoint_host`]); empty:
    /// unknown, and no thinking is kept for replay.
    endpoint: String,
}

fn protocol_error(message: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::ProviderProtocol, message, true)
}

impl AnthropicStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream answering a request sent to `url`: the thinking it keeps
    /// for replay is bound to its host.
    pub fn for_endpoint(url: &str) -> Self {
        Self {
            endpoint: super::endpoint_host(url),
            ..Self::default()
        }
    }

    /// Feed one SSE event; returns deltas to show.
    pub fn on_event(&mut self, event: &SseEvent) -> Result<Vec<StreamEvent>, ProviderError> {
        if event.data.trim().is_empty() {
            return Ok(Vec::new());
        }
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            protocol_error(format!("The provider sent an event that is not JSON: {e}"))
        })?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str())
            .to_string();
        let mut out = Vec::new();
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind.as_str() {
            "message_start" => {
                let message = &data["message"];
                if let Some(m) = message.get("model").and_then(Value::as_str) {
                    self.model = m.to_string();
                }
                self.read_usage(&message["usage"]);
            }
            "content_block_start" => {
                let block = &data["content_block"];
                let b = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = block
                            .get("text")
                            .and_then(Value::as_str)
                            .filter(|t| !t.is_empty())
                        {
                            self.text.push_str(t);
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: block
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        name: block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        json: String::new(),
                    },
                    Some("thinking") => Block::Thinking {
                        thinking: block
                            .get("thinking")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        signature: block
                            .get("signature")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    },
                    Some("redacted_thinking") => Block::Redacted(block.clone()),
                    _ => Block::Other,
                };
                self.blocks.insert(index, b);
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                let block = self.blocks.get_mut(&index).ok_or_else(|| {
                    protocol_error(format!("delta for unknown content block {index}"))
                })?;
                match (delta.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), _) => {
                        let t = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        if !t.is_empty() {
                            self.text.push_str(t);
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                    }
                    (Some("input_json_delta"), Block::ToolUse { json, .. }) => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    (Some("thinking_delta"), Block::Thinking { thinking, .. }) => {
                        let t = delta.get("thinking").and_then(Value::as_str).unwrap_or("");
                        thinking.push_str(t);
                        if !t.is_empty() {
                            self.reasoning.push_str(t);
                            out.push(StreamEvent::ReasoningDelta(t.to_string()));
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                        signature
                            .push_str(delta.get("signature").and_then(Value::as_str).unwrap_or(""));
                    }
                    _ => {}
                }
            }
            "content_block_stop" | "ping" => {}
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                self.read_usage(&data["usage"]);
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let err = &data["error"];
                return Err(error_from_type(
                    err.get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("api_error"),
                    err.get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error"),
                    None,
                ));
            }
            _ => {} // unknown event types are ignored, as the API asks
        }
        Ok(out)
    }

    fn read_usage(&mut self, usage: &Value) {
        if !usage.is_object() {
            return;
        }
        let get = |k: &str| usage.get(k).and_then(Value::as_u64);
        // message_delta carries cumulative counts; message_start the prompt side.
        if let Some(v) = get("input_tokens") {
            self.usage.input = v;
        }
        if let Some(v) = get("output_tokens") {
            self.usage.output = v;
        }
        if let Some(v) = get("cache_read_input_tokens") {
            self.usage.cache_read = v;
        }
        if let Some(v) = get("cache_creation_input_tokens") {
            self.usage.cache_write = v;
        }
        self.saw_usage = true;
    }

    /// The stream ended: assemble the response or report a truncated stream.
    pub fn finish(self) -> Result<ProviderResponse, ProviderError> {
        let Some(reason) = self.stop_reason else {
            return Err(ProviderError::new(
                ErrorKind::Network,
                "The provider's stream ended before the response was complete.",
                true,
            ));
        };
        let stop_reason = match reason.as_str() {
            "end_turn" | "stop_sequence" | "pause_turn" => StopReason::End,
            "tool_use" => StopReason::ToolUse,
            "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
            "refusal" => StopReason::ContentFilter,
            other => {
                return Err(protocol_error(format!(
                    "The provider sent an unknown stop_reason {other:?}."
                )))
            }
        };
        let mut tool_calls = Vec::new();
        let mut thinking = Vec::new();
        for (_, block) in self.blocks {
            match block {
                Block::ToolUse { id, name, json } => tool_calls.push(RawToolCall {
                    id,
                    name,
                    arguments: if json.trim().is_empty() {
                        "{}".into()
                    } else {
                        json
                    },
                }),
                Block::Thinking {
                    thinking: t,
                    signature,
                } => thinking
                    .push(json!({ "type": "thinking", "thinking": t, "signature": signature })),
                Block::Redacted(v) => thinking.push(v),
                _ => {}
            }
        }
        // Kept with the host that streamed it, and only with one: thinking
        // whose host is unknown could never be replayed (see
        // [`own_thinking`]).
        let private = (!thinking.is_empty() && !self.endpoint.is_empty()).then(|| {
            let mut m = Map::new();
            m.insert(
                PRIVATE_KEY.into(),
                json!({ "thinking": thinking, "endpoint": self.endpoint }),
            );
            Value::Object(m)
        });
        Ok(ProviderResponse {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls,
            stop_reason,
            // Anthropic's input_tokens leaves out the cached part of the
            // prompt; the engine's `input` is the whole prompt (OpenAI's
            // prompt_tokens), what its context-size calibration compares.
            usage: self.saw_usage.then(|| Usage {
                input: self.usage.input + self.usage.cache_read + self.usage.cache_write,
                ..self.usage
            }),
            model: self.model,
            private,
        })
    }
}

/// Map an Anthropic error type (and HTTP status when known) to a typed error.
pub fn error_from_type(kind: &str, message: &str, retry_after_ms: Option<u64>) -> ProviderError {
    let status = super::status_of_error_words(&[kind]).unwrap_or(400);
    error_from_status(status, message, &[kind], retry_after_ms)
}

/// Parse an HTTP error body (`{"type":"error","error":{"type":…,"message":…}}`).
pub fn error_from_http(status: u16, body: &str, retry_after_ms: Option<u64>) -> ProviderError {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str))
        .map(str::to_string)
        .unwrap_or_else(|| body.chars().take(300).collect());
    let words: Vec<&str> = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/type").and_then(Value::as_str))
        .into_iter()
        .collect();
    error_from_status(status, &message, &words, retry_after_ms)
}

/// SSE parsing plus event assembly.
pub type AnthropicDecoder = super::SseDecoder<AnthropicStream>;

impl super::Assembler for AnthropicStream {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<StreamEvent>, ProviderError> {
        AnthropicStream::on_event(self, event)
    }

    fn finish(self) -> Result<ProviderResponse, ProviderError> {
        AnthropicStream::finish(self)
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
