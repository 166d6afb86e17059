//! Context window management: compaction checkpoints, overflow repair and
//! its progress guard, on long simulated tasks; the task's messages copied
//! verbatim into checkpoints; the tail a checkpoint keeps (what the model
//! has not answered yet); the summary request (plain text, bounded,
//! retried); the threshold's room for the answer.

use sw_agent::engine::{
    compaction_threshold, estimate_text_tokens, estimate_tokens, summary_message, verbatim_section,
    COMPACTION_PROMPT, CONTINUE_TEXT, VERBATIM_HEADER, VERBATIM_MAX_TOKENS,
};
use sw_agent::model::{Node, NodeBody, RunState, StopReason};
use sw_agent::protocol::ErrorKind;
use sw_agent::provider::{ChatMessage, ProviderError, ProviderRequest};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

/// Reads the (large) page `steps` times, then answers. Summaries on request.
fn long_task(steps: usize) -> sw_agent::sim::Policy {
    let mut summaries = 0;
    let mut reads = 0;
    Box::new(move |request: &ProviderRequest| {
        if *request.system == *COMPACTION_PROMPT {
            summaries += 1;
            return Reply::text(&format!(
                "SUMMARY {summaries}: goal is to read the page {steps} times; {reads} done."
            ));
        }
        if reads >= steps {
            Reply::text("finished")
        } else {
            reads += 1;
            Reply::call("", "read_page", "{}")
        }
    })
}

fn big_page() -> sw_agent::sim::ToolFn {
    Box::new(|_: &str, _: &serde_json::Value| {
        sw_agent::engine::ToolOutcome::text(true, "PAGE ".repeat(800))
    })
}

fn compactions(sim: &Sim) -> usize {
    paths(sim)[0]
        .iter()
        .filter(|n| matches!(n.body, NodeBody::Compaction { .. }))
        .count()
}

#[test]
fn long_task_compacts_at_the_threshold_at_least_twice_and_finishes() {
    let mut sim = Sim::new(110, long_task(30), big_page());
    sim.realistic_usage = true;
    sim.profile.context_window = Some(8_000);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    assert!(
        compactions(&sim) >= 2,
        "compacted {} times",
        compactions(&sim)
    );
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    // Every request the model saw fits the window (with the 80% threshold).
    for r in sim
        .requests
        .iter()
        .filter(|r| *r.system != *COMPACTION_PROMPT)
    {
        assert!(
            estimate_tokens(r) <= 8_000,
            "a request of ~{} tokens was sent",
            estimate_tokens(r)
        );
    }
    // Requests after a checkpoint lead with its summary.
    let last = sim
        .requests
        .iter()
        .rev()
        .find(|r| *r.system != *COMPACTION_PROMPT)
        .unwrap();
    assert!(
        matches!(&last.messages[0], ChatMessage::User { text, .. } if text.contains("SUMMARY"))
    );
    // The stored history is never deleted: every tool result is still there.
    let results = paths(&sim)[0]
        .iter()
        .filter(|n| matches!(n.body, NodeBody::ToolResult { .. }))
        .count();
    let calls = paths(&sim)[0]
        .iter()
        .filter(|n| matches!(n.body, NodeBody::ToolCall { .. }))
        .count();
    assert_eq!(results, calls);
    assert!(results > 10);
    // The summaries' usage is counted.
    assert!(run.usage.input >= 10 * (sim.requests.len() as u64));
    check_invariants(&sim, &[]).unwrap();
}

/// A provider that overflows above `limit` estimated tokens.
fn overflowing(limit: u64, always: bool) -> sw_agent::sim::Policy {
    let mut inner = long_task(30);
    Box::new(move |request: &ProviderRequest| {
        if always || estimate_tokens(request) > limit {
            return Reply::Error {
                partial: String::new(),
                error: ProviderError::new(
                    ErrorKind::ContextOverflow,
                    "This model's maximum context length is exceeded",
                    false,
                ),
            };
        }
        inner(request)
    })
}

