//! Wire round trips: every op and event survives JSON unchanged, in the documented shape.

use serde_json::json;
use sw_agent::model::{Node, NodeBody, RunState, StopReason, ToolStatus};
use sw_agent::protocol::*;

use super::support::*;

fn round_trip_op(op: Op) {
    let json = serde_json::to_value(&op).unwrap();
    let back: Op = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, op, "{json}");
}

#[test]
fn queue_update_keeps_the_design_s_name_and_takes_the_old_one() {
    let op = queue_update("s", "t", "q", "later");
    assert_eq!(serde_json::to_value(&op).unwrap()["type"], "queue.update");
    let mut old = serde_json::to_value(&op).unwrap();
    old["type"] = "queue.edit".into();
    assert_eq!(serde_json::from_value::<Op>(old).unwrap(), op);
}

#[test]
fn ops_round_trip() {
    round_trip_op(submit("s", None, "hi"));
    round_trip_op(submit("s", Some("t1"), "hi"));
    round_trip_op(steer("s", "t", "r", "more"));
    round_trip_op(enqueue("s", "t", "later"));
    round_trip_op(interrupt("s", "t"));
    round_trip_op(resume("s", "t"));
    round_trip_op(resolve("s", "t", UncertainChoice::MarkDone));
    round_trip_op(initialize("s", None));
    round_trip_op(Op::ThreadCreate {
        submission: submission("s"),
    });
    round_trip_op(Op::ThreadDelete {
        submission: submission("s"),
        thread_id: "t".into(),
        stop_turn: false,
    });
    round_trip_op(Op::ThreadDelete {
        submission: submission("s"),
        thread_id: "t".into(),
        stop_turn: true,
    });
    round_trip_op(Op::QueueRemove {
        submission: submission("s"),
        thread_id: "t".into(),
        item_id: "q".into(),
    });
    round_trip_op(Op::QueueUpdate {
        submission: submission("s"),
        thread_id: "t".into(),
        item_id: "q".into(),
        input: UserInput::text("x"),
    });
    round_trip_op(Op::ThreadSelectBranch {
        submission: submission("s"),
        thread_id: "t".into(),
        node_id: "n".into(),
    });
    round_trip_op(Op::TurnSubmit {
        submission: submission("s"),
        thread_id: Some("t".into()),
        input: UserInput::text("x"),
        replaces: Some("n".into()),
    });
}

#[test]
fn provider_test_reports_success_and_typed_errors_and_writes_nothing() {
    let policy: sw_agent::sim::Policy = Box::new(|request| {
        assert_eq!(&*request.system, sw_agent::engine::PROVIDER_TEST_PROMPT);
        assert!(request.tools.is_empty());
        assert_eq!(request.profile.max_output_tokens, Some(16));
        match request.profile.model.as_str() {
            "gone" => sw_agent::sim::Reply::Error {
                partial: String::new(),
                error: sw_agent::provider::ProviderError::new(
                    ErrorKind::ModelNotFound,
                    "The model gone does not exist.",
                    false,
                ),
            },
            _ => sw_agent::sim::Reply::text("ok"),
        }
    });
    let mut sim = sw_agent::sim::Sim::new(7, policy, page_tools());
    let conn = sim.connect();
    let test = |id: &str, profile: serde_json::Value| -> Op {
        serde_json::from_value(json!({
            "type": "provider.test", "clientId": "c", "submissionId": id, "profile": profile
        }))
        .unwrap()
    };
    let good = json!({ "kind": "openai", "baseUrl": "http://127.0.0.1:9/v1", "model": "m" });
    sim.send(conn, test("t1", good));
    sim.send(
        conn,
        test(
            "t2",
            json!({ "kind": "openai", "baseUrl": "http://x/v1", "model": "gone" }),
        ),
    );
    sim.send(
        conn,
        test(
            "t3",
            json!({ "kind": "openai", "baseUrl": "", "model": "m" }),
        ),
    );
    sim.send(
        conn,
        test(
            "t4",
            json!({ "kind": "gemini", "baseUrl": "http://x", "model": "m" }),
        ),
    );
    sim.run(1000);
    let mut outcomes = answers(&sim, conn);
    sw_agent::sorting::sort_by(&mut outcomes, |a, b| a.0.cmp(&b.0));
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    let ok = outcomes[0].1.as_ref().unwrap();
    assert_eq!(ok["ok"], json!(true));
    assert_eq!(ok["model"], json!("m"));
    assert_eq!(ok["reply"], json!("ok"));
    assert_eq!(
        outcomes[1].1.as_ref().unwrap_err().kind,
        ErrorKind::ModelNotFound
    );
    assert_eq!(
        outcomes[2].1.as_ref().unwrap_err().kind,
        ErrorKind::NotConfigured
    );
    assert_eq!(
        outcomes[3].1.as_ref().unwrap_err().kind,
        ErrorKind::InvalidCommand
    );
    // A test is not a command with an outcome to keep: nothing was written.
    assert!(sim.store.threads.is_empty() && sim.store.receipts.is_empty());
}

