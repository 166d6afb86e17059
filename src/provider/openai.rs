//! OpenAI chat-completions adapter (also OpenRouter, Ollama, LM Studio, vLLM,
//! llama.cpp server: anything OpenAI-compatible).
//!
//! Owns: the request body, the endpoint URL, assembling a streamed response
//! from `chat.completion.chunk` events (text, reasoning, tool-call fragments
//! keyed by `index`, `finish_reason`, the usage chunk), and error bodies.
//!
//! Per-response data some servers need back is provider-private
//! (`ProviderResponse::private`, under the `"openai"` key, bound to the
//! endpoint's host): a tool call's `extra_content` (Gemini's thought
//! signature), and the `reasoning_content` of a reply with tool calls
//! (DeepSeek's and Kimi's thinking modes refuse a later request without
//! it). It is replayed only to the host that sent it, never to another
//! provider (see [`build_body`]).
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

/// The key under which this adapter keeps provider-private data.
pub const PRIVATE_KEY: &str = "openai";

/// The reasoning field replayed, to the host that streamed it, on an
/// assistant message with tool calls, and on the answer that ends a user
/// turn in which tools were called. DeepSeek (thinking mode) wants it back
/// on every assistant message between two user messages when tools were
/// called between them (its answer included), in every later request, and
/// refuses a request whose tool-calling messages lack it; it ignores it on
/// a turn without tools, which therefore goes without. Kimi refuses the
/// same; llama.cpp and vLLM read it. Reasoning streamed as `reasoning` (OpenRouter, Ollama,
/// Groq) is not replayed: no server needs it back, and Groq refuses it
/// for a model without reasoning.
const REPLAYED_REASONING: &str = "reasoning_content";

/// Whether the endpoint is OpenAI's own API, which gets the output limit
/// as `max_completion_tokens`. Decision: its o-series and gpt-5 models
/// refuse `max_tokens` ("Unsupported parameter … Use
/// 'max_completion_tokens' instead") and every current model there takes
/// `max_completion_tokens`; compatible servers (Ollama, vLLM, llama.cpp,
/// gateways) often know only `max_tokens`, so they keep it. Decided by
/// host: `api.openai.com` and its regional hosts (`eu.api.openai.com`).
pub fn takes_max_completion_tokens(base_url: &str) -> bool {
    let host = super::endpoint_hostname(base_url);
    host == "api.openai.com" || host.ends_with(".api.openai.com")
}

/// `…/chat/completions` under the configured base URL (which usually ends in `/v1`).
pub fn endpoint(base_url: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    if base.ends_with("/chat/completions") {
        base.to_string()
    } else {
        format!("{base}/chat/completions")
    }
}

/// An image as a content part.
fn image_part(image: &crate::model::ImageData) -> Value {
    json!({ "type": "image_url", "image_url": { "url": image.data_url() } })
}

