//! What a starting engine reads stays bounded: command receipts, and the
//! answered approvals and questions of finished runs, older than
//! `EngineConfig::retention_ms` are deleted at start, and a thread's
//! superseded finished runs that old when the thread loads
//! (`PRUNE_PER_START` at a time); a start decodes unfinished runs only. A
//! thread's latest run, unfinished runs and younger receipts are kept and
//! keep working.

use sw_agent::engine::PRUNE_PER_START;
use sw_agent::model::Receipt;
use sw_agent::protocol::{ErrorKind, Event, Op};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

const DAY: u64 = 24 * 60 * 60 * 1000;

/// The agent reads the page and clicks (each click approved), on day 30.
fn clicking(seed: u64) -> Sim {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    sim.now = 30 * DAY;
    sim
}

fn answering() -> Sim {
    let mut sim = Sim::new(7, Box::new(|_: &_| Reply::text("Hi.")), page_tools());
    sim.now = 30 * DAY;
    sim
}

fn turn(sim: &mut Sim, conn: u64, id: &str, thread: Option<&str>) -> String {
    sim.send(conn, submit(id, thread, "Hello"));
    sim.run(10_000);
    acked_thread(sim, conn, id).expect("the turn was acknowledged")
}

/// Stores question `q1` of `run_id`, answered on day 30.
fn answered_question(sim: &mut Sim, thread_id: &str, run_id: String) {
    use sw_agent::model::{InteractionRecord, InteractionStatus};
    sim.store.interactions.insert(
        "q1".into(),
        InteractionRecord {
            id: "q1".into(),
            thread_id: thread_id.to_string(),
            run_id,
            call_id: "c9".into(),
            question: "Which size?".into(),
            options: vec![],
            status: InteractionStatus::Answered,
            answer: Some("M".into()),
            created_at: 30 * DAY,
            answered_at: Some(30 * DAY),
            server: None,
            server_url: None,
            form: None,
            action: None,
            content: None,
        },
    );
}

