//! One full turn on the direct transport, asserting exact persisted nodes and event order.

use pretty_assertions::assert_eq;
use serde_json::json;
use sw_agent::engine::{Heartbeat, ToolOutcome};
use sw_agent::model::{NodeBody, RunState, StopReason, ToolStatus};
use sw_agent::protocol::{ClientKind, ErrorKind, Event};
use sw_agent::provider::{ProviderError, RawToolCall};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

fn event_names(sim: &Sim, conn: u64) -> Vec<String> {
    sim.events_for(conn)
        .into_iter()
        .map(|e| match e {
            Event::ItemComplete { node, .. } => format!("item.complete:{}", node.kind_name()),
            Event::RunStatus { state, .. } => format!(
                "run.status:{}",
                serde_json::to_value(state).unwrap().as_str().unwrap()
            ),
            Event::TurnComplete { stop_reason, .. } => format!(
                "turn.complete:{}",
                serde_json::to_value(stop_reason).unwrap().as_str().unwrap()
            ),
            Event::CommandAck { op_type, .. } => format!("ack:{op_type}"),
            Event::CommandReject { op_type, error, .. } => {
                format!("reject:{op_type}:{:?}", error.kind)
            }
            other => serde_json::to_value(other).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string(),
        })
        .collect()
}

#[test]
fn full_turn_text_tool_text_persists_exact_nodes_and_events() {
    let policy = read_then_answer("All done.");
    let mut sim = Sim::new(7, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Read the page\nplease"));
    sim.run(10_000);

    let paths = paths(&sim);
    assert_eq!(paths.len(), 1);
    let path = &paths[0];
    assert_eq!(
        kinds(path),
        vec![
            "turn_context",
            "user_message",
            "assistant_message",
            "tool_call",
            "tool_result",
            "assistant_message"
        ]
    );
    match &path[4].body {
        NodeBody::ToolResult {
            status,
            content,
            call_id,
            ..
        } => {
            assert_eq!(*status, ToolStatus::Ok);
            assert!(
                content
                    .starts_with("<untrusted_page_content origin=\"https://shop.example\">\nPAGE"),
                "{content}"
            );
            assert_eq!(call_id, "c1");
        }
        other => panic!("expected tool result, got {other:?}"),
    }
    match &path[5].body {
        NodeBody::AssistantMessage {
            text, stop_reason, ..
        } => {
            assert_eq!(text, "All done.");
            assert_eq!(*stop_reason, StopReason::End);
        }
        other => panic!("{other:?}"),
    }
    let thread = sim.store.threads.values().next().unwrap();
    assert_eq!(thread.title, "Read the page");
    assert_eq!(thread.usage.input, 20);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(run.stop_reason, Some(StopReason::End));

    let names = event_names(&sim, conn);
    // Deltas are coalesced; drop them for the order check but require at least one.
    assert!(names.iter().any(|n| n == "item.delta"));
    let names: Vec<String> = names.into_iter().filter(|n| n != "item.delta").collect();
    assert_eq!(
        names,
        vec![
            "ack:turn.submit",
            "threads.updated",
            "turn.start",
            "item.complete:turn_context",
            "item.complete:user_message",
            "run.status:streaming_model",
            "item.start",
            "item.complete:assistant_message",
            "item.complete:tool_call",
            "run.status:executing_tools",
            "token.usage",
            "item.complete:tool_result",
            "run.status:streaming_model",
            "item.start",
            "item.complete:assistant_message",
            "token.usage",
            "run.status:completed",
            "turn.complete:end",
        ]
    );
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    assert_eq!(
        sim.heartbeat,
        Heartbeat::Awake,
        "the connected panel keeps the worker"
    );
    sim.disconnect(conn);
    assert_eq!(
        sim.heartbeat,
        Heartbeat::Off,
        "heartbeat cleared when no run is active and no panel is connected"
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn ack_after_commit_submit_is_acked_only_after_its_transaction() {
    let mut sim = Sim::new(1, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    // The op produced a persist; nothing was acked yet.
    assert!(sim.events_for(conn).is_empty());
    assert_eq!(sim.store.commits, 0);
    sim.drain_effects(); // executes the persist; only then does the engine ACK
    assert_eq!(sim.store.commits, 1);
    assert!(matches!(sim.events_for(conn)[0], Event::CommandAck { .. }));
    sim.run(10_000);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn ack_after_commit_failed_write_is_rejected_not_acked() {
    let mut sim = Sim::new(1, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.fail_next_persists = 1;
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let events = sim.events_for(conn);
    assert!(
        matches!(events[0], Event::CommandReject { error, .. } if error.kind == ErrorKind::Storage)
    );
    assert!(!events.iter().any(|e| matches!(e, Event::CommandAck { .. })));
    assert!(sim.store.threads.is_empty());
    assert!(sim.requests.is_empty());
}

#[test]
fn tool_call_ids_normalized_empty_and_duplicate_ids_are_replaced() {
    let mut step = 0;
    let policy = Box::new(move |_: &sw_agent::provider::ProviderRequest| {
        step += 1;
        let call = |id: &str| RawToolCall {
            id: id.into(),
            name: "read_page".into(),
            arguments: "{}".into(),
        };
        match step {
            1 => Reply::ToolCalls {
                text: String::new(),
                calls: vec![call(""), call("dup"), call("dup")],
                stop: StopReason::ToolUse,
            },
            2 => Reply::ToolCalls {
                text: String::new(),
                calls: vec![call("dup")],
                stop: StopReason::ToolUse,
            },
            _ => Reply::text("ok"),
        }
    });
    let mut sim = Sim::new(3, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let path = &paths(&sim)[0];
    let ids: Vec<String> = path
        .iter()
        .filter_map(|n| match &n.body {
            NodeBody::ToolCall { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 4);
    assert_eq!(ids[1], "dup");
    assert!(ids.iter().all(|i| !i.is_empty()));
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), 4, "{ids:?}");
    check_invariants(&sim, &[]).unwrap();
}

/// A turn whose model answers one call of `name` with `arguments` and
/// `stop`, which must fail closed: nothing dispatched, no tool_call node, the
/// run failed with a notice. Returns the notice's text.
fn fails_closed(name: &str, arguments: &str, stop: StopReason) -> String {
    let reply = Reply::ToolCalls {
        text: "I will act".into(),
        calls: vec![RawToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments: arguments.into(),
        }],
        stop,
    };
    let policy = Box::new(move |_: &sw_agent::provider::ProviderRequest| reply.clone());
    let mut sim = Sim::new(3, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(sim.dispatches.is_empty(), "no side effect may happen");
    assert_eq!(last_stop(&sim), Some(StopReason::Error));
    let path = &paths(&sim)[0];
    assert!(!kinds(path).contains(&"tool_call"));
    check_invariants(&sim, &[]).unwrap();
    // The reply was paid for: its usage is kept with its text, counted in
    // the thread's and the turn's totals, and reported.
    let kept = path.iter().find_map(|n| match &n.body {
        NodeBody::AssistantMessage { text, usage, .. } => Some((text.clone(), *usage)),
        _ => None,
    });
    let (text, usage) = kept.expect("the reply's text is kept");
    assert_eq!(text, "I will act");
    assert_eq!(usage.map(|u| (u.input, u.output)), Some((10, 5)));
    let thread = sim.store.threads.values().next().unwrap();
    assert_eq!((thread.usage.input, thread.usage.output), (10, 5));
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!((run.usage.input, run.usage.output), (10, 5));
    assert!(sim.events.iter().any(|(_, e)| matches!(
        &e.event,
        Event::TokenUsage { turn_total, .. } if turn_total.output == 5
    )));
    match &path.last().unwrap().body {
        NodeBody::Notice { text, .. } => text.clone(),
        other => panic!("a notice expected, got {other:?}"),
    }
}

#[test]
fn tool_call_ids_normalized_tool_calls_with_end_stop_fail_closed() {
    let notice = fails_closed("click", r#"{"ref":"e1"}"#, StopReason::End);
    assert!(notice.contains("stop reason End"), "{notice}");
}

#[test]
fn tool_call_ids_normalized_a_call_cut_by_the_output_limit_fails_closed_saying_what_to_raise() {
    let notice = fails_closed("type", r#"{"ref":"e1","text":"Dear"#, StopReason::MaxTokens);
    assert!(
        notice.contains("cut off while it was writing a tool call")
            && notice.contains("Raise Max output tokens")
            && notice.contains("context window"),
        "{notice}"
    );
}

#[test]
fn tool_call_ids_normalized_a_cut_call_without_text_still_counts_and_reports_its_usage() {
    let reply = Reply::ToolCalls {
        text: String::new(),
        calls: vec![RawToolCall {
            id: "c1".into(),
            name: "type".into(),
            arguments: r#"{"ref":"e1","text":"Dear"#.into(),
        }],
        stop: StopReason::MaxTokens,
    };
    let policy = Box::new(move |_: &sw_agent::provider::ProviderRequest| reply.clone());
    let mut sim = Sim::new(4, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(sim.dispatches.is_empty());
    assert_eq!(last_stop(&sim), Some(StopReason::Error));
    // No text: no message keeps the usage, the totals and the report do.
    let path = &paths(&sim)[0];
    assert!(!kinds(path).contains(&"assistant_message"));
    let thread = sim.store.threads.values().next().unwrap();
    assert_eq!((thread.usage.input, thread.usage.output), (10, 5));
    assert!(sim.events.iter().any(|(_, e)| matches!(
        &e.event,
        Event::TokenUsage { usage, thread_total, .. } if usage.output == 5 && thread_total.output == 5
    )));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn invalid_arguments_become_an_error_result_the_model_sees() {
    let mut step = 0;
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        step += 1;
        if step == 1 {
            Reply::call("c1", "click", "{not json")
        } else {
            match request.messages.last() {
                Some(sw_agent::provider::ChatMessage::ToolResult {
                    is_error: true,
                    content,
                    ..
                }) => {
                    assert!(content.contains("not valid JSON"));
                    Reply::text("fixed")
                }
                other => panic!("model should see the validation error, got {other:?}"),
            }
        }
    });
    let mut sim = Sim::new(3, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(sim.dispatches.is_empty());
    assert_eq!(last_stop(&sim), Some(StopReason::End));
}

#[test]
fn failure_breaker_reminds_after_three_and_disables_tools_after_five() {
    let policy = Box::new(|request: &sw_agent::provider::ProviderRequest| {
        if request.tools.is_empty() {
            Reply::text("I could not do it.")
        } else {
            Reply::call("", "click", r#"{"ref":"e9"}"#)
        }
    });
    let tool = Box::new(|_: &str, _: &serde_json::Value| ToolOutcome {
        ok: false,
        content: "Element e9 is no longer on the page.".into(),
        details: None,
        images: vec![],
    });
    let mut sim = Sim::new(5, policy, tool);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(sim.dispatches.len(), 5, "the sixth call is never executed");
    let reminders: Vec<usize> = sim
        .requests
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            matches!(r.messages.last(), Some(sw_agent::provider::ChatMessage::User { text, .. }) if text.contains("Change your approach"))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        reminders,
        vec![3, 4],
        "reminder after the 3rd and 4th failure"
    );
    assert!(
        sim.requests[5].tools.is_empty(),
        "tools disabled after 5 failures"
    );
    // With no tools defined, the history holds no tool blocks (Anthropic
    // refuses those without tool definitions): the calls and their
    // results are text.
    use sw_agent::provider::ChatMessage;
    let last = &sim.requests[5].messages;
    assert!(
        last.iter().all(|m| !matches!(m, ChatMessage::ToolResult { .. })
            && !matches!(m, ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty())),
        "no tool blocks without tools: {last:?}"
    );
    let failures = last
        .iter()
        .filter(|m| matches!(m, ChatMessage::User { text, .. } if text.starts_with("[The call of click failed:]\n<untrusted_page_content") && text.contains("Element e9 is no longer on the page.")))
        .count();
    assert_eq!(
        failures, 5,
        "every result is still there, as text: {last:?}"
    );
    assert!(last.iter().any(
        |m| matches!(m, ChatMessage::Assistant { text, .. } if text.contains(r#"[Called the tool click with {"ref":"e9"}]"#))
    ));
    assert_eq!(last_stop(&sim), Some(StopReason::ToolsDisabled));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn failure_breaker_success_resets_the_count() {
    let mut step = 0;
    let policy = Box::new(move |_: &sw_agent::provider::ProviderRequest| {
        step += 1;
        match step {
            1..=4 => Reply::call("", "click", r#"{"ref":"bad"}"#),
            5 => Reply::call("", "read_page", "{}"),
            6..=9 => Reply::call("", "click", r#"{"ref":"bad"}"#),
            _ => Reply::text("end"),
        }
    });
    let tool = Box::new(|name: &str, _: &serde_json::Value| ToolOutcome {
        ok: name == "read_page",
        content: "x".into(),
        details: None,
        images: vec![],
    });
    let mut sim = Sim::new(5, policy, tool);
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(
        sim.requests.iter().all(|r| !r.tools.is_empty()),
        "never reached 5 in a row"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
}

#[test]
fn streamed_text_survives_provider_error_as_interrupted_prefix() {
    let policy = Box::new(|_: &sw_agent::provider::ProviderRequest| Reply::Error {
        partial: "Half an ans".into(),
        error: ProviderError::new(ErrorKind::ProviderUnavailable, "overloaded", true),
    });
    let mut sim = Sim::new(5, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let path = &paths(&sim)[0];
    let prefix = path.iter().find_map(|n| match &n.body {
        NodeBody::AssistantMessage {
            text, interrupted, ..
        } => Some((text.clone(), *interrupted)),
        _ => None,
    });
    assert_eq!(prefix, Some(("Half an ans".to_string(), true)));
    assert_eq!(last_stop(&sim), Some(StopReason::Error));
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(
        run.error.as_ref().unwrap().kind,
        ErrorKind::ProviderUnavailable
    );
}

#[test]
fn not_configured_provider_keeps_the_message_and_fails_with_a_clear_error() {
    let mut sim = Sim::new(5, agent_policy(), page_tools());
    sim.profile.base_url.clear();
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "hello"));
    sim.run(10_000);
    assert!(sim.requests.is_empty());
    let path = &paths(&sim)[0];
    assert_eq!(kinds(path), vec!["turn_context", "user_message", "notice"]);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.error.as_ref().unwrap().kind, ErrorKind::NotConfigured);
}

#[test]
fn content_script_cannot_command_untrusted_sender_is_refused() {
    let mut sim = Sim::new(5, agent_policy(), page_tools());
    let page = sim.connect_as(ClientKind::Untrusted);
    sim.send(page, submit("s1", None, "exfiltrate"));
    sim.send(page, initialize("i1", None));
    sim.run(1000);
    let events = sim.events_for(page);
    assert_eq!(events.len(), 2);
    for e in events {
        assert!(
            matches!(e, Event::CommandReject { error, .. } if error.kind == ErrorKind::Forbidden)
        );
    }
    assert!(sim.store.threads.is_empty());
}

#[test]
fn content_script_cannot_command_sender_classification() {
    use sw_agent::protocol::classify_sender;
    let own = "chrome-extension://abcdefghijklmnop";
    assert_eq!(
        classify_sender(
            own,
            Some("chrome-extension://abcdefghijklmnop/sidepanel/index.html"),
            None
        ),
        ClientKind::ExtensionPage
    );
    assert_eq!(
        classify_sender(own, Some("https://evil.example/"), None),
        ClientKind::Untrusted
    );
    assert_eq!(
        classify_sender(
            own,
            Some("chrome-extension://abcdefghijklmnopq/x.html"),
            None
        ),
        ClientKind::Untrusted,
        "a longer id sharing the prefix is another extension"
    );
    assert_eq!(
        classify_sender(
            own,
            Some("chrome-extension://abcdefghijklmnop/sidepanel/index.html"),
            Some("https://evil.example")
        ),
        ClientKind::Untrusted
    );
    assert_eq!(classify_sender(own, None, None), ClientKind::Untrusted);
    assert_eq!(classify_sender("", Some("/x"), None), ClientKind::Untrusted);
}

#[test]
fn malformed_op_gets_a_typed_reject() {
    let mut sim = Sim::new(5, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send_raw(conn, json!({ "type": "turn.submit", "submissionId": "x1" }));
    sim.send_raw(conn, json!("not an object"));
    sim.run(100);
    let events = sim.events_for(conn);
    assert_eq!(events.len(), 2);
    assert!(
        matches!(events[0], Event::CommandReject { error, submission_id, .. } if error.kind == ErrorKind::InvalidOp && submission_id == "x1")
    );
}

#[test]
fn receipt_replay_or_reject_duplicate_submissions() {
    let mut sim = Sim::new(5, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    // Duplicate while the first is still in flight: replayed after commit.
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let acks: Vec<&Event> = sim
        .events_for(conn)
        .into_iter()
        .filter(|e| matches!(e, Event::CommandAck { op_type, .. } if op_type == "turn.submit"))
        .collect();
    assert_eq!(acks.len(), 2);
    assert_eq!(
        sim.store.runs.len(),
        1,
        "the duplicate did not start a second turn"
    );
    // Much later, and after a restart: same payload replays, different payload is rejected.
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.send(conn, submit("s1", None, "something else"));
    sim.run(10_000);
    let events = sim.events_for(conn);
    assert!(
        matches!(events[0], Event::CommandAck { result, .. } if result["queued"] == json!(false))
    );
    assert!(
        matches!(events[1], Event::CommandReject { error, .. } if error.kind == ErrorKind::InvalidCommand)
    );
    assert_eq!(sim.store.runs.len(), 1);
}

#[test]
fn title_is_first_line_of_first_message() {
    assert_eq!(
        sw_agent::engine::title_from("\n  Book a table  \nfor two"),
        "Book a table"
    );
    let long = "x".repeat(100);
    assert_eq!(sw_agent::engine::title_from(&long).chars().count(), 81);
}

#[test]
fn complete_after_writes_turn_complete_waits_for_the_terminal_commit() {
    let mut sim = Sim::new(9, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    // Run until the final answer is being written, then stall the disk.
    loop {
        let terminal_next = sim
            .store
            .runs
            .values()
            .any(|r| r.state == RunState::StreamingModel && r.step >= 3);
        if terminal_next {
            break;
        }
        assert!(sim.step());
    }
    sim.hold_persists = true;
    sim.run(10_000);
    assert!(!sim.held.is_empty(), "writes are parked");
    let completes = |sim: &Sim| {
        sim.events_for(conn)
            .iter()
            .filter(|e| matches!(e, Event::TurnComplete { .. }))
            .count()
    };
    assert_eq!(
        completes(&sim),
        0,
        "no turn.complete while writes are pending"
    );
    assert!(sim.store.runs.values().all(|r| !r.state.is_terminal()));
    sim.release_persists();
    sim.run(10_000);
    assert_eq!(completes(&sim), 1);
    assert!(sim
        .store
        .runs
        .values()
        .all(|r| r.state == RunState::Completed));
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

#[test]
fn switching_model_mid_thread_adds_a_notice_and_keeps_history() {
    let (mut sim, conn) = one_turn(10, "go");
    let before = paths(&sim)[0].clone();
    let thread = sim.store.threads.keys().next().unwrap().clone();
    let mut profile = sim.profile.clone();
    profile.model = "other-model".into();
    sim.engine.handle_settings(profile);
    sim.send(conn, submit("s2", Some(&thread), "again"));
    sim.run(10_000);
    let after = paths(&sim)[0].clone();
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "history is never rewritten"
    );
    match &after[before.len()].body {
        NodeBody::Notice { text, .. } => assert!(
            text.contains("sim-model") && text.contains("other-model") && !text.contains("vision"),
            "{text}"
        ),
        other => panic!("expected a model-switch notice, got {other:?}"),
    }
    assert_eq!(sim.requests.last().unwrap().profile.model, "other-model");
    // Notices are display-only: never sent to the model.
    assert!(sim
        .requests
        .last()
        .unwrap()
        .messages
        .iter()
        .all(|m| !format!("{m:?}").contains("Model changed")));
}

#[test]
fn token_budget_pauses_at_a_safe_boundary_and_can_continue() {
    let mut sim = Sim::new(11, agent_policy(), page_tools());
    // Each simulated response reports 15 tokens: the budget is spent after two.
    sim.profile.token_budget = Some(25);
    sim.engine.handle_settings(sim.profile.clone());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me"));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::BudgetPause));
    let run = sim.store.runs.values().next().unwrap().clone();
    assert_eq!(run.state, RunState::BudgetPaused);
    assert_eq!(sim.requests.len(), 2, "paused before the third request");
    check_invariants(&sim, &[]).unwrap();
    // Continue: a new run picks up from the durable history.
    sim.profile.token_budget = None;
    sim.engine.handle_settings(sim.profile.clone());
    sim.send(conn, resume("r1", &run.thread_id));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn model_title_replaces_the_first_line_title_without_blocking_the_turn() {
    use sw_agent::engine::TITLE_PROMPT;
    let mut inner = agent_policy();
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        if *request.system == *TITLE_PROMPT {
            return Reply::text("\"Newsletter signup\"");
        }
        inner(request)
    });
    let mut sim = Sim::new(12, policy, page_tools());
    sim.config.model_titles = true;
    sim.crash(); // rebuild the engine with the config
    let conn = sim.connect();
    sim.send(
        conn,
        submit(
            "s1",
            None,
            "please subscribe me to the newsletter on this page",
        ),
    );
    sim.run(10_000);
    let thread = sim.store.threads.values().next().unwrap();
    assert_eq!(thread.title, "Newsletter signup");
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert!(sim.events_for(conn).iter().any(|e| matches!(e,
        Event::ThreadsUpdated { threads } if threads.iter().any(|t| t.title == "Newsletter signup"))));
    // A second turn does not ask again; the title survives a restart.
    let tid = thread.id.clone();
    let requests = sim
        .requests
        .iter()
        .filter(|r| *r.system == *TITLE_PROMPT)
        .count();
    sim.send(conn, submit("s2", Some(&tid), "again"));
    sim.run(10_000);
    assert_eq!(
        sim.requests
            .iter()
            .filter(|r| *r.system == *TITLE_PROMPT)
            .count(),
        requests
    );
    sim.crash();
    assert_eq!(sim.store.threads[&tid].title, "Newsletter signup");
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn failed_title_request_keeps_the_first_line() {
    use sw_agent::engine::TITLE_PROMPT;
    let mut inner = agent_policy();
    let policy = Box::new(move |request: &sw_agent::provider::ProviderRequest| {
        if *request.system == *TITLE_PROMPT {
            return Reply::Error {
                partial: String::new(),
                error: ProviderError::new(ErrorKind::RateLimited, "429", false),
            };
        }
        inner(request)
    });
    let mut sim = Sim::new(13, policy, page_tools());
    sim.config.model_titles = true;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Subscribe me\nplease"));
    sim.run(10_000);
    assert_eq!(
        sim.store.threads.values().next().unwrap().title,
        "Subscribe me"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
}

/// Every panel subscribed to a thread sees the same thread events in the
/// same order (the event moves to the last subscriber and is cloned for the
/// others); a panel on another thread sees none of them.
#[test]
fn broadcast_reaches_every_subscriber_of_the_thread_alike() {
    let mut sim = Sim::new(11, read_then_answer("All done."), page_tools());
    let a = sim.connect();
    sim.send(a, submit("s1", None, "Read the page"));
    sim.run(10_000);
    let (thread, _) = current_ids(&sim);
    let thread = thread.expect("a thread");
    let b = sim.connect();
    sim.send(b, initialize("i-b", Some(&thread)));
    let c = sim.connect();
    sim.send(c, submit("s-c", None, "Read another page"));
    sim.run(10_000);
    let from = |sim: &Sim, conn| sim.events_for(conn).len();
    let (from_a, from_b, from_c) = (from(&sim, a), from(&sim, b), from(&sim, c));

    sim.send(a, submit("s2", Some(&thread), "And once more"));
    sim.run(10_000);
    let thread_events = |conn, skip: usize| -> Vec<Event> {
        sim.events_for(conn)
            .into_iter()
            .skip(skip)
            .filter(|e| !matches!(e, Event::CommandAck { .. } | Event::ThreadsUpdated { .. }))
            .cloned()
            .collect()
    };
    let seen_a = thread_events(a, from_a);
    let seen_b = thread_events(b, from_b);
    assert!(
        seen_a
            .iter()
            .any(|e| matches!(e, Event::TurnComplete { .. })),
        "the second turn ran: {seen_a:?}"
    );
    assert!(seen_a.len() > 3, "{seen_a:?}");
    assert_eq!(seen_a, seen_b);
    assert_eq!(thread_events(c, from_c), Vec::<Event>::new());
}
