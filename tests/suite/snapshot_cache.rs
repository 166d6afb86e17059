//! The snapshot cache (`src/engine/snapshot_cache.rs`): a subscribed
//! thread's snapshot is cached at rest, deleted by the next unit of work,
//! adopted by a restarted engine when still current, and replaced by the
//! current snapshot when not. The crash-anywhere simulation checks the same
//! rules over 10,000 schedules (`Sim::apply`, `Sim::initialize_from_cache`).

use super::support::*;
use sw_agent::protocol::{Event, Op};
use sw_agent::sim::Sim;
use sw_agent::store::CachedSnapshot;

const DAY: u64 = 24 * 60 * 60 * 1000;

/// A finished one-turn thread with a subscribed client, settled.
fn thread_at_rest(seed: u64) -> (Sim, u64, String) {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(2000);
    let tid = sim.store.threads.keys().next().cloned().expect("a thread");
    (sim, conn, tid)
}

/// Whether `conn` got the start and the end of a turn on `tid`: the port is
/// subscribed to the thread.
fn saw_a_turn(sim: &Sim, conn: u64, tid: &str) -> bool {
    let events = sim.events_for(conn);
    events
        .iter()
        .any(|e| matches!(e, Event::TurnStart { thread_id, .. } if thread_id == tid))
        && events
            .iter()
            .any(|e| matches!(e, Event::TurnComplete { thread_id, .. } if thread_id == tid))
}

/// The port adopted with `cached` got that snapshot and no other; the next
/// turn's events reach it.
fn adopted_with(sim: &mut Sim, conn: u64, tid: &str, cached: &CachedSnapshot) {
    assert_eq!(
        snapshots_sent(sim, conn),
        vec![serde_json::to_string(&cached.snapshot).unwrap()],
        "adopted: no second snapshot"
    );
    sim.send(conn, submit("s2", Some(tid), "Again"));
    sim.run(2000);
    assert!(saw_a_turn(sim, conn, tid));
}

fn snapshots_sent(sim: &Sim, conn: u64) -> Vec<String> {
    sim.events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::Initialized { snapshot } => Some(serde_json::to_string(snapshot).unwrap()),
            _ => None,
        })
        .collect()
}