/// The JSON body of a streaming chat-completions request.
pub fn build_body(request: &ProviderRequest) -> Value {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        messages.push(json!({ "role": "system", "content": request.system }));
    }
    let mut pending_images: Vec<(String, crate::model::ImageData)> = Vec::new();
    let host = super::endpoint_host(&request.profile.base_url);
    // Whether tools were called since the last user message: the answer
    // then gets its reasoning back too (REPLAYED_REASONING).
    let mut turn_used_tools = false;
    for (position, message) in request.messages.iter().enumerate() {
        match message {
            ChatMessage::User { .. } => turn_used_tools = false,
            ChatMessage::ToolResult { .. } => turn_used_tools = true,
            ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                turn_used_tools = true
            }
            ChatMessage::Assistant { .. } => {}
        }
        messages.push(match message {
            ChatMessage::User {
                text,
                images,
                documents,
            } if images.is_empty() && documents.is_empty() => {
                json!({ "role": "user", "content": text })
            }
            ChatMessage::User {
                text,
                images,
                documents,
            } if request.profile.vision => {
                // A message of files only has no (blank) text part.
                let mut parts: Vec<Value> = (!text.trim().is_empty())
                    .then(|| json!({ "type": "text", "text": text }))
                    .into_iter()
                    .collect();
                parts.extend(images.iter().map(image_part));
                parts.extend(documents.iter().map(|d| {
                    json!({ "type": "file", "file": { "filename": d.name, "file_data": format!("data:application/pdf;base64,{}", d.data) } })
                }));
                json!({ "role": "user", "content": parts })
            }
            ChatMessage::User {
                text,
                images,
                documents,
            } => {
                let note = super::attachment_placeholder(images.len(), documents);
                json!({ "role": "user", "content": format!("{text}{note}") })
            }
            ChatMessage::Assistant {
                text,
                tool_calls,
                private,
            } => {
                let mut m = json!({ "role": "assistant", "content": if text.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(text.clone()) } });
                if !tool_calls.is_empty() {
                    let replay = own_private(private.as_ref(), &host);
                    let extras = replay
                        .and_then(|p| p.get("tool_calls"))
                        .and_then(Value::as_array);
                    m["tool_calls"] = tool_calls
                        .iter()
                        .enumerate()
                        .map(|(position, c)| {
                            let mut call = json!({
                                "id": c.id,
                                "type": "function",
                                "function": { "name": c.name, "arguments": c.arguments.to_string() },
                            });
                            // Keyed by the call's position among the
                            // message's calls (the engine may replace its
                            // id), checked by its name.
                            if let Some(extra) = extras
                                .and_then(|e| e.get(position))
                                .filter(|e| e.get("name").and_then(Value::as_str) == Some(&c.name))
                                .and_then(|e| e.get("extra_content"))
                            {
                                call["extra_content"] = extra.clone();
                            }
                            call
                        })
                        .collect();
                    if let Some(reasoning) = replay.and_then(|p| p.get(REPLAYED_REASONING)) {
                        m[REPLAYED_REASONING] = reasoning.clone();
                    }
                } else if turn_used_tools {
                    if let Some(reasoning) = own_private(private.as_ref(), &host)
                        .and_then(|p| p.get(REPLAYED_REASONING))
                    {
                        m[REPLAYED_REASONING] = reasoning.clone();
                    }
                }
                m
            }
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
                images,
            } => {
                let mut content = if *is_error {
                    format!("Error: {content}")
                } else {
                    content.to_string()
                };
                if !images.is_empty() {
                    if request.profile.vision {
                        content.push_str("\n[The image is attached in the next message.]");
                        pending_images.extend(images.iter().map(|i| (call_id.clone(), i.clone())));
                    } else {
                        content.push_str(&super::image_placeholder(images.len()));
                    }
                }
                json!({ "role": "tool", "tool_call_id": call_id, "content": content })
            }
        });
        // Tool messages cannot carry images: after the last result of a
        // group, one user message brings the images along.
        let next_is_result = matches!(
            request.messages.get(position + 1),
            Some(ChatMessage::ToolResult { .. })
        );
        if !next_is_result && !pending_images.is_empty() {
            let mut parts =
                vec![json!({ "type": "text", "text": "Images returned by the tool calls above:" })];
            for (call_id, image) in pending_images.drain(..) {
                parts.push(json!({ "type": "text", "text": format!("From {call_id}:") }));
                parts.push(image_part(&image));
            }
            messages.push(json!({ "role": "user", "content": parts }));
        }
    }
    let mut body = json!({
        "model": request.profile.model,
        "messages": messages,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": { "name": t.name, "description": t.description, "parameters": t.parameters },
                })
            })
            .collect();
    }
    if let Some(max) = request.profile.max_output_tokens {
        let field = if takes_max_completion_tokens(&request.profile.base_url) {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body[field] = json!(max);
    }
    if let Some(t) = request.profile.temperature_centi {
        body["temperature"] = json!(f64::from(t) / 100.0);
    }
    body
}

/// This adapter's private data of an assistant message, if it was made by
/// the endpoint `host` (another host's, or another provider's, is never
/// sent: a user may switch provider in the middle of a thread).
fn own_private<'a>(private: Option<&'a Value>, host: &str) -> Option<&'a Map<String, Value>> {
    private
        .and_then(|p| p.get(PRIVATE_KEY))
        .and_then(Value::as_object)
        .filter(|p| !host.is_empty() && p.get("endpoint").and_then(Value::as_str) == Some(host))
}

#[derive(Debug, Default)]
struct PartialCall {
    /// The call's `index` on the wire (its place among the response's
    /// calls); for a server that sends none, its arrival number.
    order: u64,
    id: String,
    name: String,
    arguments: String,
    /// The call's `extra_content` (Gemini: `{"google":{"thought_signature"}}`).
    extra: Option<Value>,
}

impl PartialCall {
    /// Whether the call reads as whole: a name, and arguments that are
    /// empty or one JSON object.
    fn is_whole(&self) -> bool {
        !self.name.is_empty()
            && (self.arguments.trim().is_empty()
                || serde_json::from_str::<Value>(&self.arguments).is_ok_and(|v| v.is_object()))
    }
}

