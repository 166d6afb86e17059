//! Context window management: compaction checkpoints, overflow repair and
//! its progress guard, on long simulated tasks; the task's messages and the
//! queue copied verbatim into checkpoints.

use sw_agent::engine::{
    estimate_text_tokens, estimate_tokens, summary_message, verbatim_section, COMPACTION_PROMPT,
    CONTINUE_TEXT, VERBATIM_HEADER, VERBATIM_MAX_TOKENS,
};
use sw_agent::model::{Node, NodeBody, QueueItem, RunState, StopReason};
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
fn checkpoint_copies_task_messages_and_queue_verbatim_through_two_compactions() {
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
        "Messages the user queued for after this task (not part of it; do not start them now):"
            .into(),
        block("queued_message", "", QUEUED[0]),
        block("queued_message", "", QUEUED[1]),
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
        Some(ChatMessage::User { text, .. }) if text.ends_with(&expected)));

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

fn queued(texts: &[&str]) -> Vec<QueueItem> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| QueueItem {
            id: format!("q{i}"),
            thread_id: "t".into(),
            position: i as u64,
            text: text.to_string(),
            attachments: vec![],
            created_at: 0,
        })
        .collect()
}

#[test]
fn checkpoint_verbatim_section_is_bounded_and_says_where_it_was_cut() {
    let goal = "Compare every row of the price table with last week's, café by café. ".repeat(400);
    let path = turns(&[&[goal.as_str(), "and this steer"]]);
    let queue = queued(&["later one", "later two"]);
    let section = verbatim_section(&path, &queue, 500);
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
        .ends_with("\n[3 more message(s) not copied (size limit); the summary covers them.]"));
    assert!(!section.contains("later one"));
    // Within the bound, everything is copied whole.
    let whole = verbatim_section(&path, &queue, VERBATIM_MAX_TOKENS * 100);
    assert!(whole.contains(&block("user_message", "", &goal)));
    assert!(whole.ends_with(&block("queued_message", "", "later two")));
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
    let section = verbatim_section(&path, &[], VERBATIM_MAX_TOKENS);
    assert!(section.contains(&block("user_message", "", "the goal")));
    assert!(section.contains(&block("user_message", " steered=\"true\"", "a steer")));
    assert!(section.contains(&block("user_message", "", CONTINUE_TEXT)));
    assert!(!section.contains("an older task"));
    // A new task does not carry the previous one's messages.
    let path = turns(&[&["the goal"], &["something else"]]);
    let section = verbatim_section(&path, &[], VERBATIM_MAX_TOKENS);
    assert!(!section.contains("the goal"));
    // Nothing to copy: no section.
    assert_eq!(verbatim_section(&[], &[], VERBATIM_MAX_TOKENS), "");
}