#[test]
fn op_wire_shape_matches_docs() {
    let op: Op = serde_json::from_value(json!({
        "type": "turn.steer", "clientId": "c", "submissionId": "s",
        "threadId": "t", "expectedTurnId": "r", "input": { "text": "x" }
    }))
    .unwrap();
    assert_eq!(op, steer("s", "t", "r", "x").with_client("c"));
    let v = serde_json::to_value(resolve("s", "t", UncertainChoice::MarkDone)).unwrap();
    assert_eq!(v["type"], json!("run.resolveUncertain"));
    assert_eq!(v["choice"], json!("mark_done"));
}

trait WithClient {
    fn with_client(self, c: &str) -> Self;
}

impl WithClient for Op {
    fn with_client(mut self, c: &str) -> Self {
        if let Op::TurnSteer { submission, .. } = &mut self {
            submission.client_id = c.into();
        }
        self
    }
}

#[test]
fn events_round_trip_with_seq_and_epoch() {
    let node = Node {
        id: "n1".into(),
        thread_id: "t".into(),
        parent_id: None,
        created_at: 5,
        body: NodeBody::ToolResult {
            call_id: "c".into(),
            name: "click".into(),
            status: ToolStatus::Ok,
            content: "done".into(),
            details: Some(json!({ "rect": { "x": 1 } })),
            images: vec![],
            approval: Some(sw_agent::model::ApprovalNote {
                status: sw_agent::model::ApprovalStatus::AcceptedOnce,
                origin: "https://shop.example".into(),
                decided_at: Some(4),
                by_rule: false,
            }),
        },
    };
    let events = vec![
        Event::ItemComplete {
            thread_id: "t".into(),
            turn_id: "r".into(),
            node: node.clone(),
        },
        Event::TurnComplete {
            thread_id: "t".into(),
            turn_id: "r".into(),
            stop_reason: StopReason::BudgetPause,
            error: None,
        },
        Event::RunStatus {
            thread_id: "t".into(),
            turn_id: "r".into(),
            state: RunState::PausedUncertain,
        },
        Event::CommandReject {
            submission_id: "s".into(),
            op_type: "turn.steer".into(),
            error: ErrorInfo::new(ErrorKind::QueueFull, "full"),
        },
        Event::ItemDelta {
            thread_id: "t".into(),
            turn_id: "r".into(),
            item_id: "i".into(),
            delta: Delta {
                kind: DeltaKind::ToolProgress,
                text: "50%".into(),
            },
        },
    ];
    for event in events {
        let envelope = EventEnvelope {
            seq: 9,
            epoch: "e1".into(),
            event,
        };
        let v = serde_json::to_value(&envelope).unwrap();
        assert_eq!(v["seq"], json!(9));
        assert!(v["type"].is_string());
        let back: EventEnvelope = serde_json::from_value(v).unwrap();
        assert_eq!(back, envelope);
    }
    let v = serde_json::to_value(Event::ItemComplete {
        thread_id: "t".into(),
        turn_id: "r".into(),
        node,
    })
    .unwrap();
    assert_eq!(v["type"], json!("item.complete"));
    assert_eq!(v["node"]["kind"], json!("tool_result"));
    assert_eq!(v["node"]["callId"], json!("c"));
    assert_eq!(v["node"]["threadId"], json!("t"));
    let v = serde_json::to_value(Event::TurnComplete {
        thread_id: "t".into(),
        turn_id: "r".into(),
        stop_reason: StopReason::BudgetPause,
        error: None,
    })
    .unwrap();
    assert_eq!(v["stopReason"], json!("budget_pause"));
}