/// Assembles one streamed response.
#[derive(Debug, Default)]
pub struct OpenAiStream {
    text: String,
    reasoning: String,
    /// Tool calls in arrival order of their first fragment (sorted by
    /// `order` at the end).
    calls: Vec<PartialCall>,
    /// The call a wire `index` currently continues (position in `calls`).
    by_index: VecMap<u64, usize>,
    /// The call the last fragment went to: a fragment without `index`
    /// continues it unless it names another id.
    last_call: Option<usize>,
    /// The model refused (`delta.refusal`): its words are the text.
    refused: bool,
    finish: Option<String>,
    usage: Option<Usage>,
    model: String,
    done: bool,
    /// The host the request went to ([`super::endpoint_host`]); empty: unknown,
    /// and nothing is kept for replay.
    endpoint: String,
    /// The server streamed `reasoning_content` (even empty or null): it
    /// knows the field, and a reply with tool calls gets it back.
    reasoning_content: bool,
}

impl OpenAiStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream answering a request sent to `url`: what the response keeps
    /// for replay is bound to its host.
    pub fn for_endpoint(url: &str) -> Self {
        Self {
            endpoint: super::endpoint_host(url),
            ..Self::default()
        }
    }

    /// Feed one SSE event; returns deltas to show.
    pub fn on_event(&mut self, event: &SseEvent) -> Result<Vec<StreamEvent>, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            ProviderError::new(
                ErrorKind::ProviderProtocol,
                format!("The provider sent a stream chunk that is not JSON: {e}"),
                true,
            )
        })?;
        if let Some(err) = chunk.get("error") {
            return Err(stream_error(err));
        }
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            if self.model.is_empty() {
                self.model = model.to_string();
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(parse_usage(usage));
        }
        let mut out = Vec::new();
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return Ok(out);
        };
        for choice in choices {
            // Only the first choice is used (we never ask for n > 1).
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.get("delta") {
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    if !text.is_empty() {
                        self.text.push_str(text);
                        out.push(StreamEvent::TextDelta(text.to_string()));
                    }
                }
                // A refusal (OpenAI's structured refusals) is what the
                // user reads: shown as text, and the turn ends as filtered.
                if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                    if !text.is_empty() {
                        self.refused = true;
                        self.text.push_str(text);
                        out.push(StreamEvent::TextDelta(text.to_string()));
                    }
                }
                // Servers name reasoning one way or the other; one that sent
                // both would otherwise show it twice.
                let reasoning = ["reasoning_content", "reasoning"]
                    .iter()
                    .find_map(|key| delta.get(*key).and_then(Value::as_str));
                if delta
                    .get(REPLAYED_REASONING)
                    .is_some_and(|v| v.is_string() || v.is_null())
                {
                    self.reasoning_content = true;
                }
                if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
                    self.reasoning.push_str(text);
                    out.push(StreamEvent::ReasoningDelta(text.to_string()));
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for call in calls {
                        self.on_call_fragment(call);
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(reason.to_string());
            }
        }
        Ok(out)
    }

    /// One `tool_calls[]` fragment. OpenAI sends a call's `id` and name in
    /// its first fragment and only argument text after, each with the
    /// call's `index`. Compatible servers differ, and each difference
    /// otherwise merges calls into one that does not exist:
    /// - the whole name again in every fragment (NIM, Fireworks): a name
    ///   equal to the one held is not appended again;
    /// - no `index`, or index 0 for every call, one call per chunk (Gemini's
    ///   compatible API): a fragment naming an id other than the one its
    ///   index (or, without one, the last fragment) went to starts a new call.
    fn on_call_fragment(&mut self, call: &Value) {
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let index = call.get("index").and_then(Value::as_u64);
        let current = match index {
            Some(index) => self.by_index.get(&index).copied(),
            None => self.last_call,
        };
        let position = match current {
            Some(p)
                if id.is_none_or(|id| self.calls[p].id.is_empty() || self.calls[p].id == id) =>
            {
                p
            }
            _ => {
                let order = index.unwrap_or(self.calls.len() as u64);
                self.calls.push(PartialCall {
                    order,
                    ..Default::default()
                });
                let p = self.calls.len() - 1;
                if let Some(index) = index {
                    self.by_index.insert(index, p);
                }
                p
            }
        };
        self.last_call = Some(position);
        let entry = &mut self.calls[position];
        if let Some(id) = id {
            if entry.id.is_empty() {
                entry.id = id.to_string();
            }
        }
        if let Some(function) = call.get("function") {
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                if entry.name != name {
                    entry.name.push_str(name);
                }
            }
            if let Some(args) = function.get("arguments").and_then(Value::as_str) {
                entry.arguments.push_str(args);
            }
        }
        if let Some(extra) = call.get("extra_content").filter(|e| e.is_object()) {
            entry.extra = Some(extra.clone());
        }
    }

    /// What this response keeps for replay to the same host (see
    /// [`build_body`]), for its final `calls`: none without a known host.
    fn private(&self, calls: &[PartialCall]) -> Option<Value> {
        if self.endpoint.is_empty() || (calls.is_empty() && !self.reasoning_content) {
            return None;
        }
        let mut kept = Map::new();
        if calls.iter().any(|c| c.extra.is_some()) {
            // By position among the calls (what survives the engine's id
            // normalization), with the name to check it against.
            let entries = calls
                .iter()
                .map(|c| {
                    let mut e = Map::new();
                    e.insert("name".into(), Value::String(c.name.clone()));
                    if let Some(extra) = &c.extra {
                        e.insert("extra_content".into(), extra.clone());
                    }
                    Value::Object(e)
                })
                .collect();
            kept.insert("tool_calls".into(), Value::Array(entries));
        }
        if self.reasoning_content {
            kept.insert(
                REPLAYED_REASONING.into(),
                Value::String(self.reasoning.clone()),
            );
        }
        if kept.is_empty() {
            return None;
        }
        kept.insert("endpoint".into(), Value::String(self.endpoint.clone()));
        let mut private = Map::new();
        private.insert(PRIVATE_KEY.into(), Value::Object(kept));
        Some(Value::Object(private))
    }

    /// The stream ended: assemble the response or report a truncated stream.
    pub fn finish(mut self) -> Result<ProviderResponse, ProviderError> {
        let Some(finish) = self.finish.take() else {
            return Err(ProviderError::new(
                ErrorKind::Network,
                "The provider's stream ended before the response was complete.",
                true,
            ));
        };
        let mut calls = std::mem::take(&mut self.calls);
        calls.retain(|c| !c.name.is_empty() || !c.arguments.is_empty() || !c.id.is_empty());
        let stop_reason = match finish.as_str() {
            // Some compatible servers (Gemini's, older Ollama) end a reply
            // of tool calls with "stop". Calls that are all whole (a name,
            // arguments that parse) were not cut off, so they are what the
            // model meant to call; anything else stays End and fails closed
            // in the engine (tool_call_ids_normalized).
            "stop" | "end_turn" if !calls.is_empty() && calls.iter().all(PartialCall::is_whole) => {
                StopReason::ToolUse
            }
            "stop" | "end_turn" if self.refused => StopReason::ContentFilter,
            "stop" | "end_turn" => StopReason::End,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "length" => StopReason::MaxTokens,
            "content_filter" => StopReason::ContentFilter,
            other => {
                return Err(ProviderError::new(
                    ErrorKind::ProviderProtocol,
                    format!("The provider sent an unknown finish_reason {other:?}."),
                    false,
                ))
            }
        };
        crate::sorting::sort_by_key(&mut calls, |c| c.order);
        let private = self.private(&calls);
        Ok(ProviderResponse {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls: calls
                .into_iter()
                .map(|c| RawToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            stop_reason,
            usage: self.usage,
            model: self.model,
            private,
        })
    }
}

