//! Bad input of every kind gets a typed answer and breaks nothing: ops
//! from a client, streams from a provider and messages from a page, each
//! built well formed and then mutated at random (a field dropped, a value of
//! another type, unknown fields, bytes flipped, the stream cut). Seeds are
//! fixed, so a failure replays.

use serde_json::json;
use sw_agent::model::StopReason;
use sw_agent::protocol::*;
use sw_agent::provider::{Decoder, ProviderError, StreamEvent, Transport};
use sw_agent::sim::{Policy, Reply, Sim};

use super::support::*;

/// A small deterministic generator (xorshift64*), so a failing case can be
/// replayed from its seed.
pub struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A value of some JSON type, often not the one a field expects.
    pub fn value(&mut self) -> serde_json::Value {
        match self.below(12) {
            0 => json!(null),
            1 => json!(true),
            2 => json!(-1),
            3 => json!(u64::MAX),
            4 => json!(1.5e300),
            5 => json!(""),
            6 => json!("x".repeat(70_000)),
            7 => json!("ü\u{0}\u{202e}<script>"),
            8 => json!([]),
            9 => json!({}),
            10 => json!([{ "text": 1 }]),
            _ => json!({ "text": null, "type": "turn.submit" }),
        }
    }

    /// One structural change somewhere in `value`: a field dropped, a value
    /// replaced by one of another type, an unknown field added, or the op's
    /// type renamed.
    pub fn mutate(&mut self, value: &mut serde_json::Value, depth: usize) {
        match value {
            serde_json::Value::Object(map) if !map.is_empty() => {
                let keys: Vec<String> = map.keys().cloned().collect();
                let key = keys[self.below(keys.len())].clone();
                match self.below(if depth < 2 { 5 } else { 4 }) {
                    0 => {
                        map.remove(&key);
                    }
                    1 => {
                        map.insert(key, self.value());
                    }
                    2 => {
                        map.insert(format!("unexpected{}", self.below(3)), self.value());
                    }
                    3 if depth == 0 => {
                        let names = [
                            "turn.explode",
                            "",
                            "INITIALIZE",
                            "turn.submit",
                            "thread.delete",
                        ];
                        map.insert("type".into(), json!(names[self.below(names.len())]));
                    }
                    _ => {
                        let inner = map.get_mut(&key).expect("a key of the map");
                        self.mutate(inner, depth + 1);
                    }
                }
            }
            serde_json::Value::Array(items) if !items.is_empty() => {
                let i = self.below(items.len());
                self.mutate(&mut items[i], depth + 1);
            }
            other => *other = self.value(),
        }
    }
}

/// One of each op, well formed, about the thread `t`, its turn `r` and a node `n`.
fn every_op(id: &str, t: &str, r: &str, n: &str) -> Vec<serde_json::Value> {
    let s = |op: &str| json!({ "type": op, "clientId": "fuzz", "submissionId": id });
    let with = |op: &str, fields: serde_json::Value| {
        let mut value = s(op);
        for (k, v) in fields.as_object().expect("fields").iter() {
            value[k] = v.clone();
        }
        value
    };
    let input = json!({ "text": "Hello" });
    vec![
        with("initialize", json!({ "threadId": t })),
        s("thread.create"),
        with("thread.fork", json!({ "threadId": t, "nodeId": n })),
        with("thread.selectBranch", json!({ "threadId": t, "nodeId": n })),
        with("thread.delete", json!({ "threadId": t })),
        with(
            "thread.rename",
            json!({ "threadId": t, "title": "Renamed" }),
        ),
        with("turn.submit", json!({ "threadId": t, "input": input })),
        with(
            "turn.steer",
            json!({ "threadId": t, "expectedTurnId": r, "input": input }),
        ),
        with("turn.enqueue", json!({ "threadId": t, "input": input })),
        with("queue.remove", json!({ "threadId": t, "itemId": "q1" })),
        with(
            "queue.update",
            json!({ "threadId": t, "itemId": "q1", "input": input }),
        ),
        with("turn.interrupt", json!({ "threadId": t })),
        with("run.resume", json!({ "threadId": t, "input": input })),
        with(
            "approval.response",
            json!({ "threadId": t, "approvalId": "a1", "decision": "acceptOnce" }),
        ),
        with(
            "interaction.response",
            json!({ "threadId": t, "interactionId": "i1", "answer": "yes" }),
        ),
        with(
            "thread.history",
            json!({ "threadId": t, "beforeNodeId": n, "limit": 5 }),
        ),
        with(
            "provider.test",
            json!({ "profile": { "kind": "openai", "baseUrl": "http://127.0.0.1:1", "model": "m" } }),
        ),
        with(
            "run.resolveUncertain",
            json!({ "threadId": t, "choice": "markDone" }),
        ),
        s("siteRules.list"),
        s("settings.defaults"),
        with(
            "siteRule.revoke",
            json!({ "origin": "https://shop.example" }),
        ),
    ]
}

