//! Builders and invariant checks shared by the native suites.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};
use sw_agent::engine::ToolOutcome;
use sw_agent::model::{path_to_leaf, Node, NodeBody, StopReason};
use sw_agent::protocol::{ErrorInfo, Event, Op, Submission, UncertainChoice, UserInput};
use sw_agent::provider::{ChatMessage, ProviderRequest, RawToolCall};
use sw_agent::sim::{Policy, Reply, Sim, ToolFn};

pub fn submission(id: &str) -> Submission {
    Submission {
        client_id: "client-1".into(),
        submission_id: id.into(),
    }
}

pub fn submit(id: &str, thread: Option<&str>, text: &str) -> Op {
    Op::TurnSubmit {
        submission: submission(id),
        thread_id: thread.map(str::to_string),
        input: UserInput::text(text),
        replaces: None,
    }
}

pub fn steer(id: &str, thread: &str, turn: &str, text: &str) -> Op {
    Op::TurnSteer {
        submission: submission(id),
        thread_id: thread.into(),
        expected_turn_id: turn.into(),
        input: UserInput::text(text),
    }
}

pub fn enqueue(id: &str, thread: &str, text: &str) -> Op {
    Op::TurnEnqueue {
        submission: submission(id),
        thread_id: thread.into(),
        input: UserInput::text(text),
    }
}

pub fn interrupt(id: &str, thread: &str) -> Op {
    Op::TurnInterrupt {
        submission: submission(id),
        thread_id: thread.into(),
    }
}

pub fn resume(id: &str, thread: &str) -> Op {
    Op::RunResume {
        submission: submission(id),
        thread_id: thread.into(),
        input: None,
    }
}

pub fn resolve(id: &str, thread: &str, choice: UncertainChoice) -> Op {
    Op::RunResolveUncertain {
        submission: submission(id),
        thread_id: thread.into(),
        choice,
    }
}

pub fn queue_remove(id: &str, thread: &str, item: &str) -> Op {
    Op::QueueRemove {
        submission: submission(id),
        thread_id: thread.into(),
        item_id: item.into(),
    }
}

pub fn queue_update(id: &str, thread: &str, item: &str, text: &str) -> Op {
    Op::QueueUpdate {
        submission: submission(id),
        thread_id: thread.into(),
        item_id: item.into(),
        input: UserInput::text(text),
    }
}

pub fn approval_response(
    id: &str,
    thread: &str,
    approval: &str,
    decision: sw_agent::protocol::ApprovalDecision,
) -> Op {
    Op::ApprovalResponse {
        submission: submission(id),
        thread_id: thread.into(),
        approval_id: approval.into(),
        decision,
    }
}

pub fn interaction_response(id: &str, thread: &str, interaction: &str, answer: &str) -> Op {
    Op::InteractionResponse {
        submission: submission(id),
        thread_id: thread.into(),
        interaction_id: interaction.into(),
        answer: answer.into(),
    }
}

pub fn fork(id: &str, thread: &str, node: Option<&str>) -> Op {
    Op::ThreadFork {
        submission: submission(id),
        thread_id: thread.into(),
        node_id: node.map(str::to_string),
    }
}

pub fn select_branch(id: &str, thread: &str, node: &str) -> Op {
    Op::ThreadSelectBranch {
        submission: submission(id),
        thread_id: thread.into(),
        node_id: node.into(),
    }
}

pub fn history(id: &str, thread: &str, before: &str, limit: Option<u32>) -> Op {
    Op::ThreadHistory {
        submission: submission(id),
        thread_id: thread.into(),
        before_node_id: before.into(),
        limit,
    }
}

pub fn initialize(id: &str, thread: Option<&str>) -> Op {
    Op::Initialize {
        submission: submission(id),
        thread_id: thread.map(str::to_string),
    }
}

