//! Thread operations: fork at a message.

use sw_agent::model::{NodeBody, RunState};
use sw_agent::protocol::{ErrorKind, Event, Op};
use sw_agent::sim::Sim;

use super::support::*;

fn fork(id: &str, thread: &str, node: Option<&str>) -> Op {
    Op::ThreadFork {
        submission: submission(id),
        thread_id: thread.into(),
        node_id: node.map(str::to_string),
    }
}

#[test]
fn fork_at_a_message_copies_the_conversation_up_to_it() {
    let mut sim = Sim::new(120, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let source = sim.store.threads.values().next().unwrap().clone();
    let path = paths(&sim)[0].clone();
    let user = path
        .iter()
        .find(|n| matches!(n.body, NodeBody::UserMessage { .. }))
        .unwrap()
        .id
        .clone();
    sim.send(conn, fork("f1", &source.id, Some(&user)));
    sim.run(10_000);
    let fork_id = sim
        .events_for(conn)
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::CommandAck {
                op_type, result, ..
            } if op_type == "thread.fork" => result["threadId"].as_str().map(str::to_string),
            _ => None,
        });
    let fork_id = fork_id.expect("fork acked");
    let forked = &sim.store.threads[&fork_id];
    assert_eq!(forked.parent_thread_id.as_deref(), Some(source.id.as_str()));
    let fork_path: Vec<_> = sw_agent::model::path_to_leaf(
        &sim.store
            .nodes
            .values()
            .filter(|n| n.thread_id == fork_id)
            .cloned()
            .collect::<Vec<_>>(),
        forked.leaf_id.as_deref(),
    );
    assert_eq!(kinds(&fork_path), vec!["turn_context", "user_message"]);
    assert!(
        fork_path.iter().all(|n| !path.iter().any(|p| p.id == n.id)),
        "copies have their own ids"
    );
    // The client now looks at the fork; a turn there leaves the source alone.
    assert!(sim.events_for(conn).iter().any(|e| matches!(e,
        Event::Initialized { snapshot } if snapshot.thread.as_ref().is_some_and(|t| t.id == fork_id))));
    sim.send(conn, submit("s2", Some(&fork_id), "Now unsubscribe"));
    sim.run(10_000);
    assert_eq!(sim.store.threads[&source.id].leaf_id, source.leaf_id);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == RunState::Completed));
    // The same submission replays; nothing is copied twice.
    let before = sim.store.threads.len();
    sim.send(conn, fork("f1", &source.id, Some(&user)));
    sim.run(1000);
    assert_eq!(sim.store.threads.len(), before);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn fork_is_refused_at_an_open_tool_call_or_while_a_question_waits() {
    let mut sim = Sim::new(121, agent_policy(), page_tools());
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let thread = sim.store.threads.keys().next().unwrap().clone();
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::WaitingApproval
    );
    sim.send(conn, fork("f1", &thread, None));
    sim.run(1000);
    // Settle the question, then try to fork right after the click's call.
    let approval = sim.store.approvals.keys().next().unwrap().clone();
    sim.send(
        conn,
        Op::ApprovalResponse {
            submission: submission("a1"),
            thread_id: thread.clone(),
            approval_id: approval,
            decision: sw_agent::protocol::ApprovalDecision::Decline,
        },
    );
    sim.run(10_000);
    let call = paths(&sim)[0]
        .iter()
        .rev()
        .find(|n| matches!(n.body, NodeBody::ToolCall { .. }))
        .unwrap()
        .id
        .clone();
    sim.send(conn, fork("f2", &thread, Some(&call)));
    sim.send(conn, fork("f3", &thread, Some("no-such-node")));
    sim.run(1000);
    let rejects: Vec<(String, ErrorKind, String)> = sim
        .events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::CommandReject {
                submission_id,
                op_type,
                error,
            } if op_type == "thread.fork" => {
                Some((submission_id.clone(), error.kind, error.message.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(rejects.len(), 3, "{rejects:?}");
    assert!(rejects[0].2.contains("answer"), "{rejects:?}");
    assert!(rejects[1].2.contains("tool call"), "{rejects:?}");
    assert_eq!(rejects[2].1, ErrorKind::NotFound);
    assert_eq!(sim.store.threads.len(), 1);
}