#[test]
fn context_overflow_triggers_compaction_and_the_task_still_finishes() {
    let mut sim = Sim::new(111, overflowing(6_000, false), big_page());
    sim.realistic_usage = true;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    assert!(compactions(&sim) >= 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_model_that_keeps_overflowing_ends_in_a_clear_error() {
    let mut sim = Sim::new(112, overflowing(0, true), big_page());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page"));
    sim.run(200_000);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(run.error.as_ref().unwrap().kind, ErrorKind::ContextOverflow);
    assert!(
        sim.requests.len() <= 3,
        "bounded: {} requests",
        sim.requests.len()
    );
    check_invariants(&sim, &[]).unwrap();
}

// ------------------------------------------------- verbatim task messages

/// Bytes a summary would not keep: line breaks, indentation, a tab, quotes,
/// non-Latin text, an emoji, JSON, trailing spaces.
const GOAL: &str = "Read the page many times.\n  Then:\t\"report\" the count — in 中文 and русский 🚀 {\"exact\": [1, 2.50]}  \n- keep this line too ";
const STEER: &str = "Also note the page title, exactly as written: «Ünïcødé — Tab\there».";
const QUEUED: [&str; 2] = [
    "Afterwards: open https://example.com/a?b=1&c=%20d and read it.",
    "Then  (two spaces)  summarize both pages in 3 bullet points.",
];

/// The verbatim sections of the compaction checkpoints, with their summaries.
fn checkpoints(sim: &Sim) -> Vec<(String, String)> {
    paths(sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::Compaction {
                summary, verbatim, ..
            } => Some((summary.clone(), verbatim.clone())),
            _ => None,
        })
        .collect()
}

fn block(tag: &str, attributes: &str, text: &str) -> String {
    format!("<{tag}{attributes}>\n{text}\n</{tag}>")
}

#[test]
fn checkpoint_copies_task_messages_verbatim_through_two_compactions() {
    let mut sim = Sim::new(113, long_task(30), big_page());
    sim.realistic_usage = true;
    sim.profile.context_window = Some(8_000);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, GOAL));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let (thread, turn) = current_ids(&sim);
    let (thread, turn) = (thread.unwrap(), turn.unwrap());
    // Steer submissions are named "steer-<text>" (see check_invariants).
    sim.send(
        conn,
        steer(&format!("steer-{STEER}"), &thread, &turn, STEER),
    );
    sim.send(conn, enqueue("q-1", &thread, QUEUED[0]));
    sim.send(conn, enqueue("q-2", &thread, QUEUED[1]));
    sim.run(200_000);

    let checkpoints = checkpoints(&sim);
    assert!(checkpoints.len() >= 2, "{} checkpoints", checkpoints.len());
    let expected = [
        VERBATIM_HEADER.to_string(),
        "The user's messages of the task in progress, oldest first:".into(),
        block("user_message", "", GOAL),
        block("user_message", " steered=\"true\"", STEER),
    ]
    .join("\n");
    for (summary, verbatim) in &checkpoints[..2] {
        // Copied by the engine byte for byte, whatever the model wrote.
        assert_eq!(verbatim, &expected);
        assert!(summary.starts_with("SUMMARY") && !summary.contains("many times.\n"));
    }

    // Each checkpoint leads the requests after it, verbatim part included; by
    // the second one the original user message is two checkpoints back and
    // no longer in the view, yet its exact bytes still reach the model.
    let leads: Vec<&str> = sim
        .requests
        .iter()
        .filter(|r| *r.system != *COMPACTION_PROMPT)
        .filter_map(|r| match r.messages.first() {
            Some(ChatMessage::User { text, .. }) if text.starts_with("[Summary") => {
                Some(text.as_str())
            }
            _ => None,
        })
        .collect();
    for (summary, verbatim) in &checkpoints[..2] {
        let message = summary_message(summary, verbatim);
        assert!(
            leads.contains(&message.as_str()),
            "no request led with {summary:?}"
        );
        assert!(message.ends_with(&format!("\n\n{expected}")));
    }
    let after_second = sim
        .requests
        .iter()
        .filter(|r| *r.system != *COMPACTION_PROMPT)
        .find(|r| {
            matches!(r.messages.first(), Some(ChatMessage::User { text, .. })
                if *text == summary_message(&checkpoints[1].0, &checkpoints[1].1))
        })
        .expect("a request after the second checkpoint");
    assert!(!after_second
        .messages
        .iter()
        .any(|m| matches!(m, ChatMessage::User { text, .. } if text == GOAL)));
    // The second summary was written from a view that held the first
    // checkpoint's verbatim section.
    let second_summary_request = sim
        .requests
        .iter()
        .filter(|r| *r.system == *COMPACTION_PROMPT)
        .nth(1)
        .unwrap();
    assert!(matches!(second_summary_request.messages.first(),
        Some(ChatMessage::User { text, .. }) if text.contains(&expected)));
    // The queue is not part of the task: never copied.
    for (_, verbatim) in &checkpoints {
        assert!(!verbatim.contains(QUEUED[0]) && !verbatim.contains(QUEUED[1]));
    }

    let run = sim.store.runs.values().find(|r| r.id == turn).unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    check_invariants(&sim, &[STEER.to_string()]).unwrap();
}