/// The tiny agent of the demo: read the page, click Subscribe, report.
/// A pure function of the request, so it answers the same after a crash.
pub fn agent_policy() -> Policy {
    Box::new(|request: &ProviderRequest| match request.messages.last() {
        Some(ChatMessage::ToolResult { content, .. }) if content.contains("PAGE Acme") => {
            Reply::call("", "click", r#"{"ref":"e1"}"#)
        }
        Some(ChatMessage::ToolResult { .. }) => Reply::text("Done: clicked Subscribe."),
        _ if request.tools.is_empty() => Reply::text("Tools are disabled; stopping."),
        // Two reads at once: the simulation also covers parallel batches.
        _ => Reply::ToolCalls {
            text: String::new(),
            calls: vec![
                sw_agent::provider::RawToolCall {
                    id: "call_outline".into(),
                    name: "page_snapshot".into(),
                    arguments: "{}".into(),
                },
                sw_agent::provider::RawToolCall {
                    id: "call_read".into(),
                    name: "read_page".into(),
                    arguments: "{}".into(),
                },
            ],
            stop: StopReason::ToolUse,
        },
    })
}

/// One `read_page` call ("Reading."), then `answer`: a stateful policy for
/// tests that run one turn without crashes.
pub fn read_then_answer(answer: &'static str) -> Policy {
    let mut step = 0;
    Box::new(move |_: &ProviderRequest| {
        step += 1;
        match step {
            1 => Reply::ToolCalls {
                text: "Reading.".into(),
                calls: vec![sw_agent::provider::RawToolCall {
                    id: "c1".into(),
                    name: "read_page".into(),
                    arguments: "{}".into(),
                }],
                stop: StopReason::ToolUse,
            },
            _ => Reply::text(answer),
        }
    })
}

/// Page tools that always work; the page counts clicks.
pub fn page_tools() -> ToolFn {
    Box::new(|name: &str, _params: &Value| match name {
        "page_snapshot" => ToolOutcome {
            ok: true,
            content: "Outline: [e1] button \"Subscribe\"".into(),
            details: None,
            images: vec![],
        },
        "read_page" => ToolOutcome {
            ok: true,
            content: "PAGE Acme\n[e1] button \"Subscribe\"".into(),
            details: None,
            images: vec![],
        },
        "click" => ToolOutcome {
            ok: true,
            content: "Clicked button \"Subscribe\" (e1).".into(),
            details: Some(json!({ "ref": "e1" })),
            images: vec![],
        },
        other => ToolOutcome {
            ok: false,
            content: format!("unknown tool {other}"),
            details: None,
            images: vec![],
        },
    })
}

/// The page tools with one change that alters a digest: `click` gains a
/// parameter (what a restarted worker with an updated registry would see).
pub fn registry_with_changed_click() -> sw_agent::tools::ToolRegistry {
    let mut registry = sw_agent::tools::ToolRegistry::new();
    for d in sw_agent::tools::ToolRegistry::page_tools().descriptors() {
        let mut d = d.clone();
        if d.name == "click" {
            d.parameters["properties"]["force"] = json!({ "type": "boolean" });
        }
        registry.register(d).expect("valid descriptor");
    }
    registry
}

/// A client reconnecting after a crash: connect and subscribe to the thread.
pub fn reconnect(sim: &mut Sim) -> u64 {
    let conn = sim.connect();
    let thread = sim.store.threads.keys().next().cloned();
    // As the worker script does: a cached snapshot first, when there is
    // one; every other reconnect is a fresh panel's (no thread id).
    let asked = if sim.crashes % 2 == 0 {
        None
    } else {
        thread.as_deref()
    };
    if sim.initialize_from_cache(conn, asked) {
        return conn;
    }
    sim.send(conn, initialize("init-after-crash", thread.as_deref()));
    conn
}

/// The thread id and latest turn id seen by a client.
pub fn current_ids(sim: &Sim) -> (Option<String>, Option<String>) {
    let mut thread = None;
    let mut turn = None;
    for (_, envelope) in &sim.events {
        if let Event::TurnStart { thread_id, turn_id } = &envelope.event {
            thread = Some(thread_id.clone());
            turn = Some(turn_id.clone());
        }
    }
    (thread, turn)
}

/// The durable path of every thread in the store.
/// A stored thread record's `pathLen`, when set, is its active path's length
/// (a cold start pages the thread's tail by it).
pub fn check_path_lengths(sim: &Sim, all_paths: &[Vec<Node>]) -> Result<(), String> {
    for (thread, path) in sim.store.threads.values().zip(all_paths) {
        if let Some(len) = thread.path_len {
            if len != path.len() as u64 {
                return Err(format!(
                    "thread {} stores pathLen {len}, its active path has {} nodes",
                    thread.id,
                    path.len()
                ));
            }
        }
    }
    Ok(())
}

/// The texts of the user's messages on the first thread's path: the
/// steers (`steered`) or the others.
pub fn user_texts(sim: &Sim, steered: bool) -> Vec<String> {
    paths(sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::UserMessage {
                text, steered: s, ..
            } if *s == steered => Some(text.clone()),
            _ => None,
        })
        .collect()
}

