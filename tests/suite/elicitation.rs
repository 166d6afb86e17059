//! An MCP server asking the user for input during one of its tool calls
//! (`elicitation/create`, spec 000 §5: "MCP Elicitation"): the request is
//! kept before it is shown, the answer is checked against the form and
//! ACKed once durable before it goes to the server, the request ends with
//! its call, and after a restart the server's call is not continued: the
//! model is told to call again only if that is safe.

use serde_json::{json, Value};
use sw_agent::elicitation::{parse_request, Request};
use sw_agent::model::{
    ElicitationAction, InteractionRecord, InteractionStatus, RunState, ToolStatus,
};
use sw_agent::protocol::{ErrorKind, Event, Op};
use sw_agent::sim::Sim;

use super::mcp::{policy, ran, result_of, server_world, with_docs};
use super::support::*;

const URL: &str = "http://127.0.0.1:9000/mcp";

fn booking() -> Request {
    let params = json!({
        "message": "How many seats, and where shall the confirmation go?",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "email": { "type": "string", "format": "email" },
                "seats": { "type": "integer", "minimum": 1, "maximum": 8 }
            },
            "required": ["email"]
        }
    });
    parse_request(&params, &["email".into(), "seats".into()]).unwrap()
}

fn respond(
    id: &str,
    thread: &str,
    interaction: &str,
    action: ElicitationAction,
    content: Option<Value>,
) -> Op {
    Op::ElicitationResponse {
        submission: submission(id),
        thread_id: thread.into(),
        interaction_id: interaction.into(),
        action,
        content,
    }
}

/// A run whose call `tool` is running (its result held) with every
/// approval accepted: (sim, conn, thread, the call's dispatch).
fn calling(seed: u64, tool: &'static str) -> (Sim, u64, String, u64) {
    let mut sim = Sim::new(seed, policy(), server_world());
    with_docs(&mut sim.config, URL);
    sim.reconfigure();
    sim.auto_approve = Some(sw_agent::protocol::ApprovalDecision::AcceptOnce);
    sim.hold_tools = Some(match tool {
        "docs__search" => |name: &str| name == "docs__search",
        _ => |name: &str| name == "docs__page_create",
    });
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Document the install"));
    while ran(&sim, tool) == 0 {
        assert!(sim.step(), "{tool} was never called");
    }
    sim.run(10_000);
    let thread = sim.store.threads.keys().next().unwrap().clone();
    let dispatch = sim
        .dispatches
        .iter()
        .find(|d| d.name == tool)
        .unwrap()
        .dispatch_id;
    (sim, conn, thread, dispatch)
}

fn ask(sim: &mut Sim, dispatch: u64) -> InteractionRecord {
    sim.engine
        .handle_elicitation(sim.now, dispatch, "docs", URL, booking());
    sim.run(10_000);
    sim.store
        .interactions
        .values()
        .find(|i| i.server.is_some() && i.status == InteractionStatus::Pending)
        .expect("the request is kept")
        .clone()
}

