//! Commands that arrive while a run's last checkpoint, or another command,
//! is being saved: each is answered for what it really did.

use sw_agent::model::RunState;
use sw_agent::protocol::{ErrorKind, Event};
use sw_agent::provider::ProviderError;
use sw_agent::sim::{Reply, Sim};
use sw_agent::store::{Record, UnitOfWork};

use super::support::*;

/// Steps, committing the saves before it one by one, until a held save
/// matches `wanted` (commits are held first).
fn step_until_held(sim: &mut Sim, what: &str, wanted: impl Fn(&UnitOfWork) -> bool) {
    for _ in 0..10_000 {
        if sim.held.iter().any(|(_, unit)| wanted(unit)) {
            return;
        }
        if !sim.step() && !sim.release_one() {
            break;
        }
    }
    assert!(
        sim.held.iter().any(|(_, unit)| wanted(unit)),
        "no held save of {what}"
    );
}

/// A save that ends a run.
fn finishes_run(unit: &UnitOfWork) -> bool {
    unit.puts
        .iter()
        .any(|r| matches!(r, Record::Run(run) if run.state.is_terminal()))
}

/// A model that fails for good on `fail_on`'s request and says "done" to
/// the others.
fn failing_on(fail_on: &'static str) -> sw_agent::sim::Policy {
    Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        let last_user = request.messages.iter().rev().find_map(|m| match m {
            sw_agent::provider::ChatMessage::User { text, .. } => Some(text.clone()),
            _ => None,
        });
        if last_user.as_deref() == Some(fail_on) {
            Reply::Error {
                partial: String::new(),
                error: ProviderError::new(ErrorKind::Auth, "bad key", false),
            }
        } else {
            Reply::text("done")
        }
    })
}