fn node(id: usize, body: NodeBody) -> Node {
    Node {
        id: format!("n{id}"),
        thread_id: "t".into(),
        parent_id: id.checked_sub(1).map(|p| format!("n{p}")),
        created_at: id as u64,
        body,
    }
}

/// A path of turns, each given as its user messages (the first opens it).
fn turns(turns: &[&[&str]]) -> Vec<Node> {
    let mut path = Vec::new();
    for (index, messages) in turns.iter().enumerate() {
        path.push(NodeBody::TurnContext {
            turn_id: format!("r{index}"),
            model: "m".into(),
        });
        for (position, text) in messages.iter().enumerate() {
            path.push(NodeBody::UserMessage {
                text: text.to_string(),
                steered: position > 0,
                attachments: vec![],
            });
            path.push(NodeBody::AssistantMessage {
                text: "ok".into(),
                reasoning: None,
                stop_reason: StopReason::End,
                usage: None,
                interrupted: false,
                model: "m".into(),
                provider_private: None,
            });
        }
    }
    path.into_iter()
        .enumerate()
        .map(|(i, body)| node(i, body))
        .collect()
}

#[test]
fn checkpoint_verbatim_section_is_bounded_and_says_where_it_was_cut() {
    let goal = "Compare every row of the price table with last week's, café by café. ".repeat(400);
    let path = turns(&[&[goal.as_str(), "and this steer"]]);
    let section = verbatim_section(&path, 0, 500);
    // The bound covers the whole section, framing and notes included.
    assert!(
        estimate_text_tokens(&section) <= 500,
        "{} tokens",
        estimate_text_tokens(&section)
    );
    // What is kept is an exact prefix of the message, then a note says how
    // much was cut and how many messages were left out.
    let start = section.find("<user_message>\n").unwrap() + "<user_message>\n".len();
    let kept = &section[start..section.find("\n</user_message>").unwrap()];
    assert!(kept.len() > 1_000 && goal.starts_with(kept));
    let cut = goal.chars().count() - kept.chars().count();
    assert!(section.contains(&format!(
        "[… the size limit cut this message here: {cut} more characters are not copied"
    )));
    assert!(section
        .ends_with("\n[1 more message(s) not copied (size limit); the summary covers them.]"));
    assert!(!section.contains("and this steer"));
    // Within the bound, everything is copied whole.
    let whole = verbatim_section(&path, 0, VERBATIM_MAX_TOKENS * 100);
    assert!(whole.contains(&block("user_message", "", &goal)));
    assert!(whole.ends_with(&block(
        "user_message",
        " steered=\"true\"",
        "and this steer"
    )));
    // The messages in the tail the checkpoint keeps (its last nodes) are
    // sent as they are, not copied: here the steer and the answer after it.
    let without_tail = verbatim_section(&path, 2, VERBATIM_MAX_TOKENS * 100);
    assert!(without_tail.ends_with(&block("user_message", "", &goal)));
}

#[test]
fn checkpoint_verbatim_section_keeps_the_goal_across_a_plain_resume_only() {
    // A task paused (budget) and continued with the default text keeps the
    // goal of the turn it continues.
    let path = turns(&[
        &["an older task"],
        &["the goal", "a steer"],
        &[CONTINUE_TEXT],
    ]);
    let section = verbatim_section(&path, 0, VERBATIM_MAX_TOKENS);
    assert!(section.contains(&block("user_message", "", "the goal")));
    assert!(section.contains(&block("user_message", " steered=\"true\"", "a steer")));
    assert!(section.contains(&block("user_message", "", CONTINUE_TEXT)));
    assert!(!section.contains("an older task"));
    // A new task does not carry the previous one's messages.
    let path = turns(&[&["the goal"], &["something else"]]);
    let section = verbatim_section(&path, 0, VERBATIM_MAX_TOKENS);
    assert!(!section.contains("the goal"));
    // Nothing to copy: no section.
    assert_eq!(verbatim_section(&[], 0, VERBATIM_MAX_TOKENS), "");
}