#[test]
fn page_messages_decode_by_hand_with_typed_errors() {
    let decode = |v: serde_json::Value| PageMessage::from_value(v);
    assert_eq!(
        decode(json!({ "type": "tool.progress", "callId": "c", "text": "50%", "extra": 1 })),
        Ok(PageMessage::ToolProgress {
            call_id: "c".into(),
            text: "50%".into()
        }),
        "unknown fields are ignored"
    );
    assert_eq!(
        decode(
            json!({ "type": "tool.result", "callId": "c", "ok": false, "content": "no", "details": null })
        ),
        Ok(PageMessage::ToolResult {
            call_id: "c".into(),
            ok: false,
            content: "no".into(),
            details: None
        }),
        "null details are none"
    );
    assert_eq!(
        decode(
            json!({ "type": "tool.result", "callId": "c", "ok": true, "content": "", "details": { "box": [1, 2] } })
        ),
        Ok(PageMessage::ToolResult {
            call_id: "c".into(),
            ok: true,
            content: String::new(),
            details: Some(json!({ "box": [1, 2] }))
        })
    );
    for (message, error) in [
        (json!("tool.result"), "expected a page message object"),
        (json!({ "callId": "c" }), "missing field `type`"),
        (json!({ "type": 3 }), "field `type`: invalid type"),
        (
            json!({ "type": "tool.execute", "callId": "c" }),
            "unknown variant `tool.execute`, expected one of `tool.progress`, `tool.result`",
        ),
        (
            json!({ "type": "tool.progress", "text": "x" }),
            "missing field `callId`",
        ),
        (
            json!({ "type": "tool.result", "callId": "c", "ok": "yes", "content": "x" }),
            "field `ok`: invalid type",
        ),
        (
            json!({ "type": "tool.result", "callId": "c", "ok": true }),
            "missing field `content`",
        ),
        (
            json!({ "type": "tool.result", "callId": 7, "ok": true, "content": "x" }),
            "field `callId`: invalid type",
        ),
    ] {
        let got = decode(message.clone()).unwrap_err();
        assert!(got.contains(error), "{message}: {got}");
    }
    // Through serde too (the Deserialize impl is the same decoder).
    let via_serde =
        serde_json::from_value::<PageMessage>(json!({ "type": "tool.progress" })).unwrap_err();
    assert!(
        via_serde.to_string().contains("missing field `callId`"),
        "{via_serde}"
    );
}

