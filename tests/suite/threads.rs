//! Thread operations: fork at a message.

use sw_agent::model::{Node, NodeBody, RunState, StopReason};
use sw_agent::protocol::{ErrorKind, Event, Op};
use sw_agent::sim::Sim;

use super::support::*;

/// A thread whose first turn ("Subscribe me") waits for the click's approval.
fn waiting_for_approval(seed: u64) -> (Sim, u64, String) {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::WaitingApproval
    );
    (sim, conn, tid)
}

/// "Allow once" for the thread's approval (submission "a1").
fn allow_the_waiting_call_once(sim: &mut Sim, conn: u64, tid: &str) {
    let approval = sim.store.approvals.values().next().unwrap().id.clone();
    sim.send(
        conn,
        approval_response(
            "a1",
            tid,
            &approval,
            sw_agent::protocol::ApprovalDecision::AcceptOnce,
        ),
    );
}

#[test]
fn fork_at_a_message_copies_the_conversation_up_to_it() {
    let (mut sim, conn) = one_turn(120, "Subscribe me");
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
    let fork_id = acked_thread(&sim, conn, "f1").expect("fork acked");
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
    let (mut sim, conn, thread) = waiting_for_approval(121);
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
    let rejects = rejects(&sim, conn, "thread.fork");
    assert_eq!(rejects.len(), 3, "{rejects:?}");
    assert!(rejects[0].2.contains("answer"), "{rejects:?}");
    assert!(rejects[1].2.contains("tool call"), "{rejects:?}");
    assert_eq!(rejects[2].1, ErrorKind::NotFound);
    assert_eq!(sim.store.threads.len(), 1);
}

/// A model that answers every turn with an echo of the last user message.
fn echo_policy() -> sw_agent::sim::Policy {
    Box::new(|request: &sw_agent::provider::ProviderRequest| {
        let last = request
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                sw_agent::provider::ChatMessage::User { text, .. } => Some(text.clone()),
                _ => None,
            })
            .unwrap_or_default();
        sw_agent::sim::Reply::text(&format!("echo: {last}"))
    })
}

fn select(id: &str, thread: &str, node: &str) -> Op {
    Op::ThreadSelectBranch {
        submission: submission(id),
        thread_id: thread.into(),
        node_id: node.into(),
    }
}

fn edit(id: &str, thread: &str, replaces: &str, text: &str) -> Op {
    Op::TurnSubmit {
        submission: submission(id),
        thread_id: Some(thread.into()),
        input: sw_agent::protocol::UserInput::text(text),
        replaces: Some(replaces.into()),
    }
}

fn user_texts(path: &[sw_agent::model::Node]) -> Vec<String> {
    path.iter()
        .filter_map(|n| match &n.body {
            NodeBody::UserMessage { text, .. } => Some(text.clone()),
            NodeBody::AssistantMessage { text, .. } => Some(format!("A:{text}")),
            _ => None,
        })
        .collect()
}

fn user_node(sim: &Sim, text: &str) -> String {
    paths(sim)[0]
        .iter()
        .find(|n| matches!(&n.body, NodeBody::UserMessage { text: t, .. } if t == text))
        .expect("message on the active path")
        .id
        .clone()
}

fn rejects(sim: &Sim, conn: u64, op: &str) -> Vec<(String, ErrorKind, String)> {
    sim.events_for(conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::CommandReject {
                submission_id,
                op_type,
                error,
            } if op_type == op => Some((submission_id.clone(), error.kind, error.message.clone())),
            _ => None,
        })
        .collect()
}

fn last_branches(sim: &Sim, conn: u64) -> Vec<sw_agent::protocol::BranchPoint> {
    sim.events_for(conn)
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::Initialized { snapshot } => snapshot.thread.as_ref().map(|t| t.branches.clone()),
            _ => None,
        })
        .expect("a snapshot")
}

