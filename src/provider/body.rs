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
//!
//! The worker does not even copy the history out of wasm memory at every
//! step: [`BodyCache::plan_with`] gives the body as a [`BodyPlan`] whose
//! unchanged runs of groups the caller keeps as `Blob`s between requests
//! (`platform::fetch::compose`), so only new and changing messages go over.

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
    /// What the cached texts depend on besides the messages themselves:
    /// the wire format, vision, and the endpoint's host (an OpenAI
    /// message replays private data only to the host that made it).
    key: Option<(Transport, bool, String)>,
    /// Each group: whether tools were called in its turn before it (an
    /// OpenAI answer's encoding depends on it: `openai::build_body_after`),
    /// its messages, and their text.
    groups: Vec<((bool, Vec<ChatMessage>), String)>,
    /// Where each group ends in the last request's messages (exclusive).
    ends: Vec<usize>,
    /// Of the last request's groups: which were the same as the group at
    /// the same position in the request before it.
    same: Vec<bool>,
    /// The group that carries the send-time note in the last request.
    noted: Option<usize>,
    /// The last request's send-time note and the message it went on. A
    /// user message keeps the note it was first sent with (its time and
    /// tab) for as long as it is the last one in the requests of one
    /// outbound view: the context is per user message, as the design's
    /// per-turn context, not per step, so a turn's steps share their
    /// prefix and the provider's prompt cache keeps it (a note rewritten
    /// each minute or navigation made every step pay for the whole turn
    /// again). A new user message (a turn, a steer) gets a fresh one.
    note: Option<(usize, String)>,
    /// The last request's lineage.
    lineage: Option<crate::provider::Lineage>,
    /// What the caller of [`BodyCache::plan_with`] holds (see [`BodyPlan`]),
    /// in its order. Empty after a body it did not get as a plan.
    slots: Vec<Slot>,
    /// The last request's body around its groups.
    last: Option<Prepared>,
    /// Groups taken from the cache / encoded, over the cache's life, and
    /// of the groups taken, those whose messages were compared (the others
    /// the request's lineage vouched for).
    pub reused: u64,
    pub encoded: u64,
    pub compared: u64,
    /// Groups a request's preparation walked (the leading ones its lineage
    /// vouches for stay in place, unread).
    pub walked: u64,
    /// How many times the body around the messages was built.
    pub heads: u64,
}

/// The inputs of a request's body besides its messages.
#[derive(Debug, Clone)]
struct Around {
    profile: crate::model::ProviderProfile,
    system: std::rc::Rc<str>,
    tools: std::rc::Rc<[super::ToolSpec]>,
}

impl Around {
    /// Whether `request` has these inputs: the same shared values (the
    /// common case, no reading) or equal ones.
    fn matches(&self, request: &ProviderRequest) -> bool {
        use std::rc::Rc;
        self.profile == request.profile
            && (Rc::ptr_eq(&self.system, &request.system) || self.system == request.system)
            && (Rc::ptr_eq(&self.tools, &request.tools) || self.tools == request.tools)
    }
}

/// Text after a kept slot that stays in the body rather than making a
/// new slot (another `Blob`) at every step.
const FOLD_BYTES: usize = 64 * 1024;

/// A run of groups `start..end` whose texts (the non-empty ones, joined
/// with commas) a caller of [`BodyCache::plan_with`] keeps between
/// requests, as a `Blob` in the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    start: usize,
    end: usize,
    /// Its length in bytes (0: empty).
    len: usize,
}

/// A piece of a [`BodyPlan`]: text to hand over, or a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Slot(usize),
}

/// A body as pieces a caller assembles without handing the history over at
/// every step. The caller keeps slots between requests (`Blob`s in the
/// worker). Its new slots are `slots`, each made of its slots before this
/// plan (`Piece::Slot` indexes those) and text; the body is `body`, whose
/// `Piece::Slot`s index the new slots. The history sits in slots that each
/// step passes on by reference; only new messages and the ones that change
/// (the last group, the one with the send-time note) go over as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyPlan {
    pub slots: Vec<Vec<Piece>>,
    pub body: Vec<Piece>,
    /// The body's length in bytes.
    pub len: usize,
}