#[test]
fn every_mutated_op_gets_one_typed_answer_and_the_engine_keeps_going() {
    // `BAD_OP_SEEDS=N` runs more schedules.
    let seeds: u64 = std::env::var("BAD_OP_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    for seed in 1..=seeds {
        let mut gen = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let policy: sw_agent::sim::Policy =
            Box::new(|request: &sw_agent::provider::ProviderRequest| {
                if *request.system == *sw_agent::engine::TITLE_PROMPT {
                    sw_agent::sim::Reply::text("A model title")
                } else {
                    sw_agent::sim::Reply::text("Hi.")
                }
            });
        let mut sim = Sim::new(seed, policy, page_tools());
        // Titles arrive in the background, between the ops.
        sim.config.model_titles = true;
        sim.reconfigure();
        let conn = sim.connect();
        sim.send(conn, submit("setup", None, "Start"));
        sim.run(10_000);
        let (thread, turn) = current_ids(&sim);
        let (thread, turn) = (thread.expect("a thread"), turn.expect("a turn"));
        let node = paths(&sim)[0][0].id.clone();

        // Every op, mutated once or twice, under a submission id of its own.
        let mut sent: Vec<(String, serde_json::Value)> = Vec::new();
        for round in 0..40 {
            for (k, mut op) in every_op("", &thread, &turn, &node).into_iter().enumerate() {
                let id = format!("f{round}-{k}");
                op["submissionId"] = json!(id);
                for _ in 0..1 + gen.below(2) {
                    gen.mutate(&mut op, 0);
                }
                sim.send_raw(conn, op.clone());
                sent.push((id, op));
            }
            sim.run(10_000);
        }
        sim.run(100_000);
        assert!(
            sim.violations.is_empty(),
            "seed {seed}: {:?}",
            sim.violations
        );
        // Nothing of a deleted thread was written again after its delete.
        check_store_belongs_to_threads(&sim).unwrap_or_else(|e| panic!("seed {seed}: {e}"));

        let answered = answers(&sim, conn);
        for (id, op) in &sent {
            // Only messages that still carry their own submission id can be matched to an answer.
            if op.get("submissionId") != Some(&json!(id))
                || op.get("type") == Some(&json!("initialize"))
            {
                continue;
            }
            let mine: Vec<&Answer> = answered.iter().filter(|(a, _)| a == id).collect();
            assert_eq!(
                mine.len(),
                1,
                "seed {seed}: one answer to {op}, got {mine:?}"
            );
            if let Err(message) = Op::from_value(op.clone()) {
                let error = mine[0]
                    .1
                    .as_ref()
                    .expect_err("an undecodable op is refused");
                assert_eq!(error.kind, ErrorKind::InvalidOp, "seed {seed}: {op}");
                assert!(
                    error.message.contains(&message),
                    "seed {seed}: the reject says why: {} / {message}",
                    error.message
                );
            }
        }

        // The engine still works: a well-formed turn on a new thread completes.
        let conn = sim.connect();
        sim.send(conn, submit("after", None, "One more"));
        sim.run(100_000);
        let ack = answer(&sim, conn, "after").expect("answered");
        assert!(ack.is_ok(), "seed {seed}: {ack:?}");
        assert!(
            sim.events_for(conn).iter().any(|e| matches!(
                e,
                Event::TurnComplete {
                    stop_reason: StopReason::End,
                    ..
                }
            )),
            "seed {seed}: the last turn completed"
        );
        assert!(
            sim.violations.is_empty(),
            "seed {seed}: {:?}",
            sim.violations
        );
    }
}

/// A chat-completions stream: text, two tool calls with fragmented
/// arguments, the stop, usage, `[DONE]`.
const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Looking \"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"at it.\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"page_snapshot\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"click\",\"arguments\":\"{\\\"ref\\\":\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"\\\"e1\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
);