#[test]
fn edit_starts_a_sibling_branch_and_select_branch_switches_between_them() {
    let mut sim = Sim::new(130, echo_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "first"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, submit("s2", Some(&tid), "second"));
    sim.run(10_000);
    let second = user_node(&sim, "second");
    let before_nodes = sim.store.nodes.len();

    sim.send(conn, edit("e1", &tid, &second, "second, edited"));
    sim.run(10_000);
    assert_eq!(
        user_texts(&paths(&sim)[0]),
        [
            "first",
            "A:echo: first",
            "second, edited",
            "A:echo: second, edited"
        ]
    );
    // The old branch is still stored; the request of the new one never saw it.
    assert_eq!(sim.store.nodes.len(), before_nodes + 3);
    assert!(sim.store.nodes.contains_key(&second));
    let points = last_branches(&sim, conn);
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].node_ids.len(), 2);
    assert_eq!(points[0].active, 1);
    let old_start = points[0].node_ids[0].clone();

    // Switch back: the leaf becomes the old branch's tip, clients get a snapshot.
    sim.send(conn, select("b1", &tid, &old_start));
    sim.run(10_000);
    assert_eq!(
        user_texts(&paths(&sim)[0]),
        ["first", "A:echo: first", "second", "A:echo: second"]
    );
    assert_eq!(last_branches(&sim, conn)[0].active, 0);
    let revision = sim.store.threads[&tid].revision;

    // receipt_replay_or_reject: the same submission replays, another payload under its id is refused.
    sim.send(conn, select("b1", &tid, &old_start));
    sim.send(conn, select("b1", &tid, &points[0].node_ids[1]));
    sim.run(1000);
    assert_eq!(sim.store.threads[&tid].revision, revision);
    let refused = rejects(&sim, conn, "thread.selectBranch");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].1, ErrorKind::InvalidCommand);
    let acks = sim
        .events_for(conn)
        .into_iter()
        .filter(
            |e| matches!(e, Event::CommandAck { op_type, .. } if op_type == "thread.selectBranch"),
        )
        .count();
    assert_eq!(acks, 2, "original ACK and its replay");

    // A turn on the selected branch extends it, not the other one.
    sim.send(conn, submit("s3", Some(&tid), "third"));
    sim.run(10_000);
    assert_eq!(
        user_texts(&paths(&sim)[0]),
        [
            "first",
            "A:echo: first",
            "second",
            "A:echo: second",
            "third",
            "A:echo: third"
        ]
    );

    // After a restart the branches are rebuilt from the store.
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(1000);
    let points = last_branches(&sim, conn);
    assert_eq!(points.len(), 1);
    assert_eq!(points[0].active, 0);
    sim.send(conn, select("b2", &tid, &points[0].node_ids[1]));
    sim.run(1000);
    assert_eq!(
        user_texts(&paths(&sim)[0]),
        [
            "first",
            "A:echo: first",
            "second, edited",
            "A:echo: second, edited"
        ]
    );

    // Deleting the thread removes every branch.
    sim.send(
        conn,
        Op::ThreadDelete {
            submission: submission("d1"),
            thread_id: tid.clone(),
            stop_turn: false,
        },
    );
    sim.run(1000);
    assert!(sim.store.nodes.is_empty(), "{:?}", sim.store.nodes.keys());
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn edit_and_branch_switch_are_refused_while_a_turn_holds_the_thread() {
    let (mut sim, conn, tid) = waiting_for_approval(131);
    let first = user_node(&sim, "Subscribe me");
    let leaf = sim.store.threads[&tid].leaf_id.clone();
    sim.send(conn, edit("e1", &tid, &first, "Do not subscribe"));
    sim.send(conn, select("b1", &tid, &first));
    sim.run(1000);
    let edits = rejects(&sim, conn, "turn.submit");
    let selects = rejects(&sim, conn, "thread.selectBranch");
    assert!(edits[0].2.contains("answer"), "{edits:?}");
    assert!(selects[0].2.contains("answer"), "{selects:?}");
    assert_eq!(sim.store.threads[&tid].leaf_id, leaf);
    assert_eq!(sim.store.runs.len(), 1);

    // Once the turn ended: only a turn's opening message can be replaced,
    // and unknown messages are not found.
    sim.send(conn, interrupt("x1", &tid));
    sim.run(10_000);
    let call = paths(&sim)[0]
        .iter()
        .find(|n| matches!(n.body, NodeBody::ToolCall { .. }))
        .unwrap()
        .id
        .clone();
    sim.send(conn, edit("e2", &tid, &call, "nope"));
    sim.send(conn, edit("e3", &tid, "no-such-node", "nope"));
    sim.send(conn, select("b2", &tid, "no-such-node"));
    sim.run(1000);
    let edits = rejects(&sim, conn, "turn.submit");
    assert!(edits[1].2.contains("started a turn"), "{edits:?}");
    assert_eq!(edits[2].1, ErrorKind::NotFound);
    assert_eq!(
        rejects(&sim, conn, "thread.selectBranch")[1].1,
        ErrorKind::NotFound
    );
}

