//! Request bodies built incrementally.
//!
//! Every step of a run sends the whole conversation again, and the history
//! only grows at its end. Encoding it from scratch each time made the body
//! cost grow with the thread (36 ms for a ~10,000-node thread natively). The
//! cache keeps the JSON text of each *group* of messages — a maximal run of
//! messages that becomes the same wire role, which is the unit both formats
//! encode independently (Anthropic merges a run of user text and tool results
//! into one `user` message; OpenAI attaches the images of a run of tool
//! results after its last one) — and re-encodes only the groups that differ
//! from the previous request at the same position. The result is byte for
//! byte the text `build_body(request).to_string()` gives (tested).

use serde_json::Value;

use super::{
    anthropic, dynamic_note, openai, ChatMessage, DynamicContext, ProviderRequest, Transport,
};

/// Stands in for the messages while the rest of the body is serialized.
/// The NUL makes it impossible in a prompt, a model name or a tool schema.
const PLACEHOLDER: &str = "sw-agent\u{0}messages";
/// How the placeholder looks in serialized JSON, with its key.
const PLACEHOLDER_JSON: &str = "\"messages\":\"sw-agent\\u0000messages\"";

/// The JSON text of the message groups of the last request.
#[derive(Debug, Default, Clone)]
pub struct BodyCache {
    /// What the cached texts depend on besides the messages themselves.
    key: Option<(Transport, bool)>,
    groups: Vec<(Vec<ChatMessage>, String)>,
    /// Groups taken from the cache / encoded, over the cache's life.
    pub reused: u64,
    pub encoded: u64,
}

impl BodyCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The body text of `request`.
    pub fn body(&mut self, request: &ProviderRequest) -> String {
        self.body_with(request, None)
    }

    /// The body text of `request` with the send-time `context` appended to
    /// its last user message (as `add_dynamic_context` does).
    pub fn body_with(
        &mut self,
        request: &ProviderRequest,
        context: Option<&DynamicContext>,
    ) -> String {
        let noted = context.and_then(|c| {
            let at = request
                .messages
                .iter()
                .rposition(|m| matches!(m, ChatMessage::User { .. }))?;
            Some((at, dynamic_note(c)))
        });
        let transport = Transport::from_kind(&request.profile.kind);
        let key = (transport, request.profile.vision);
        if self.key != Some(key) {
            self.groups.clear();
            self.key = Some(key);
        }
        // Everything but the conversation: model, system, tools, options.
        let head = ProviderRequest {
            profile: request.profile.clone(),
            system: request.system.clone(),
            messages: Default::default(),
            tools: request.tools.clone(),
        };
        let mut body = build(transport, &head);
        let leading: Vec<String> = match body.get_mut("messages").map(Value::take) {
            // OpenAI carries the system prompt as the first message.
            Some(Value::Array(leading)) => leading.iter().map(Value::to_string).collect(),
            _ => Vec::new(),
        };
        body["messages"] = Value::String(PLACEHOLDER.to_string());

        let mut previous = std::mem::take(&mut self.groups).into_iter();
        let messages = &request.messages;
        let mut start = 0;
        while start < messages.len() {
            let role = wire_role(transport, &messages[start]);
            let end = messages[start..]
                .iter()
                .position(|m| wire_role(transport, m) != role)
                .map_or(messages.len(), |n| start + n);
            let mut group = std::borrow::Cow::Borrowed(&messages[start..end]);
            if let Some((at, note)) = noted.as_ref().filter(|(at, _)| (start..end).contains(at)) {
                if let Some(ChatMessage::User { text }) = group.to_mut().get_mut(at - start) {
                    text.push_str(note);
                }
            }
            let cached = previous
                .next()
                .filter(|(old, _)| old.as_slice() == &group[..]);
            let (group, text) = match cached {
                Some(hit) => {
                    self.reused += 1;
                    hit
                }
                None => {
                    self.encoded += 1;
                    let text = encode_group(transport, request, &group);
                    (group.into_owned(), text)
                }
            };
            self.groups.push((group, text));
            start = end;
        }

        let skeleton = body.to_string();
        let at = skeleton
            .find(PLACEHOLDER_JSON)
            .expect("the placeholder is serialized verbatim");
        let parts = leading
            .iter()
            .chain(self.groups.iter().map(|(_, text)| text))
            .filter(|text| !text.is_empty());
        let mut out = String::with_capacity(
            skeleton.len() + parts.clone().map(|p| p.len() + 1).sum::<usize>(),
        );
        out.push_str(&skeleton[..at]);
        out.push_str("\"messages\":[");
        for (i, part) in parts.enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(part);
        }
        out.push(']');
        out.push_str(&skeleton[at + PLACEHOLDER_JSON.len()..]);
        out
    }
}

fn build(transport: Transport, request: &ProviderRequest) -> Value {
    match transport {
        Transport::OpenAi => openai::build_body(request),
        Transport::Anthropic => anthropic::build_body(request),
    }
}

/// The role a message takes on the wire: runs of one role are encoded together.
fn wire_role(transport: Transport, message: &ChatMessage) -> u8 {
    match (message, transport) {
        (ChatMessage::User { .. }, _) => 0,
        (ChatMessage::Assistant { .. }, _) => 1,
        (ChatMessage::ToolResult { .. }, Transport::OpenAi) => 2,
        // Anthropic: tool results are blocks of a user message.
        (ChatMessage::ToolResult { .. }, Transport::Anthropic) => 0,
    }
}