/// A Messages stream: a text block, two tool_use blocks with streamed
/// input, the stop with usage.
const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Looking at it.\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"page_snapshot\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"click\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"ref\\\":\\\"e1\\\"}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

fn stream_of(transport: Transport) -> &'static str {
    match transport {
        Transport::OpenAi => OPENAI_STREAM,
        Transport::Anthropic => ANTHROPIC_STREAM,
    }
}

/// `stream` changed once or twice: an event's JSON mutated, an event dropped
/// or repeated; then maybe the bytes cut, a byte flipped (possibly into
/// invalid UTF-8) or junk inserted.
fn mutated_stream(gen: &mut Gen, stream: &str) -> Vec<u8> {
    let mut events: Vec<String> = stream
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    for _ in 0..1 + gen.below(2) {
        let i = gen.below(events.len());
        match gen.below(6) {
            0..=2 => {
                let Some((head, data)) = events[i].split_once("data: ") else {
                    continue;
                };
                let Ok(mut value) = serde_json::from_str::<serde_json::Value>(data) else {
                    continue;
                };
                gen.mutate(&mut value, 0);
                events[i] = format!("{head}data: {value}");
            }
            3 => {
                events.remove(i);
            }
            4 => {
                let copy = events[gen.below(events.len())].clone();
                events.insert(i, copy);
            }
            _ => {}
        }
        if events.is_empty() {
            break;
        }
    }
    let mut bytes = (events.join("\n\n") + "\n\n").into_bytes();
    match gen.below(5) {
        0 => bytes.truncate(gen.below(bytes.len().max(1))),
        1 if !bytes.is_empty() => {
            let i = gen.below(bytes.len());
            bytes[i] = gen.next() as u8;
        }
        2 => {
            let junk: [&[u8]; 4] = [
                b"\n\ndata: {\n\n",
                b"\xff\xfe",
                b"data: [DONE]\n\n",
                b"event: error\ndata: {}\n\n",
            ];
            let at = gen.below(bytes.len().max(1));
            let piece = junk[gen.below(junk.len())];
            bytes.splice(at..at, piece.iter().copied());
        }
        _ => {}
    }
    bytes
}

/// Decode `bytes` in random chunks: the deltas shown, then the response or
/// the typed error.
fn decode(
    gen: &mut Gen,
    transport: Transport,
    bytes: &[u8],
) -> (
    Vec<StreamEvent>,
    Result<sw_agent::provider::ProviderResponse, ProviderError>,
) {
    let mut decoder = Decoder::new(transport);
    let mut deltas = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(1 + gen.below(rest.len().min(64)));
        rest = tail;
        if let Err(error) = decoder.push_with(chunk, &mut |d| deltas.push(d)) {
            return (deltas, Err(error));
        }
    }
    (deltas, decoder.finish())
}

#[test]
fn mutated_provider_streams_end_in_a_response_or_a_typed_error() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        let mut gen = Gen(0x5EED_0001);
        let (mut responses, mut errors) = (0, 0);
        for case in 0..3_000 {
            let bytes = mutated_stream(&mut gen, stream_of(transport));
            let (deltas, result) = decode(&mut gen, transport, &bytes);
            let shown = |reasoning: bool| -> String {
                deltas
                    .iter()
                    .filter_map(|d| match (d, reasoning) {
                        (StreamEvent::TextDelta(t), false)
                        | (StreamEvent::ReasoningDelta(t), true) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect()
            };
            let context = || {
                format!(
                    "{transport:?} case {case}: {}",
                    String::from_utf8_lossy(&bytes)
                )
            };
            match result {
                Ok(response) => {
                    responses += 1;
                    // What the user saw stream in is what the response keeps.
                    assert_eq!(response.text, shown(false), "{}", context());
                    assert_eq!(response.reasoning, shown(true), "{}", context());
                    if !response.tool_calls.is_empty() {
                        assert_eq!(response.stop_reason, StopReason::ToolUse, "{}", context());
                    }
                }
                Err(error) => {
                    errors += 1;
                    assert!(!error.message.trim().is_empty(), "{}", context());
                }
            }
        }
        // Both outcomes occur: the mutations are neither all harmless nor all fatal.
        assert!(
            responses > 300 && errors > 300,
            "{transport:?}: {responses} responses, {errors} errors"
        );
    }
}