#[test]
fn steer_exactly_once_in_order_a_steer_sent_while_a_failed_run_is_saved_becomes_a_queued_turn() {
    let mut sim = Sim::new(331, failing_on("Subscribe me"), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let (thread, turn) = current_ids(&sim);
    let (thread, turn) = (thread.unwrap(), turn.unwrap());
    // The model fails for good: the run's last checkpoint is being saved
    // when the steer arrives.
    sim.hold_persists = true;
    step_until_held(&mut sim, "the failed run", finishes_run);
    sim.send(conn, steer("steer-also this", &thread, &turn, "also this"));
    sim.run(10_000);
    sim.release_persists();
    sim.run(10_000);
    let acked = answer(&sim, conn, "steer-also this")
        .expect("answered")
        .expect("accepted");
    assert_eq!(
        acked["queued"], true,
        "not a steer of the ending run: {acked}"
    );
    assert!(acked.get("steerId").is_none(), "{acked}");
    assert!(sim.store.steers.is_empty(), "no steer left pending");
    // It ran as the next turn, right after the failed one.
    assert_eq!(user_texts(&sim, false), ["Subscribe me", "also this"]);
    assert_eq!(sim.requests.len(), 2);
    check_invariants(&sim, &["also this".into()]).unwrap();
}

/// A thread whose first turn is answered while `queued` waits; the run's
/// last checkpoint is held. → (conn, thread, queue item id).
fn queued_while_the_run_ends(seed: u64) -> (Sim, u64, String, String) {
    let mut sim = Sim::new(seed, Box::new(|_| Reply::text("done")), page_tools());
    let conn = sim.connect();
    sim.hold_replies_to = Some(|_| true);
    sim.send(conn, submit("s1", None, "first"));
    sim.run(10_000);
    let thread = current_ids(&sim).0.unwrap();
    sim.send(conn, enqueue("e1", &thread, "queued"));
    sim.run(10_000);
    let item = answer(&sim, conn, "e1").unwrap().unwrap()["queueItemId"]
        .as_str()
        .unwrap()
        .to_string();
    sim.hold_persists = true;
    sim.hold_replies_to = None;
    sim.release_replies();
    step_until_held(&mut sim, "the finished run", finishes_run);
    (sim, conn, thread, item)
}

#[test]
fn a_queued_turn_edited_while_the_turn_before_it_is_saved_runs_as_edited() {
    let (mut sim, conn, thread, item) = queued_while_the_run_ends(332);
    sim.send(conn, queue_update("u1", &thread, &item, "queued, edited"));
    sim.run(10_000);
    // The run's end commits first, then the edit.
    sim.release_persists();
    sim.run(10_000);
    assert!(answer(&sim, conn, "u1").unwrap().is_ok());
    assert_eq!(user_texts(&sim, false), ["first", "queued, edited"]);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_queued_turn_removed_while_the_turn_before_it_is_saved_does_not_run() {
    let (mut sim, conn, thread, item) = queued_while_the_run_ends(333);
    sim.send(conn, queue_remove("r1", &thread, &item));
    sim.run(10_000);
    sim.release_persists();
    sim.run(10_000);
    assert!(answer(&sim, conn, "r1").unwrap().is_ok());
    assert_eq!(
        user_texts(&sim, false),
        ["first"],
        "the removed turn never ran"
    );
    assert!(sim.store.queue.is_empty());
    assert_eq!(
        sim.store
            .runs
            .values()
            .filter(|r| r.state == RunState::Completed)
            .count(),
        1
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn receipt_replay_or_reject_an_interrupt_s_id_is_taken_from_its_arrival() {
    let mut sim = Sim::new(334, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let thread = current_ids(&sim).0.unwrap();
    // The stop arrives while a step's checkpoint is being saved, so the
    // run ends (and the stop's receipt is written) only after it; meanwhile
    // the same id comes again for the same stop, and for another command.
    sim.hold_persists = true;
    step_until_held(&mut sim, "a step", |unit| !finishes_run(unit));
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    sim.send(conn, interrupt("i1", &thread));
    sim.send(conn, enqueue("i1", &thread, "another command"));
    sim.run(10_000);
    sim.release_persists();
    sim.run(10_000);
    let answers: Vec<_> = answers(&sim, conn)
        .into_iter()
        .filter(|(id, _)| id == "i1")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    let refused = answers.iter().filter(|a| a.is_err()).count();
    assert_eq!(refused, 1, "only the other command is refused: {answers:?}");
    let err = answers.iter().find_map(|a| a.as_ref().err()).unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidCommand);
    let acks: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(acks[0], acks[1], "the same stop, answered alike");
    assert!(sim.store.queue.is_empty(), "the other command did nothing");
    assert!(!sim.events.iter().any(|(_, e)| matches!(
        &e.event,
        Event::QueueUpdated { queue, .. } if !queue.is_empty()
    )));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_model_title_that_cannot_be_saved_stops_nothing_and_is_saved_with_the_next_write() {
    use sw_agent::engine::TITLE_PROMPT;
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        if *request.system == *TITLE_PROMPT {
            return Reply::text("A model title");
        }
        Reply::text("Done.")
    });
    let mut sim = Sim::new(332, policy, page_tools());
    sim.config.model_titles = true;
    sim.reconfigure();
    // The title comes late: after the turn's last save was issued.
    sim.hold_replies_to = Some(|request| *request.system == *TITLE_PROMPT);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let (thread, _) = current_ids(&sim);
    let thread = thread.unwrap();
    sim.send(conn, enqueue("q1", &thread, "Subscribe me again"));
    sim.hold_persists = true;
    step_until_held(&mut sim, "the end of the turn", finishes_run);
    sim.release_replies();
    while sim.step() {}
    // The turn's end commits; the title is saved on its own after it, and
    // the queued turn starts.
    let saves_title = |unit: &UnitOfWork| {
        !unit.puts.iter().any(|r| matches!(r, Record::Run(_)))
            && unit
                .puts
                .iter()
                .any(|r| matches!(r, Record::Thread(t) if t.title == "A model title"))
    };
    step_until_held(&mut sim, "the model title", saves_title);
    // The disk refuses the title's save, for good.
    let at = sim
        .held
        .iter()
        .position(|(_, unit)| saves_title(unit))
        .unwrap();
    assert!(sim.fail_nth(at, false));
    sim.hold_persists = false;
    sim.release_persists();
    sim.run(100_000);
    // Nothing stalled: both turns completed, none ended with a storage error.
    assert_eq!(sim.store.runs.len(), 2);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == RunState::Completed));
    assert!(!sim.events_for(conn).iter().any(|e| matches!(
        e,
        Event::TurnComplete { error: Some(error), .. } if error.kind == ErrorKind::Storage
    )));
    // The title was kept in memory and went with the thread's next write.
    assert_eq!(sim.store.threads[&thread].title, "A model title");
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}