pub fn paths(sim: &Sim) -> Vec<Vec<Node>> {
    sim.store
        .threads
        .values()
        .map(|t| {
            let nodes: Vec<Node> = sim
                .store
                .nodes
                .values()
                .filter(|n| n.thread_id == t.id)
                .cloned()
                .collect();
            path_to_leaf(&nodes, t.leaf_id.as_deref())
        })
        .collect()
}

pub fn kinds(path: &[Node]) -> Vec<&'static str> {
    path.iter().map(Node::kind_name).collect()
}

/// Every invariant the native driver can check on a finished simulation.
/// `steer_texts` are the steers in the order they were sent; `acked` the
/// submission ids the engine ACKed.
pub fn check_invariants(sim: &Sim, steer_texts: &[String]) -> Result<(), String> {
    check_invariants_except(sim, steer_texts, &HashSet::new())
}

/// [`check_invariants`], where the acked steers in `deleted` went with
/// their thread (a `thread.delete` after they landed).
pub fn check_invariants_except(
    sim: &Sim,
    steer_texts: &[String],
    deleted: &HashSet<String>,
) -> Result<(), String> {
    if let Some(v) = sim.violations.first() {
        return Err(v.clone());
    }
    let mut acked_steers: HashSet<String> = acked_steer_texts(sim);
    acked_steers.retain(|t| !deleted.contains(t));
    let all_paths = paths(sim);
    check_path_lengths(sim, &all_paths)?;
    let runs_terminal = sim.store.runs.values().all(|r| r.state.is_terminal());
    for path in &all_paths {
        check_path_shape(path, runs_terminal)?;
    }
    // steer_exactly_once_in_order: once per thread (a fork copies its
    // thread's path, steers included, into a thread of its own).
    let mut steered: Vec<String> = Vec::new();
    for path in &all_paths {
        let mut seen: HashSet<&str> = HashSet::new();
        for node in path {
            if let NodeBody::UserMessage {
                text,
                steered: true,
                ..
            } = &node.body
            {
                if !seen.insert(text) {
                    return Err(format!(
                        "steer_exactly_once_in_order: steer {text:?} appears twice in thread {}",
                        node.thread_id
                    ));
                }
                if !steered.contains(text) {
                    steered.push(text.clone());
                }
            }
        }
    }
    let counts: HashSet<&str> = steered.iter().map(String::as_str).collect();
    if runs_terminal {
        for text in &acked_steers {
            // The simulation may reuse a steer's id with other text ("<text>
            // (conflict)"); if the first was lost before it was durable, the
            // ACK under that id is the conflicting steer's.
            let conflict = format!("{text} (conflict)");
            let durable_pending = sim
                .store
                .steers
                .values()
                .any(|s| &s.text == text || s.text == conflict);
            // Landed on any branch (an edit or a branch switch may have
            // moved the active path away from it since).
            let landed = counts.contains(text.as_str())
                || counts.contains(conflict.as_str())
                || sim.store.nodes.values().any(|n| {
                    matches!(&n.body, NodeBody::UserMessage { text: t, steered: true, .. }
                        if t == text || *t == conflict)
                });
            if !landed && !durable_pending {
                return Err(format!(
                    "steer_exactly_once_in_order: acked steer {text:?} was lost"
                ));
            }
        }
    }
    // Admission order of the steers the engine accepted as steers (a steer it
    // downgraded to a queued turn is ordered by the queue, not by admission).
    let accepted: HashSet<&str> = steered.iter().map(String::as_str).collect();
    let order: HashMap<&str, usize> = steer_texts
        .iter()
        .filter(|t| acked_steers.contains(*t) || accepted.contains(t.as_str()))
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    // In admission order within each thread.
    for path in &all_paths {
        let in_path: Vec<&str> = path
            .iter()
            .filter_map(|n| match &n.body {
                NodeBody::UserMessage {
                    text,
                    steered: true,
                    ..
                } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let positions: Vec<usize> = in_path
            .iter()
            .filter_map(|t| order.get(t).copied())
            .collect();
        if positions.windows(2).any(|w| w[0] > w[1]) {
            return Err(format!(
                "steer_exactly_once_in_order: steers out of admission order: {in_path:?}"
            ));
        }
    }
    // one_cutoff_per_request and no_orphan_tool_calls, per request.
    for (i, request) in sim.requests.iter().enumerate() {
        check_request(request).map_err(|e| format!("request {i}: {e}"))?;
        check_wire_bodies(request).map_err(|e| format!("request {i}: {e}"))?;
        let in_request: Vec<usize> = request
            .messages
            .iter()
            .filter_map(|m| match m {
                ChatMessage::User { text, .. } => order.get(text.as_str()).copied(),
                _ => None,
            })
            .collect();
        if in_request.windows(2).any(|w| w[0] >= w[1]) {
            let users: Vec<&str> = request
                .messages
                .iter()
                .filter_map(|m| match m {
                    ChatMessage::User { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            return Err(format!(
                "one_cutoff_per_request: request {i} has steers out of order or twice: {users:?}"
            ));
        }
    }
    // never_retry_at_most_once: a repeat needs the user's explicit Retry of
    // an uncertain write (one more dispatch per Retry decision).
    let retries = sim
        .events
        .iter()
        .filter(|(_, e)| {
            matches!(&e.event, Event::CommandAck { op_type, result, .. }
                if op_type == "run.resolveUncertain" && result["choice"] == "retry")
        })
        .map(|(_, e)| match &e.event {
            Event::CommandAck { submission_id, .. } => submission_id.clone(),
            _ => unreachable!(),
        })
        .collect::<HashSet<_>>()
        .len();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for d in &sim.dispatches {
        if d.name != "click" {
            continue;
        }
        let n = counts.entry(d.call_id.as_str()).or_default();
        *n += 1;
        if *n > 1 + retries {
            return Err(format!(
                "never_retry_at_most_once: click {} dispatched twice",
                d.call_id
            ));
        }
    }
    Ok(())
}

fn acked_steer_texts(sim: &Sim) -> HashSet<String> {
    let acked: HashSet<&str> = sim
        .events
        .iter()
        .filter_map(|(_, e)| match &e.event {
            Event::CommandAck {
                submission_id,
                op_type,
                result,
            } if op_type == "turn.steer" && result.get("steerId").is_some() => {
                Some(submission_id.as_str())
            }
            _ => None,
        })
        .collect();
    // Steer submissions are named "steer-<text>" by the simulation.
    acked
        .iter()
        .filter_map(|id| id.strip_prefix("steer-").map(str::to_string))
        .collect()
}

/// tool_call_ids_normalized + no_orphan_tool_calls + steers never between a call and its result.
pub fn check_path_shape(path: &[Node], terminal: bool) -> Result<(), String> {
    let mut call_ids = HashSet::new();
    let mut open: Vec<String> = Vec::new();
    let mut results: HashMap<String, usize> = HashMap::new();
    for node in path {
        match &node.body {
            NodeBody::ToolCall { call_id, .. } => {
                if call_id.is_empty() || !call_ids.insert(call_id.clone()) {
                    return Err(format!(
                        "tool_call_ids_normalized: bad or duplicate id {call_id:?}"
                    ));
                }
                open.push(call_id.clone());
            }
            NodeBody::ToolResult { call_id, .. } => {
                *results.entry(call_id.clone()).or_default() += 1;
                open.retain(|c| c != call_id);
            }
            NodeBody::UserMessage { steered, text, .. } if !open.is_empty() => {
                return Err(format!(
                    "steer_exactly_once_in_order: user message {text:?} (steered: {steered}) between a tool call and its result"
                ));
            }
            NodeBody::AssistantMessage { .. } if !open.is_empty() => {
                return Err(format!(
                    "no_orphan_tool_calls: {open:?} have no result before the next response"
                ));
            }
            _ => {}
        }
    }
    if let Some((id, n)) = results.iter().find(|(_, n)| **n > 1) {
        return Err(format!("no_orphan_tool_calls: call {id} has {n} results"));
    }
    if terminal && !open.is_empty() {
        return Err(format!(
            "no_orphan_tool_calls: {open:?} without result in a terminal state"
        ));
    }
    Ok(())
}

/// Every tool call in a request has exactly one result right after its message.
pub fn check_request(request: &ProviderRequest) -> Result<(), String> {
    let mut open: Vec<&str> = Vec::new();
    for message in request.messages.iter() {
        match message {
            ChatMessage::Assistant { tool_calls, .. } => {
                if !open.is_empty() {
                    return Err(format!("no_orphan_tool_calls: {open:?} unanswered"));
                }
                open = tool_calls.iter().map(|c| c.id.as_str()).collect();
            }
            ChatMessage::ToolResult { call_id, .. } => {
                if !open.contains(&call_id.as_str()) {
                    return Err(format!(
                        "no_orphan_tool_calls: result for unknown call {call_id}"
                    ));
                }
                open.retain(|c| *c != call_id);
            }
            ChatMessage::User { .. } => {
                if !open.is_empty() {
                    return Err(format!(
                        "no_orphan_tool_calls: user message before results of {open:?}"
                    ));
                }
            }
        }
    }
    if !open.is_empty() {
        return Err(format!(
            "no_orphan_tool_calls: {open:?} unanswered at request end"
        ));
    }
    // A request never ends with the model's own finished answer: that turn was over.
    if let Some(ChatMessage::Assistant { tool_calls, .. }) = request.messages.last() {
        if tool_calls.is_empty() {
            return Err(
                "request ends with a finished assistant answer (a completed turn was re-run)"
                    .into(),
            );
        }
    }
    Ok(())
}

/// One command answer: the submission id, and the ACK's result or the
/// reject's error.
pub type Answer = (String, Result<Value, ErrorInfo>);

/// Every command answer one client got, in the order it got them.
pub fn answers(sim: &Sim, conn: u64) -> Vec<Answer> {
    sim.events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::CommandAck {
                submission_id,
                result,
                ..
            } => Some((submission_id.clone(), Ok(result.clone()))),
            Event::CommandReject {
                submission_id,
                error,
                ..
            } => Some((submission_id.clone(), Err(error.clone()))),
            _ => None,
        })
        .collect()
}

/// The first answer to `submission`.
pub fn answer(sim: &Sim, conn: u64, submission: &str) -> Option<Result<Value, ErrorInfo>> {
    answers(sim, conn)
        .into_iter()
        .find(|(id, _)| id == submission)
        .map(|(_, answer)| answer)
}

/// The thread named by the ACK of `submission` on `conn` (a submit that
/// created one, a fork), if it was ACKed.
pub fn acked_thread(sim: &Sim, conn: u64, submission: &str) -> Option<String> {
    answer(sim, conn, submission)?.ok()?["threadId"]
        .as_str()
        .map(str::to_string)
}

/// A simulation with one panel whose task `text` ran to its end in a new
/// thread (the agent reads the page and, asked to, clicks): (sim, conn).
pub fn one_turn(seed: u64, text: &str) -> (Sim, u64) {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, text));
    sim.run(10_000);
    (sim, conn)
}

/// The message of the `command.reject` that answered `submission_id` on `conn`.
pub fn reject_message(
    sim: &Sim,
    conn: sw_agent::engine::ConnId,
    submission_id: &str,
) -> Option<String> {
    sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::CommandReject {
            submission_id: id,
            error,
            ..
        } if id == submission_id => Some(error.message.clone()),
        _ => None,
    })
}

