//! What a starting engine reads stays bounded: command receipts and
//! superseded finished runs older than `EngineConfig::retention_ms` are
//! deleted at start (`PRUNE_PER_START` at a time); a thread's latest run,
//! unfinished runs and younger receipts are kept and keep working.

use sw_agent::engine::PRUNE_PER_START;
use sw_agent::model::Receipt;
use sw_agent::protocol::{Event, Op};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

const DAY: u64 = 24 * 60 * 60 * 1000;

fn answering() -> Sim {
    let mut sim = Sim::new(7, Box::new(|_: &_| Reply::text("Hi.")), page_tools());
    sim.now = 30 * DAY;
    sim
}

/// The thread a turn.submit created (from its ACK).
fn acked_thread(sim: &Sim, conn: u64, submission: &str) -> Option<String> {
    sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::CommandAck {
            submission_id,
            result,
            ..
        } if submission_id == submission => result["threadId"].as_str().map(str::to_string),
        _ => None,
    })
}

fn turn(sim: &mut Sim, conn: u64, id: &str, thread: Option<&str>) -> String {
    sim.send(conn, submit(id, thread, "Hello"));
    sim.run(10_000);
    acked_thread(sim, conn, id).expect("the turn was acknowledged")
}

#[test]
fn start_deletes_expired_receipts_and_superseded_finished_runs_only() {
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
    sim.send(
        conn,
        Op::ThreadDelete {
            submission: submission("d1"),
            thread_id: t1.clone(),
        },
    );
    sim.run(10_000);
    assert!(sim.store.runs.values().all(|r| r.thread_id != t1));
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