#[test]
fn snapshot_cache_is_written_at_rest_and_deleted_by_the_next_unit() {
    let (mut sim, conn, tid) = thread_at_rest(1);
    let cached = sim
        .store
        .snapshots
        .get(&tid)
        .expect("cached at rest")
        .clone();
    assert_eq!(cached.build, sim.config.build);
    assert!(sim.engine.cached_snapshot_is_current(&tid));
    // It is what `initialize` sends for the thread now.
    let other = sim.connect();
    sim.send(other, initialize("i1", Some(&tid)));
    sim.run(100);
    assert_eq!(
        snapshots_sent(&sim, other),
        vec![serde_json::to_string(&cached.snapshot).unwrap()]
    );

    // The next turn's first checkpoint deletes it, in the same transaction.
    sim.hold_persists = true;
    sim.send(conn, submit("s2", Some(&tid), "Again"));
    for _ in 0..50 {
        if !sim.held.is_empty() {
            break;
        }
        sim.step();
    }
    assert!(!sim.engine.cached_snapshot_is_current(&tid));
    let (_, first) = &sim.held[0];
    assert!(
        first
            .deletes
            .iter()
            .any(|k| k.store == "snapshots" && k.key == tid),
        "the first unit after the rest deletes the cached snapshot: {:?}",
        first.deletes
    );
    assert!(sim.release_one());
    assert!(sim.store.snapshots.is_empty());
    // While the turn runs nothing is cached; at its end the new state is.
    sim.hold_persists = false;
    sim.release_persists();
    let mut cached_during_turn = false;
    for _ in 0..2000 {
        let running = sim.store.runs.values().any(|r| !r.state.is_terminal());
        cached_during_turn |= running && !sim.store.snapshots.is_empty();
        if !sim.step() {
            break;
        }
    }
    assert!(
        !cached_during_turn,
        "a snapshot was cached while a run was going"
    );
    let again = sim
        .store
        .snapshots
        .get(&tid)
        .expect("cached at the next rest");
    assert_ne!(again.snapshot, cached.snapshot);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_adopted_by_a_restarted_engine_sends_no_second_snapshot() {
    let (mut sim, _, tid) = thread_at_rest(2);
    let cached = sim.store.snapshots.get(&tid).unwrap().clone();
    sim.crash();
    assert!(sim.engine.cached_snapshot_is_current(&tid));
    let conn = sim.connect();
    assert!(sim.initialize_from_cache(conn, Some(&tid)));
    sim.run(200);
    // The client got the cached snapshot first (seq 0) and nothing more;
    // the port is subscribed: the next turn's events reach it.
    let first = sim.events.iter().find(|(c, _)| *c == conn).unwrap();
    assert_eq!(first.1.seq, 0);
    assert_eq!(first.1.epoch, sim.engine.epoch());
    adopted_with(&mut sim, conn, &tid, &cached);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_changed_at_start_is_replaced_by_the_current_snapshot() {
    let (mut sim, _, tid) = thread_at_rest(3);
    let cached = sim.store.snapshots.get(&tid).unwrap().clone();
    // A week later the start deletes expired receipts: a unit, so the
    // snapshot the worker script sent may no longer be what the engine has.
    sim.now += 8 * DAY;
    sim.crash();
    assert!(!sim.engine.cached_snapshot_is_current(&tid));
    let conn = sim.connect();
    assert!(sim.initialize_from_cache(conn, Some(&tid)));
    sim.run(200);
    let sent = snapshots_sent(&sim, conn);
    assert_eq!(sent.len(), 2, "the cached snapshot, then the current one");
    assert_eq!(sent[0], serde_json::to_string(&cached.snapshot).unwrap());
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_of_another_build_is_never_served_and_is_deleted() {
    let (mut sim, _, tid) = thread_at_rest(4);
    sim.config.build = "next-build".into();
    sim.crash();
    assert!(!sim.engine.cached_snapshot_is_current(&tid));
    let conn = sim.connect();
    assert!(
        !sim.initialize_from_cache(conn, Some(&tid)),
        "another build's snapshot was served"
    );
    // The first unit deletes it; the next rest caches this build's.
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.send(conn, submit("s2", Some(&tid), "Again"));
    sim.run(2000);
    let cached = sim.store.snapshots.get(&tid).expect("cached again");
    assert_eq!(cached.build, "next-build");
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_left_by_a_failed_unit_is_deleted_by_the_next_one() {
    let (mut sim, conn, tid) = thread_at_rest(5);
    assert!(sim.store.snapshots.contains_key(&tid));
    // A command whose unit fails: nothing of it is written, the cached
    // snapshot stays, and the engine must still delete it later.
    sim.fail_next_persists = 1;
    sim.send(conn, submit("s2", Some(&tid), "Again"));
    sim.run(100);
    assert!(sim.store.snapshots.contains_key(&tid));
    assert!(!sim.engine.cached_snapshot_is_current(&tid));
    sim.send(conn, submit("s3", Some(&tid), "Once more"));
    sim.run(2000);
    // `Sim::apply` records a unit that committed and left a cached snapshot.
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    assert!(
        sim.store.snapshots.contains_key(&tid),
        "cached again at rest"
    );
}

#[test]
fn snapshot_cache_of_a_thread_waiting_for_an_approval_is_adopted_and_answered() {
    let mut sim = Sim::new(6, agent_policy(), page_tools());
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(2000);
    let tid = sim.store.threads.keys().next().cloned().unwrap();
    let approval = sim
        .store
        .approvals
        .values()
        .find(|a| a.status == sw_agent::model::ApprovalStatus::Pending)
        .cloned()
        .expect("the demo task asks before clicking");
    // Waiting for the user is a rest: the snapshot shows the request.
    let cached = sim
        .store
        .snapshots
        .get(&tid)
        .expect("cached while waiting")
        .clone();
    let shown = cached.snapshot.thread.as_ref().unwrap();
    assert_eq!(
        shown.pending_approval.as_ref().map(|a| &a.id),
        Some(&approval.id)
    );
    // After a kill the panel gets it from the cache, and the engine, which
    // re-presented the request at start without a unit, adopts the port.
    sim.crash();
    assert!(sim.engine.cached_snapshot_is_current(&tid));
    let panel = sim.connect();
    assert!(sim.initialize_from_cache(panel, Some(&tid)));
    sim.run(100);
    assert_eq!(
        snapshots_sent(&sim, panel).len(),
        1,
        "adopted: no second snapshot"
    );
    // The user answers from the cached card; the run goes on and ends.
    sim.send(
        panel,
        Op::ApprovalResponse {
            submission: submission("a1"),
            thread_id: tid.clone(),
            approval_id: approval.id.clone(),
            decision: sw_agent::protocol::ApprovalDecision::AcceptOnce,
        },
    );
    sim.run(2000);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == sw_agent::model::RunState::Completed));
    // The adopted port gets the rest of the turn.
    assert!(sim
        .events_for(panel)
        .iter()
        .any(|e| matches!(e, Event::TurnComplete { thread_id, .. } if *thread_id == tid)));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn content_script_cannot_command_snapshot_cache_adoption_refused_to_an_untrusted_port() {
    let (mut sim, _, tid) = thread_at_rest(7);
    sim.crash();
    let conn = sim.connect_as(sw_agent::protocol::ClientKind::Untrusted);
    let message = serde_json::json!({
        "type": "initialize", "clientId": "x", "submissionId": "i1", "threadId": tid,
    });
    sim.engine
        .handle_cached_initialize(sim.now, conn, message, &tid);
    sim.run(100);
    // Handled as any op from it: refused, and no subscription.
    let events = sim.events_for(conn);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CommandReject { .. })),
        "{events:?}"
    );
    let panel = sim.connect();
    sim.send(
        panel,
        Op::TurnSubmit {
            submission: submission("s2"),
            thread_id: Some(tid.clone()),
            input: sw_agent::protocol::UserInput::text("Again"),
            replaces: None,
        },
    );
    sim.run(2000);
    assert!(!sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::TurnStart { .. })));
}