/// The last turn.complete stop reason seen.
pub fn last_stop(sim: &Sim) -> Option<StopReason> {
    sim.events.iter().rev().find_map(|(_, e)| match &e.event {
        Event::TurnComplete { stop_reason, .. } => Some(*stop_reason),
        _ => None,
    })
}

/// What the providers' APIs refuse with a 400, checked on the bodies the
/// engine would send for `request` in both formats: OpenAI, every tool
/// call answered by tool messages right after its assistant message and
/// nothing else answered; Anthropic, a user message first, roles
/// alternating, no empty text, every tool_use answered by a tool_result in
/// the very next (user) message, tool results first in it and for nothing else.
pub fn check_wire_bodies(request: &ProviderRequest) -> Result<(), String> {
    let openai = sw_agent::provider::openai::build_body(request);
    let messages = openai["messages"].as_array().ok_or("openai: no messages")?;
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            if !open.iter().any(|c| c == id) {
                return Err(format!(
                    "openai: message {i} answers {id}, which is not open"
                ));
            }
            open.retain(|c| c != id);
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "openai: message {i} ({role}) before the results of {open:?}"
            ));
        }
        if role == "assistant" {
            let calls = m["tool_calls"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            if calls.is_empty() && !m["content"].is_string() {
                return Err(format!(
                    "openai: assistant message {i} with neither text nor calls"
                ));
            }
            open = calls
                .iter()
                .filter_map(|c| c["id"].as_str().map(str::to_string))
                .collect();
        }
    }
    if !open.is_empty() {
        return Err(format!("openai: {open:?} unanswered at the end"));
    }

    let anthropic = sw_agent::provider::anthropic::build_body(request);
    let messages = anthropic["messages"]
        .as_array()
        .ok_or("anthropic: no messages")?;
    let mut previous_uses: Vec<String> = Vec::new();
    let defines_tools = anthropic.get("tools").is_some();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        let tool_block = m["content"].as_array().is_some_and(|blocks| {
            blocks
                .iter()
                .any(|b| b["type"] == "tool_use" || b["type"] == "tool_result")
        });
        if tool_block && !defines_tools {
            return Err(format!(
                "anthropic: message {i} holds tool blocks, but the request defines no tools"
            ));
        }
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!(
                "anthropic: message {i} is {role}, {expected} expected"
            ));
        }
        let blocks = m["content"]
            .as_array()
            .ok_or(format!("anthropic: message {i} has no blocks"))?;
        if blocks.is_empty() {
            return Err(format!("anthropic: message {i} is empty"));
        }
        let mut results_done = false;
        let mut answered: Vec<String> = Vec::new();
        let mut uses: Vec<String> = Vec::new();
        for block in blocks {
            match block["type"].as_str().unwrap_or_default() {
                "text" if block["text"].as_str().unwrap_or_default().trim().is_empty() => {
                    return Err(format!("anthropic: a blank text block in message {i}"));
                }
                "tool_result" => {
                    let blank = block["content"].as_array().is_some_and(|parts| {
                        parts.iter().any(|p| {
                            p["type"] == "text"
                                && p["text"].as_str().unwrap_or_default().trim().is_empty()
                        })
                    });
                    if blank {
                        return Err(format!(
                            "anthropic: a blank text block in a tool_result of message {i}"
                        ));
                    }
                    if results_done {
                        return Err(format!(
                            "anthropic: a tool_result after text in message {i}"
                        ));
                    }
                    let id = block["tool_use_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    if !previous_uses.contains(&id) {
                        return Err(format!(
                            "anthropic: message {i} answers {id}, not used just before"
                        ));
                    }
                    answered.push(id);
                }
                "tool_use" => uses.push(block["id"].as_str().unwrap_or_default().to_string()),
                _ => results_done = true,
            }
        }
        if let Some(missing) = previous_uses.iter().find(|u| !answered.contains(u)) {
            return Err(format!(
                "anthropic: tool_use {missing} has no result in message {i}"
            ));
        }
        previous_uses = uses;
    }
    if !previous_uses.is_empty() {
        return Err(format!(
            "anthropic: {previous_uses:?} unanswered at the end"
        ));
    }
    Ok(())
}