#[test]
fn page_messages_round_trip_and_cannot_carry_ops() {
    let m: PageMessage = serde_json::from_value(json!({
        "type": "tool.result", "callId": "c", "ok": true, "content": "x"
    }))
    .unwrap();
    assert_eq!(
        m,
        PageMessage::ToolResult {
            call_id: "c".into(),
            ok: true,
            content: "x".into(),
            details: None
        }
    );
    let op_as_page = serde_json::from_value::<PageMessage>(json!({
        "type": "turn.submit", "clientId": "c", "submissionId": "s", "input": { "text": "x" }
    }));
    assert!(op_as_page.is_err());
    let r = PageRequest::ToolExecute {
        call_id: "c".into(),
        name: "click".into(),
        params: json!({ "ref": "f7:e1" }),
        frame_id: 7,
        expect: Some(sw_agent::model::TargetElement {
            reference: "f7:e1".into(),
            role: "button".into(),
            name: "Archive".into(),
            state: "(disabled)".into(),
        }),
    };
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["type"], json!("tool.execute"));
    assert_eq!(v["frameId"], json!(7));
    assert_eq!(
        v["expect"],
        json!({ "ref": "f7:e1", "role": "button", "name": "Archive", "state": "(disabled)" })
    );
    assert_eq!(serde_json::from_value::<PageRequest>(v).unwrap(), r);
}

#[test]
fn receipt_replay_or_reject_a_submission_sent_again_while_its_commit_fails_is_refused_with_it() {
    let mut sim = sw_agent::sim::Sim::new(31, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Hello"));
    sim.run(10_000);
    let (thread, _) = current_ids(&sim);
    let thread = thread.expect("a thread");
    // A queued turn is saving when the panel, unsure, sends it again; then
    // the disk refuses the write. Both sendings get the refusal.
    sim.hold_persists = true;
    sim.send(conn, enqueue("q1", &thread, "Later"));
    sim.run(1000);
    sim.send(conn, enqueue("q1", &thread, "Later"));
    sim.run(1000);
    assert!(
        answers(&sim, conn).iter().all(|(id, _)| id != "q1"),
        "both wait"
    );
    sim.fail_held_persists(false);
    sim.run(10_000);
    let refused: Vec<ErrorKind> = answers(&sim, conn)
        .into_iter()
        .filter(|(id, _)| id == "q1")
        .map(|(_, answer)| answer.expect_err("refused").kind)
        .collect();
    assert_eq!(refused, [ErrorKind::Storage, ErrorKind::Storage]);
    // Sent once more, it is a new attempt and goes through.
    sim.send(conn, enqueue("q1", &thread, "Later"));
    sim.run(10_000);
    assert!(
        matches!(answer(&sim, conn, "q1"), Some(Err(_))),
        "the first answer stays the first"
    );
    let last = answers(&sim, conn)
        .into_iter()
        .rev()
        .find(|(id, _)| id == "q1");
    assert!(matches!(last, Some((_, Ok(_)))), "{last:?}");
}

#[test]
fn receipt_replay_or_reject_an_interrupt_that_stopped_nothing_does_not_stop_a_later_turn() {
    let mut sim = sw_agent::sim::Sim::new(32, agent_policy(), page_tools());
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Hello"));
    sim.run(10_000);
    let (thread, _) = current_ids(&sim);
    let thread = thread.expect("a thread");
    sim.send(conn, interrupt("x1", &thread));
    sim.run(10_000);
    // Stop pressed with nothing running: "nothing to stop".
    sim.send(conn, interrupt("x2", &thread));
    sim.run(10_000);
    assert_eq!(
        answer(&sim, conn, "x2").and_then(Result::ok),
        Some(serde_json::json!({ "turnId": null }))
    );
    // A new turn waits for an approval when the panel, unsure the Stop
    // was heard, sends it again: the answer replays, the turn goes on.
    sim.send(conn, submit("s2", Some(&thread), "Again"));
    sim.run(10_000);
    let panel = sim.connect();
    sim.send(panel, interrupt("x2", &thread));
    sim.run(10_000);
    assert_eq!(
        answer(&sim, panel, "x2").and_then(Result::ok),
        Some(serde_json::json!({ "turnId": null }))
    );
    let latest = sim
        .store
        .runs
        .values()
        .max_by_key(|r| r.created_at)
        .unwrap();
    assert_eq!(latest.state, sw_agent::model::RunState::WaitingApproval);
}
