//! ask_user: a durable question, answered exactly once, across restarts.

use sw_agent::model::{InteractionStatus, NodeBody, RunState, StopReason, ToolStatus};
use sw_agent::protocol::{ErrorKind, Event, Op};
use sw_agent::provider::{ChatMessage, ProviderRequest};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

/// Asks once, then reports what the user said.
fn asking_policy() -> sw_agent::sim::Policy {
    Box::new(|request: &ProviderRequest| match request.messages.last() {
        Some(ChatMessage::ToolResult { content, .. }) => Reply::text(&format!("Noted: {content}")),
        _ => Reply::call(
            "q1",
            "ask_user",
            r#"{"question":"Which plan?","options":["Basic","Pro"]}"#,
        ),
    })
}

fn answer(id: &str, thread: &str, interaction: &str, text: &str) -> Op {
    Op::InteractionResponse {
        submission: submission(id),
        thread_id: thread.into(),
        interaction_id: interaction.into(),
        answer: text.into(),
    }
}

fn waiting(seed: u64) -> (Sim, u64, String, String) {
    let mut sim = Sim::new(seed, asking_policy(), page_tools());
    sim.auto_answer = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Sign me up"));
    sim.run(10_000);
    let run = sim.store.runs.values().next().unwrap().clone();
    assert_eq!(run.state, RunState::WaitingInteraction);
    let interaction = sim.store.interactions.values().next().unwrap().clone();
    assert_eq!(interaction.question, "Which plan?");
    assert_eq!(interaction.options, vec!["Basic", "Pro"]);
    assert!(sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::InteractionRequest { .. })));
    (sim, conn, run.thread_id, interaction.id)
}

#[test]
fn ask_user_answer_becomes_a_trusted_result_and_the_run_continues() {
    let (mut sim, conn, thread, interaction) = waiting(100);
    sim.send(conn, answer("a1", &thread, &interaction, "Pro"));
    sim.run(10_000);
    let result = paths(&sim)[0].iter().find_map(|n| match &n.body {
        NodeBody::ToolResult {
            name,
            status,
            content,
            ..
        } if name == "ask_user" => Some((*status, content.clone())),
        _ => None,
    });
    assert_eq!(
        result,
        Some((ToolStatus::Ok, "The user answered: Pro".to_string()))
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert_eq!(
        sim.store.interactions[&interaction].status,
        InteractionStatus::Answered
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn receipt_replay_or_reject_answer_is_claimed_exactly_once() {
    let (mut sim, conn, thread, interaction) = waiting(101);
    sim.send(conn, answer("a1", &thread, &interaction, "Pro"));
    sim.send(conn, answer("a1", &thread, &interaction, "Pro"));
    sim.run(10_000);
    sim.send(conn, answer("a2", &thread, &interaction, "Pro"));
    sim.send(conn, answer("a3", &thread, &interaction, "Basic"));
    sim.run(10_000);
    let answers = paths(&sim)[0]
        .iter()
        .filter(|n| matches!(&n.body, NodeBody::ToolResult { name, .. } if name == "ask_user"))
        .count();
    assert_eq!(answers, 1);
    let mut outcomes: Vec<(String, bool)> = sim
        .events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::CommandAck {
                op_type,
                submission_id,
                ..
            } if op_type == "interaction.response" => Some((submission_id.clone(), true)),
            Event::CommandReject {
                op_type,
                error,
                submission_id,
            } if op_type == "interaction.response" => {
                assert_eq!(error.kind, ErrorKind::InvalidCommand);
                assert_eq!(error.message, "This question was already answered.");
                Some((submission_id.clone(), false))
            }
            _ => None,
        })
        .collect();
    // By submission: a2's ACK waits for its receipt's commit, a3's refusal does not.
    sw_agent::sorting::sort_by(&mut outcomes, |a, b| a.0.cmp(&b.0));
    let expected = [("a1", true), ("a1", true), ("a2", true), ("a3", false)];
    assert_eq!(outcomes, expected.map(|(id, ok)| (id.to_string(), ok)));
}

#[test]
fn question_pending_across_crash_is_re_presented_and_answered_once() {
    let (mut sim, _, thread, interaction) = waiting(102);
    sim.crash();
    let conn = reconnect(&mut sim);
    sim.run(10_000);
    let pending = sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::Initialized { snapshot } => snapshot
            .thread
            .as_ref()
            .and_then(|t| t.pending_interaction.clone()),
        _ => None,
    });
    assert_eq!(pending.map(|p| p.id), Some(interaction.clone()));
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::WaitingInteraction
    );
    sim.send(conn, answer("a1", &thread, &interaction, "Basic"));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn interrupt_withdraws_the_question() {
    let (mut sim, conn, thread, interaction) = waiting(103);
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    assert_eq!(
        sim.store.interactions[&interaction].status,
        InteractionStatus::Cancelled
    );
    assert!(sim.events_for(conn).iter().any(|e| matches!(
        e,
        Event::InteractionResolved {
            status: InteractionStatus::Cancelled,
            ..
        }
    )));
    sim.send(conn, answer("late", &thread, &interaction, "Pro"));
    sim.run(1000);
    assert_eq!(
        reject_message(&sim, conn, "late").as_deref(),
        Some("This question was already withdrawn: its run ended.")
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn new_turns_are_queued_while_a_question_holds_the_thread() {
    let (mut sim, conn, thread, _) = waiting(104);
    sim.send(conn, submit("s2", Some(&thread), "Something else"));
    sim.run(10_000);
    let ack = sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::CommandAck {
            submission_id,
            result,
            ..
        } if submission_id == "s2" => Some(result.clone()),
        _ => None,
    });
    assert_eq!(ack.unwrap()["queued"], serde_json::json!(true));
    assert_eq!(sim.store.queue.len(), 1);
    sim.send(conn, resume("r1", &thread));
    sim.run(1000);
    assert!(sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::CommandReject { submission_id, .. } if submission_id == "r1")));
}