#[test]
fn snapshot_cache_write_overtaken_by_a_unit_is_written_again() {
    let (mut sim, conn, tid) = thread_at_rest(8);
    // A new thread (a unit) makes the engine cache again at the next rest;
    // hold that write and issue another unit before it commits.
    sim.hold_persists = true;
    let creator = sim.connect();
    sim.send(
        creator,
        Op::ThreadCreate {
            submission: submission("c1"),
        },
    );
    sim.drain_effects();
    assert!(sim.release_one(), "the thread.create unit");
    // At rest: the write is due a moment later.
    let due = sim.engine.poll_timeout().expect("the cache write is armed");
    assert_eq!(due, sim.now + sw_agent::engine::CACHE_WRITE_DELAY_MS);
    sim.now = due;
    sim.engine.handle_timeout(sim.now);
    sim.drain_effects();
    let cache_write = sim.held.iter().any(|(_, unit)| {
        !unit.puts.is_empty()
            && unit
                .puts
                .iter()
                .all(|r| matches!(r, sw_agent::store::Record::Snapshot(_)))
    });
    assert!(cache_write, "the cache write is held: {:?}", sim.held.len());
    sim.send(
        conn,
        Op::ThreadCreate {
            submission: submission("c2"),
        },
    );
    sim.drain_effects();
    sim.hold_persists = false;
    sim.release_persists();
    sim.run(200);
    // The overtaken write's snapshots were deleted by the later unit; the
    // rest after it cached both subscribed threads (the two new ones) again.
    let created: Vec<&String> = sim.store.threads.keys().filter(|t| **t != tid).collect();
    assert_eq!(created.len(), 2);
    for thread in created {
        let cached = sim
            .store
            .snapshots
            .get(thread)
            .expect("cached after the overtaking unit");
        assert!(sim.engine.cached_snapshot_is_current(thread));
        assert_eq!(cached.build, sim.config.build);
    }
    assert_eq!(sim.engine.units_in_flight(), 0);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_answers_a_fresh_panel_with_the_most_recent_thread() {
    let (mut sim, _, tid) = thread_at_rest(9);
    let cached = sim.store.snapshots.get(&tid).unwrap().clone();
    assert!(cached.is_recent(), "the only thread is the most recent one");
    // The key of the `recentOf` index the worker script reads it by.
    assert_eq!(cached.recent_of.as_deref(), Some(cached.build.as_str()));
    sim.crash();
    // A fresh panel knows no thread: `initialize` without an id.
    let conn = sim.connect();
    assert!(sim.initialize_from_cache(conn, None));
    sim.run(200);
    adopted_with(&mut sim, conn, &tid, &cached);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_recent_flag_follows_the_most_recent_thread() {
    let (mut sim, conn, first) = thread_at_rest(10);
    // A second thread, updated later: it is what a fresh panel opens now.
    sim.now += 1000;
    sim.send(conn, submit("s2", None, "Subscribe me too"));
    sim.run(2000);
    let second = sim
        .store
        .threads
        .keys()
        .find(|t| **t != first)
        .cloned()
        .unwrap();
    let recent: Vec<&String> = sim
        .store
        .snapshots
        .values()
        .filter(|c| c.is_recent())
        .map(|c| &c.thread_id)
        .collect();
    assert_eq!(recent, vec![&second]);
    // A port still on the first thread keeps it cached, not as the recent one.
    let other = sim.connect();
    sim.send(other, initialize("i1", Some(&first)));
    sim.run(200);
    let old = sim
        .store
        .snapshots
        .get(&first)
        .expect("the first thread cached");
    assert!(!old.is_recent());
    // No `recentOf` key: the worker script never reads it at start.
    let json = serde_json::to_value(old).unwrap();
    assert!(json.get("recentOf").is_none(), "{json}");
    sim.crash();
    let fresh = sim.connect();
    assert!(sim.initialize_from_cache(fresh, None));
    sim.run(200);
    let shown = snapshots_sent(&sim, fresh);
    assert_eq!(shown.len(), 1);
    assert!(shown[0].contains(&format!("\"thread\":{{\"id\":\"{second}\"")));
    // Told that a fresh panel was sent the first thread (not what it would
    // open), the engine sends the snapshot of the thread it opens.
    assert!(sim.engine.cached_snapshot_is_current(&first));
    let wrong = sim.connect();
    let message = serde_json::json!({ "type": "initialize", "clientId": "c", "submissionId": "w1", "threadId": null });
    sim.engine
        .handle_cached_initialize(sim.now, wrong, message, &first);
    sim.run(200);
    let sent = snapshots_sent(&sim, wrong);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains(&format!("\"thread\":{{\"id\":\"{second}\"")));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_skips_a_snapshot_larger_than_a_mebibyte() {
    let mut sim = Sim::new(11, read_then_answer("Read."), page_tools());
    let conn = sim.connect();
    // A 1.2 MB message: its snapshot is larger than the cache takes.
    sim.send(conn, submit("s1", None, &"x".repeat(1_200_000)));
    sim.run(2000);
    let tid = sim.store.threads.keys().next().cloned().unwrap();
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == sw_agent::model::RunState::Completed));
    assert!(
        sim.store.snapshots.is_empty(),
        "a 1.2 MB snapshot was cached"
    );
    assert!(!sim.engine.cached_snapshot_is_current(&tid));
    // Small again after a thread switch: the other thread is cached.
    sim.send(conn, submit("s2", None, "short"));
    sim.run(2000);
    assert_eq!(sim.store.snapshots.len(), 1);
}