#[test]
fn queued_turn_can_be_edited_until_it_starts() {
    let (mut sim, conn, tid) = waiting_for_approval(132);
    // The turn waits for an approval, so a new message is queued.
    sim.send(conn, submit("s2", Some(&tid), "then read, draft"));
    sim.run(1000);
    let item = sim.store.queue.keys().next().cloned().expect("queued");
    let edit_op = |id: &str, text: &str| Op::QueueUpdate {
        submission: submission(id),
        thread_id: tid.clone(),
        item_id: item.clone(),
        input: sw_agent::protocol::UserInput::text(text),
    };
    sim.send(conn, edit_op("qe1", "then read"));
    sim.send(conn, edit_op("qe2", "   "));
    sim.run(1000);
    assert_eq!(sim.store.queue[&item].text, "then read");
    assert_eq!(rejects(&sim, conn, "queue.update")[0].0, "qe2");

    // Answer the approval with commits parked: once the queued turn's start
    // is in flight, editing or removing it is refused.
    sim.hold_persists = true;
    let approval = sim.store.approvals.keys().next().unwrap().clone();
    sim.send(
        conn,
        Op::ApprovalResponse {
            submission: submission("a1"),
            thread_id: tid.clone(),
            approval_id: approval,
            decision: sw_agent::protocol::ApprovalDecision::AcceptOnce,
        },
    );
    let mut starting = false;
    for _ in 0..200 {
        sim.run(1000);
        starting = sim.held.iter().any(|(_, unit)| {
            unit.deletes
                .iter()
                .any(|d| d.store == "queue" && d.key == item)
        });
        if starting || !sim.release_one() {
            break;
        }
    }
    assert!(starting, "the queued turn started");
    sim.send(conn, edit_op("qe3", "too late"));
    sim.send(
        conn,
        Op::QueueRemove {
            submission: submission("qr1"),
            thread_id: tid.clone(),
            item_id: item.clone(),
        },
    );
    sim.run(1000);
    sim.release_persists();
    sim.auto_approve = Some(sw_agent::protocol::ApprovalDecision::AcceptOnce);
    sim.run(20_000);
    let late = rejects(&sim, conn, "queue.update");
    assert!(late[1].2.contains("starting"), "{late:?}");
    assert!(rejects(&sim, conn, "queue.remove")[0]
        .2
        .contains("starting"));
    let texts = user_texts(&paths(&sim)[0]);
    assert!(texts.contains(&"then read".to_string()), "{texts:?}");
    assert!(!texts
        .iter()
        .any(|t| t.contains("draft") || t.contains("late")));
    // receipt_replay_or_reject: the first edit replays after the item is gone.
    sim.send(conn, edit_op("qe1", "then read"));
    sim.send(conn, edit_op("qe4", "again"));
    sim.run(1000);
    let acks = sim
        .events_for(conn)
        .into_iter()
        .filter(|e| matches!(e, Event::CommandAck { submission_id, .. } if submission_id == "qe1"))
        .count();
    assert_eq!(acks, 2);
    assert_eq!(
        rejects(&sim, conn, "queue.update")[2].1,
        ErrorKind::NotFound
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn snapshot_carries_the_tail_and_history_pages_in_the_rest() {
    let mut sim = Sim::new(133, agent_policy(), page_tools());
    sim.config.snapshot_nodes = 5;
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, submit("s2", Some(&tid), "Subscribe me again"));
    sim.run(10_000);
    let path = paths(&sim)[0].clone();
    assert!(path.len() > 12, "{}", path.len());

    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(1000);
    let view = last_view(&sim, conn);
    assert!(view.nodes.len() <= 5 && !view.nodes.is_empty());
    assert_eq!(view.older_nodes as usize + view.nodes.len(), path.len());
    assert_eq!(view.nodes, path[view.older_nodes as usize..]);

    // Page backwards until the start; no page splits a call from its result.
    let mut pages: Vec<Vec<sw_agent::model::Node>> = vec![view.nodes.clone()];
    let mut older = view.older_nodes;
    let mut n = 0;
    while older > 0 {
        n += 1;
        assert!(n < 50);
        let before = pages.last().unwrap()[0].id.clone();
        let result = history_page(&mut sim, conn, &tid, &before, 4, &format!("h{n}"));
        let page: Vec<sw_agent::model::Node> =
            serde_json::from_value(result["nodes"].clone()).unwrap();
        assert!(!page.is_empty(), "an empty page");
        older = result["olderNodes"].as_u64().unwrap();
        pages.push(page);
    }
    let mut rebuilt = Vec::new();
    for page in pages.iter().rev() {
        assert!(
            !matches!(
                page[0].body,
                NodeBody::ToolCall { .. } | NodeBody::ToolResult { .. }
            ),
            "a page starts between a call and its result"
        );
        rebuilt.extend(page.iter().cloned());
    }
    assert_eq!(rebuilt, path);
    // Reads leave no receipt; a node not on the path is not found.
    assert!(!sim.store.receipts.keys().any(|k| k.contains("h1")));
    sim.send(
        conn,
        Op::ThreadHistory {
            submission: submission("h-bad"),
            thread_id: tid.clone(),
            before_node_id: "no-such-node".into(),
            limit: None,
        },
    );
    sim.run(100);
    assert_eq!(
        rejects(&sim, conn, "thread.history")[0].1,
        ErrorKind::NotFound
    );
}

/// One `thread.history` page before `before`: the ACK's result.
fn history_page(
    sim: &mut Sim,
    conn: u64,
    tid: &str,
    before: &str,
    limit: u32,
    id: &str,
) -> serde_json::Value {
    sim.send(conn, history(id, tid, before, Some(limit)));
    sim.run(1000);
    answer(sim, conn, id)
        .and_then(Result::ok)
        .expect("history acked")
}

/// A long thread (~200 nodes, tool calls included) whose last message was
/// edited, so the tail has a version switcher; `snapshot_nodes` is 12.
fn long_branched_thread(seed: u64) -> (Sim, String, Vec<sw_agent::model::Node>) {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    sim.config.snapshot_nodes = 12;
    sim.crash(); // the engine takes the config
    let conn = sim.connect();
    sim.send(conn, submit("s0", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    for i in 1..30 {
        sim.send(
            conn,
            submit(&format!("s{i}"), Some(&tid), "Subscribe me again"),
        );
        sim.run(10_000);
    }
    sim.send(conn, submit("last", Some(&tid), "One more thing"));
    sim.run(10_000);
    let last = user_node(&sim, "One more thing");
    sim.send(conn, edit("e1", &tid, &last, "One more thing, edited"));
    sim.run(10_000);
    let path = paths(&sim)[0].clone();
    assert!(path.len() > 150, "{}", path.len());
    check_invariants(&sim, &[]).unwrap();
    (sim, tid, path)
}

#[test]
fn cold_initialize_of_a_long_thread_reads_only_its_tail() {
    let (mut sim, tid, path) = long_branched_thread(177);
    sim.crash();
    sim.loads.clear();
    sim.tail_loads.clear();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(1000);
    let from_tail = last_view(&sim, conn);
    assert!(sim.loads.is_empty(), "read whole: {:?}", sim.loads);
    assert_eq!(sim.tail_loads.len(), 1);
    let (_, read, complete) = sim.tail_loads[0].clone();
    assert!(
        !complete && read < path.len() / 2,
        "read {read} of {} nodes",
        path.len()
    );
    // What it shows: the path's tail, how many come before, the edit's switcher.
    assert!(!from_tail.nodes.is_empty() && from_tail.nodes.len() <= 12);
    assert_eq!(
        from_tail.older_nodes as usize + from_tail.nodes.len(),
        path.len()
    );
    assert_eq!(from_tail.nodes, path[from_tail.older_nodes as usize..]);
    assert_eq!(from_tail.branches.len(), 1, "{:?}", from_tail.branches);
    assert_eq!(from_tail.branches[0].node_ids.len(), 2);

    // The same as a snapshot of the thread read whole (history needs it all).
    let other = sim.connect();
    sim.send(
        other,
        Op::ThreadHistory {
            submission: submission("h1"),
            thread_id: tid.clone(),
            before_node_id: from_tail.nodes[0].id.clone(),
            limit: None,
        },
    );
    sim.run(1000);
    assert_eq!(
        sim.loads,
        vec![tid.clone()],
        "history reads the thread whole"
    );
    sim.send(other, initialize("i2", Some(&tid)));
    sim.run(1000);
    let whole = last_view(&sim, other);
    assert_eq!(from_tail.nodes, whole.nodes);
    assert_eq!(from_tail.older_nodes, whole.older_nodes);
    assert_eq!(from_tail.branches, whole.branches);

    // A turn on it after the tail-only start runs on the whole conversation.
    sim.send(
        conn,
        submit("s-after", Some(&tid), "And after the restart?"),
    );
    sim.run(10_000);
    let request = sim.requests.last().unwrap();
    assert!(request.messages.len() > 100, "{}", request.messages.len());
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn history_pages_carry_their_version_switchers() {
    let (mut sim, tid, _) = long_branched_thread(178);
    let conn = sim.connect();
    // More turns after the edit: its switcher leaves the snapshot's page.
    for i in 0..4 {
        sim.send(
            conn,
            submit(&format!("m{i}"), Some(&tid), "Subscribe me again"),
        );
        sim.run(10_000);
    }
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(1000);
    let view = last_view(&sim, conn);
    assert_eq!(view.branches, Vec::new(), "only the shown nodes' switchers");
    let mut before = view.nodes[0].id.clone();
    let mut older = view.older_nodes;
    let mut switchers = Vec::new();
    let mut n = 0;
    while older > 0 {
        n += 1;
        let result = history_page(&mut sim, conn, &tid, &before, 5, &format!("h{n}"));
        let branches: Vec<sw_agent::protocol::BranchPoint> =
            serde_json::from_value(result["branches"].clone()).unwrap();
        let page: Vec<sw_agent::model::Node> =
            serde_json::from_value(result["nodes"].clone()).unwrap();
        for point in &branches {
            let active = &point.node_ids[point.active];
            assert!(
                page.iter().any(|p| &p.id == active),
                "a switcher for a node not in the page"
            );
        }
        switchers.extend(branches);
        before = page[0].id.clone();
        older = result["olderNodes"].as_u64().unwrap();
    }
    assert_eq!(
        switchers.len(),
        1,
        "the edit's switcher, once: {switchers:?}"
    );
    assert_eq!(switchers[0].node_ids.len(), 2);
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn thread_written_before_path_lengths_is_read_whole_and_shows_the_same() {
    let (mut sim, tid, path) = long_branched_thread(179);
    sim.store.threads.get_mut(&tid).unwrap().path_len = None;
    sim.crash();
    sim.loads.clear();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&tid)));
    sim.run(1000);
    assert!(sim.tail_loads.is_empty());
    assert_eq!(sim.loads, vec![tid.clone()]);
    let view = last_view(&sim, conn);
    assert_eq!(view.older_nodes as usize + view.nodes.len(), path.len());
    assert_eq!(view.branches.len(), 1);
    // A wrong stored length (damaged record) never shows a wrong count: read whole.
    sim.send(conn, submit("s-next", Some(&tid), "Next"));
    sim.run(10_000);
    let stored = sim.store.threads[&tid].path_len;
    assert_eq!(
        stored,
        Some(paths(&sim)[0].len() as u64),
        "restamped by the next write"
    );
    sim.store.threads.get_mut(&tid).unwrap().path_len = Some(3);
    sim.crash();
    sim.loads.clear();
    sim.tail_loads.clear();
    let conn = sim.connect();
    sim.send(conn, initialize("i2", Some(&tid)));
    sim.run(1000);
    assert_eq!(sim.tail_loads.len(), 1);
    assert_eq!(
        sim.loads,
        vec![tid.clone()],
        "a tail longer than the stored length is not trusted"
    );
    let view = last_view(&sim, conn);
    assert_eq!(
        view.older_nodes as usize + view.nodes.len(),
        paths(&sim)[0].len()
    );
}

#[test]
fn a_thread_being_deleted_takes_no_new_turn_and_is_not_written_again() {
    let mut sim = Sim::new(133, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Hello"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, interrupt("x1", &tid));
    sim.run(10_000);

    // The delete is committing (a slow disk) when a new turn, a queued
    // turn and a fork of the same thread arrive: each is refused.
    sim.hold_persists = true;
    sim.send(conn, delete("d1", &tid));
    sim.run(1000);
    sim.send(conn, submit("s2", Some(&tid), "One more"));
    sim.send(conn, enqueue("q1", &tid, "Later"));
    sim.send(conn, fork("f1", &tid, None));
    sim.run(1000);
    for id in ["s2", "q1", "f1"] {
        let refused = answer(&sim, conn, id).and_then(Result::err);
        assert_eq!(refused.map(|e| e.kind), Some(ErrorKind::NotFound), "{id}");
    }
    sim.release_persists();
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert!(sim.store.threads.is_empty(), "{:?}", sim.store.threads);
    assert!(sim.store.nodes.is_empty(), "{:?}", sim.store.nodes.keys());
    assert!(sim.store.runs.is_empty() && sim.store.queue.is_empty());
    check_invariants(&sim, &[]).unwrap();
}

/// A stopped thread gets a queued turn whose save is held; `delete_op`
/// ("d1") is sent meanwhile and must wait for that save, which is then
/// released: (sim, conn, the thread).
fn delete_behind_a_queued_turn_s_save(delete_op: fn(&str, &str) -> Op) -> (Sim, u64, String) {
    let (mut sim, conn, tid) = waiting_for_approval(136);
    sim.send(conn, interrupt("x1", &tid));
    sim.run(10_000);
    sim.hold_persists = true;
    sim.send(conn, enqueue("q1", &tid, "Next"));
    sim.run(1000);
    sim.send(conn, delete_op("d1", &tid));
    sim.run(1000);
    assert!(
        answer(&sim, conn, "d1").is_none(),
        "waits for the queued turn's save"
    );
    sim.release_persists();
    sim.run(10_000);
    (sim, conn, tid)
}

#[test]
fn ack_after_commit_a_delete_sent_while_a_change_of_the_thread_is_saving_waits_for_it() {
    // A rename's commit is in flight: the delete waits for it (written
    // before it, the rename would write the thread's record again after
    // the delete), then goes through.
    let (mut sim, conn, tid) = waiting_for_approval(134);
    sim.send(conn, interrupt("x1", &tid));
    sim.run(10_000);
    sim.hold_persists = true;
    sim.send(conn, rename("n1", &tid, "Kept a moment"));
    sim.run(1000);
    sim.send(conn, delete("d1", &tid));
    sim.run(1000);
    assert!(answer(&sim, conn, "n1").is_none() && answer(&sim, conn, "d1").is_none());
    sim.release_persists();
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "n1"), Some(Ok(_))));
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert!(sim.store.threads.is_empty() && sim.store.nodes.is_empty());
    check_invariants(&sim, &[]).unwrap();

    // A queued turn's commit is in flight: the delete waits for it, and
    // the turn it starts is running when the delete's turn comes, so the
    // delete is refused; nothing the queue wrote is left behind.
    let (mut sim, conn, tid) = delete_behind_a_queued_turn_s_save(delete);
    assert_eq!(
        reject_message(&sim, conn, "d1").as_deref(),
        Some(
            "This thread has a running turn; stop it before deleting the thread \
             (or send the delete with stopTurn)."
        )
    );
    assert!(sim.store.threads.contains_key(&tid));
    check_invariants(&sim, &[]).unwrap();

    // Once the turn is stopped, the same delete goes through.
    sim.send(conn, interrupt("x2", &tid));
    sim.run(10_000);
    sim.send(conn, delete("d2", &tid));
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d2"), Some(Ok(_))));
    assert!(sim.store.threads.is_empty() && sim.store.nodes.is_empty());
    assert!(sim.store.queue.is_empty() && sim.store.runs.is_empty());
    check_invariants(&sim, &[]).unwrap();

    // With stopTurn, the same delete behind a queued turn's save stops the
    // turn it starts and then goes through.
    let (sim, conn, _) = delete_behind_a_queued_turn_s_save(stop_and_delete);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    assert!(sim.store.threads.is_empty() && sim.store.nodes.is_empty());
    assert!(sim.store.queue.is_empty() && sim.store.runs.is_empty());
    check_invariants(&sim, &[]).unwrap();
}