/// The comma-separated JSON of the wire messages one group becomes.
fn encode_group(transport: Transport, request: &ProviderRequest, group: &[ChatMessage]) -> String {
    let alone = ProviderRequest {
        profile: request.profile.clone(),
        system: String::new(),
        messages: group.to_vec().into(),
        tools: Vec::new(),
    };
    match build(transport, &alone).get("messages") {
        Some(Value::Array(items)) => items
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{ImageData, ProviderProfile};
    use crate::provider::{add_dynamic_context, OutboundToolCall, ToolSpec};

    fn profile(kind: &str, vision: bool) -> ProviderProfile {
        ProviderProfile {
            kind: kind.into(),
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m \"quoted\" \u{0}".into(),
            max_output_tokens: Some(256),
            temperature_centi: Some(30),
            vision,
            ..ProviderProfile::default()
        }
    }

    /// A conversation with every shape: steps with calls, runs of results
    /// (some with images), steers after results, an empty assistant text,
    /// thinking data, text that looks like the placeholder.
    fn conversation() -> Vec<ChatMessage> {
        let image = ImageData {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        };
        let call = |id: &str, name: &str| OutboundToolCall {
            id: id.into(),
            name: name.into(),
            arguments: json!({ "ref": "e1", "text": "a \"b\" ü" }),
        };
        let result = |id: &str, images: Vec<ImageData>| ChatMessage::ToolResult {
            call_id: id.into(),
            content: format!("result of {id}: \"messages\":\"sw-agent\\u0000messages\""),
            is_error: id.ends_with('x'),
            images,
        };
        let mut messages = vec![ChatMessage::User {
            text: "Find the cheapest flight, then book it.".into(),
        }];
        for step in 0..6 {
            let a = format!("c{step}a");
            let b = format!("c{step}bx");
            messages.push(ChatMessage::Assistant {
                text: if step % 2 == 0 { String::new() } else { format!("Step {step}.") },
                tool_calls: vec![call(&a, "page_snapshot"), call(&b, "screenshot")],
                private: (step == 3).then(|| {
                    json!({ "anthropic": { "thinking": [{ "type": "thinking", "thinking": "hm", "signature": "s" }] } })
                }),
            });
            messages.push(result(&a, Vec::new()));
            messages.push(result(
                &b,
                if step % 3 == 1 {
                    vec![image.clone()]
                } else {
                    Vec::new()
                },
            ));
            if step == 2 {
                messages.push(ChatMessage::User {
                    text: "Also check the return date.".into(),
                });
            }
        }
        messages.push(ChatMessage::Assistant {
            text: "Booked.".into(),
            tool_calls: Vec::new(),
            private: None,
        });
        messages
    }

    fn request(kind: &str, vision: bool, messages: Vec<ChatMessage>) -> ProviderRequest {
        ProviderRequest {
            profile: profile(kind, vision),
            system: "You drive web pages.".into(),
            messages: messages.into(),
            tools: vec![ToolSpec {
                name: "click".into(),
                description: "Click an element.".into(),
                parameters: json!({ "type": "object", "properties": { "ref": { "type": "string" } } }),
            }],
        }
    }

    #[test]
    fn incremental_body_is_byte_identical_to_a_full_build_step_after_step() {
        for kind in ["openai", "anthropic"] {
            for vision in [false, true] {
                let all = conversation();
                let mut cache = BodyCache::new();
                for end in 1..=all.len() {
                    let plain = request(kind, vision, all[..end].to_vec());
                    // The send-time note changes the last user message every step.
                    let context = DynamicContext {
                        now_ms: 1_700_000_000_000 + end as u64 * 1000,
                        tab: Some(("Flights".into(), "https://example.com/".into())),
                    };
                    let mut noted = plain.clone();
                    add_dynamic_context(&mut noted, &context);
                    let full = build(Transport::from_kind(kind), &noted).to_string();
                    assert_eq!(
                        cache.body_with(&plain, Some(&context)),
                        full,
                        "{kind} vision={vision} end={end}"
                    );
                }
                assert!(
                    cache.reused > cache.encoded,
                    "{kind}: the cache did its job ({} reused, {} encoded)",
                    cache.reused,
                    cache.encoded
                );
            }
        }
    }

    #[test]
    fn incremental_body_follows_a_rewritten_prefix_a_shorter_path_and_a_new_profile() {
        for kind in ["openai", "anthropic"] {
            let all = conversation();
            let mut cache = BodyCache::new();
            let mut check = |r: &ProviderRequest| {
                let full = build(Transport::from_kind(&r.profile.kind), r).to_string();
                assert_eq!(cache.body(r), full);
            };
            check(&request(kind, false, all.clone()));
            // A compaction: a summary replaces the start.
            let mut compacted = vec![ChatMessage::User {
                text: "[Summary] flights compared".into(),
            }];
            compacted.extend(all[10..].iter().cloned());
            check(&request(kind, false, compacted));
            // Another branch: shorter, different end.
            let mut branch = all[..4].to_vec();
            branch.push(ChatMessage::User {
                text: "No, only search.".into(),
            });
            check(&request(kind, false, branch.clone()));
            // Vision turned on, then the other provider.
            check(&request(kind, true, branch.clone()));
            let other = if kind == "openai" {
                "anthropic"
            } else {
                "openai"
            };
            check(&request(other, true, branch));
            check(&request(kind, false, Vec::new()));
        }
    }
}
