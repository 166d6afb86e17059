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

/// One seeded schedule: a run that calls a server's read and write while
/// the server asks for input at random moments, two panels answer (right,
/// wrong, conflicting, repeated), requests expire, results arrive, the
/// user stops, saves are slow and the worker dies anywhere.
fn elicitation_schedule(seed: u64) -> Result<(u32, usize), String> {
    use sw_agent::protocol::{ApprovalDecision, UncertainChoice};
    use sw_agent::sim::CrashPoint;
    let mut rng = Rng(seed);
    let mut sim = Sim::new(seed, policy(), server_world());
    with_docs(&mut sim.config, URL);
    sim.reconfigure();
    sim.auto_approve = Some(ApprovalDecision::AcceptOnce);
    sim.hold_tools = Some(|name: &str| name.starts_with("docs__"));
    let mut panels = [sim.connect(), sim.connect()];
    sim.send(panels[0], submit("s1", None, "Document the install"));
    let mut n = 0u32;
    let mut steps = 0;
    loop {
        steps += 1;
        if steps > 5_000 {
            return Err("did not settle in 5,000 steps".into());
        }
        let thread = sim.store.threads.keys().next().cloned();
        let last_dispatch = sim.dispatches.last().map(|d| d.dispatch_id);
        if let Some(dispatch) = last_dispatch {
            if rng.chance(80) {
                sim.engine
                    .handle_elicitation(sim.now, dispatch, "docs", URL, booking());
            }
            if rng.chance(15) {
                sim.engine.handle_elicitation_expired(sim.now, dispatch);
            }
        }
        if rng.chance(300) {
            // Mostly the request waiting now; sometimes one shown before.
            let waiting = sim
                .store
                .interactions
                .values()
                .find(|i| i.status == InteractionStatus::Pending)
                .cloned();
            let shown = sim.events.iter().rev().find_map(|(_, e)| match &e.event {
                Event::InteractionRequest { interaction, .. } => Some(interaction.clone()),
                _ => None,
            });
            let pending = if rng.chance(800) {
                waiting.or(shown)
            } else {
                shown
            };
            if let Some(asked) = pending {
                n += 1;
                let (action, content) = match rng.next() % 5 {
                    0 => (
                        ElicitationAction::Accept,
                        Some(json!({ "email": "ada@example.com", "seats": 2 })),
                    ),
                    1 => (
                        ElicitationAction::Accept,
                        Some(json!({ "email": "nobody" })),
                    ),
                    2 => (ElicitationAction::Decline, None),
                    3 => (ElicitationAction::Cancel, None),
                    _ => (
                        ElicitationAction::Accept,
                        Some(json!({ "email": "bob@example.com", "seats": 9 })),
                    ),
                };
                // Sometimes a submission id used before (a resend).
                let id = if rng.chance(300) {
                    format!("e{}", n / 2)
                } else {
                    format!("e{n}")
                };
                let panel = panels[(rng.next() % 2) as usize];
                sim.send(
                    panel,
                    respond(&id, &asked.thread_id, &asked.id, action, content),
                );
            }
        }
        if rng.chance(20) {
            sim.release_tools();
        }
        if rng.chance(8) {
            if let Some(thread) = &thread {
                n += 1;
                sim.send(panels[0], interrupt(&format!("i{n}"), thread));
            }
        }
        if rng.chance(40) {
            if sim.hold_persists {
                sim.release_persists();
            } else {
                sim.hold_persists = true;
            }
        }
        if rng.chance(20) {
            match rng.next() % 3 {
                0 | 1 => {
                    let point = if rng.next() % 2 == 0 {
                        CrashPoint::BeforeCommit
                    } else {
                        CrashPoint::AfterCommit
                    };
                    let before = sim.crashes;
                    while sim.crashes == before {
                        if !sim.step_with(Some(point)) {
                            sim.crash();
                        }
                    }
                }
                _ => sim.crash(),
            }
            sim.hold_persists = false;
            panels = [reconnect(&mut sim), sim.connect()];
            continue;
        }
        if sim.step() {
            continue;
        }
        if sim.hold_persists {
            sim.release_persists();
            continue;
        }
        // Idle: what a user (or the server) would settle.
        let run = sim
            .store
            .runs
            .values()
            .max_by_key(|r| (r.created_at, r.id.clone()))
            .cloned();
        match run.map(|r| (r.state, r.thread_id)) {
            Some((RunState::PausedUncertain, thread)) => {
                n += 1;
                let choice = match rng.next() % 3 {
                    0 => UncertainChoice::MarkDone,
                    1 => UncertainChoice::Retry,
                    _ => UncertainChoice::Fail,
                };
                sim.send(panels[0], resolve(&format!("u{n}"), &thread, choice));
            }
            // A call is running (its result held): the server takes its time.
            Some((state, _)) if !state.is_terminal() => {
                if rng.chance(100) {
                    sim.release_tools();
                }
            }
            _ => break,
        }
    }
    check_invariants(&sim, &[])?;
    // Nothing is left asking at quiescence.
    if let Some(open) = sim
        .store
        .interactions
        .values()
        .find(|i| i.status == InteractionStatus::Pending)
    {
        return Err(format!("request {} still pending at quiescence", open.id));
    }
    // ack_after_commit: every ACKed answer is the stored one.
    for (_, e) in &sim.events {
        if let Event::CommandAck {
            op_type, result, ..
        } = &e.event
        {
            if op_type != "elicitation.response" {
                continue;
            }
            let id = result["interactionId"].as_str().unwrap_or_default();
            let kept = sim
                .store
                .interactions
                .get(id)
                .ok_or(format!("ACKed answer to {id}, which is not stored"))?;
            let action = serde_json::to_value(kept.action).unwrap();
            if kept.status != InteractionStatus::Answered || action != result["action"] {
                return Err(format!("ACKed {result} but stored {kept:?}"));
            }
        }
    }
    // Every answer sent to the server (other than cancel) is a stored
    // answer of that call's request, and no request is answered twice.
    let mut answered_sent: std::collections::HashMap<String, usize> = Default::default();
    for ((_, action, content), call) in sim
        .elicitation_answers
        .iter()
        .zip(&sim.elicitation_answer_calls)
    {
        if *action == ElicitationAction::Cancel {
            continue;
        }
        let call = call.clone();
        let kept = sim.store.interactions.values().filter(|i| {
            i.call_id == call
                && i.status == InteractionStatus::Answered
                && i.action == Some(*action)
                && i.content == *content
        });
        let count = kept.count();
        if count == 0 {
            return Err(format!(
                "sent {action:?} {content:?} for {call}, which no stored answer says"
            ));
        }
        *answered_sent.entry(call).or_default() += 1;
    }
    for (call, sent) in answered_sent {
        let stored = sim
            .store
            .interactions
            .values()
            .filter(|i| i.call_id == call && i.status == InteractionStatus::Answered)
            .count();
        if sent > stored {
            return Err(format!("{sent} answers sent for {call}, {stored} stored"));
        }
    }
    let answers = sim
        .elicitation_answers
        .iter()
        .filter(|(_, action, _)| *action != ElicitationAction::Cancel)
        .count();
    Ok((sim.crashes, answers))
}

#[test]
fn ack_after_commit_randomized_schedules_send_servers_only_durable_answers_once() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
        .min(2_000);
    let (mut crashes, mut answers, mut failures) = (0u64, 0usize, Vec::new());
    for seed in (0..seeds).map(|s| 7_000 + s) {
        match elicitation_schedule(seed) {
            Ok((c, a)) => {
                crashes += u64::from(c);
                answers += a;
            }
            Err(e) if failures.len() < 5 => failures.push(format!("seed {seed}: {e}")),
            Err(_) => {}
        }
    }
    eprintln!("{seeds} schedules: {crashes} crashes, {answers} answers sent to the server");
    // The schedules did what they are for: workers died, answers went out.
    assert!(
        crashes > seeds,
        "only {crashes} crashes in {seeds} schedules"
    );
    assert!(
        answers as u64 > seeds / 4,
        "only {answers} answers sent in {seeds} schedules"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