/// The thread's records left in the store: none once it is deleted.
fn assert_nothing_left_of(sim: &Sim, tid: &str) {
    assert!(!sim.store.threads.contains_key(tid));
    assert!(sim.store.nodes.values().all(|n| n.thread_id != tid));
    assert!(sim.store.runs.values().all(|r| r.thread_id != tid));
    assert!(sim.store.approvals.values().all(|a| a.thread_id != tid));
    assert!(sim.store.steers.values().all(|s| s.thread_id != tid));
    assert!(sim.store.queue.values().all(|q| q.thread_id != tid));
}

/// Where the first event matching `is` sits in what `conn` got.
fn position(sim: &Sim, conn: u64, is: impl Fn(&Event) -> bool) -> Option<usize> {
    sim.events_for(conn).into_iter().position(is)
}

#[test]
fn ack_after_commit_a_delete_with_stop_turn_ends_the_turn_then_deletes_the_thread() {
    // The turn waits for an approval: the delete stops it (its end is
    // saved and announced, the approval withdrawn), then deletes the
    // thread, and the ACK comes once the delete is saved.
    let (mut sim, conn, tid) = waiting_for_approval(138);
    sim.send(conn, stop_and_delete("d1", &tid));
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    let ended = position(&sim, conn, |e| {
        matches!(
            e,
            Event::TurnComplete {
                stop_reason: StopReason::Interrupted,
                ..
            }
        )
    });
    let acked = position(
        &sim,
        conn,
        |e| matches!(e, Event::CommandAck { submission_id, .. } if submission_id == "d1"),
    );
    assert!(ended.is_some() && ended < acked, "{ended:?} {acked:?}");
    assert_nothing_left_of(&sim, &tid);
    check_invariants(&sim, &[]).unwrap();

    // A checkpoint of the turn is in flight when the delete arrives: the
    // turn ends after it, and the delete waits for that end.
    let (mut sim, conn, tid) = waiting_for_approval(139);
    sim.hold_persists = true;
    allow_the_waiting_call_once(&mut sim, conn, &tid);
    sim.run(1000);
    assert!(!sim.held.is_empty());
    sim.send(conn, stop_and_delete("d1", &tid));
    sim.run(1000);
    assert!(
        answer(&sim, conn, "d1").is_none(),
        "waits for the turn's end"
    );
    sim.release_persists();
    sim.run(10_000);
    assert!(matches!(answer(&sim, conn, "d1"), Some(Ok(_))));
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    assert_nothing_left_of(&sim, &tid);
    check_invariants(&sim, &[]).unwrap();

    // Without stopTurn the same delete is still refused while the turn runs.
    let (mut sim, conn, tid) = waiting_for_approval(140);
    sim.send(conn, delete("d1", &tid));
    sim.run(10_000);
    assert_eq!(
        answer(&sim, conn, "d1").unwrap().unwrap_err().kind,
        ErrorKind::InvalidCommand
    );
    let run = sim
        .store
        .runs
        .values()
        .find(|r| r.thread_id == tid)
        .unwrap();
    assert_eq!(run.state, RunState::WaitingApproval);
}