fn parse_usage(usage: &Value) -> Usage {
    let get = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input: get(usage.get("prompt_tokens")),
        output: get(usage.get("completion_tokens")),
        cache_read: get(usage.pointer("/prompt_tokens_details/cached_tokens")),
        cache_write: 0,
        reasoning: get(usage.pointer("/completion_tokens_details/reasoning_tokens")),
    }
}

/// An error object sent in the stream (`{"error":{"message","type","code"}}`):
/// its `code` is an HTTP status (OpenRouter) or a word (OpenAI), its `type`
/// a word; the words say what the status would have.
fn stream_error(err: &Value) -> ProviderError {
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("unknown error");
    let status = super::status_of_error_object(err);
    error_from_status(status, message, &super::error_words(err), None)
}

/// Parse an HTTP error body (`{"error":{"message":…}}`) into a typed error.
pub fn error_from_http(status: u16, body: &str, retry_after_ms: Option<u64>) -> ProviderError {
    let parsed = serde_json::from_str::<Value>(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.chars().take(300).collect());
    let words = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .map(super::error_words)
        .unwrap_or_default();
    error_from_status(status, &message, &words, retry_after_ms)
}

/// SSE parsing plus chunk assembly: what the driver feeds response bytes to.
pub type OpenAiDecoder = super::SseDecoder<OpenAiStream>;

impl super::Assembler for OpenAiStream {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<StreamEvent>, ProviderError> {
        OpenAiStream::on_event(self, event)
    }

    fn finish(self) -> Result<ProviderResponse, ProviderError> {
        OpenAiStream::finish(self)
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
