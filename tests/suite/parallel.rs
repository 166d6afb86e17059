//! Parallel reads: consecutive parallel-safe reads run together (bounded),
//! writes are barriers, results persist and reach the model in model order.

use sw_agent::model::{NodeBody, ToolStatus};
use sw_agent::provider::{ChatMessage, RawToolCall};
use sw_agent::sim::Sim;

use super::support::*;

#[test]
fn consecutive_reads_are_dispatched_together_and_persisted_in_model_order() {
    let calls = vec![
        call("a", "page_snapshot", "{}"),
        call("b", "read_page", "{}"),
        call("c", "page_snapshot", "{}"),
        call("d", "click", r#"{"ref":"e1"}"#),
        call("e", "read_page", "{}"),
    ];
    let mut sim = Sim::new(90, once(calls), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    // Step until the first result is durable; by then all three reads were out.
    while result_ids(&sim).is_empty() {
        assert!(sim.step());
    }
    let dispatched: Vec<&str> = sim.dispatches.iter().map(|d| d.call_id.as_str()).collect();
    assert_eq!(
        dispatched,
        vec!["a", "b", "c"],
        "the reads ran together, the click did not"
    );
    assert_eq!(
        result_ids(&sim),
        vec!["a", "b", "c"],
        "one checkpoint, model order"
    );
    sim.run(10_000);
    let dispatched: Vec<&str> = sim.dispatches.iter().map(|d| d.call_id.as_str()).collect();
    assert_eq!(
        dispatched,
        vec!["a", "b", "c", "d", "e"],
        "the write is a barrier"
    );
    assert_eq!(result_ids(&sim), vec!["a", "b", "c", "d", "e"]);
    // The model sees the results in its own order.
    let last = sim.requests.last().unwrap();
    let order: Vec<&str> = last
        .messages
        .iter()
        .filter_map(|m| match m {
            ChatMessage::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec!["a", "b", "c", "d", "e"]);
    check_invariants(&sim, &[]).unwrap();
}

/// `reads` read_page calls in one response, with a pool of `pool` reads
/// (None: the default): how many were out when the first result was
/// durable; the turn then runs to its end with every result.
fn reads_out_at_once(seed: u64, reads: usize, pool: Option<f64>) -> usize {
    let calls: Vec<RawToolCall> = (0..reads)
        .map(|i| call(&format!("r{i}"), "read_page", "{}"))
        .collect();
    let mut sim = Sim::new(seed, once(calls), page_tools());
    if let Some(pool) = pool {
        sim.config.set_parallel_reads(pool).unwrap();
        sim.crash();
    }
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    while result_ids(&sim).is_empty() {
        assert!(sim.step());
    }
    let out = sim.dispatches.len();
    sim.run(10_000);
    assert_eq!(result_ids(&sim).len(), reads);
    check_invariants(&sim, &[]).unwrap();
    out
}

#[test]
fn the_pool_is_bounded() {
    assert_eq!(
        reads_out_at_once(91, 6, None),
        4,
        "at most parallel_reads at once"
    );
}

#[test]
fn the_embedding_extension_sets_the_pool_s_size_within_bounds() {
    let mut config = sw_agent::engine::EngineConfig::default();
    for wrong in [0.0, 2.5, 17.0, -1.0, f64::NAN] {
        let refused = config.set_parallel_reads(wrong).unwrap_err();
        assert!(
            refused.contains("from 1 to 16") && refused.contains("4 is kept"),
            "{refused}"
        );
    }
    assert_eq!(config.parallel_reads, 4);
    assert_eq!(
        reads_out_at_once(92, 5, Some(2.0)),
        2,
        "at most the 2 set at once"
    );
}

#[test]
fn no_orphan_tool_calls_interrupt_during_a_batch() {
    let calls = vec![
        call("a", "read_page", "{}"),
        call("b", "read_page", "{}"),
        call("c", "click", r#"{"ref":"e1"}"#),
    ];
    let mut sim = Sim::new(92, once(calls), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    while sim.dispatches.len() < 2 {
        assert!(sim.step());
    }
    let thread = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    let statuses: Vec<(String, ToolStatus)> = paths(&sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::ToolResult {
                call_id, status, ..
            } => Some((call_id.clone(), *status)),
            _ => None,
        })
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("a".to_string(), ToolStatus::Interrupted),
            ("b".to_string(), ToolStatus::Interrupted),
            ("c".to_string(), ToolStatus::Aborted)
        ]
    );
    check_invariants(&sim, &[]).unwrap();
}
