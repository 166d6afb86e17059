//! Native benchmarks (criterion), run by `make bench` and folded into
//! `target/bench/results.json` by `scripts/bench.mjs`. See BENCHMARKS.md.
//!
//! - `sse/*`: the SSE parser alone and the full OpenAI decoder (SSE + JSON +
//!   assembly) on a recorded-shape stream of 5,000 text chunks and a tool
//!   call, fed in 4 KiB reads: bytes per second.
//! - `context/*`: the outbound context builder (`outbound_messages`), the
//!   whole request body (`http_request`) and the size estimate
//!   (`estimate_tokens`) for active paths of 10 to 10,000 nodes: time per
//!   call (each runs once per provider request; the estimate only when the
//!   model has a context window).
//! - `sim/*`: whole agent turns on the native driver (engine + in-memory
//!   store, no IO): provider steps per second, for a fresh thread and for
//!   threads that already hold 1,000 and 10,000 nodes.
//!
//! Benchmarks measure; they never fail on slow numbers.

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::time::Duration;

    use criterion::{criterion_group, BatchSize, BenchmarkId, Criterion, Throughput};
    use serde_json::json;
    use std::hint::black_box;
    use sw_agent::engine::{estimate_tokens, outbound_messages, ToolOutcome};
    use sw_agent::model::{Node, ProviderProfile, Thread};
    use sw_agent::protocol::Op;
    use sw_agent::provider::body::BodyCache;
    use sw_agent::provider::sse::SseParser;
    use sw_agent::provider::{http_request, ChatMessage, Decoder, ProviderRequest, Transport};
    use sw_agent::sim::{Reply, Sim};
    use sw_agent::store::{Record, UnitOfWork};

    /// Tokens in the streamed text of the recorded stream.
    const STREAM_TOKENS: usize = 5_000;
    /// Bytes per read when feeding a stream (a typical fetch chunk).
    const READ_BYTES: usize = 4096;

    /// An OpenAI chat-completions SSE body in the exact frame shape the mock
    /// LLM (and api.openai.com) sends: one `chat.completion.chunk` per token,
    /// then a tool call in fragments, the finish chunk, usage and `[DONE]`.
    pub fn recorded_openai_stream(tokens: usize) -> Vec<u8> {
        let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
            let value = json!({
                "id": "chatcmpl-mock-1",
                "object": "chat.completion.chunk",
                "created": 1_760_000_000,
                "model": "mock-1",
                "system_fingerprint": "fp_mock",
                "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
                "usage": null,
            });
            format!("data: {value}\n\n")
        };
        let mut out = String::new();
        out.push_str(&chunk(
            json!({ "role": "assistant", "content": "" }),
            json!(null),
        ));
        for i in 0..tokens {
            let word = if i % 7 == 6 {
                "naïve✓ ".to_string()
            } else {
                format!("tok{i} ")
            };
            out.push_str(&chunk(json!({ "content": word }), json!(null)));
        }
        out.push_str(&chunk(
            json!({ "tool_calls": [{ "index": 0, "id": "call_1", "type": "function", "function": { "name": "page_snapshot", "arguments": "" } }] }),
            json!(null),
        ));
        for fragment in ["{\"re", "f\":\"e1", "2\"}"] {
            out.push_str(&chunk(
                json!({ "tool_calls": [{ "index": 0, "function": { "arguments": fragment } }] }),
                json!(null),
            ));
        }
        out.push_str(&chunk(json!({}), json!("tool_calls")));
        out.push_str(&format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-mock-1", "object": "chat.completion.chunk", "created": 1_760_000_000, "model": "mock-1", "choices": [], "usage": { "prompt_tokens": 1000, "completion_tokens": tokens, "total_tokens": 1000 + tokens } })
        ));
        out.push_str("data: [DONE]\n\n");
        out.into_bytes()
    }

    fn sse(c: &mut Criterion) {
        let body = recorded_openai_stream(STREAM_TOKENS);
        let mut group = c.benchmark_group("sse");
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("parser_5000_tokens", |b| {
            b.iter(|| {
                let mut parser = SseParser::new();
                let mut events = 0usize;
                for piece in body.chunks(READ_BYTES) {
                    events += parser.push(black_box(piece)).len();
                }
                events += parser.finish().len();
                events
            })
        });
        group.bench_function("openai_decoder_5000_tokens", |b| {
            b.iter(|| {
                let mut decoder = Decoder::new(Transport::OpenAi);
                let mut deltas = 0usize;
                for piece in body.chunks(READ_BYTES) {
                    deltas += decoder.push(black_box(piece)).expect("valid stream").len();
                }
                (deltas, decoder.finish().expect("complete stream"))
            })
        });
        group.finish();
    }

    /// A thread of about `len` nodes in the engine's record shapes: a turn
    /// context and a user message, then (assistant → tool_call → tool_result)
    /// triples of small realistic text, and a final answer. Built as JSON
    /// (the stored shape, the same as scripts/bench/seed.mjs) so that fields
    /// added later with serde defaults do not break the bench.
    pub fn seeded_nodes(thread_id: &str, len: usize) -> Vec<Node> {
        let mut bodies = vec![
            json!({ "kind": "turn_context", "turnId": format!("{thread_id}-turn"), "model": "mock-1" }),
            json!({ "kind": "user_message", "text": "Look at the page and tell me what is on sale.", "steered": false }),
        ];
        let mut i = 0;
        while bodies.len() + 3 < len.max(5) {
            let assistant_id = format!("{thread_id}-n{}", bodies.len());
            bodies.push(json!({
                "kind": "assistant_message",
                "text": format!("Step {i}: let me look at the page outline again."),
                "stopReason": "tool_use", "interrupted": false, "model": "mock-1",
            }));
            bodies.push(json!({
                "kind": "tool_call", "callId": format!("call_{i}"), "assistantId": assistant_id,
                "name": "page_snapshot", "label": "Page outline", "arguments": {},
            }));
            bodies.push(json!({
                "kind": "tool_result", "callId": format!("call_{i}"), "name": "page_snapshot", "status": "ok",
                "content": format!("Title: Shop (step {i})\n[e1] button \"Subscribe\"\n[e2] link \"Sale\"\nMain: Spring sale, 20% off shoes."),
            }));
            i += 1;
        }
        bodies.push(json!({
            "kind": "assistant_message", "text": "Shoes are 20% off.",
            "stopReason": "end", "interrupted": false, "model": "mock-1",
        }));
        bodies
            .into_iter()
            .enumerate()
            .map(|(index, mut body)| {
                let fields = body.as_object_mut().expect("object");
                fields.insert("id".into(), json!(format!("{thread_id}-n{index}")));
                fields.insert("threadId".into(), json!(thread_id));
                let parent = (index > 0).then(|| format!("{thread_id}-n{}", index - 1));
                fields.insert("parentId".into(), json!(parent));
                fields.insert("createdAt".into(), json!(1_000 + index as u64));
                serde_json::from_value(body).expect("a node in the stored shape")
            })
            .collect()
    }

    fn profile() -> ProviderProfile {
        ProviderProfile {
            kind: "openai".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "mock-1".into(),
            tool_use: true,
            ..ProviderProfile::default()
        }
    }

    fn context(c: &mut Criterion) {
        let mut group = c.benchmark_group("context");
        for len in [10usize, 1_000, 10_000] {
            let path = seeded_nodes("t", len);
            group.throughput(Throughput::Elements(path.len() as u64));
            group.bench_with_input(
                BenchmarkId::new("outbound_messages", len),
                &path,
                |b, path| b.iter(|| outbound_messages(black_box(path))),
            );
            let request = ProviderRequest {
                lineage: None,
                profile: profile(),
                system: "You are a browser agent.".into(),
                messages: outbound_messages(&path).into(),
                tools: Default::default(),
            };
            group.bench_with_input(
                BenchmarkId::new("request_body", len),
                &request,
                |b, request| b.iter(|| http_request(black_box(request), "sk-bench").body.len()),
            );
            // What a step really pays: the cache holds the previous step's
            // request (the same path without its last step: an assistant
            // message and its tool result), so only the new groups are encoded.
            let mut primed = BodyCache::new();
            let previous = ProviderRequest {
                lineage: None,
                messages: request.messages[..request.messages.len().saturating_sub(2)]
                    .to_vec()
                    .into(),
                ..request.clone()
            };
            primed.body(&previous);
            group.bench_with_input(
                BenchmarkId::new("request_body_next_step", len),
                &request,
                |b, request| {
                    b.iter_batched(
                        || primed.clone(),
                        |mut cache| cache.body(black_box(request)).len(),
                        BatchSize::LargeInput,
                    )
                },
            );
            group.bench_with_input(
                BenchmarkId::new("estimate_tokens", len),
                &request,
                |b, request| b.iter(|| estimate_tokens(black_box(request))),
            );
        }
        group.finish();
    }

    /// A native turn of `steps` page_snapshot steps and a final answer, on a
    /// thread that already holds `history` nodes (0: a fresh thread), loaded
    /// into memory before the measured part starts.
    fn sim_turn(steps: usize, history: usize) -> Sim {
        let policy = Box::new(move |request: &ProviderRequest| {
            let done = request
                .messages
                .iter()
                .rev()
                .take_while(|m| !matches!(m, ChatMessage::User { .. }))
                .filter(|m| matches!(m, ChatMessage::ToolResult { .. }))
                .count();
            if done < steps {
                Reply::call(&format!("call_s{done}"), "page_snapshot", "{}")
            } else {
                Reply::text("Done.")
            }
        });
        let tool = Box::new(|_: &str, _: &serde_json::Value| {
            ToolOutcome::text(true, "Title: Shop\n[e1] button \"Subscribe\"")
        });
        let mut sim = Sim::new(7, policy, tool);
        // Like the browser driver, hold no finished request's conversation.
        sim.keep_request_messages = false;
        let thread_id = if history > 0 {
            let nodes = seeded_nodes("seeded", history);
            let thread: Thread = serde_json::from_value(json!({
                "id": "seeded", "title": "Seeded", "leafId": nodes.last().map(|n| n.id.clone()),
                "createdAt": 1, "updatedAt": 1, "revision": 1, "parentThreadId": null,
            }))
            .expect("a thread in the stored shape");
            let mut unit = UnitOfWork::new();
            unit.put(Record::Thread(thread));
            for node in nodes {
                unit.put(Record::Node(node));
            }
            sim.store.apply(&unit);
            sim.crash(); // restart the engine from the seeded store
            Some("seeded".to_string())
        } else {
            None
        };
        let conn = sim.connect();
        let op =
            |value: serde_json::Value| -> Op { serde_json::from_value(value).expect("a valid op") };
        if let Some(thread_id) = &thread_id {
            // Load the thread before the measured turn (a cold start is measured elsewhere).
            sim.send(
                conn,
                op(json!({ "type": "initialize", "clientId": "bench", "submissionId": "s0", "threadId": thread_id })),
            );
            sim.drain_effects();
        }
        sim.send(
            conn,
            op(json!({
                "type": "turn.submit", "clientId": "bench", "submissionId": "s1",
                "threadId": thread_id, "input": { "text": "Look at the page repeatedly." },
            })),
        );
        sim
    }

    fn sim(c: &mut Criterion) {
        let mut group = c.benchmark_group("sim");
        let steps = 20usize;
        // One element = one provider request (the step), the final answer included.
        group.throughput(Throughput::Elements(steps as u64 + 1));
        for history in [0usize, 1_000, 10_000] {
            group.bench_with_input(
                BenchmarkId::new("turn_20_steps_history", history),
                &history,
                |b, &history| {
                    b.iter_batched(
                        || sim_turn(steps, history),
                        |mut sim| {
                            sim.run(1_000_000);
                            assert_eq!(sim.requests.len(), steps + 1, "every step ran");
                            sim
                        },
                        criterion::BatchSize::LargeInput,
                    )
                },
            );
        }
        group.finish();
    }

    criterion_group! {
        name = benches;
        config = Criterion::default()
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        targets = sse, context, sim
    }

    pub fn main() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    native::main();
}

/// The benches are native only; on wasm32 (`clippy --all-targets`) this is empty.
#[cfg(target_arch = "wasm32")]
fn main() {}