// ------------------------------------------ the tail a checkpoint keeps

/// The requests the model answered as the agent (not summaries).
fn step_requests(sim: &Sim) -> Vec<&ProviderRequest> {
    sim.requests
        .iter()
        .filter(|r| *r.system != *COMPACTION_PROMPT)
        .map(|r| &**r)
        .collect()
}

/// The summary requests, in order.
fn summary_requests(sim: &Sim) -> Vec<&ProviderRequest> {
    sim.requests
        .iter()
        .filter(|r| *r.system == *COMPACTION_PROMPT)
        .map(|r| &**r)
        .collect()
}

/// The first step request that leads with a checkpoint's summary.
fn first_after_checkpoint(sim: &Sim) -> &ProviderRequest {
    step_requests(sim)
        .into_iter()
        .find(|r| {
            matches!(r.messages.first(), Some(ChatMessage::User { text, .. })
                if text.starts_with("[Summary"))
        })
        .expect("a request after a checkpoint")
}

/// The marker at the end of the large snapshot: past the 2,000 characters a
/// summary request keeps of a result, inside the 24,000 the model gets.
const SNAPSHOT_MARK: &str = "SNAPSHOT-END: [e999] button \"Pay now\"";

/// A page snapshot of about 7,000 estimated tokens, ending with the marker.
fn large_snapshot() -> String {
    let mut text = String::new();
    let mut i = 0;
    while estimate_text_tokens(&text) < 7_000 {
        text.push_str(&format!("[e{i}] link \"Item {i}\" /p/{i}?x=qz\n"));
        i += 1;
    }
    text.push_str(SNAPSHOT_MARK);
    assert!(text.chars().count() < sw_agent::engine::MAX_TOOL_RESULT_CHARS);
    text
}

/// `read_page` returns ~2,500 tokens, `page_snapshot` the large snapshot.
fn snapshot_tools() -> sw_agent::sim::ToolFn {
    let snapshot = large_snapshot();
    Box::new(move |name: &str, _: &serde_json::Value| match name {
        "page_snapshot" => sw_agent::engine::ToolOutcome::text(true, snapshot.clone()),
        _ => sw_agent::engine::ToolOutcome::text(true, "Some text of the page. ".repeat(500)),
    })
}

/// Reads the page `reads` times, then takes a snapshot until it sees the
/// snapshot's end (at most 4 times), then answers.
fn read_then_snapshot(reads: usize) -> sw_agent::sim::Policy {
    let mut steps = 0;
    Box::new(move |request: &ProviderRequest| {
        if *request.system == *COMPACTION_PROMPT {
            return Reply::text("SUMMARY: read the page, then a snapshot.");
        }
        let seen = request.messages.iter().any(|m| {
            matches!(m, ChatMessage::ToolResult { content, .. } if content.contains(SNAPSHOT_MARK))
        });
        if seen {
            return Reply::text("done: the Pay now button is e999");
        }
        steps += 1;
        if steps <= reads {
            Reply::call("", "read_page", "{}")
        } else if steps <= reads + 4 {
            Reply::call("", "page_snapshot", "{}")
        } else {
            Reply::text("gave up")
        }
    })
}

fn snapshot_sim(seed: u64, reads: usize) -> Sim {
    let mut sim = Sim::new(seed, read_then_snapshot(reads), snapshot_tools());
    sim.realistic_usage = true;
    sim.profile.context_window = Some(16_000);
    sim.engine.handle_settings(sim.profile.clone());
    sim
}