#[test]
fn receipt_replay_or_reject_holds_within_retention_and_start_deletes_only_what_expired() {
    let mut sim = answering();
    let conn = sim.connect();
    let t1 = turn(&mut sim, conn, "a1", None);
    turn(&mut sim, conn, "a2", Some(&t1));
    turn(&mut sim, conn, "a3", Some(&t1));
    let t2 = turn(&mut sim, conn, "b1", None);
    assert_eq!(sim.store.runs.len(), 4);
    let latest_t1 = sim
        .store
        .runs
        .values()
        .filter(|r| r.thread_id == t1)
        .max_by_key(|r| (r.created_at, r.id.clone()))
        .map(|r| r.id.clone())
        .unwrap();
    // Within the week: a restart deletes nothing.
    sim.now += 6 * DAY;
    sim.crash();
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 4);
    assert_eq!(sim.store.receipts.len(), 4);

    // A receipt of yesterday, then a restart more than a week after the rest.
    sim.now += 2 * DAY;
    let conn = sim.connect();
    turn(&mut sim, conn, "b2", Some(&t2));
    sim.now += DAY;
    sim.crash();
    sim.run(10_000);
    // Receipts go at start; a thread's runs are read, and the expired ones
    // deleted, when the thread loads (a start decodes no finished run).
    assert_eq!(sim.store.receipts.len(), 1);
    assert_eq!(sim.store.runs.len(), 5, "no thread loaded yet");
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&t1)));
    sim.send(conn, initialize("i2", Some(&t2)));
    sim.run(10_000);
    let runs: Vec<(String, String)> = sim
        .store
        .runs
        .values()
        .map(|r| (r.thread_id.clone(), r.id.clone()))
        .collect();
    assert_eq!(
        runs.iter()
            .filter(|(t, _)| *t == t1)
            .map(|(_, r)| r.clone())
            .collect::<Vec<_>>(),
        vec![latest_t1],
        "t1 keeps only its latest run"
    );
    assert_eq!(
        runs.iter().filter(|(t, _)| *t == t2).count(),
        1,
        "t2's old run was superseded by yesterday's"
    );
    let receipts: Vec<&str> = sim.store.receipts.keys().map(String::as_str).collect();
    assert_eq!(
        receipts,
        vec!["client-1\u{1f}b2"],
        "only yesterday's receipt is left"
    );
    // The conversation itself is untouched: four turns' nodes on t1 and t2.
    assert!(paths(&sim).iter().all(|p| !p.is_empty()));

    // Yesterday's submission still replays; a week-old one is a new command.
    let conn = sim.connect();
    let runs_before = sim.store.runs.len();
    sim.send(conn, submit("b2", Some(&t2), "Hello"));
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), runs_before, "b2 replayed, no new run");
    assert_eq!(acked_thread(&sim, conn, "b2").as_deref(), Some(t2.as_str()));
    sim.send(conn, submit("a1", Some(&t1), "Hello"));
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), runs_before + 1, "a1 is new again");

    // Deleting a thread still deletes every run it has left.
    sim.send(conn, delete("d1", &t1));
    sim.run(10_000);
    assert!(sim.store.runs.values().all(|r| r.thread_id != t1));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn receipt_replay_or_reject_a_delete_or_queue_edit_sent_again_after_a_restart_replays_its_ack() {
    let mut sim = clicking(8);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    let thread = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, enqueue("q1", &thread, "first"));
    sim.send(conn, enqueue("q2", &thread, "second"));
    sim.drain_effects();
    let item = |sim: &Sim, text: &str| {
        sim.store
            .queue
            .values()
            .find(|q| q.text == text)
            .map(|q| q.id.clone())
            .expect("queued")
    };
    let (first, second) = (item(&sim, "first"), item(&sim, "second"));
    sim.send(conn, queue_update("u1", &thread, &second, "second, fixed"));
    sim.send(conn, queue_remove("r1", &thread, &first));
    sim.drain_effects();
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    sim.send(conn, delete("d1", &thread));
    sim.run(10_000);
    for id in ["u1", "r1", "d1"] {
        let answered = answer(&sim, conn, id).expect("answered");
        assert!(answered.is_ok(), "{id}: {answered:?}");
        let receipt = &sim.store.receipts[&format!("client-1\u{1f}{id}")];
        assert!(
            receipt.created_at >= 30 * DAY,
            "{id} is dated when it was done"
        );
    }
    // The ACKs were lost with the worker; a day later the panel sends the
    // same submissions again: each replays its answer (not "No such
    // thread", not "Not changed").
    sim.now += DAY;
    sim.crash();
    sim.run(10_000);
    let conn = sim.connect();
    sim.send(conn, queue_update("u1", &thread, &second, "second, fixed"));
    sim.send(conn, queue_remove("r1", &thread, &first));
    sim.send(conn, delete("d1", &thread));
    sim.run(10_000);
    for id in ["u1", "r1", "d1"] {
        let replayed = answer(&sim, conn, id).expect("answered");
        assert!(replayed.is_ok(), "{id}: {replayed:?}");
    }
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn a_large_backlog_is_deleted_a_bounded_batch_per_start() {
    let mut sim = answering();
    let backlog = PRUNE_PER_START + 25;
    for i in 0..backlog {
        let key = format!("old-client\u{1f}s{i}");
        sim.store.receipts.insert(
            key.clone(),
            Receipt {
                key,
                op_type: "turn.submit".into(),
                fingerprint: "f".into(),
                result: serde_json::json!({}),
                created_at: DAY,
            },
        );
    }
    let commits = sim.store.commits;
    sim.crash();
    sim.run(10_000);
    assert_eq!(sim.store.receipts.len(), 25);
    assert_eq!(sim.store.commits, commits + 1, "one unit per start");
    sim.crash();
    sim.run(10_000);
    assert!(sim.store.receipts.is_empty());
}

