//! The three paths: steer, enqueue, interrupt.

use sw_agent::model::{NodeBody, RunState, StopReason, ToolStatus, MAX_QUEUE};
use sw_agent::protocol::{ErrorKind, Event};
use sw_agent::provider::ChatMessage;
use sw_agent::sim::{Reply, Sim};

use super::support::*;

/// Start a turn and step until the first provider request is streaming.
fn started(sim: &mut Sim, conn: u64) -> (String, String) {
    sim.send(conn, submit("s1", None, "Subscribe me"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let (thread, turn) = current_ids(sim);
    (thread.unwrap(), turn.unwrap())
}

fn steered_texts(sim: &Sim) -> Vec<String> {
    user_texts(sim, true)
}

#[test]
fn steer_exactly_once_in_order_during_streaming_lands_after_tool_results() {
    let mut sim = Sim::new(11, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    sim.send(conn, steer("steer-a", &thread, &turn, "a"));
    sim.send(conn, steer("steer-b", &thread, &turn, "b"));
    sim.run(10_000);
    assert_eq!(steered_texts(&sim), vec!["a", "b"]);
    let path = &paths(&sim)[0];
    let kinds = kinds(path);
    // The first response (read_page) had not seen the steers: they follow its result.
    let first_result = kinds.iter().position(|k| *k == "tool_result").unwrap();
    let first_steer = path
        .iter()
        .position(|n| matches!(n.body, NodeBody::UserMessage { steered: true, .. }))
        .unwrap();
    assert!(first_steer > first_result);
    check_invariants(&sim, &["a".into(), "b".into()]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_a_steered_message_is_named_by_its_steer_id() {
    let mut sim = Sim::new(19, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    sim.send(conn, steer("steer-a", &thread, &turn, "a"));
    sim.send(conn, steer("steer-b", &thread, &turn, "b"));
    sim.run(10_000);
    let steer_id = |sim: &Sim, conn: u64, submission: &str| {
        answer(sim, conn, submission).unwrap().unwrap()["steerId"]
            .as_str()
            .expect("a steer, not downgraded")
            .to_string()
    };
    let ids = [
        steer_id(&sim, conn, "steer-a"),
        steer_id(&sim, conn, "steer-b"),
    ];
    let steered: Vec<(String, String)> = paths(&sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::UserMessage {
                text,
                steered: true,
                ..
            } => Some((n.id.clone(), text.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        steered,
        [(ids[0].clone(), "a".into()), (ids[1].clone(), "b".into())]
    );
    // The panel never got the first ACK; after a restart it sends the steer
    // again: the replayed ACK names the message already in the conversation.
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, steer("steer-a", &thread, &turn, "a"));
    sim.run(10_000);
    assert_eq!(steer_id(&sim, conn, "steer-a"), ids[0]);
    assert_eq!(steered_texts(&sim), ["a", "b"], "read once");
    check_invariants(&sim, &["a".into(), "b".into()]).unwrap();
}

#[test]
fn one_cutoff_per_request_steer_after_cutoff_waits_for_next_request() {
    let mut sim = Sim::new(12, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    // Request 1 is out; a steer now is not in it.
    sim.send(conn, steer("steer-late", &thread, &turn, "late"));
    sim.run(10_000);
    let has = |i: usize| {
        sim.requests[i]
            .messages
            .iter()
            .any(|m| matches!(m, ChatMessage::User { text, .. } if text == "late"))
    };
    assert!(!has(0));
    assert!(has(1));
    // It is materialized exactly once even though later requests rebuild context.
    assert!(sim.requests.len() >= 3);
    check_invariants(&sim, &["late".into()]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_with_final_answer_triggers_one_more_request() {
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        match request.messages.last() {
            Some(ChatMessage::User { text, .. }) if text == "also say hi" => Reply::text("hi"),
            _ => Reply::text("final"),
        }
    });
    let mut sim = Sim::new(13, policy, page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    // Deliver the final answer's persist, then steer while admission is closing.
    sim.send(
        conn,
        steer("steer-also say hi", &thread, &turn, "also say hi"),
    );
    sim.run(10_000);
    assert_eq!(
        sim.requests.len(),
        2,
        "the steer caused one more request instead of ending"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    let path = &paths(&sim)[0];
    let texts: Vec<&str> = path
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::AssistantMessage { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, vec!["final", "hi"]);
    check_invariants(&sim, &["also say hi".into()]).unwrap();
}

#[test]
fn steer_with_wrong_turn_id_is_rejected() {
    let mut sim = Sim::new(14, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, _turn) = started(&mut sim, conn);
    sim.send(conn, steer("steer-x", &thread, "r-other", "x"));
    sim.run(10_000);
    assert!(sim.events_for(conn).iter().any(
        |e| matches!(e, Event::CommandReject { op_type, error, .. } if op_type == "turn.steer" && error.kind == ErrorKind::InvalidCommand)
    ));
    assert!(steered_texts(&sim).is_empty());
}

#[test]
fn steer_without_running_turn_is_downgraded_to_enqueue() {
    let mut sim = Sim::new(15, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    sim.run(10_000);
    sim.send(conn, steer("steer-next", &thread, &turn, "next task"));
    sim.run(10_000);
    let ack = sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::CommandAck {
            op_type, result, ..
        } if op_type == "turn.steer" => Some(result.clone()),
        _ => None,
    });
    let ack = ack.expect("steer acked");
    assert_eq!(ack["downgraded"], serde_json::json!(true));
    // It ran as its own turn.
    assert_eq!(sim.store.runs.len(), 2);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == RunState::Completed));
}

#[test]
fn enqueue_runs_after_the_current_turn_in_order_and_is_bounded() {
    let mut sim = Sim::new(16, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    for i in 0..MAX_QUEUE {
        sim.send(
            conn,
            enqueue(&format!("q{i}"), &thread, &format!("task {i}")),
        );
    }
    sim.send(conn, enqueue("q-overflow", &thread, "too many"));
    sim.drain_effects();
    assert!(sim.events_for(conn).iter().any(
        |e| matches!(e, Event::CommandReject { error, .. } if error.kind == ErrorKind::QueueFull)
    ));
    assert!(sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::QueueUpdated { queue, .. } if queue.len() == MAX_QUEUE)));
    sim.run(100_000);
    assert_eq!(sim.store.runs.len(), 1 + MAX_QUEUE);
    assert!(sim.store.queue.is_empty());
    let users: Vec<String> = paths(&sim)[0]
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::UserMessage {
                text,
                steered: false,
                ..
            } => Some(text.clone()),
            _ => None,
        })
        .collect();
    let mut expected = vec!["Subscribe me".to_string()];
    expected.extend((0..MAX_QUEUE).map(|i| format!("task {i}")));
    assert_eq!(users, expected);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn queue_remove_drops_the_item() {
    let mut sim = Sim::new(17, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    sim.send(conn, enqueue("q1", &thread, "later"));
    sim.drain_effects();
    let item = sim.store.queue.values().next().unwrap().id.clone();
    sim.send(
        conn,
        sw_agent::protocol::Op::QueueRemove {
            submission: submission("rm1"),
            thread_id: thread.clone(),
            item_id: item,
        },
    );
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 1);
}

#[test]
fn editing_or_removing_a_queued_turn_after_an_interrupt_does_not_start_the_queue() {
    let mut sim = Sim::new(18, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    sim.send(conn, enqueue("q1", &thread, "first later"));
    sim.send(conn, enqueue("q2", &thread, "second later"));
    sim.drain_effects();
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 1);
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::Interrupted
    );
    // The user fixes a typo in one queued turn and removes the other: the
    // agent was stopped, and stays stopped.
    let item = |text: &str| {
        sim.store
            .queue
            .values()
            .find(|q| q.text == text)
            .map(|q| q.id.clone())
            .expect("queued")
    };
    let (first, second) = (item("first later"), item("second later"));
    sim.send(conn, queue_update("u1", &thread, &second, "second, fixed"));
    sim.run(10_000);
    sim.send(conn, queue_remove("r1", &thread, &first));
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 1, "no queued turn started");
    assert_eq!(sim.store.queue.len(), 1);
    assert_eq!(
        sim.store.queue.values().next().unwrap().text,
        "second, fixed"
    );
    // The next explicit action starts work again; the queue follows it.
    sim.send(conn, resume("c1", &thread));
    sim.run(100_000);
    assert_eq!(sim.store.runs.len(), 3);
    assert!(sim.store.queue.is_empty());
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn streamed_text_survives_interrupt_and_tool_calls_get_results() {
    let policy = Box::new(|_: &sw_agent::provider::ProviderRequest| Reply::ToolCalls {
        text: "I will read the page first".into(),
        calls: vec![
            sw_agent::provider::RawToolCall {
                id: "a".into(),
                name: "read_page".into(),
                arguments: "{}".into(),
            },
            sw_agent::provider::RawToolCall {
                id: "b".into(),
                name: "click".into(),
                arguments: r#"{"ref":"e1"}"#.into(),
            },
        ],
        stop: StopReason::ToolUse,
    });
    // Interrupt mid-stream: the visible prefix is kept.
    let mut sim = Sim::new(18, policy, page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    for _ in 0..3 {
        sim.step(); // a few deltas
    }
    let shown: String = sim
        .events_for(conn)
        .iter()
        .filter_map(|e| match e {
            Event::ItemDelta { delta, .. } => Some(delta.text.clone()),
            _ => None,
        })
        .collect();
    assert!(!shown.is_empty());
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    let path = &paths(&sim)[0];
    let prefix = path.iter().find_map(|n| match &n.body {
        NodeBody::AssistantMessage {
            text,
            interrupted: true,
            ..
        } => Some(text.clone()),
        _ => None,
    });
    let prefix = prefix.expect("interrupted prefix kept");
    assert!(prefix.starts_with(&shown), "{prefix:?} vs shown {shown:?}");
    assert!(
        !kinds(path).contains(&"tool_call"),
        "no half-formed tool calls"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    assert!(sim.dispatches.is_empty());
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn no_orphan_tool_calls_interrupt_while_tool_runs() {
    let policy = Box::new(|_: &sw_agent::provider::ProviderRequest| Reply::ToolCalls {
        text: String::new(),
        calls: vec![
            sw_agent::provider::RawToolCall {
                id: "a".into(),
                name: "read_page".into(),
                arguments: "{}".into(),
            },
            sw_agent::provider::RawToolCall {
                id: "b".into(),
                name: "click".into(),
                arguments: r#"{"ref":"e1"}"#.into(),
            },
        ],
        stop: StopReason::ToolUse,
    });
    let mut sim = Sim::new(19, policy, page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    while sim.dispatches.is_empty() {
        assert!(sim.step());
    }
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    let path = &paths(&sim)[0];
    let statuses: Vec<(String, ToolStatus)> = path
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
            ("b".to_string(), ToolStatus::Aborted)
        ]
    );
    assert_eq!(
        sim.dispatches.len(),
        1,
        "the never-started call was never dispatched"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_acked_steer_survives_interrupt() {
    let mut sim = Sim::new(20, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, turn) = started(&mut sim, conn);
    sim.send(conn, steer("steer-keep me", &thread, &turn, "keep me"));
    sim.drain_effects(); // the steer commits and is ACKed
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    assert_eq!(steered_texts(&sim), vec!["keep me"]);
    assert!(sim.store.steers.is_empty());
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    check_invariants(&sim, &["keep me".into()]).unwrap();
}

#[test]
fn interrupt_without_running_turn_is_acked() {
    let mut sim = Sim::new(21, agent_policy(), page_tools());
    let conn = sim.connect();
    let (thread, _) = started(&mut sim, conn);
    sim.run(10_000);
    sim.send(conn, interrupt("i1", &thread));
    sim.run(100);
    assert!(sim.events_for(conn).iter().any(
        |e| matches!(e, Event::CommandAck { op_type, result, .. } if op_type == "turn.interrupt" && result["turnId"].is_null())
    ));
}