#[test]
fn no_orphan_tool_calls_compaction_keeps_the_unseen_results() {
    let mut sim = snapshot_sim(120, 3);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Find the pay button"));
    sim.run(200_000);
    assert_eq!(compactions(&sim), 1);
    // The model asked for the snapshot once: the compaction right after it
    // did not summarize the result away.
    let snapshots = sim
        .dispatches
        .iter()
        .filter(|d| d.name == "page_snapshot")
        .count();
    assert_eq!(snapshots, 1);
    // The request after the checkpoint: the summary, then the model's call
    // and its result, whole and paired.
    let after = first_after_checkpoint(&sim);
    assert!(matches!(&after.messages[1],
        ChatMessage::Assistant { tool_calls, .. }
            if tool_calls.len() == 1 && tool_calls[0].name == "page_snapshot"));
    assert!(matches!(&after.messages[2],
        ChatMessage::ToolResult { content, .. } if content.contains(SNAPSHOT_MARK)));
    assert_eq!(after.messages.len(), 3);
    check_request(after).unwrap();
    // The summary stands for what the model had answered, not for the
    // result it had not seen yet.
    let summary = summary_requests(&sim)[0];
    let transcript = format!("{:?}", summary.messages);
    assert!(!transcript.contains("page_snapshot") && !transcript.contains("SNAPSHOT-END"));
    // The checkpoint records that tail: the model's message, its call, the result.
    let kept = paths(&sim)[0].iter().find_map(|n| match &n.body {
        NodeBody::Compaction { kept_nodes, .. } => Some(*kept_nodes),
        _ => None,
    });
    assert_eq!(kept, Some(3));
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_the_newest_steer_survives_compaction() {
    // A goal longer than the verbatim section's bound: a steer copied after
    // it would not fit there.
    let goal = format!(
        "Find the pay button. {}",
        "Check every line of the page carefully. ".repeat(350)
    );
    let steer_text = "Also tell me its label, exactly.";
    let mut sim = snapshot_sim(121, 1);
    sim.hold_tools = Some(|name| name == "page_snapshot");
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, &goal));
    sim.run(200_000);
    assert_eq!(
        sim.dispatches.last().map(|d| d.name.as_str()),
        Some("page_snapshot"),
        "the snapshot is running"
    );
    let (thread, turn) = current_ids(&sim);
    let (thread, turn) = (thread.unwrap(), turn.unwrap());
    sim.send(
        conn,
        steer(&format!("steer-{steer_text}"), &thread, &turn, steer_text),
    );
    sim.run(200_000);
    sim.hold_tools = None;
    sim.release_tools();
    sim.run(200_000);
    assert_eq!(compactions(&sim), 1);
    // The steer reached the model as its own message, once, after the
    // result it was admitted after, in the request the compaction made.
    let after = first_after_checkpoint(&sim);
    let steers: Vec<usize> = after
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, ChatMessage::User { text, .. } if text == steer_text))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(steers.len(), 1, "{:?}", after.messages.len());
    assert!(matches!(&after.messages[steers[0] - 1],
        ChatMessage::ToolResult { content, .. } if content.contains(SNAPSHOT_MARK)));
    // Not copied into the checkpoint a second time.
    let verbatim = paths(&sim)[0]
        .iter()
        .find_map(|n| match &n.body {
            NodeBody::Compaction { verbatim, .. } => Some(verbatim.clone()),
            _ => None,
        })
        .unwrap();
    assert!(!verbatim.contains(steer_text), "{verbatim}");
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    check_invariants(&sim, &[steer_text.to_string()]).unwrap();
}

#[test]
fn compaction_makes_progress_or_stops_with_context_overflow() {
    // A result too large for the window on its own (vowelless pieces cost a
    // token a letter), after a small one: what could be summarized is
    // a few nodes but few tokens. The provider refuses above the window.
    let huge = "zq ".repeat(7_900);
    let mut steps = 0;
    let policy: sw_agent::sim::Policy = Box::new(move |request: &ProviderRequest| {
        if *request.system == *COMPACTION_PROMPT {
            return Reply::text("SUMMARY");
        }
        if estimate_tokens(request) > 16_000 {
            return Reply::Error {
                partial: String::new(),
                error: ProviderError::new(
                    ErrorKind::ContextOverflow,
                    "prompt is too long: 17000 tokens > 16000 maximum",
                    false,
                ),
            };
        }
        steps += 1;
        match steps {
            1 => Reply::call("", "click", r#"{"ref":"e1"}"#),
            2..=6 => Reply::call("", "read_page", "{}"),
            _ => Reply::text("gave up"),
        }
    });
    let tools: sw_agent::sim::ToolFn =
        Box::new(move |name: &str, _: &serde_json::Value| match name {
            "read_page" => sw_agent::engine::ToolOutcome::text(true, huge.clone()),
            _ => sw_agent::engine::ToolOutcome::text(true, "Clicked."),
        });
    let mut sim = Sim::new(122, policy, tools);
    sim.realistic_usage = true;
    sim.profile.context_window = Some(16_000);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page"));
    sim.run(200_000);
    // No summary of a few hundred tokens, no asking again: the request goes
    // out once more, the provider refuses it, and the run ends.
    assert!(summary_requests(&sim).is_empty());
    assert_eq!(compactions(&sim), 0);
    assert_eq!(sim.dispatches.len(), 2);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(run.error.as_ref().unwrap().kind, ErrorKind::ContextOverflow);
    check_invariants(&sim, &[]).unwrap();
}

// ------------------------------------------------- the summary request

/// `long_task`, whose first `failures` summary requests fail with `error`.
fn failing_summaries(failures: usize, error: ProviderError) -> sw_agent::sim::Policy {
    let mut inner = long_task(30);
    let mut failed = 0;
    Box::new(move |request: &ProviderRequest| {
        if *request.system == *COMPACTION_PROMPT && failed < failures {
            failed += 1;
            return Reply::Error {
                partial: String::new(),
                error: error.clone(),
            };
        }
        inner(request)
    })
}

fn retry_events(sim: &Sim) -> Vec<(u32, ErrorKind)> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match &e.event {
            sw_agent::protocol::Event::RunRetry { attempt, error, .. } => {
                Some((*attempt, error.kind))
            }
            _ => None,
        })
        .collect()
}