#[test]
fn ack_after_commit_a_stop_and_delete_cut_off_by_a_crash_is_finished_when_sent_again() {
    // The worker dies after the turn's end was saved and before or while
    // the delete is saved: the panel sends the unanswered delete again,
    // and the next worker deletes the thread (or replays the ACK).
    for seed in 141..149 {
        let (mut sim, conn, tid) = waiting_for_approval(seed);
        sim.hold_persists = true;
        sim.send(conn, stop_and_delete("d1", &tid));
        sim.run(1000);
        assert!(sim.release_one(), "the turn's end is saved first");
        sim.run(1000);
        assert!(answer(&sim, conn, "d1").is_none());
        sim.crash();
        sim.hold_persists = false;
        let conn = sim.connect();
        sim.send(conn, stop_and_delete("d1", &tid));
        sim.run(10_000);
        assert!(
            matches!(answer(&sim, conn, "d1"), Some(Ok(_))),
            "seed {seed}"
        );
        assert_nothing_left_of(&sim, &tid);
        check_invariants(&sim, &[]).unwrap();
    }
}

#[test]
fn no_orphan_tool_calls_a_rename_waits_for_a_checkpoint_in_flight() {
    let (mut sim, conn, tid) = waiting_for_approval(137);
    sim.hold_persists = true;
    allow_the_waiting_call_once(&mut sim, conn, &tid);
    sim.run(1000);
    // Step the turn one commit at a time until a checkpoint that moves the
    // conversation's end (the thread's record) is in flight.
    let moves_the_end = |sim: &Sim| {
        sim.held.iter().any(|(_, unit)| {
            unit.puts
                .iter()
                .any(|r| matches!(r, sw_agent::store::Record::Thread(_)))
        })
    };
    let mut steps = 0;
    while !moves_the_end(&sim) {
        assert!(!sim.held.is_empty() && steps < 50, "the turn went on");
        sim.release_persists();
        sim.hold_persists = true;
        sim.run(1000);
        steps += 1;
    }
    sim.send(conn, rename("n1", &tid, "Mine"));
    sim.run(1000);
    assert!(answer(&sim, conn, "n1").is_none(), "waits for the save");
    sim.release_persists();
    sim.run(10_000);
    assert_eq!(answer(&sim, conn, "n1").unwrap().unwrap()["title"], "Mine");
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    let thread = &sim.store.threads[&tid];
    assert_eq!(thread.title, "Mine");
    // The rename did not move the conversation's end back.
    let path = &paths(&sim)[0];
    assert_eq!(thread.leaf_id.as_ref(), path.last().map(|n| &n.id));
    assert!(matches!(
        path.last().unwrap().body,
        NodeBody::AssistantMessage { .. }
    ));
    check_invariants(&sim, &[]).unwrap();
}

/// A turn that reads and clicks, then a fork of its whole thread:
/// (sim, conn, the thread, the fork).
fn forked_after_a_tool_turn(seed: u64) -> (Sim, u64, String, String) {
    let (mut sim, conn) = one_turn(seed, "Subscribe me");
    let tid = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, fork("f1", &tid, None));
    sim.run(10_000);
    let fork_id = acked_thread(&sim, conn, "f1").expect("forked");
    (sim, conn, tid, fork_id)
}

