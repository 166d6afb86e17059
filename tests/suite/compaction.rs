//! Context window management: compaction checkpoints, overflow repair and
//! its progress guard, on long simulated tasks.

use sw_agent::engine::{estimate_tokens, COMPACTION_PROMPT};
use sw_agent::model::{NodeBody, RunState, StopReason};
use sw_agent::protocol::ErrorKind;
use sw_agent::provider::{ChatMessage, ProviderError, ProviderRequest};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

/// Reads the (large) page `steps` times, then answers. Summaries on request.
fn long_task(steps: usize) -> sw_agent::sim::Policy {
    let mut summaries = 0;
    let mut reads = 0;
    Box::new(move |request: &ProviderRequest| {
        if request.system == COMPACTION_PROMPT {
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
        .filter(|r| r.system != COMPACTION_PROMPT)
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
        .find(|r| r.system != COMPACTION_PROMPT)
        .unwrap();
    assert!(matches!(&last.messages[0], ChatMessage::User { text } if text.contains("SUMMARY")));
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