/// The store holds no record of a deleted thread (nothing was written again
/// after its delete, nothing was left behind by it), and every thread's leaf
/// is a node of that thread.
pub fn check_store_belongs_to_threads(sim: &Sim) -> Result<(), String> {
    let store = &sim.store;
    let owners = store
        .nodes
        .values()
        .map(|n| &n.thread_id)
        .chain(store.runs.values().map(|r| &r.thread_id))
        .chain(store.queue.values().map(|q| &q.thread_id))
        .chain(store.steers.values().map(|s| &s.thread_id))
        .chain(store.approvals.values().map(|a| &a.thread_id))
        .chain(store.interactions.values().map(|i| &i.thread_id))
        .chain(store.snapshots.values().map(|s| &s.thread_id));
    for owner in owners {
        if !store.threads.contains_key(owner) {
            return Err(format!("a record of the deleted thread {owner}"));
        }
    }
    for thread in store.threads.values() {
        if let Some(leaf) = &thread.leaf_id {
            if store
                .nodes
                .get(leaf)
                .is_none_or(|n| n.thread_id != thread.id)
            {
                return Err(format!("{} has no leaf {leaf}", thread.id));
            }
        }
    }
    Ok(())
}

/// `thread.delete` of `thread`.
pub fn delete(id: &str, thread: &str) -> Op {
    Op::ThreadDelete {
        submission: submission(id),
        thread_id: thread.into(),
        stop_turn: false,
    }
}