#[test]
fn a_fork_of_a_thread_with_tool_steps_takes_its_calls_along_under_the_copied_messages() {
    let (mut sim, conn, _, fork_id) = forked_after_a_tool_turn(135);
    // Every copied call names the copy of its assistant message.
    let copies: Vec<&Node> = sim
        .store
        .nodes
        .values()
        .filter(|n| n.thread_id == fork_id)
        .collect();
    let calls: Vec<&str> = copies
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::ToolCall { assistant_id, .. } => Some(assistant_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 3, "two reads and the click");
    for assistant in calls {
        assert!(
            copies.iter().any(|n| n.id == assistant),
            "{assistant} is not in the fork"
        );
    }
    // A turn in the fork sends every call with its result.
    let before = sim.requests.len();
    sim.send(conn, submit("s2", Some(&fork_id), "Once more"));
    sim.run(10_000);
    assert!(sim.requests.len() > before);
    for request in &sim.requests[before..] {
        check_request(request).unwrap();
    }
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_fork_stored_with_calls_naming_the_source_messages_still_sends_every_call_with_its_result() {
    // What forks made before the fix stored: copied calls whose assistant
    // id is the source thread's message.
    let (mut sim, _, tid, fork_id) = forked_after_a_tool_turn(136);
    let source_owner = sim
        .store
        .nodes
        .values()
        .find_map(|n| match &n.body {
            NodeBody::ToolCall { assistant_id, .. } if n.thread_id == tid => {
                Some(assistant_id.clone())
            }
            _ => None,
        })
        .unwrap();
    for node in sim
        .store
        .nodes
        .values_mut()
        .filter(|n| n.thread_id == fork_id)
    {
        if let NodeBody::ToolCall { assistant_id, .. } = &mut node.body {
            *assistant_id = source_owner.clone();
        }
    }
    sim.crash();
    let conn = sim.connect();
    let before = sim.requests.len();
    sim.send(conn, submit("s2", Some(&fork_id), "Once more"));
    sim.run(10_000);
    assert!(sim.requests.len() > before);
    for request in &sim.requests[before..] {
        check_request(request).unwrap();
    }
}

#[test]
fn an_old_edit_keeps_its_version_switcher_after_a_restart() {
    // The edited message's other version is older than what a cold start
    // reads of a thread's newest nodes: the thread is read whole instead.
    let mut sim = Sim::new(181, agent_policy(), page_tools());
    sim.config.snapshot_nodes = 12;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s0", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    for i in 1..30 {
        sim.send(conn, submit(&format!("s{i}"), Some(&tid), "Again"));
        sim.run(10_000);
    }
    // Back to the first message: the new version's path is short, the old
    // one's ~200 nodes are all newer than the message itself.
    let first = user_node(&sim, "Subscribe me");
    sim.send(conn, edit("e1", &tid, &first, "Subscribe me, edited"));
    sim.run(10_000);
    let view_of = |sim: &mut Sim, id: &str| {
        let conn = sim.connect();
        sim.send(conn, initialize(id, Some(&tid)));
        sim.run(10_000);
        let view = last_view(sim, conn);
        // The first page and the switchers in it, then every older page's.
        let mut switchers = view.branches.clone();
        let mut before = view.nodes[0].id.clone();
        let mut older = view.older_nodes;
        let mut n = 0;
        while older > 0 {
            n += 1;
            let result = history_page(sim, conn, &tid, &before, 12, &format!("{id}-h{n}"));
            let branches: Vec<sw_agent::protocol::BranchPoint> =
                serde_json::from_value(result["branches"].clone()).unwrap();
            let page: Vec<sw_agent::model::Node> =
                serde_json::from_value(result["nodes"].clone()).unwrap();
            switchers.extend(branches);
            before = page[0].id.clone();
            older = result["olderNodes"].as_u64().unwrap();
        }
        switchers
    };
    let before = view_of(&mut sim, "i1");
    assert_eq!(before.len(), 1, "the edit's switcher: {before:?}");
    sim.crash();
    assert_eq!(view_of(&mut sim, "i2"), before, "the same after a restart");
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn initialize_of_a_deleted_thread_after_a_restart_shows_the_most_recent_one_whole() {
    // A panel that held a thread another panel deleted asks for it after a
    // restart: it gets the most recent thread, read first (it was sent an
    // empty conversation).
    let (mut sim, conn) = one_turn(137, "Subscribe me");
    let kept = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, submit("s2", None, "Another thread"));
    sim.run(10_000);
    let gone = acked_thread(&sim, conn, "s2").unwrap();
    sim.send(conn, delete("d1", &gone));
    sim.run(10_000);
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&gone)));
    sim.run(10_000);
    let view = last_view(&sim, conn);
    assert_eq!(view.id, kept);
    assert!(!view.nodes.is_empty(), "the conversation, not an empty one");
}

fn create(id: &str) -> Op {
    Op::ThreadCreate {
        submission: submission(id),
    }
}