#[test]
fn finished_runs_come_with_their_thread_and_keep_working() {
    use sw_agent::engine::TITLE_PROMPT;
    let policy = Box::new(|request: &sw_agent::provider::ProviderRequest| {
        if *request.system == *TITLE_PROMPT {
            return Reply::text("Greeting");
        }
        Reply::text("Hi.")
    });
    let mut sim = Sim::new(8, policy, page_tools());
    sim.now = 30 * DAY;
    sim.config.model_titles = true;
    sim.crash(); // rebuild the engine with the config
    let conn = sim.connect();
    let tid = turn(&mut sim, conn, "a1", None);
    let titles = |sim: &Sim| {
        sim.requests
            .iter()
            .filter(|r| *r.system == *TITLE_PROMPT)
            .count()
    };
    assert_eq!(titles(&sim), 1);
    let first_run = sim.store.runs.values().next().unwrap().clone();

    // A start decodes no finished run: the image has none.
    sim.crash();
    assert!(sim.store.image().runs.is_empty());
    // Opening the thread brings its runs: the snapshot shows the latest.
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(10_000);
    let shown = sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::Initialized { snapshot } => snapshot.thread.as_ref().map(|t| t.run.clone()),
        _ => None,
    });
    assert_eq!(shown, Some(Some(first_run.clone())));

    // A second turn after the restart knows the first: no second title.
    sim.crash();
    let conn = sim.connect();
    turn(&mut sim, conn, "a2", Some(&tid));
    assert_eq!(
        titles(&sim),
        1,
        "the thread's first run came with the thread"
    );
    assert_eq!(sim.store.runs.len(), 2);
    // A delete after another restart reaches both runs.
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, delete("d1", &tid));
    sim.run(10_000);
    assert!(sim.store.runs.is_empty());
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn answered_approvals_and_questions_of_finished_runs_expire_pending_ones_stay() {
    use sw_agent::model::{ApprovalStatus, NodeBody, RunState};
    use sw_agent::protocol::ApprovalDecision;
    // One thread whose click was approved (the run finished), one whose run
    // still waits for its approval.
    let mut sim = clicking(9);
    let conn = sim.connect();
    let done = turn(&mut sim, conn, "a1", None);
    sim.auto_approve = None;
    let waiting = turn(&mut sim, conn, "b1", None);
    let status = |sim: &Sim, thread: &str| {
        sim.store
            .approvals
            .values()
            .filter(|a| a.thread_id == thread)
            .map(|a| a.status)
            .collect::<Vec<_>>()
    };
    assert_eq!(status(&sim, &done), vec![ApprovalStatus::AcceptedOnce]);
    assert_eq!(status(&sim, &waiting), vec![ApprovalStatus::Pending]);
    let finished_run = sim
        .store
        .runs
        .values()
        .find(|r| r.thread_id == done)
        .unwrap()
        .id
        .clone();
    answered_question(&mut sim, &done, finished_run);

    sim.now += 8 * DAY;
    sim.crash();
    sim.run(10_000);
    assert!(
        status(&sim, &done).is_empty(),
        "the finished run's answered approval expired"
    );
    assert!(
        sim.store.interactions.is_empty(),
        "so did its answered question"
    );
    assert_eq!(status(&sim, &waiting), vec![ApprovalStatus::Pending]);
    // The waiting run still takes its answer and finishes.
    let approval = sim
        .store
        .approvals
        .values()
        .find(|a| a.thread_id == waiting)
        .unwrap()
        .id
        .clone();
    let conn = sim.connect();
    sim.send(
        conn,
        Op::ApprovalResponse {
            submission: submission("ap1"),
            thread_id: waiting.clone(),
            approval_id: approval,
            decision: ApprovalDecision::AcceptOnce,
        },
    );
    sim.run(10_000);
    let run = sim
        .store
        .runs
        .values()
        .find(|r| r.thread_id == waiting)
        .unwrap();
    assert_eq!(run.state, RunState::Completed);
    assert!(paths(&sim).iter().any(|p| p.iter().any(|n| matches!(
        &n.body,
        NodeBody::AssistantMessage { text, .. } if text.contains("clicked Subscribe")
    ))));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn receipt_replay_or_reject_when_commands_arrive_before_the_receipts_are_read() {
    // A start reads the receipts after its image (they are not needed to
    // answer `initialize`); commands that arrive first wait for them.
    let mut sim = answering();
    let conn = sim.connect();
    let t1 = turn(&mut sim, conn, "a1", None);
    let runs = sim.store.runs.len();
    sim.receipts_on_hold = true;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&t1)));
    sim.send(conn, submit("a1", None, "Hello"));
    sim.send(conn, submit("a1", None, "Something else"));
    sim.send(conn, submit("c1", Some(&t1), "A new turn"));
    sim.run(10_000);
    assert!(
        sim.events_for(conn)
            .iter()
            .any(|e| matches!(e, Event::Initialized { .. })),
        "initialize is answered without the receipts"
    );
    for id in ["a1", "c1"] {
        assert_eq!(answer(&sim, conn, id), None, "{id} waits for the receipts");
    }
    assert_eq!(sim.store.runs.len(), runs, "nothing ran yet");

    sim.receipts_on_hold = false;
    sim.run(10_000);
    let answered = answers(&sim, conn);
    let ids: Vec<&str> = answered.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["a1", "a1", "c1"], "answered in arrival order");
    let replay = answered[0].1.as_ref().expect("a1 replayed");
    assert_eq!(
        replay["threadId"].as_str(),
        Some(t1.as_str()),
        "a1 replayed"
    );
    assert!(
        answered[1].1.is_err(),
        "the same id with another payload is rejected"
    );
    assert!(matches!(answer(&sim, conn, "c1"), Some(Ok(_))));
    assert_eq!(sim.store.runs.len(), runs + 1, "only c1 started a run");
}