fn compacting_sim(seed: u64, policy: sw_agent::sim::Policy) -> Sim {
    let mut sim = Sim::new(seed, policy, big_page());
    sim.realistic_usage = true;
    sim.profile.context_window = Some(8_000);
    sim.engine.handle_settings(sim.profile.clone());
    sim
}

#[test]
fn compaction_retries_a_transient_provider_error() {
    // Overloaded twice, then the summary comes: the run goes on.
    let overloaded =
        ProviderError::new(ErrorKind::ProviderUnavailable, "HTTP 529 overloaded", true);
    let mut sim = compacting_sim(130, failing_summaries(2, overloaded.clone()));
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    assert_eq!(
        retry_events(&sim)[..2],
        [
            (1, ErrorKind::ProviderUnavailable),
            (2, ErrorKind::ProviderUnavailable)
        ]
    );
    // The same summary request, sent three times.
    let summaries = summary_requests(&sim);
    assert!(summaries.len() >= 3);
    assert_eq!(summaries[0].messages, summaries[2].messages);
    assert!(compactions(&sim) >= 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    check_invariants(&sim, &[]).unwrap();

    // Rate limited every time: the policy's attempts, then the run fails
    // with the provider's error, not as an overflow.
    let limited = ProviderError::new(ErrorKind::RateLimited, "HTTP 429 slow down", true);
    let mut sim = compacting_sim(131, failing_summaries(usize::MAX, limited));
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    let attempts = sw_agent::engine::RetryPolicy::default().max_attempts as usize;
    assert_eq!(summary_requests(&sim).len(), attempts);
    assert_eq!(retry_events(&sim).len(), attempts - 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Failed);
    let error = run.error.as_ref().unwrap();
    assert_eq!(error.kind, ErrorKind::RateLimited);
    assert!(error.message.starts_with("HTTP 429 slow down"), "{error:?}");
    check_invariants(&sim, &[]).unwrap();

    // A permanent error is not retried.
    let denied = ProviderError::new(ErrorKind::Auth, "HTTP 401 bad key", false);
    let mut sim = compacting_sim(132, failing_summaries(usize::MAX, denied));
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    assert_eq!(summary_requests(&sim).len(), 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.error.as_ref().unwrap().kind, ErrorKind::Auth);
}

#[test]
fn compaction_request_carries_no_tool_blocks() {
    let mut sim = compacting_sim(133, long_task(30));
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    let summaries = summary_requests(&sim);
    assert!(summaries.len() >= 2);
    for request in summaries {
        // One user message of text: no calls, no results, no tools.
        assert!(request.tools.is_empty());
        assert_eq!(request.messages.len(), 1);
        let ChatMessage::User {
            text,
            images,
            documents,
        } = &request.messages[0]
        else {
            panic!("{:?}", request.messages[0]);
        };
        assert!(images.is_empty() && documents.is_empty());
        // The calls and results are there as text, results cut.
        assert!(text.contains("[tool call read_page (id "), "{text}");
        assert!(text.contains("[tool result (id "), "{text}");
        assert!(text.contains("more characters not shown]"), "{text}");
        assert!(text.ends_with("Write the summary now, following the instructions."));
        // As the providers get it: no tool blocks in either format.
        let anthropic = sw_agent::provider::anthropic::build_body(request);
        for message in anthropic["messages"].as_array().unwrap() {
            for block in message["content"].as_array().unwrap() {
                assert_eq!(block["type"], "text", "{block}");
            }
        }
        let openai = sw_agent::provider::openai::build_body(request);
        for message in openai["messages"].as_array().unwrap() {
            assert!(message["role"] != "tool" && message.get("tool_calls").is_none());
        }
    }
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn compaction_request_fits_the_window_leaving_the_oldest_out() {
    // The provider reports a quarter of the estimate, so the engine lets the
    // view grow to four times its threshold (calibration) before it compacts:
    // the transcript is larger than the window, and its oldest part goes.
    let mut sim = Sim::new(134, long_task(30), big_page());
    sim.profile.context_window = Some(8_000);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    let threshold = compaction_threshold(8_000, None);
    let summaries = summary_requests(&sim);
    assert!(!summaries.is_empty());
    let mut left_out = 0;
    for request in &summaries {
        assert!(
            estimate_tokens(request) <= threshold,
            "a summary request of ~{} tokens",
            estimate_tokens(request)
        );
        let ChatMessage::User { text, .. } = &request.messages[0] else {
            panic!();
        };
        if text.contains("message(s) are left out here to fit the context window.]") {
            left_out += 1;
            // The newest part is what stays.
            assert!(!text.contains("[user]\nRead the page many times"));
        }
    }
    assert!(left_out > 0);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn compaction_checkpoint_does_not_freeze_the_queue() {
    let mut sim = compacting_sim(135, long_task(30));
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let (thread, _) = current_ids(&sim);
    let thread = thread.unwrap();
    sim.send(conn, enqueue("q-1", &thread, "QUEUED-ONE: open the cart"));
    sim.send(conn, enqueue("q-2", &thread, "QUEUED-TWO: then pay"));
    while compactions(&sim) == 0 {
        assert!(sim.step(), "no compaction");
    }
    // Removed after the checkpoint was written.
    let item = sim
        .store
        .queue
        .values()
        .find(|q| q.text.starts_with("QUEUED-ONE"))
        .unwrap()
        .id
        .clone();
    let removed_at = sim.requests.len();
    sim.send(conn, queue_remove("rm-1", &thread, &item));
    sim.run(200_000);
    // No checkpoint holds the queue, and no request shows the removed item.
    for (_, verbatim) in checkpoints(&sim) {
        assert!(!verbatim.contains("QUEUED-"), "{verbatim}");
    }
    for request in &sim.requests[removed_at..] {
        for message in request.messages.iter() {
            if let ChatMessage::User { text, .. } = message {
                assert!(!text.contains("QUEUED-ONE"), "{text}");
            }
        }
    }
    // The other queued turn ran, as its own turn.
    assert!(user_texts(&sim, false).contains(&"QUEUED-TWO: then pay".to_string()));
    assert!(!user_texts(&sim, false)
        .iter()
        .any(|t| t.contains("QUEUED-ONE")));
    check_invariants(&sim, &[]).unwrap();
}

// -------------------------------------------------------- the threshold

#[test]
fn compaction_threshold_leaves_room_for_the_answer() {
    // 80% of the window, lowered by the answer's room (4,096 unset), which
    // takes at most half the window.
    assert_eq!(compaction_threshold(200_000, None), 160_000);
    assert_eq!(compaction_threshold(16_000, None), 16_000 - 4_096);
    assert_eq!(compaction_threshold(16_000, Some(1_000)), 12_800);
    assert_eq!(compaction_threshold(16_000, Some(8_000)), 8_000);
    assert_eq!(compaction_threshold(4_000, None), 2_000);
    // A model that may answer with 8,000 tokens of a 16,000 window: no
    // request leaves more than 8,000 for the answer (80% would leave 3,200).
    let mut sim = Sim::new(136, long_task(20), big_page());
    sim.realistic_usage = true;
    sim.profile.context_window = Some(16_000);
    sim.profile.max_output_tokens = Some(8_000);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page many times"));
    sim.run(200_000);
    assert!(compactions(&sim) >= 1);
    for request in step_requests(&sim) {
        assert!(
            estimate_tokens(request) <= 8_000,
            "a request of ~{} tokens",
            estimate_tokens(request)
        );
    }
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    check_invariants(&sim, &[]).unwrap();
}