#[test]
fn receipt_replay_or_reject_a_fork_sent_again_after_a_restart_shows_the_fork_again() {
    // The worker was killed after the fork committed and before the panel
    // got its answer. The panel reconnects, shows the source thread again
    // and re-sends the fork: it gets the same answer and the fork is shown,
    // read back from disk, as the first answer would have shown it.
    let (mut sim, _, source, fork_id) = forked_after_a_tool_turn(138);
    let copied = paths(&sim)
        .into_iter()
        .find(|p| p.first().is_some_and(|n| n.thread_id == fork_id))
        .expect("the fork's path")
        .len();
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&source)));
    sim.send(conn, fork("f1", &source, None));
    sim.run(10_000);
    assert_eq!(
        acked_thread(&sim, conn, "f1").as_deref(),
        Some(fork_id.as_str())
    );
    let view = last_view(&sim, conn);
    assert_eq!(view.id, fork_id, "the fork is shown, not the source");
    assert_eq!(view.nodes.len(), copied.min(sim.config.snapshot_nodes));
    assert_eq!(sim.store.threads.len(), 2, "forked once");
    // The panel follows the fork: its next turn goes there.
    sim.send(conn, submit("s2", Some(&fork_id), "Go on"));
    sim.run(10_000);
    assert!(
        sim.events_for(conn)
            .iter()
            .any(|e| matches!(e, Event::TurnStart { thread_id, .. } if *thread_id == fork_id)),
        "the fork's events reach the panel"
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn receipt_replay_or_reject_a_create_sent_again_after_a_restart_shows_the_new_thread() {
    let mut sim = Sim::new(139, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Hello"));
    sim.run(10_000);
    let first = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, create("c1"));
    sim.run(10_000);
    let created = acked_thread(&sim, conn, "c1").expect("created");
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, initialize("i1", Some(&first)));
    sim.send(conn, create("c1"));
    sim.run(10_000);
    assert_eq!(acked_thread(&sim, conn, "c1"), Some(created.clone()));
    assert_eq!(last_view(&sim, conn).id, created);
    assert_eq!(sim.store.threads.len(), 2, "created once");
    // A thread deleted since cannot be shown: the retry still gets a
    // snapshot (the panel waits for one), of the most recent thread.
    sim.send(conn, delete("d1", &created));
    sim.run(10_000);
    let panel = sim.connect();
    sim.send(panel, initialize("i2", Some(&first)));
    sim.send(panel, create("c1"));
    sim.run(10_000);
    assert_eq!(acked_thread(&sim, panel, "c1"), Some(created));
    let snapshots: Vec<Option<String>> = sim
        .events_for(panel)
        .iter()
        .filter_map(|e| match e {
            Event::Initialized { snapshot } => Some(snapshot.thread.as_ref().map(|t| t.id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(snapshots, [Some(first.clone()), Some(first)]);
    assert_eq!(sim.store.threads.len(), 1, "not created again");
}

#[test]
fn receipt_replay_or_reject_a_create_sent_again_while_it_saves_shows_the_new_thread_to_the_retry() {
    // The panel's Port dropped while its thread.create was saving; the
    // reconnected panel sends it again and waits with it.
    let mut sim = Sim::new(140, agent_policy(), page_tools());
    let first = sim.connect();
    sim.hold_persists = true;
    sim.send(first, create("c1"));
    sim.run(1000);
    sim.disconnect(first);
    let second = sim.connect();
    sim.send(second, initialize("i1", None));
    sim.send(second, create("c1"));
    sim.run(1000);
    assert!(answer(&sim, second, "c1").is_none(), "waits for the commit");
    sim.hold_persists = false;
    assert!(sim.release_one());
    sim.run(10_000);
    let created = acked_thread(&sim, second, "c1").expect("acked");
    assert_eq!(last_view(&sim, second).id, created);
    assert_eq!(sim.store.threads.len(), 1);
}

/// A policy that answers title requests with "A model title" and acts as
/// the agent otherwise, in a simulation that asks for model titles.
fn titled_sim(seed: u64) -> Sim {
    use sw_agent::engine::TITLE_PROMPT;
    let mut inner = agent_policy();
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        if *request.system == *TITLE_PROMPT {
            return sw_agent::sim::Reply::text("A model title");
        }
        inner(request)
    });
    let mut sim = Sim::new(seed, policy, page_tools());
    sim.config.model_titles = true;
    sim.reconfigure();
    sim
}

/// The title the client was last shown for a thread, in a thread list or
/// a snapshot.
fn listed_title(sim: &Sim, conn: u64, tid: &str) -> Option<String> {
    sim.events_for(conn).iter().rev().find_map(|e| match e {
        Event::ThreadsUpdated { threads } => threads
            .iter()
            .find(|t| t.id == tid)
            .map(|t| t.title.clone()),
        Event::Initialized { snapshot } => snapshot
            .threads
            .iter()
            .find(|t| t.id == tid)
            .map(|t| t.title.clone()),
        _ => None,
    })
}

#[test]
fn a_renamed_thread_is_acked_once_saved_listed_and_kept_after_a_crash() {
    let (mut sim, conn) = one_turn(140, "Subscribe me");
    let tid = sim.store.threads.keys().next().unwrap().clone();

    sim.hold_persists = true;
    sim.send(conn, rename("n1", &tid, "  Newsletter\n  at   the shop "));
    sim.run(10_000);
    assert!(
        answer(&sim, conn, "n1").is_none(),
        "acked before it was saved"
    );
    sim.hold_persists = false;
    sim.release_persists();
    sim.run(10_000);
    assert_eq!(
        answer(&sim, conn, "n1").unwrap().unwrap(),
        serde_json::json!({ "threadId": tid, "title": "Newsletter at the shop" })
    );
    assert_eq!(sim.store.threads[&tid].title, "Newsletter at the shop");
    assert_eq!(
        listed_title(&sim, conn, &tid).as_deref(),
        Some("Newsletter at the shop")
    );

    // Wrong titles change nothing.
    sim.send(conn, rename("n2", &tid, " \n\t "));
    sim.send(conn, rename("n3", &tid, &"x".repeat(81)));
    sim.send(conn, rename("n4", "t-none", "Elsewhere"));
    sim.run(10_000);
    for (id, kind) in [
        ("n2", ErrorKind::InvalidCommand),
        ("n3", ErrorKind::InvalidCommand),
        ("n4", ErrorKind::NotFound),
    ] {
        assert_eq!(
            answer(&sim, conn, id).unwrap().unwrap_err().kind,
            kind,
            "{id}"
        );
    }
    assert_eq!(sim.store.threads[&tid].title, "Newsletter at the shop");

    // A second turn and a restart keep it.
    sim.send(conn, submit("s2", Some(&tid), "Subscribe me again"));
    sim.run(10_000);
    sim.crash();
    let conn = reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(sim.store.threads[&tid].title, "Newsletter at the shop");
    let snapshot_title = sim.events_for(conn).iter().find_map(|e| match e {
        Event::Initialized { snapshot } => snapshot
            .threads
            .iter()
            .find(|t| t.id == tid)
            .map(|t| t.title.clone()),
        _ => None,
    });
    assert_eq!(snapshot_title.as_deref(), Some("Newsletter at the shop"));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_user_s_title_is_never_replaced_by_a_model_title() {
    use sw_agent::engine::TITLE_PROMPT;
    // Named before its first message: no model title is asked for.
    let mut sim = titled_sim(141);
    let conn = sim.connect();
    sim.send(
        conn,
        Op::ThreadCreate {
            submission: submission("c1"),
        },
    );
    sim.run(10_000);
    let tid = acked_thread(&sim, conn, "c1").unwrap();
    sim.send(conn, rename("n1", &tid, "Shopping"));
    sim.send(conn, submit("s1", Some(&tid), "please subscribe me"));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert_eq!(sim.store.threads[&tid].title, "Shopping");
    assert!(!sim.requests.iter().any(|r| *r.system == *TITLE_PROMPT));

    // Renamed after the turn, while the model's title is still on its way
    // (a slow title model): the user's stays.
    let mut sim = titled_sim(142);
    sim.hold_replies_to = Some(|r| *r.system == *TITLE_PROMPT);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "please subscribe me"));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert!(sim.requests.iter().any(|r| *r.system == *TITLE_PROMPT));
    let tid = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, rename("n1", &tid, "Mine"));
    sim.run(10_000);
    assert_eq!(answer(&sim, conn, "n1").unwrap().unwrap()["title"], "Mine");
    sim.release_replies();
    sim.run(10_000);
    assert_eq!(sim.store.threads[&tid].title, "Mine");
    assert_eq!(listed_title(&sim, conn, &tid).as_deref(), Some("Mine"));
    check_invariants(&sim, &[]).unwrap();

    // While the turn runs (waiting for an approval, the model's title on
    // its way), a rename is saved at once: the turn's later checkpoints
    // carry it, the model's title does not replace it, and a fresh worker
    // reads it.
    let mut sim = titled_sim(144);
    sim.auto_approve = None;
    sim.hold_replies_to = Some(|r| *r.system == *TITLE_PROMPT);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::WaitingApproval
    );
    sim.send(conn, rename("n1", &tid, "Mine"));
    sim.run(10_000);
    assert_eq!(answer(&sim, conn, "n1").unwrap().unwrap()["title"], "Mine");
    assert_eq!(sim.store.threads[&tid].title, "Mine");
    sim.release_replies();
    allow_the_waiting_call_once(&mut sim, conn, &tid);
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert_eq!(sim.store.threads[&tid].title, "Mine");
    sim.crash();
    let conn = reconnect(&mut sim);
    sim.run(10_000);
    assert_eq!(listed_title(&sim, conn, &tid).as_deref(), Some("Mine"));
    check_invariants(&sim, &[]).unwrap();

    // Without a rename the model's title replaces the first line.
    let mut sim = titled_sim(143);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "please subscribe me"));
    sim.run(10_000);
    let thread = sim.store.threads.values().next().unwrap();
    assert_eq!(thread.title, "A model title");
}