#[test]
fn turns_on_mutated_provider_streams_settle_with_every_invariant_kept() {
    for (seed, transport) in [
        (1u64, Transport::OpenAi),
        (2, Transport::Anthropic),
        (3, Transport::OpenAi),
        (4, Transport::Anthropic),
    ] {
        // The model's every answer is the recorded stream, mutated and
        // decoded as the driver does; every fourth is a plain final answer,
        // so turns end.
        let mut gen = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut requests = 0u64;
        let policy: Policy = Box::new(move |_: &_| {
            requests += 1;
            if requests % 4 == 0 {
                return Reply::text("Done.");
            }
            let bytes = mutated_stream(&mut gen, stream_of(transport));
            match decode(&mut gen, transport, &bytes) {
                (_, Ok(response)) if response.tool_calls.is_empty() => Reply::Text {
                    text: response.text,
                    stop: response.stop_reason,
                },
                (_, Ok(response)) => Reply::ToolCalls {
                    text: response.text,
                    calls: response.tool_calls,
                    stop: response.stop_reason,
                },
                (deltas, Err(error)) => Reply::Error {
                    partial: deltas
                        .into_iter()
                        .filter_map(|d| match d {
                            StreamEvent::TextDelta(t) => Some(t),
                            StreamEvent::ReasoningDelta(_) => None,
                        })
                        .collect(),
                    error,
                },
            }
        });
        let mut sim = Sim::new(seed, policy, page_tools());
        let conn = sim.connect();
        let mut thread: Option<String> = None;
        for turn in 0..40 {
            let id = format!("t{turn}");
            sim.send(conn, submit(&id, thread.as_deref(), "Look at the page"));
            sim.run(100_000);
            let ack =
                answer(&sim, conn, &id).unwrap_or_else(|| panic!("seed {seed}: {id} answered"));
            let ack = ack.unwrap_or_else(|e| panic!("seed {seed}: {id} refused: {e:?}"));
            thread = ack["threadId"].as_str().map(str::to_string);
            // Whatever the stream did, the run reached a state a user can act on.
            let run = sim
                .store
                .runs
                .values()
                .max_by_key(|r| r.created_at)
                .expect("a run");
            assert!(
                run.state.is_terminal() || run.state == sw_agent::model::RunState::PausedUncertain,
                "seed {seed} {id}: run left {:?}",
                run.state
            );
            if !run.state.is_terminal() {
                sim.send(
                    conn,
                    interrupt(&format!("x{turn}"), thread.as_deref().unwrap()),
                );
                sim.run(100_000);
            }
        }
        assert!(
            sim.violations.is_empty(),
            "seed {seed}: {:?}",
            sim.violations
        );
        check_invariants(&sim, &[]).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        // The mix is real: tools ran, some turns completed and some failed.
        let ended = |state| sim.store.runs.values().filter(|r| r.state == state).count();
        assert!(!sim.dispatches.is_empty(), "seed {seed}: no tool ran");
        assert!(
            ended(sw_agent::model::RunState::Completed) > 5,
            "seed {seed}"
        );
        assert!(ended(sw_agent::model::RunState::Failed) > 5, "seed {seed}");
    }
}

#[test]
fn mutated_page_messages_are_decoded_or_refused_with_a_reason() {
    let mut gen = Gen(0x5EED_0002);
    let well_formed = [
        json!({ "type": "tool.progress", "callId": "c1", "text": "waiting… 1 s" }),
        json!({ "type": "tool.result", "callId": "c1", "ok": true, "content": "Title: Shop", "details": { "frames": [] } }),
        json!({ "type": "tool.result", "callId": "c1", "ok": false, "content": "No element e9." }),
    ];
    let (mut decoded, mut refused) = (0, 0);
    for case in 0..5_000 {
        let mut message = well_formed[case % well_formed.len()].clone();
        for _ in 0..1 + gen.below(2) {
            gen.mutate(&mut message, 0);
        }
        match PageMessage::from_value(message.clone()) {
            Ok(_) => decoded += 1,
            Err(reason) => {
                refused += 1;
                assert!(!reason.trim().is_empty(), "{message}");
            }
        }
    }
    assert!(
        decoded > 500 && refused > 500,
        "{decoded} decoded, {refused} refused"
    );
}