impl BodyPlan {
    /// The bytes the plan hands over as text (the rest are in kept slots).
    pub fn text_len(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .chain(&self.body)
            .map(|piece| match piece {
                Piece::Text(text) => text.len(),
                Piece::Slot(_) => 0,
            })
            .sum()
    }
}

/// A request's body around its messages, after the cache was brought up to
/// date with them.
#[derive(Debug, Clone)]
struct Prepared {
    /// The body up to and including `"messages":[`.
    head: String,
    /// What follows the messages' `]`.
    tail: String,
    /// Messages outside the groups that come first (OpenAI's system message).
    leading: Vec<String>,
    /// What the three were built from: a request with the same profile,
    /// system prompt and tools reuses them (every step of a run: the engine
    /// shares one system prompt and one tool list, `Engine::request_tools`).
    from: Around,
}

/// Pieces joined the way the message array joins its elements: a comma
/// between two non-empty ones, adjacent text merged.
#[derive(Default)]
struct Joiner {
    pieces: Vec<Piece>,
    any: bool,
    len: usize,
}

impl Joiner {
    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let comma = if self.any { "," } else { "" };
        self.len += comma.len() + text.len();
        self.any = true;
        match self.pieces.last_mut() {
            Some(Piece::Text(last)) => {
                last.push_str(comma);
                last.push_str(text);
            }
            _ => self.pieces.push(Piece::Text(format!("{comma}{text}"))),
        }
    }

    /// A slot holding `len` bytes.
    fn slot(&mut self, index: usize, len: usize) {
        if len == 0 {
            self.pieces.push(Piece::Slot(index));
            return;
        }
        if self.any {
            self.text_raw(",");
        }
        self.any = true;
        self.len += len;
        self.pieces.push(Piece::Slot(index));
    }

    fn text_raw(&mut self, text: &str) {
        self.len += text.len();
        match self.pieces.last_mut() {
            Some(Piece::Text(last)) => last.push_str(text),
            _ => self.pieces.push(Piece::Text(text.to_string())),
        }
    }
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
        self.prepare(request, context);
        // Whoever follows the plans did not get this request.
        self.slots.clear();
        self.last_body()
    }

    /// The last request's body as text.
    pub fn last_body(&self) -> String {
        let Some(prepared) = &self.last else {
            return String::new();
        };
        let mut joined = Joiner::default();
        for text in prepared
            .leading
            .iter()
            .chain(self.groups.iter().map(|(_, text)| text))
        {
            joined.text(text);
        }
        let mut out = String::with_capacity(prepared.head.len() + joined.len + prepared.tail.len());
        out.push_str(&prepared.head);
        if let Some(Piece::Text(text)) = joined.pieces.first() {
            out.push_str(text);
        }
        out.push_str(&prepared.tail);
        out
    }

    /// The body of `request` (byte for byte what [`BodyCache::body_with`]
    /// gives) as a [`BodyPlan`] against the slots the caller kept from the
    /// last plan. Every run of groups that will not change by the next
    /// request (all but the last group and the one with the send-time
    /// note) becomes a slot, made of the caller's slots still valid inside
    /// it (their groups unchanged) and the text of the rest. The caller
    /// must apply every plan, or call [`BodyCache::forget_slots`].
    pub fn plan_with(
        &mut self,
        request: &ProviderRequest,
        context: Option<&DynamicContext>,
    ) -> BodyPlan {
        self.prepare(request, context);
        let prepared = self.last.as_ref().expect("prepared above");
        let n = self.groups.len();
        let old: Vec<(usize, Slot)> = self
            .slots
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, s)| s.end <= n && self.same[s.start..s.end].iter().all(|same| *same))
            .collect();
        let volatile = |i: usize| i + 1 == n || Some(i) == self.noted;
        // The length of the texts of `range` joined (what a slot of them holds).
        let text_len = |range: std::ops::Range<usize>| {
            self.groups[range]
                .iter()
                .filter(|(_, t)| !t.is_empty())
                .map(|(_, t)| t.len() + 1)
                .sum::<usize>()
                .saturating_sub(1)
        };
        let mut slots = Vec::new();
        let mut new = Vec::new();
        let mut i = 0;
        while i < n {
            if volatile(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && !volatile(i) {
                i += 1;
            }
            // A kept slot that starts the run, followed by little new text:
            // kept as it is, the text goes into the body (one `Blob` fewer
            // per step) until there is enough of it to fold in.
            if let Some((index, s)) = old.iter().find(|(_, s)| s.start == start && s.end <= i) {
                if text_len(s.end..i) < FOLD_BYTES {
                    new.push(*s);
                    slots.push(vec![Piece::Slot(*index)]);
                    continue;
                }
            }
            // The run start..i: the caller's valid slots inside it, and text.
            let mut joined = Joiner::default();
            let mut g = start;
            while g < i {
                match old.iter().find(|(_, s)| s.start == g && s.end <= i) {
                    Some((index, s)) => {
                        joined.slot(*index, s.len);
                        g = s.end;
                    }
                    None => {
                        joined.text(&self.groups[g].1);
                        g += 1;
                    }
                }
            }
            new.push(Slot {
                start,
                end: i,
                len: joined.len,
            });
            slots.push(joined.pieces);
        }
        let mut body = Joiner::default();
        body.text_raw(&prepared.head);
        body.any = false;
        for text in &prepared.leading {
            body.text(text);
        }
        let mut g = 0;
        let mut slot = 0;
        while g < n {
            match new.get(slot).filter(|s| s.start == g) {
                Some(s) => {
                    body.slot(slot, s.len);
                    g = s.end;
                    slot += 1;
                }
                None => {
                    body.text(&self.groups[g].1);
                    g += 1;
                }
            }
        }
        body.text_raw(&prepared.tail);
        self.slots = new;
        BodyPlan {
            slots,
            body: body.pieces,
            len: body.len,
        }
    }

    /// The caller dropped its slots: the next plan starts from none.
    pub fn forget_slots(&mut self) {
        self.slots.clear();
    }

    /// Bring the cached groups up to date with `request`'s messages and
    /// encode everything around them.
    fn prepare(&mut self, request: &ProviderRequest, context: Option<&DynamicContext>) {
        // The same message of the same view (a view only appends) keeps
        // its note; the lineage is compared before it is updated below.
        let same_view = matches!((self.lineage, request.lineage),
            (Some(last), Some(now)) if last.view == now.view);
        let kept_note = self.note.take().filter(|_| same_view);
        let noted = context.and_then(|c| {
            let at = request
                .messages
                .iter()
                .rposition(|m| matches!(m, ChatMessage::User { .. }))?;
            let note = match kept_note {
                Some((was, note)) if was == at => note,
                _ => dynamic_note(c),
            };
            Some((at, note))
        });
        self.note = noted.clone();
        let transport = Transport::from_kind(&request.profile.kind);
        let key = (
            transport,
            request.profile.vision,
            super::endpoint_host(&request.profile.base_url),
        );
        if self.key.as_ref() != Some(&key) {
            self.groups.clear();
            self.ends.clear();
            self.key = Some(key);
        }
        if !self.last.as_ref().is_some_and(|p| p.from.matches(request)) {
            self.last = Some(Self::around_messages(transport, request));
            self.heads += 1;
        }

        let previously_noted = self.noted.take();
        // Messages this request shares with the last one by lineage: taken
        // as equal without reading them (a long thread's history).
        let trusted = match (self.lineage, request.lineage) {
            (Some(last), Some(now)) if last.view == now.view => {
                last.len.min(now.len).saturating_sub(1)
            }
            _ => 0,
        };
        self.lineage = request.lineage;
        // The leading groups made only of trusted messages stay where they
        // are, unread: their messages, and the role of the message after
        // each (which ends it), are the same. Not the group with the note,
        // now or before, nor any after it (they are walked below, which
        // costs the turn's length, not the thread's).
        let mut keep = self.ends.partition_point(|end| *end <= trusted);
        if let Some(before) = previously_noted {
            keep = keep.min(before);
        }
        if let Some((at, _)) = &noted {
            keep = keep.min(self.ends.partition_point(|end| end <= at));
        }
        let mut previous = self.groups.split_off(keep).into_iter();
        self.ends.truncate(keep);
        self.same.clear();
        self.same.resize(keep, true);
        self.reused += keep as u64;
        let messages = &request.messages;
        let mut start = self.ends.last().copied().unwrap_or(0);
        while start < messages.len() {
            let role = wire_role(transport, &messages[start]);
            let end = messages[start..]
                .iter()
                .position(|m| wire_role(transport, m) != role)
                .map_or(messages.len(), |n| start + n);
            let mut group = std::borrow::Cow::Borrowed(&messages[start..end]);
            if let Some((at, note)) = noted.as_ref().filter(|(at, _)| (start..end).contains(at)) {
                self.noted = Some(self.groups.len());
                if let Some(ChatMessage::User { text, .. }) = group.to_mut().get_mut(at - start) {
                    text.push_str(note);
                }
            }
            let index = self.groups.len();
            self.walked += 1;
            // A group follows one of another role: after tool results, the
            // turn has called tools (a user message starts a turn).
            let after_tools =
                start > 0 && matches!(messages[start - 1], ChatMessage::ToolResult { .. });
            let cached = previous.next().filter(|((was_after, old), _)| {
                let as_before = end <= trusted
                    && old.len() == end - start
                    && self.noted != Some(index)
                    && previously_noted != Some(index);
                if as_before {
                    return true;
                }
                self.compared += 1;
                *was_after == after_tools && old.as_slice() == &group[..]
            });
            let (group, text) = match cached {
                Some(hit) => {
                    self.reused += 1;
                    self.same.push(true);
                    hit
                }
                None => {
                    self.encoded += 1;
                    self.same.push(false);
                    let text = encode_group(transport, request, &group, after_tools);
                    ((after_tools, group.into_owned()), text)
                }
            };
            self.groups.push((group, text));
            self.ends.push(end);
            start = end;
        }
    }

    /// Everything of `request`'s body but the conversation: model, system,
    /// tools, options.
    fn around_messages(transport: Transport, request: &ProviderRequest) -> Prepared {
        let head = ProviderRequest {
            lineage: None,
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
        let skeleton = body.to_string();
        let at = skeleton
            .find(PLACEHOLDER_JSON)
            .expect("the placeholder is serialized verbatim");
        Prepared {
            head: format!("{}\"messages\":[", &skeleton[..at]),
            tail: format!("]{}", &skeleton[at + PLACEHOLDER_JSON.len()..]),
            leading,
            from: Around {
                profile: request.profile.clone(),
                system: request.system.clone(),
                tools: request.tools.clone(),
            },
        }
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
/// `after_tools`: tools were called in the group's turn before it.
fn encode_group(
    transport: Transport,
    request: &ProviderRequest,
    group: &[ChatMessage],
    after_tools: bool,
) -> String {
    let alone = ProviderRequest {
        lineage: None,
        profile: request.profile.clone(),
        system: Default::default(),
        messages: group.to_vec().into(),
        tools: Default::default(),
    };
    let body = match transport {
        Transport::OpenAi => openai::build_body_after(&alone, after_tools),
        Transport::Anthropic => anthropic::build_body(&alone),
    };
    match body.get("messages") {
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
            content: format!("result of {id}: \"messages\":\"sw-agent\\u0000messages\"").into(),
            is_error: id.ends_with('x'),
            images,
        };
        let mut messages = vec![ChatMessage::user("Find the cheapest flight, then book it.")];
        for step in 0..6 {
            let a = format!("c{step}a");
            let b = format!("c{step}bx");
            messages.push(ChatMessage::Assistant {
                text: if step % 2 == 0 { String::new() } else { format!("Step {step}.") },
                tool_calls: vec![call(&a, "page_snapshot"), call(&b, "screenshot")],
                private: match step {
                    3 => Some(json!({ "anthropic": { "thinking": [{ "type": "thinking", "thinking": "hm", "signature": "s" }] } })),
                    // Replayed to the endpoint of `profile` (OpenAI only).
                    1 => Some(json!({ "openai": {
                        "endpoint": "127.0.0.1:9",
                        "reasoning_content": "first the snapshot",
                        "tool_calls": [{ "name": "page_snapshot", "extra_content": { "google": { "thought_signature": "c2ln" } } }, { "name": "screenshot" }],
                    } })),
                    _ => None,
                },
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
                messages.push(ChatMessage::user("Also check the return date."));
            }
        }
        // The answer of a turn that called tools: DeepSeek wants its
        // reasoning back (openai::REPLAYED_REASONING), which depends on the
        // messages before it.
        messages.push(ChatMessage::Assistant {
            text: "Booked.".into(),
            tool_calls: Vec::new(),
            private: Some(json!({ "openai": {
                "endpoint": "127.0.0.1:9",
                "reasoning_content": "all booked, say so",
            } })),
        });
        messages
    }

    fn request(kind: &str, vision: bool, messages: Vec<ChatMessage>) -> ProviderRequest {
        ProviderRequest {
            lineage: None,
            profile: profile(kind, vision),
            system: "You drive web pages.".into(),
            messages: messages.into(),
            tools: vec![ToolSpec {
                name: "click".into(),
                description: "Click an element.".into(),
                parameters: json!({ "type": "object", "properties": { "ref": { "type": "string" } } }),
            }].into(),
        }
    }

    #[test]
    fn incremental_body_is_byte_identical_to_a_full_build_step_after_step() {
        for kind in ["openai", "anthropic"] {
            for vision in [false, true] {
                let all = conversation();
                let mut cache = BodyCache::new();
                for end in 1..=all.len() {
                    let (plain, context, full) = noted_step(kind, vision, all[..end].to_vec(), end);
                    assert_eq!(
                        cache.body_with(&plain, Some(&context)),
                        full,
                        "{kind} vision={vision} end={end}"
                    );
                }
                if kind == "openai" {
                    let full = build(Transport::OpenAi, &request(kind, vision, all.clone()));
                    assert!(
                        full.to_string().contains("all booked, say so"),
                        "the answer's reasoning goes back"
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

    /// A request of `messages` at step `end`, the send-time context that
    /// step adds (its note changes the last user message every step), and
    /// the body a full build of the noted request gives.
    fn noted_step(
        kind: &str,
        vision: bool,
        messages: Vec<ChatMessage>,
        end: usize,
    ) -> (ProviderRequest, DynamicContext, String) {
        let plain = request(kind, vision, messages);
        let context = DynamicContext {
            now_ms: 1_700_000_000_000 + end as u64 * 1000,
            tab: Some(("Flights".into(), "https://example.com/".into())),
        };
        let mut noted = plain.clone();
        add_dynamic_context(&mut noted, &context);
        let full = build(Transport::from_kind(kind), &noted).to_string();
        (plain, context, full)
    }

    /// The body a view's cache gives at a step of `messages` when each step
    /// came with `noted_step`'s context: the last user message keeps the
    /// note of the first step it was last in (steps go one message at a
    /// time, so the step that ended with it).
    fn kept_note_body(kind: &str, vision: bool, messages: &[ChatMessage]) -> String {
        let first = messages
            .iter()
            .rposition(|m| matches!(m, ChatMessage::User { .. }))
            .map_or(messages.len(), |at| at + 1);
        let (plain, _, _) = noted_step(kind, vision, messages.to_vec(), messages.len());
        let (_, context, _) = noted_step(kind, vision, messages.to_vec(), first);
        let mut noted = plain;
        add_dynamic_context(&mut noted, &context);
        build(Transport::from_kind(kind), &noted).to_string()
    }

    #[test]
    fn a_user_message_keeps_its_send_time_note_through_a_view_s_steps() {
        for kind in ["openai", "anthropic"] {
            let all = conversation();
            let steer = all
                .iter()
                .rposition(|m| matches!(m, ChatMessage::User { .. }))
                .unwrap();
            let mut cache = BodyCache::new();
            let mut notes = Vec::new();
            for end in 1..=all.len() {
                let (mut r, mut context, _) = noted_step(kind, false, all[..end].to_vec(), end);
                // Later steps: another minute, the tab navigated.
                context.now_ms += end as u64 * 60_000;
                context.tab = Some((format!("Page {end}"), format!("https://example.com/{end}")));
                r.lineage = Some(crate::provider::Lineage { view: 9, len: end });
                let body = cache.body_with(&r, Some(&context));
                notes.push(body.matches("https://example.com/").count());
                // The first message's note, while it is the last user
                // message: the tab of the first step, every step.
                if (1..=steer).contains(&end) {
                    assert!(body.contains("https://example.com/1 "), "{kind} end={end}");
                } else {
                    // The steer's note: the step that sent it.
                    let first = format!("https://example.com/{} ", steer + 1);
                    assert!(body.contains(&first), "{kind} end={end}");
                }
                assert_eq!(notes[end - 1], 1, "{kind} end={end}: one note");
            }
            // Another view (a rebuild, another run): a fresh note.
            let (mut r, context, full) = noted_step(kind, false, all.clone(), all.len());
            r.lineage = Some(crate::provider::Lineage {
                view: 10,
                len: all.len(),
            });
            assert_eq!(cache.body_with(&r, Some(&context)), full, "{kind}");
        }
    }

    /// What a caller of `plan_with` does with a plan (`String`s for its
    /// `Blob`s): its new slots, and the body it sends. Returns the body and
    /// the bytes it handed over as text.
    fn apply(slots: &mut Vec<String>, plan: &BodyPlan) -> (String, usize) {
        let mut handed = 0;
        let mut join = |pieces: &[Piece], from: &[String]| {
            pieces
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => {
                        handed += t.len();
                        t.clone()
                    }
                    Piece::Slot(i) => from[*i].clone(),
                })
                .collect::<String>()
        };
        let new: Vec<String> = plan
            .slots
            .iter()
            .map(|pieces| join(pieces, slots))
            .collect();
        let body = join(&plan.body, &new);
        *slots = new;
        assert_eq!(body.len(), plan.len, "the plan's length");
        (body, handed)
    }

    #[test]
    fn planned_body_is_byte_identical_and_hands_over_only_what_changed() {
        for kind in ["openai", "anthropic"] {
            for vision in [false, true] {
                let all = conversation();
                // A long history first: the turn's steps follow it.
                let mut history: Vec<ChatMessage> = Vec::new();
                for _ in 0..20 {
                    history.extend(all.iter().cloned());
                }
                let mut cache = BodyCache::new();
                let mut slots = Vec::new();
                let mut handed = 0;
                let mut largest = 0;
                for end in 1..=all.len() {
                    let mut messages = history.clone();
                    messages.extend(all[..end].iter().cloned());
                    let (plain, context, full) = noted_step(kind, vision, messages, end);
                    let plan = cache.plan_with(&plain, Some(&context));
                    let (body, text) = apply(&mut slots, &plan);
                    assert_eq!(body, full, "{kind} vision={vision} end={end}");
                    assert_eq!(cache.last_body(), full);
                    if end > 1 {
                        handed += text;
                        largest = largest.max(full.len());
                    }
                }
                // After the first step, the history is never handed over again.
                assert!(
                    handed < largest,
                    "{kind} vision={vision}: {handed} bytes handed over in {} steps of up to {largest} bytes",
                    all.len() - 1
                );
            }
        }
    }

    #[test]
    fn planned_body_keeps_a_slot_as_it_is_until_enough_new_text_is_folded_in() {
        let mut messages = vec![ChatMessage::user("Go.")];
        let mut cache = BodyCache::new();
        let mut slots = Vec::new();
        let (mut kept, mut folded) = (0, 0);
        for step in 0..40 {
            messages.push(ChatMessage::Assistant {
                text: format!("Step {step}."),
                tool_calls: Vec::new(),
                private: None,
            });
            messages.push(ChatMessage::user("x".repeat(10_000)));
            let r = request("openai", false, messages.clone());
            let full = build(Transport::OpenAi, &r).to_string();
            let plan = cache.plan_with(&r, None);
            assert_eq!(apply(&mut slots, &plan).0, full, "step {step}");
            for pieces in &plan.slots {
                match pieces.as_slice() {
                    [Piece::Slot(_)] => kept += 1,
                    [Piece::Slot(_), ..] => folded += 1,
                    _ => {}
                }
            }
            // What stays out of the slots is bounded by the fold threshold.
            let text: usize = plan
                .body
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => t.len(),
                    Piece::Slot(_) => 0,
                })
                .sum();
            assert!(
                text < FOLD_BYTES + 30_000,
                "step {step}: {text} bytes of text in the body"
            );
        }
        assert!(kept > 20 && folded >= 4, "kept {kept}, folded {folded}");
    }

    #[test]
    fn lineage_spares_comparing_the_shared_messages_and_never_their_noted_group() {
        for kind in ["openai", "anthropic"] {
            let all = conversation();
            let mut with = BodyCache::new();
            let mut without = BodyCache::new();
            for end in 1..=all.len() {
                let (mut r, context, full) = noted_step(kind, false, all[..end].to_vec(), end);
                assert_eq!(without.body_with(&r, Some(&context)), full);
                r.lineage = Some(crate::provider::Lineage { view: 7, len: end });
                let kept = kept_note_body(kind, false, &all[..end]);
                assert_eq!(with.body_with(&r, Some(&context)), kept, "{kind} end={end}");
            }
            assert_eq!(
                with.encoded, without.encoded,
                "{kind}: the same groups encoded"
            );
            assert!(
                with.compared * 3 < without.compared,
                "{kind}: {} compared with a lineage, {} without",
                with.compared,
                without.compared
            );
            // Another view (or none): compared again.
            let r = request(kind, false, all.clone());
            let before = with.compared;
            with.body(&r);
            assert!(with.compared > before);
        }
    }

    #[test]
    fn lineage_keeps_the_history_before_the_noted_group_in_place_unread() {
        for kind in ["openai", "anthropic"] {
            // A long history, then a turn: its user message (the noted one)
            // and steps of an assistant message and its tool result.
            let history = conversation();
            let mut all = Vec::new();
            for _ in 0..20 {
                all.extend(history.iter().cloned());
            }
            let turn_start = all.len();
            all.push(ChatMessage::user("Now check the page again."));
            for step in 0..8 {
                let id = format!("t{step}");
                all.push(ChatMessage::Assistant {
                    text: String::new(),
                    tool_calls: vec![OutboundToolCall {
                        id: id.clone(),
                        name: "page_snapshot".into(),
                        arguments: json!({}),
                    }],
                    private: None,
                });
                all.push(ChatMessage::ToolResult {
                    call_id: id,
                    content: format!("step {step}").into(),
                    is_error: false,
                    images: Vec::new(),
                });
            }
            let mut cache = BodyCache::new();
            let mut slots = Vec::new();
            for end in turn_start + 1..=all.len() {
                let (mut r, context, _) = noted_step(kind, false, all[..end].to_vec(), end);
                r.lineage = Some(crate::provider::Lineage { view: 3, len: end });
                let before = cache.walked;
                let plan = cache.plan_with(&r, Some(&context));
                let kept = kept_note_body(kind, false, &all[..end]);
                assert_eq!(apply(&mut slots, &plan).0, kept, "{kind} end={end}");
                if end > turn_start + 1 {
                    // The noted group and the turn's steps after it: never
                    // the hundreds of groups before.
                    let walked = cache.walked - before;
                    assert!(
                        walked <= (end - turn_start) as u64 + 1,
                        "{kind} end={end}: walked {walked} groups"
                    );
                }
            }
            // A step without the note, then one with it: the noted group
            // is written again although the lineage vouches for it.
            let mut r = request(kind, false, all.clone());
            r.lineage = Some(crate::provider::Lineage {
                view: 3,
                len: all.len(),
            });
            cache.body(&r);
            let (mut r, context, full) = noted_step(kind, false, all.clone(), all.len());
            r.lineage = Some(crate::provider::Lineage {
                view: 3,
                len: all.len(),
            });
            assert_eq!(
                cache.body_with(&r, Some(&context)),
                full,
                "{kind}: noted again"
            );
            // Another view: every group is walked (and compared) again.
            let (mut r, context, full) = noted_step(kind, false, all.clone(), all.len());
            r.lineage = Some(crate::provider::Lineage {
                view: 4,
                len: all.len(),
            });
            let before = cache.walked;
            assert_eq!(cache.body_with(&r, Some(&context)), full);
            assert!(
                cache.walked - before > 100,
                "{kind}: another view walks all"
            );
        }
    }

    #[test]
    fn planned_body_drops_slots_whose_messages_changed_or_that_a_full_body_skipped() {
        for kind in ["openai", "anthropic"] {
            let all = conversation();
            let mut cache = BodyCache::new();
            let mut slots = Vec::new();
            // Returns how much was handed over as text.
            let mut check = |cache: &mut BodyCache, r: &ProviderRequest| {
                let full = build(Transport::from_kind(&r.profile.kind), r).to_string();
                let plan = cache.plan_with(r, None);
                let (body, handed) = apply(&mut slots, &plan);
                assert_eq!(body, full, "{kind}");
                (handed, full.len())
            };
            check(&mut cache, &request(kind, false, all[..6].to_vec()));
            let (handed, len) = check(&mut cache, &request(kind, false, all.clone()));
            assert!(handed < len, "appended messages reuse the slots");
            // A compaction: a summary replaces the start; all of it is new.
            let mut compacted = vec![ChatMessage::user("[Summary] flights compared")];
            compacted.extend(all[10..].iter().cloned());
            let (handed, len) = check(&mut cache, &request(kind, false, compacted.clone()));
            assert_eq!(handed, len, "nothing reused after a compaction");
            // Another branch, shorter.
            let mut branch = compacted[..2].to_vec();
            branch.push(ChatMessage::user("No, only search."));
            check(&mut cache, &request(kind, false, branch.clone()));
            check(&mut cache, &request(kind, false, compacted.clone()));
            // A full body in between: the caller's slots are not the cache's.
            cache.body(&request(kind, false, all.clone()));
            let (handed, len) = check(&mut cache, &request(kind, false, all.clone()));
            assert_eq!(handed, len, "slots forgotten after a full body");
            // Vision (every group encoded again), no messages at all, a
            // caller that dropped its slots.
            check(&mut cache, &request(kind, true, all.clone()));
            check(&mut cache, &request(kind, true, Vec::new()));
            check(&mut cache, &request(kind, true, all.clone()));
            cache.forget_slots();
            let (handed, len) = check(&mut cache, &request(kind, true, all.clone()));
            assert_eq!(handed, len, "slots forgotten");
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
            let mut compacted = vec![ChatMessage::user("[Summary] flights compared")];
            compacted.extend(all[10..].iter().cloned());
            check(&request(kind, false, compacted));
            // Another branch: shorter, different end.
            let mut branch = all[..4].to_vec();
            branch.push(ChatMessage::user("No, only search."));
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

    #[test]
    fn cached_groups_follow_a_switch_of_endpoint() {
        // The conversation's private data was made by 127.0.0.1:9: its
        // groups as cached for that host must not go to another.
        let all = conversation();
        let mut cache = BodyCache::new();
        for (base_url, replayed) in [
            ("http://127.0.0.1:9/v1", true),
            ("https://api.openai.com/v1", false),
            ("http://127.0.0.1:9/v1/", true),
        ] {
            let mut r = request("openai", false, all.clone());
            r.profile.base_url = base_url.into();
            let body = cache.body(&r);
            assert_eq!(body, build(Transport::OpenAi, &r).to_string(), "{base_url}");
            assert_eq!(body.contains("thought_signature"), replayed, "{base_url}");
            assert_eq!(body.contains("first the snapshot"), replayed, "{base_url}");
        }
    }

    #[test]
    fn the_body_around_the_messages_is_built_again_only_when_profile_prompt_or_tools_change() {
        for kind in ["openai", "anthropic"] {
            let all = conversation();
            let mut cache = BodyCache::new();
            let mut check = |r: &ProviderRequest| {
                let full = build(Transport::from_kind(&r.profile.kind), r).to_string();
                assert_eq!(cache.body(r), full, "{kind}");
                cache.heads
            };
            // Steps of one run share one prompt and one tool list.
            let first = request(kind, false, all[..2].to_vec());
            assert_eq!(check(&first), 1);
            for end in 3..=all.len() {
                let step = ProviderRequest {
                    messages: all[..end].to_vec().into(),
                    ..first.clone()
                };
                assert_eq!(check(&step), 1, "{kind}: step {end} reuses it");
            }
            // Equal values that are not the same allocation: reused too.
            assert_eq!(check(&request(kind, false, all.clone())), 1);
            // Each input changes it, even with the same messages.
            let mut prompt = request(kind, false, all.clone());
            prompt.system = "You drive web pages. Be brief.".into();
            assert_eq!(check(&prompt), 2, "{kind}: system prompt");
            let mut tools = prompt.clone();
            tools.tools = vec![ToolSpec {
                name: "type_text".into(),
                description: "Type into a field.".into(),
                parameters: json!({ "type": "object" }),
            }]
            .into();
            assert_eq!(check(&tools), 3, "{kind}: tools");
            let mut no_tools = tools.clone();
            no_tools.tools = Default::default();
            assert_eq!(check(&no_tools), 4, "{kind}: no tools");
            let mut model = no_tools.clone();
            model.profile.model = "another-model".into();
            assert_eq!(check(&model), 5, "{kind}: model");
            let mut budget = model.clone();
            budget.profile.max_output_tokens = Some(77);
            assert_eq!(check(&budget), 6, "{kind}: output tokens");
        }
    }
}