#[test]
fn commands_are_refused_while_the_receipts_cannot_be_read_and_the_next_one_reads_again() {
    let mut sim = answering();
    let conn = sim.connect();
    let t1 = turn(&mut sim, conn, "a1", None);
    let runs = sim.store.runs.len();

    // Two failed reads: the third succeeds and the command runs once.
    sim.fail_receipt_reads = 2;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("a1", None, "Hello"));
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "a1"), Some(Ok(_))));
    assert_eq!(sim.store.runs.len(), runs, "replayed, not run again");

    // Three failed reads: the commands that waited are refused (one sent
    // twice could otherwise run twice); reading a thread still works.
    sim.fail_receipt_reads = 3;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("a1", None, "Hello"));
    sim.send(conn, submit("c1", Some(&t1), "A new turn"));
    sim.send(conn, initialize("i1", Some(&t1)));
    sim.run(10_000);
    for id in ["a1", "c1"] {
        assert_eq!(
            answer(&sim, conn, id).and_then(Result::err).map(|e| e.kind),
            Some(ErrorKind::Storage),
            "{id}"
        );
    }
    assert!(sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::Initialized { .. })));
    assert_eq!(sim.store.runs.len(), runs, "nothing ran");

    // The next command reads them again: the same submission replays, a new one runs.
    let conn = sim.connect();
    sim.send(conn, submit("a1", None, "Hello"));
    sim.send(conn, submit("c1", Some(&t1), "A new turn"));
    sim.run(10_000);
    assert_eq!(
        answer(&sim, conn, "a1")
            .and_then(Result::ok)
            .map(|r| r["threadId"].clone()),
        Some(serde_json::json!(t1)),
        "a1 replayed"
    );
    assert!(matches!(answer(&sim, conn, "c1"), Some(Ok(_))));
    assert_eq!(sim.store.runs.len(), runs + 1, "only c1 ran");
}

#[test]
fn a_thread_deleted_after_its_old_runs_could_not_be_pruned_leaves_none_behind() {
    let mut sim = answering();
    let conn = sim.connect();
    let tid = turn(&mut sim, conn, "a1", None);
    turn(&mut sim, conn, "a2", Some(&tid));
    turn(&mut sim, conn, "a3", Some(&tid));
    assert_eq!(sim.store.runs.len(), 3);
    // Days later the thread loads: its superseded runs expired, and the
    // unit deleting them fails (the disk is full).
    sim.now += 10 * DAY;
    sim.crash();
    let conn = sim.connect();
    sim.hold_persists = true;
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(10_000);
    assert!(!sim.held.is_empty(), "the prune is in flight");
    sim.fail_held_persists(false);
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 3, "nothing was deleted");
    // Deleting the thread still deletes every run of it.
    sim.send(conn, delete("d1", &tid));
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert!(sim.store.runs.is_empty(), "{:?}", sim.store.runs.keys());
}

#[test]
fn a_thread_deleted_after_its_old_approvals_and_questions_could_not_be_pruned_leaves_none_behind() {
    use sw_agent::model::ApprovalStatus;
    let mut sim = clicking(9);
    let conn = sim.connect();
    let tid = turn(&mut sim, conn, "a1", None);
    let run_id = sim.store.runs.values().next().unwrap().id.clone();
    assert!(sim
        .store
        .approvals
        .values()
        .any(|a| a.thread_id == tid && a.status == ApprovalStatus::AcceptedOnce));
    answered_question(&mut sim, &tid, run_id);
    // Days later a start finds them expired, and the unit deleting them
    // fails (the disk is full).
    sim.now += 8 * DAY;
    sim.crash();
    sim.hold_persists = true;
    sim.run(10_000);
    assert!(!sim.held.is_empty(), "the prune is in flight");
    sim.fail_held_persists(false);
    sim.run(10_000);
    assert!(!sim.store.approvals.is_empty(), "nothing was deleted");
    assert!(!sim.store.interactions.is_empty(), "nothing was deleted");
    // Deleting the thread still deletes them.
    let conn = sim.connect();
    sim.send(conn, delete("d1", &tid));
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert!(sim.store.approvals.is_empty(), "{:?}", sim.store.approvals);
    assert!(
        sim.store.interactions.is_empty(),
        "{:?}",
        sim.store.interactions
    );
    check_store_belongs_to_threads(&sim).unwrap();
}