/// `thread.delete` of `thread` with `stopTurn`: a running turn is stopped first.
pub fn stop_and_delete(id: &str, thread: &str) -> Op {
    Op::ThreadDelete {
        submission: submission(id),
        thread_id: thread.into(),
        stop_turn: true,
    }
}

pub fn list_site_rules(id: &str) -> Op {
    Op::SiteRulesList {
        submission: submission(id),
    }
}

/// Every approval request the engine sent, in order.
pub fn approval_requests(sim: &Sim) -> Vec<sw_agent::model::ApprovalRecord> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match &e.event {
            Event::ApprovalRequest { approval, .. } => Some(approval.clone()),
            _ => None,
        })
        .collect()
}

pub fn list_mcp_servers(id: &str) -> Op {
    Op::McpServersList {
        submission: submission(id),
    }
}

pub fn refresh_mcp_servers(id: &str, name: Option<&str>) -> Op {
    Op::McpServersRefresh {
        submission: submission(id),
        name: name.map(str::to_string),
    }
}

pub fn revoke_site_rule(id: &str, origin: &str) -> Op {
    Op::SiteRuleRevoke {
        submission: submission(id),
        origin: origin.into(),
    }
}

/// A tool call as the model sends it.
pub fn call(id: &str, name: &str, args: &str) -> RawToolCall {
    RawToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

/// A model that calls `calls` at once, then answers "done".
pub fn once(calls: Vec<RawToolCall>) -> sw_agent::sim::Policy {
    let mut sent = false;
    Box::new(move |_: &ProviderRequest| {
        if sent {
            Reply::text("done")
        } else {
            sent = true;
            Reply::ToolCalls {
                text: String::new(),
                calls: calls.clone(),
                stop: StopReason::ToolUse,
            }
        }
    })
}

/// Results persisted so far, in path order.
pub fn result_ids(sim: &Sim) -> Vec<String> {
    paths(sim)
        .first()
        .map(|p| {
            p.iter()
                .filter_map(|n| match &n.body {
                    NodeBody::ToolResult { call_id, .. } => Some(call_id.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn rename(id: &str, thread: &str, title: &str) -> Op {
    Op::ThreadRename {
        submission: submission(id),
        thread_id: thread.into(),
        title: title.into(),
    }
}

/// The latest snapshot's thread view a client received.
pub fn last_view(sim: &Sim, conn: u64) -> sw_agent::protocol::ThreadView {
    sim.events_for(conn)
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::Initialized { snapshot } => snapshot.thread.clone(),
            _ => None,
        })
        .expect("a snapshot with a thread")
}

/// How many tool results a request carries: which step of a turn it is.
pub fn tool_results_so_far(request: &ProviderRequest) -> usize {
    request
        .messages
        .iter()
        .filter(|m| matches!(m, ChatMessage::ToolResult { .. }))
        .count()
}

/// A model that makes the calls `(id, name, arguments)` one per step, in
/// order (the step is the number of tool results so far), then answers `text`.
pub fn calls_then_text(
    calls: &'static [(&'static str, &'static str, &'static str)],
    text: &'static str,
) -> sw_agent::sim::Policy {
    Box::new(move |request: &ProviderRequest| {
        let results = tool_results_so_far(request);
        match calls.get(results) {
            Some((id, name, arguments)) => sw_agent::sim::Reply::call(id, name, arguments),
            None => sw_agent::sim::Reply::text(text),
        }
    })
}

/// A tiny deterministic RNG for seeded schedules (independent of engine ids).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
}
