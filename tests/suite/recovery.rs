//! Crash and resume at specific points.

use sw_agent::engine::Heartbeat;
use sw_agent::model::{NodeBody, RunState, StopReason, ToolStatus};
use sw_agent::protocol::{Event, UncertainChoice};
use sw_agent::sim::{CrashPoint, Sim};

use super::support::*;

fn start(seed: u64) -> (Sim, u64) {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    (sim, conn)
}

fn thread_id(sim: &Sim) -> String {
    sim.store.threads.keys().next().unwrap().clone()
}

/// The (only) run in the store.
fn stored_run(sim: &Sim) -> sw_agent::model::Run {
    sim.store.runs.values().next().unwrap().clone()
}

#[test]
fn auto_resume_streaming_run_after_crash_mid_stream() {
    let (mut sim, _) = start(31);
    while sim.requests.is_empty() {
        sim.step();
    }
    sim.step(); // one delta delivered
    sim.crash();
    reconnect(&mut sim);
    assert_eq!(sim.requests.len(), 1);
    // No client op: the new engine rebuilds the request from the durable path.
    sim.run(10_000);
    assert!(sim.requests.len() >= 2);
    assert_eq!(sim.requests[1].messages, sim.requests[0].messages);
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::Completed);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn auto_resume_streaming_run_but_user_interrupt_stays_interrupted() {
    let (mut sim, conn) = start(32);
    while sim.requests.is_empty() {
        sim.step();
    }
    let thread = thread_id(&sim);
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    let requests = sim.requests.len();
    sim.crash();
    sim.run(10_000);
    assert_eq!(
        sim.requests.len(),
        requests,
        "an interrupted run is not resumed"
    );
    assert_eq!(stored_run(&sim).state, RunState::Interrupted);
    assert_eq!(sim.heartbeat, Heartbeat::Off);
    // The user continues it explicitly.
    let conn = reconnect(&mut sim);
    sim.send(conn, resume("r1", &thread));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

fn crash_while_click_in_flight(seed: u64) -> Sim {
    let (mut sim, _) = start(seed);
    while !sim.dispatches.iter().any(|d| d.name == "click") {
        assert!(sim.step());
    }
    // The click happened on the page; its result never reached the store.
    sim.crash();
    sim.run(10_000);
    sim
}

#[test]
fn never_retry_at_most_once_in_flight_write_becomes_paused_uncertain() {
    let sim = crash_while_click_in_flight(33);
    let clicks = sim.dispatches.iter().filter(|d| d.name == "click").count();
    assert_eq!(clicks, 1, "never re-dispatched by recovery");
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::PausedUncertain);
    assert!(run.in_flight_tool.is_some());
    // No panel is connected, and the run waits for the user's decision:
    // nothing needs the worker until a panel's Port wakes it.
    assert_eq!(
        sim.heartbeat,
        Heartbeat::Off,
        "a run waiting for the user lets the worker sleep"
    );
    // Another crash does not change that.
    let mut sim = sim;
    sim.crash();
    sim.run(10_000);
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
}