#[test]
fn a_model_title_arriving_while_a_branch_switch_is_saved_does_not_switch_back() {
    use sw_agent::engine::TITLE_PROMPT;
    let mut sim = titled_sim(145);
    sim.hold_replies_to = Some(|r| *r.system == *TITLE_PROMPT);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "please subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    let first_user = paths(&sim)[0]
        .iter()
        .find(|n| matches!(n.body, NodeBody::UserMessage { .. }))
        .unwrap()
        .id
        .clone();
    let first_leaf = sim.store.threads[&tid].leaf_id.clone();
    // A second version of the first message.
    sim.send(
        conn,
        Op::TurnSubmit {
            submission: submission("s2"),
            thread_id: Some(tid.clone()),
            input: sw_agent::protocol::UserInput::text("please subscribe me twice"),
            replaces: Some(first_user.clone()),
        },
    );
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    let second_leaf = sim.store.threads[&tid].leaf_id.clone();

    // Back to the first version; its save is in flight when the model's
    // title (asked for at the first turn) arrives.
    sim.hold_persists = true;
    sim.send(conn, select_branch("b1", &tid, &first_user));
    sim.run(10_000);
    sim.release_replies();
    sim.run(10_000);
    sim.hold_persists = false;
    sim.release_persists();
    sim.run(10_000);
    assert!(answer(&sim, conn, "b1").unwrap().is_ok());
    let thread = &sim.store.threads[&tid];
    assert_ne!(first_leaf, second_leaf);
    assert_eq!(thread.leaf_id, first_leaf, "the branch switch was undone");
    assert_eq!(thread.title, "A model title");
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn ack_after_commit_a_refused_rename_leaves_the_old_title_in_the_store() {
    // The model's second answer is held: the turn waits on the provider,
    // with nothing of the thread being saved.
    let mut sim = Sim::new(146, agent_policy(), page_tools());
    sim.hold_replies_to = Some(|r| {
        r.messages
            .iter()
            .any(|m| matches!(m, sw_agent::provider::ChatMessage::ToolResult { .. }))
    });
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    let tid = sim.store.threads.keys().next().unwrap().clone();
    let before = sim.store.threads[&tid].title.clone();
    assert!(sim.held.is_empty());
    assert!(
        sim.store.runs.values().any(|r| !r.state.is_terminal()),
        "the turn runs"
    );

    // The rename is written at once; the answer arrives while it is in
    // flight, and its checkpoint (built from memory) carries the new title.
    sim.hold_persists = true;
    sim.send(conn, rename("n1", &tid, "Mine"));
    sim.run(1000);
    assert_eq!(sim.held.len(), 1, "the rename's commit");
    sim.hold_replies_to = None;
    sim.release_replies();
    sim.run(1000);
    let carried = sim.held[1..].iter().any(|(_, unit)| {
        unit.puts
            .iter()
            .any(|r| matches!(r, sw_agent::store::Record::Thread(t) if t.title == "Mine"))
    });
    assert!(carried, "a checkpoint carrying the new title is in flight");

    // The rename fails (IndexedDB completes it before the checkpoint, whose
    // stores overlap its own); the checkpoint commits after it.
    sim.fail_nth(0, false);
    sim.release_persists();
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert!(answer(&sim, conn, "n1").unwrap().is_err(), "refused");
    // What the client was told holds: the old title, in the store and in
    // the list.
    assert_eq!(sim.store.threads[&tid].title, before);
    sim.send(conn, initialize("i2", Some(&tid)));
    sim.run(10_000);
    assert_eq!(
        listed_title(&sim, conn, &tid).as_deref(),
        Some(before.as_str())
    );
    check_invariants(&sim, &[]).unwrap();
}