#[test]
fn snapshot_cache_follows_a_model_title_written_after_the_turn() {
    let policy: sw_agent::sim::Policy = {
        let mut inner = agent_policy();
        Box::new(move |request: &sw_agent::provider::ProviderRequest| {
            if *request.system == *sw_agent::engine::TITLE_PROMPT {
                return sw_agent::sim::Reply::text("A model title");
            }
            inner(request)
        })
    };
    let mut sim = Sim::new(12, policy, page_tools());
    sim.config.model_titles = true;
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(2000);
    let cached = sim.store.snapshots.values().next().expect("cached at rest");
    assert_eq!(cached.snapshot.threads[0].title, "A model title");
    assert!(sim.engine.cached_snapshot_is_current(&cached.thread_id));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_copy_read_at_start_is_not_adopted_once_rewritten() {
    let (mut sim, _, tid) = thread_at_rest(13);
    sim.crash();
    let read_at_start = sim.start_snapshots[0].clone();
    // The restarted engine runs a turn on the thread: a unit deletes the
    // cached snapshot, and the rest after it writes a new one.
    let panel = sim.connect();
    sim.send(panel, initialize("i1", Some(&tid)));
    sim.send(panel, submit("s2", Some(&tid), "Again"));
    sim.run(2000);
    assert!(sim.engine.cached_snapshot_is_current(&tid));
    assert_ne!(sim.store.snapshots[&tid].snapshot, read_at_start.snapshot);
    // The worker script still holds the copy it read at start: it must not
    // be adopted now.
    assert_eq!(sim.engine.start_snapshot_for(Some(&tid)), None);
    let late = sim.connect();
    assert!(sim.initialize_from_cache(late, Some(&tid)));
    sim.run(200);
    let sent = snapshots_sent(&sim, late);
    assert_eq!(sent.len(), 2, "the start copy, then the current snapshot");
    assert_eq!(
        sent[1],
        serde_json::to_string(&sim.store.snapshots[&tid].snapshot).unwrap()
    );
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_write_waits_for_a_moment_of_rest_and_a_unit_cancels_it() {
    let mut sim = Sim::new(14, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    // Drive the turn to its end without letting time jump to the cache write.
    let settled = |sim: &Sim| {
        !sim.store.runs.is_empty() && sim.store.runs.values().all(|r| r.state.is_terminal())
    };
    while !settled(&sim) {
        assert!(sim.step(), "the turn settles");
    }
    sim.drain_effects();
    let tid = sim.store.threads.keys().next().cloned().unwrap();
    assert!(sim.store.runs.values().all(|r| r.state.is_terminal()));
    assert!(sim.store.snapshots.is_empty(), "not written at once");
    let due = sim.engine.poll_timeout().expect("armed at rest");
    assert_eq!(due, sim.now + sw_agent::engine::CACHE_WRITE_DELAY_MS);
    // A command before it is due: its unit cancels the write.
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.send(conn, enqueue("q1", &tid, "later"));
    sim.drain_effects();
    assert_ne!(sim.engine.poll_timeout(), Some(due));
    sim.run(5000);
    // The queued turn ran; the rest after it is cached.
    assert!(sim.store.snapshots.contains_key(&tid));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn snapshot_cache_keeps_a_thread_opened_by_a_client_that_left_within_the_rest() {
    let (mut sim, conn, tid) = thread_at_rest(15);
    sim.crash();
    // A client opens the thread, gets its snapshot and goes before the
    // engine has been at rest long enough to write the cache.
    let _ = conn;
    let brief = sim.connect();
    sim.send(brief, initialize("i1", Some(&tid)));
    // A unit (another client's new thread) makes every cached snapshot go.
    let other = sim.connect();
    sim.send(
        other,
        Op::ThreadCreate {
            submission: submission("c1"),
        },
    );
    sim.drain_effects();
    sim.engine.handle_disconnect(brief);
    sim.run(2000);
    assert!(
        sim.store.snapshots.contains_key(&tid),
        "the thread the departed client opened is cached again"
    );
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}