fn requests_shown(sim: &Sim, conn: u64) -> Vec<InteractionRecord> {
    sim.events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::InteractionRequest { interaction, .. } => Some(interaction.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn ack_after_commit_a_server_s_request_for_input_is_kept_before_it_is_shown_and_answered_after() {
    let (mut sim, conn, thread, dispatch) = calling(601, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    // Kept, then shown (the simulation checks every event against the store).
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    assert_eq!(requests_shown(&sim, conn), vec![asked.clone()]);
    assert_eq!(asked.server.as_deref(), Some("docs"));
    assert_eq!(asked.server_url.as_deref(), Some(URL));
    assert_eq!(
        asked.question,
        "How many seats, and where shall the confirmation go?"
    );
    let fields: Vec<&str> = asked
        .form
        .as_ref()
        .unwrap()
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(fields, ["email", "seats"]);
    // The run stays on its call; a panel that connects now sees the request.
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::ExecutingTools
    );
    let late = sim.connect();
    sim.send(late, initialize("late", Some(&thread)));
    sim.run(10_000);
    let view = last_view(&sim, late);
    assert_eq!(
        view.pending_interaction.as_ref().map(|i| i.id.clone()),
        Some(asked.id.clone())
    );

    // An answer that does not fit the form is refused, naming the field;
    // nothing is kept or sent.
    sim.send(
        conn,
        respond(
            "e1",
            &thread,
            &asked.id,
            ElicitationAction::Accept,
            Some(json!({ "email": "ada", "seats": 2 })),
        ),
    );
    sim.run(10_000);
    let error = answer(&sim, conn, "e1").unwrap().unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidCommand);
    assert_eq!(error.message, "Field \"email\": not an email address.");
    sim.send(
        conn,
        respond(
            "e2",
            &thread,
            &asked.id,
            ElicitationAction::Accept,
            Some(json!({ "seats": 2 })),
        ),
    );
    sim.run(10_000);
    assert_eq!(
        reject_message(&sim, conn, "e2").as_deref(),
        Some("Field \"email\" is required.")
    );
    assert!(sim.elicitation_answers.is_empty());
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Pending
    );

    // A fitting one: durable with its receipt, ACKed, then sent to the server.
    sim.send(
        conn,
        respond(
            "e3",
            &thread,
            &asked.id,
            ElicitationAction::Accept,
            Some(json!({ "email": "ada@example.com", "seats": 4.0 })),
        ),
    );
    sim.run(10_000);
    let ack = answer(&sim, conn, "e3").unwrap().unwrap();
    assert_eq!(
        ack,
        json!({ "interactionId": asked.id, "status": "answered", "action": "accept" })
    );
    let kept = &sim.store.interactions[&asked.id];
    assert_eq!(kept.status, InteractionStatus::Answered);
    assert_eq!(kept.action, Some(ElicitationAction::Accept));
    assert_eq!(
        kept.content,
        Some(json!({ "email": "ada@example.com", "seats": 4 }))
    );
    assert_eq!(
        sim.elicitation_answers,
        vec![(
            dispatch,
            ElicitationAction::Accept,
            Some(json!({ "email": "ada@example.com", "seats": 4 }))
        )]
    );
    assert!(sim.events_for(conn).iter().any(|e| matches!(e,
        Event::InteractionResolved { interaction_id, status: InteractionStatus::Answered, action: Some(ElicitationAction::Accept), .. } if *interaction_id == asked.id)));
    // Claimed once: the same answer again is ACKed (nothing sent twice), another refused.
    sim.send(
        conn,
        respond(
            "e4",
            &thread,
            &asked.id,
            ElicitationAction::Accept,
            Some(json!({ "email": "ada@example.com", "seats": 4 })),
        ),
    );
    sim.send(
        conn,
        respond("e5", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.run(10_000);
    assert!(answer(&sim, conn, "e4").unwrap().is_ok());
    assert_eq!(
        reject_message(&sim, conn, "e5").as_deref(),
        Some("This request was already answered.")
    );
    assert_eq!(sim.elicitation_answers.len(), 1);

    // The server's answer to the call arrives: the run goes on to its end.
    sim.release_tools();
    sim.run(10_000);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
    assert_eq!(result_of(&sim, "docs__page_create").0, ToolStatus::Ok);
    assert_eq!(ran(&sim, "docs__page_create"), 1);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_request_for_input_ends_with_its_call_and_a_late_answer_is_refused() {
    let (mut sim, conn, thread, dispatch) = calling(602, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    // The server answers the call without waiting for the user.
    sim.release_tools();
    sim.run(10_000);
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Cancelled
    );
    assert!(sim.events_for(conn).iter().any(|e| matches!(e,
        Event::InteractionResolved { interaction_id, status: InteractionStatus::Cancelled, .. } if *interaction_id == asked.id)));
    sim.send(
        conn,
        respond("late", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.run(10_000);
    assert_eq!(
        reject_message(&sim, conn, "late").as_deref(),
        Some("This request was already withdrawn: the server's call ended.")
    );
    assert!(sim.elicitation_answers.is_empty());
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::Completed
    );
    check_invariants(&sim, &[]).unwrap();

    // A stop withdraws it with the run.
    let (mut sim, conn, thread, dispatch) = calling(603, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    sim.send(conn, interrupt("stop", &thread));
    sim.run(10_000);
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Cancelled
    );
    let fresh = sim.connect();
    sim.send(fresh, initialize("fresh", Some(&thread)));
    sim.run(10_000);
    let view = last_view(&sim, fresh);
    assert!(view.pending_interaction.is_none());
    check_invariants(&sim, &[]).unwrap();

    // A request for a call that already ended is answered "cancel" at once
    // and never kept.
    let kept = sim.store.interactions.len();
    sim.engine
        .handle_elicitation(sim.now, dispatch, "docs", URL, booking());
    sim.run(10_000);
    assert_eq!(
        sim.elicitation_answers,
        vec![(dispatch, ElicitationAction::Cancel, None)]
    );
    assert_eq!(sim.store.interactions.len(), kept);

    // Left unanswered for as long as a request may wait: withdrawn, the
    // server told "cancel", and the call goes on.
    let (mut sim, conn, thread, waiting) = calling(607, "docs__page_create");
    let asked = ask(&mut sim, waiting);
    sim.engine.handle_elicitation_expired(sim.now, waiting);
    sim.run(10_000);
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Cancelled
    );
    assert_eq!(
        sim.elicitation_answers,
        vec![(waiting, ElicitationAction::Cancel, None)]
    );
    assert!(sim.events_for(conn).iter().any(|e| matches!(e,
        Event::InteractionResolved { interaction_id, status: InteractionStatus::Cancelled, .. } if *interaction_id == asked.id)));
    sim.send(
        conn,
        respond("slow", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.run(10_000);
    assert!(reject_message(&sim, conn, "slow")
        .unwrap()
        .contains("withdrawn"));
    // Expiring again (or after the answer) changes nothing.
    sim.engine.handle_elicitation_expired(sim.now, waiting);
    sim.run(10_000);
    assert_eq!(sim.elicitation_answers.len(), 1);
    sim.release_tools();
    sim.run(10_000);
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::Completed
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_read_whose_server_asked_for_input_is_not_run_again_after_a_restart_and_the_model_is_told() {
    // Asked, not answered; and asked, answered, the answer sent: either way
    // the server's call died with the worker. A read would be run again by
    // itself; this one is not.
    for (seed, answered) in [(604, false), (605, true)] {
        let (mut sim, conn, thread, dispatch) = calling(seed, "docs__search");
        let asked = ask(&mut sim, dispatch);
        if answered {
            sim.send(
                conn,
                respond("e1", &thread, &asked.id, ElicitationAction::Decline, None),
            );
            sim.run(10_000);
            assert_eq!(
                sim.elicitation_answers,
                vec![(dispatch, ElicitationAction::Decline, None)]
            );
        }
        sim.crash();
        sim.hold_tools = None;
        let panel = reconnect(&mut sim);
        sim.run(10_000);
        assert_eq!(ran(&sim, "docs__search"), 1, "the read must not run again");
        let (status, content) = result_of(&sim, "docs__search");
        assert_eq!(status, ToolStatus::Interrupted);
        assert!(
            content.contains("asked the user for input during this call"),
            "{content}"
        );
        assert!(content.contains("cannot be continued"), "{content}");
        assert!(
            content.contains("Call the tool again only if that is safe"),
            "{content}"
        );
        assert_eq!(
            content.contains("the user had answered it: decline"),
            answered,
            "{content}"
        );
        let expected = if answered {
            InteractionStatus::Answered
        } else {
            InteractionStatus::Cancelled
        };
        assert_eq!(sim.store.interactions[&asked.id].status, expected);
        // The run goes on: the next call asks first, then the answer.
        let approval = approval_requests(&sim)
            .into_iter()
            .last()
            .expect("the next call asks");
        assert_eq!(approval.tool_name, "docs__page_create");
        let decision = sw_agent::protocol::ApprovalDecision::AcceptOnce;
        sim.send(
            panel,
            approval_response("a1", &thread, &approval.id, decision),
        );
        sim.run(10_000);
        let run = sim.store.runs.values().next().unwrap();
        assert_eq!(run.state, RunState::Completed, "{:?}", run.error);
        check_invariants(&sim, &[]).unwrap();
    }
}

#[test]
fn never_retry_at_most_once_a_write_whose_server_asked_for_input_is_the_user_s_to_decide_after_a_restart(
) {
    let (mut sim, _, _, dispatch) = calling(606, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    sim.crash();
    sim.hold_tools = None;
    let panel = reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(ran(&sim, "docs__page_create"), 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::PausedUncertain);
    // The request died with its call: no form is offered for it any more.
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Cancelled
    );
    assert!(sim.events_for(panel).iter().any(|e| matches!(e,
        Event::InteractionResolved { interaction_id, status: InteractionStatus::Cancelled, .. } if *interaction_id == asked.id)));
    let thread = asked.thread_id.clone();
    sim.send(panel, initialize("again", Some(&thread)));
    sim.run(10_000);
    assert!(last_view(&sim, panel).pending_interaction.is_none());
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn ack_after_commit_an_answer_being_saved_claims_its_request_against_another_answer_and_a_withdrawal(
) {
    // Two panels answer differently before the first answer is saved: one
    // answer is kept, ACKed and sent; the other is refused.
    let (mut sim, conn, thread, dispatch) = calling(608, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    let other = sim.connect();
    sim.hold_persists = true;
    sim.send(
        conn,
        respond(
            "e1",
            &thread,
            &asked.id,
            ElicitationAction::Accept,
            Some(json!({ "email": "ada@example.com" })),
        ),
    );
    sim.send(
        other,
        respond("e2", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.drain_effects();
    assert_eq!(
        reject_message(&sim, other, "e2").as_deref(),
        Some("An answer to this request, or its withdrawal, is being saved.")
    );
    assert!(
        answer(&sim, conn, "e1").is_none(),
        "no ACK before the commit"
    );
    assert!(
        sim.elicitation_answers.is_empty(),
        "nothing sent before the commit"
    );
    // The server's answer to the call arrives while the answer is being
    // saved: the answer stays the user's (not overwritten as withdrawn).
    sim.release_tools();
    sim.run(10_000);
    sim.release_persists();
    sim.run(10_000);
    assert!(answer(&sim, conn, "e1").unwrap().is_ok());
    let kept = &sim.store.interactions[&asked.id];
    assert_eq!(kept.status, InteractionStatus::Answered);
    assert_eq!(kept.action, Some(ElicitationAction::Accept));
    assert_eq!(sim.elicitation_answers.len(), 1);
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::Completed
    );
    check_invariants(&sim, &[]).unwrap();

    // A withdrawal (the request waited too long) being saved: an answer is
    // refused, and the server hears `cancel` only once the withdrawal is kept.
    let (mut sim, conn, thread, dispatch) = calling(609, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    sim.hold_persists = true;
    sim.engine.handle_elicitation_expired(sim.now, dispatch);
    sim.send(
        conn,
        respond("late", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.drain_effects();
    assert!(reject_message(&sim, conn, "late")
        .unwrap()
        .contains("being saved"));
    assert!(sim.elicitation_answers.is_empty());
    sim.release_persists();
    sim.run(10_000);
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Cancelled
    );
    assert_eq!(
        sim.elicitation_answers,
        vec![(dispatch, ElicitationAction::Cancel, None)]
    );

    // A withdrawal that could not be saved leaves the request answerable.
    let (mut sim, conn, thread, dispatch) = calling(610, "docs__page_create");
    let asked = ask(&mut sim, dispatch);
    sim.refuse_writes = true;
    sim.engine.handle_elicitation_expired(sim.now, dispatch);
    sim.run(10_000);
    sim.refuse_writes = false;
    assert!(sim.elicitation_answers.is_empty());
    assert_eq!(
        sim.store.interactions[&asked.id].status,
        InteractionStatus::Pending
    );
    sim.send(
        conn,
        respond("e3", &thread, &asked.id, ElicitationAction::Decline, None),
    );
    sim.run(10_000);
    assert!(answer(&sim, conn, "e3").unwrap().is_ok());
    assert_eq!(
        sim.elicitation_answers,
        vec![(dispatch, ElicitationAction::Decline, None)]
    );
}