#[test]
fn never_retry_at_most_once_a_write_in_flight_when_the_run_cannot_resume_is_reported_as_maybe_done()
{
    let (mut sim, _) = start(37);
    while !sim.dispatches.iter().any(|d| d.name == "click") {
        assert!(sim.step());
    }
    // The click happened; then the worker died, and came back with another
    // tool catalog (an extension update): the run cannot resume.
    sim.config.registry = registry_with_changed_click();
    sim.crash();
    sim.run(10_000);
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::Failed);
    assert!(run.in_flight_tool.is_none());
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
    // The model (after Continue) must not read "not run" and click again.
    let (status, content) = paths(&sim)[0]
        .iter()
        .find_map(|n| match &n.body {
            NodeBody::ToolResult {
                name,
                status,
                content,
                ..
            } if name == "click" => Some((*status, content.clone())),
            _ => None,
        })
        .expect("the click has a result");
    assert_eq!(status, ToolStatus::Interrupted, "{content}");
    assert!(
        content.contains("may or may not have taken effect"),
        "{content}"
    );
    assert!(!content.contains("by the user"), "{content}");
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn never_retry_at_most_once_resolved_mark_done_continues() {
    let mut sim = crash_while_click_in_flight(34);
    let conn = reconnect(&mut sim);
    let thread = thread_id(&sim);
    sim.send(conn, resolve("u1", &thread, UncertainChoice::MarkDone));
    sim.run(10_000);
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    let status = paths(&sim)[0].iter().rev().find_map(|n| match &n.body {
        NodeBody::ToolResult { name, status, .. } if name == "click" => Some(*status),
        _ => None,
    });
    assert_eq!(status, Some(ToolStatus::Ok));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn never_retry_at_most_once_resolved_fail_tells_the_model() {
    let mut sim = crash_while_click_in_flight(35);
    let conn = reconnect(&mut sim);
    let thread = thread_id(&sim);
    sim.send(conn, resolve("u1", &thread, UncertainChoice::Fail));
    sim.run(10_000);
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
    let result = paths(&sim)[0].iter().rev().find_map(|n| match &n.body {
        NodeBody::ToolResult {
            name,
            status,
            content,
            ..
        } if name == "click" => Some((*status, content.clone())),
        _ => None,
    });
    let (status, content) = result.unwrap();
    assert_eq!(status, ToolStatus::Error);
    assert!(content.contains("outcome is unknown"));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn never_retry_at_most_once_resolved_retry_dispatches_once_more_by_user_choice() {
    let mut sim = crash_while_click_in_flight(36);
    let conn = reconnect(&mut sim);
    let thread = thread_id(&sim);
    sim.send(conn, resolve("u1", &thread, UncertainChoice::Retry));
    sim.run(10_000);
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        2
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert!(sim.events_for(conn).iter().any(
        |e| matches!(e, Event::CommandAck { op_type, .. } if op_type == "run.resolveUncertain")
    ));
}

#[test]
fn retry_safe_read_reruns_by_itself_after_crash_mid_tool() {
    let (mut sim, _) = start(37);
    while sim.dispatches.len() < 2 {
        assert!(sim.step());
    }
    assert_eq!(sim.dispatches[1].name, "read_page");
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(
        sim.dispatches
            .iter()
            .filter(|d| d.name == "read_page")
            .count(),
        2
    );
    assert_eq!(stored_run(&sim).state, RunState::Completed);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_pending_steer_survives_crash() {
    let (mut sim, conn) = start(38);
    while sim.requests.is_empty() {
        sim.step();
    }
    let (thread, turn) = current_ids(&sim);
    sim.send(
        conn,
        steer("steer-durable", &thread.unwrap(), &turn.unwrap(), "durable"),
    );
    sim.drain_effects(); // committed and ACKed
    assert_eq!(sim.store.steers.len(), 1);
    sim.crash();
    sim.run(10_000);
    assert!(sim.store.steers.is_empty());
    check_invariants(&sim, &["durable".into()]).unwrap();
    let n = paths(&sim)[0]
        .iter()
        .filter(|n| matches!(&n.body, NodeBody::UserMessage { text, steered: true, .. } if text == "durable"))
        .count();
    assert_eq!(n, 1);
}

#[test]
fn ack_after_commit_crash_between_commit_and_ack_replays_on_retry() {
    let mut sim = Sim::new(39, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.step_with(Some(CrashPoint::AfterCommit));
    // Committed, never ACKed (the client saw nothing). The panel re-sends it.
    assert!(sim.events_for(conn).is_empty());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(matches!(sim.events_for(conn)[0], Event::CommandAck { .. }));
    assert_eq!(sim.store.runs.len(), 1);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn crash_before_commit_loses_only_the_unacknowledged_write() {
    let mut sim = Sim::new(40, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.step_with(Some(CrashPoint::BeforeCommit));
    assert!(sim.store.threads.is_empty());
    assert!(sim.events_for(conn).is_empty(), "nothing was acknowledged");
}

#[test]
fn snapshot_after_restart_loads_the_thread_lazily() {
    let (mut sim, _) = start(41);
    sim.run(10_000);
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", None));
    sim.run(100);
    let snapshot = sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::Initialized { snapshot } => Some(snapshot.clone()),
        _ => None,
    });
    let thread = snapshot.unwrap().thread.unwrap();
    assert_eq!(thread.nodes.len(), paths(&sim)[0].len());
    assert_eq!(thread.run.unwrap().state, RunState::Completed);
}

#[test]
fn queued_turn_survives_crash_and_runs() {
    let (mut sim, conn) = start(42);
    let thread = loop {
        sim.step();
        if let (Some(t), Some(_)) = current_ids(&sim) {
            break t;
        }
    };
    sim.send(conn, enqueue("q1", &thread, "second task"));
    sim.drain_effects();
    assert_eq!(sim.store.queue.len(), 1);
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(sim.store.runs.len(), 2);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == RunState::Completed));
    assert!(sim.store.queue.is_empty());
}

#[test]
fn auto_resume_streaming_run_crash_after_final_answer_commit_does_not_rerun_the_turn() {
    let (mut sim, _) = start(43);
    while sim.requests.len() < 3 {
        assert!(sim.step());
    }
    // The final answer streams in and its checkpoint commits; the worker dies
    // before the run's terminal checkpoint.
    sim.hold_persists = true;
    sim.run(10_000);
    let (_, final_answer) = sim.held.remove(0);
    sim.store.apply(&final_answer);
    sim.held.clear();
    sim.hold_persists = false;
    assert_eq!(stored_run(&sim).state, RunState::StreamingModel);
    sim.crash();
    sim.run(10_000);
    assert_eq!(
        sim.requests.len(),
        3,
        "the finished turn is closed, not asked again"
    );
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(run.stop_reason, Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn never_retry_at_most_once_inspect_first_call_in_flight_at_crash_tells_the_model_to_look() {
    let mut once = false;
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        if !once {
            once = true;
            return sw_agent::sim::Reply::call("back", "go_back", "{}");
        }
        match request.messages.last() {
            Some(sw_agent::provider::ChatMessage::ToolResult {
                content, is_error, ..
            }) => {
                assert!(
                    *is_error && content.contains("Look at the page"),
                    "{content}"
                );
                sw_agent::sim::Reply::text("I will look first.")
            }
            other => panic!("unexpected {other:?}"),
        }
    });
    let mut sim = Sim::new(44, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Go back"));
    while !sim.dispatches.iter().any(|d| d.name == "go_back") {
        assert!(sim.step());
    }
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(
        sim.dispatches
            .iter()
            .filter(|d| d.name == "go_back")
            .count(),
        1,
        "not repeated by recovery"
    );
    assert_eq!(stored_run(&sim).state, RunState::Completed);
    check_invariants(&sim, &[]).unwrap();
}

/// The run of `conn`'s panel's thread as a fresh `initialize` shows it.
fn shown_run(sim: &mut Sim, id: &str) -> sw_agent::model::Run {
    let conn = sim.connect();
    sim.send(conn, initialize(id, None));
    sim.run(10_000);
    sim.events_for(conn)
        .iter()
        .find_map(|e| match e {
            Event::Initialized { snapshot } => snapshot.thread.as_ref()?.run.clone(),
            _ => None,
        })
        .expect("a snapshot with a run")
}

/// Run the simulation until the submission `s1` on `conn` is acknowledged.
fn until_acked(sim: &mut Sim, conn: u64) {
    while !sim
        .events_for(conn)
        .iter()
        .any(|e| matches!(e, Event::CommandAck { .. }))
    {
        assert!(sim.step(), "the submission was never acknowledged");
    }
}

/// The storage error the panel was told when its run stopped, if any.
fn told_storage_error(sim: &Sim, conn: u64) -> Option<sw_agent::protocol::ErrorInfo> {
    sim.events_for(conn).into_iter().find_map(|e| match e {
        Event::TurnComplete {
            stop_reason: StopReason::Error,
            error: Some(error),
            ..
        } if error.kind == sw_agent::protocol::ErrorKind::Storage => Some(error.clone()),
        _ => None,
    })
}

/// Step until the panel is told the run stopped on a storage error.
fn until_paused(sim: &mut Sim, conn: u64) -> sw_agent::protocol::ErrorInfo {
    loop {
        if let Some(error) = told_storage_error(sim, conn) {
            return error;
        }
        assert!(sim.step(), "the run never paused");
    }
}

#[test]
fn a_run_whose_checkpoint_cannot_be_saved_shows_ended_with_the_error_until_a_new_worker_resumes_it()
{
    let (mut sim, conn) = start(41);
    // The submission is saved and acknowledged; then the disk is full for
    // longer than this worker probes it.
    until_acked(&mut sim, conn);
    sim.refuse_writes = true;
    let told = until_paused(&mut sim, conn);
    // The user closes the panel. The worker keeps its wake-up alarm while
    // it probes the store.
    sim.disconnect(conn);
    assert_eq!(sim.heartbeat, Heartbeat::Working);
    let requests = sim.requests.len();
    sim.run(10_000);
    // Every probe failed, and none of them cost a provider request.
    assert_eq!(sim.requests.len(), requests);
    assert!(sim.engine.poll_timeout().is_none(), "the probes stop");
    // Then the alarm goes: Chrome may stop the worker, and the next one
    // resumes the run.
    assert_eq!(sim.heartbeat, Heartbeat::Off);
    // A panel opened now is shown what the first one was told, not a run
    // that looks busy forever; the store still holds the saved run.
    let shown = shown_run(&mut sim, "i1");
    assert_eq!(shown.state, RunState::Failed);
    assert_eq!(shown.error.as_ref(), Some(&told));
    let stored = stored_run(&sim);
    assert!(!stored.state.is_terminal(), "{:?}", stored.state);
    assert_eq!(shown.id, stored.id);
    // Space is freed; a new worker resumes the saved run to its end.
    sim.refuse_writes = false;
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    let resumed = shown_run(&mut sim, "i2");
    assert_eq!(resumed.state, RunState::Completed);
    assert_eq!(resumed.error, None);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_paused_run_resumes_in_the_same_worker_once_the_store_takes_writes_again() {
    let (mut sim, conn) = start(42);
    until_acked(&mut sim, conn);
    sim.refuse_writes = true;
    until_paused(&mut sim, conn);
    let requests = sim.requests.len();
    // The disk stays full for a while: the probes fail, nothing is asked
    // of the provider, and the thread stays paused.
    let paused_until = sim.now + 30_000;
    while sim.now < paused_until {
        assert!(sim.step(), "the probes stopped before the disk was freed");
    }
    assert_eq!(sim.requests.len(), requests);
    let tid = thread_id(&sim);
    let refused = sim.connect();
    let sent_at = sim.now;
    sim.send(refused, steer("st1", &tid, "", "Also check the footer."));
    while answer(&sim, refused, "st1").is_none() {
        assert!(sim.step());
    }
    // It waited for a probe run at once (not the next scheduled one), which
    // failed.
    assert!(sim.now - sent_at < sim.config.stall_probe.base_delay_ms);
    let refusal = answer(&sim, refused, "st1").unwrap().unwrap_err();
    assert_eq!(refusal.kind, sw_agent::protocol::ErrorKind::Storage);
    assert!(refusal.message.contains("paused"), "{}", refusal.message);
    // Space is freed: the next probe commits, the thread is read back, and
    // the run goes on in this same worker to its end.
    sim.refuse_writes = false;
    let loads = sim.loads.len();
    sim.run(10_000);
    assert_eq!(sim.crashes, 0);
    assert_eq!(
        sim.heartbeat,
        Heartbeat::Awake,
        "the run is over, the panels are open"
    );
    sim.disconnect(refused);
    sim.disconnect(conn);
    assert_eq!(sim.heartbeat, Heartbeat::Off, "the run is over, no panel");
    assert_eq!(&sim.loads[loads..], std::slice::from_ref(&tid));
    assert!(sim.requests.len() > requests);
    let events = sim.events_for(conn);
    let paused_at = events
        .iter()
        .position(|e| {
            matches!(
                e,
                Event::TurnComplete {
                    stop_reason: StopReason::Error,
                    ..
                }
            )
        })
        .unwrap();
    // The panel that was told of the pause redraws from the store, then
    // sees the run end.
    let redraw = events[paused_at..]
        .iter()
        .position(|e| matches!(e, Event::Initialized { .. }))
        .expect("a snapshot after the pause");
    assert!(matches!(
        events[paused_at + redraw..].last(),
        Some(Event::TurnComplete {
            stop_reason: StopReason::End,
            ..
        })
    ));
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(shown_run(&mut sim, "i1").state, RunState::Completed);
    // Nothing of the probes stays in the store.
    assert!(sim.store.snapshots.keys().all(|k| !k.starts_with("probe:")));
    check_invariants(&sim, &[]).unwrap();
    check_store_belongs_to_threads(&sim).unwrap();
}

#[test]
fn never_retry_at_most_once_a_click_whose_result_could_not_be_saved_is_not_repeated_when_the_paused_run_resumes_in_place(
) {
    let (mut sim, conn) = start(43);
    // The disk fills up right after the click was dispatched: its result
    // cannot be saved.
    while !sim.dispatches.iter().any(|d| d.name == "click") {
        assert!(sim.step(), "the click was never dispatched");
    }
    sim.refuse_writes = true;
    until_paused(&mut sim, conn);
    sim.refuse_writes = false;
    sim.run(10_000);
    assert_eq!(sim.crashes, 0);
    // Read back, the run knows only that the click was sent: the user is
    // asked, as after a crash, and the click is not sent again.
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::PausedUncertain);
    let tid = thread_id(&sim);
    sim.send(conn, resolve("r1", &tid, UncertainChoice::MarkDone));
    sim.run(10_000);
    assert_eq!(
        sim.dispatches.iter().filter(|d| d.name == "click").count(),
        1
    );
    assert_eq!(stored_run(&sim).state, RunState::Completed);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn resume_refuses_drift_when_a_paused_run_is_read_back_in_the_same_worker() {
    let (mut sim, conn) = start(44);
    until_acked(&mut sim, conn);
    sim.refuse_writes = true;
    until_paused(&mut sim, conn);
    // The user points the extension at another provider while the thread
    // is paused.
    let mut profile = sim.profile.clone();
    profile.kind = "anthropic".into();
    profile.base_url = "http://127.0.0.1:2".into();
    sim.engine.handle_settings(profile);
    let requests = sim.requests.len();
    sim.refuse_writes = false;
    sim.run(10_000);
    assert_eq!(sim.crashes, 0);
    // The run started under the old model does not go on under the new one.
    assert_eq!(sim.requests.len(), requests);
    let run = stored_run(&sim);
    assert_eq!(run.state, RunState::Failed);
    let error = run.error.expect("the run says why it stopped");
    assert_eq!(error.kind, sw_agent::protocol::ErrorKind::EnvironmentDrift);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_paused_thread_is_never_cached_as_ended_so_a_restart_shows_its_saved_run() {
    let mut sim = Sim::new(45, agent_policy(), page_tools());
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let approval = sim.store.approvals.values().next().expect("asked").clone();
    // While the click waits for approval, the user stops the run; its
    // terminal checkpoint and both retries fail, then the disk takes writes
    // again, long before the worker's first probe.
    sim.send(conn, interrupt("x1", &approval.thread_id));
    sim.fail_next_persists = 3;
    until_paused(&mut sim, conn);
    let stored = stored_run(&sim);
    assert_eq!(stored.state, RunState::WaitingApproval);
    // Another panel creates a thread: its unit commits, and at the next
    // rest the cache is written, but not with the pause, which only this
    // worker knows of (a new worker shows the saved run waiting).
    let creator = sim.connect();
    sim.send(
        creator,
        sw_agent::protocol::Op::ThreadCreate {
            submission: submission("c1"),
        },
    );
    let probe_at = sim.engine.poll_timeout().expect("a probe is scheduled");
    while sim.now + 1 < probe_at && sim.step() {}
    assert!(answer(&sim, creator, "c1").is_some());
    assert!(!sim.store.snapshots.is_empty(), "the cache was written");
    for cached in sim.store.snapshots.values() {
        if let Some(run) = cached.snapshot.thread.as_ref().and_then(|t| t.run.as_ref()) {
            assert_eq!(run.state, RunState::WaitingApproval, "{run:?}");
        }
    }
    sim.crash();
    let panel = sim.connect();
    sim.initialize_from_cache(panel, Some(&approval.thread_id));
    sim.run(10_000);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn steer_exactly_once_in_order_a_steer_sent_to_a_paused_thread_probes_at_once_and_joins_the_resumed_run(
) {
    let (mut sim, conn) = start(46);
    until_acked(&mut sim, conn);
    // A passing storage failure: the checkpoint and both retries fail, then
    // the disk takes writes again, seconds before the first probe is due.
    sim.fail_next_persists = 3;
    until_paused(&mut sim, conn);
    let paused_at = sim.now;
    let tid = thread_id(&sim);
    let turn = stored_run(&sim).id;
    let requests = sim.requests.len();
    // The user steers: the store is probed now, the thread read back and
    // its run resumed, and the steer is taken by the resumed run.
    sim.send(conn, steer("st1", &tid, &turn, "Also check the footer."));
    while answer(&sim, conn, "st1").is_none() {
        assert!(sim.step());
    }
    assert!(
        sim.now - paused_at < sim.config.stall_probe.base_delay_ms,
        "answered {} ms after the pause",
        sim.now - paused_at
    );
    assert!(answer(&sim, conn, "st1").unwrap().is_ok());
    sim.run(10_000);
    assert_eq!(sim.crashes, 0);
    assert!(sim.requests.len() > requests);
    assert_eq!(stored_run(&sim).state, RunState::Completed);
    check_invariants(&sim, &["Also check the footer.".to_string()]).unwrap();
}
