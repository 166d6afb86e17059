//! Tools the embedding extension defines in its service worker
//! (`extension/host-tools.js`, `Binding::Host`): they join the built-in
//! tools in one registry, run without a page, and are gatekept like every
//! other tool (reads run, every write asks, and never for a whole site).

use serde_json::{json, Value};
use sw_agent::engine::ToolOutcome;
use sw_agent::model::{ApprovalStatus, NodeBody, RunState, StopReason, ToolStatus};
use sw_agent::protocol::{ApprovalDecision, ErrorKind, Event};
use sw_agent::provider::{ProviderRequest, RawToolCall};
use sw_agent::sim::{Policy, Reply, Sim, ToolFn};
use sw_agent::tools::{
    time_limit_text, Binding, HostDefinition, Recovery, ToolRegistry, TOOL_TIME_LIMIT_MS,
};

use super::support::*;

/// The built-in tools plus the two an embedder defined in JS.
fn registry() -> ToolRegistry {
    let mut registry = ToolRegistry::page_tools();
    for definition in [
        json!({
            "name": "crm_lookup",
            "label": "Look up a customer",
            "description": "Find a customer record by e-mail.",
            "parameters": {
                "type": "object",
                "properties": { "email": { "type": "string" } },
                "required": ["email"],
                "additionalProperties": false
            },
            "effects": "read",
            "execute": null
        }),
        json!({
            "name": "crm_note",
            "label": "Add a note",
            "description": "Add a note to a customer record.",
            "parameters": {
                "type": "object",
                "properties": { "email": { "type": "string" }, "text": { "type": "string" } },
                "required": ["email", "text"]
            },
            "effects": "write"
        }),
    ] {
        let descriptor = HostDefinition::parse(&definition)
            .expect("valid definition")
            .descriptor;
        registry.register(descriptor).expect("no clash");
    }
    registry
}

/// Look the customer up, add a note, then answer.
fn policy() -> Policy {
    Box::new(|request: &ProviderRequest| {
        let results = tool_results_so_far(request);
        match results {
            0 => Reply::ToolCalls {
                text: "Looking.".into(),
                calls: vec![RawToolCall {
                    id: "c_lookup".into(),
                    name: "crm_lookup".into(),
                    arguments: r#"{"email":"ada@example.com"}"#.into(),
                }],
                stop: StopReason::ToolUse,
            },
            1 => Reply::call(
                "c_note",
                "crm_note",
                r#"{"email":"ada@example.com","text":"VIP"}"#,
            ),
            _ => Reply::text("Noted."),
        }
    })
}

fn host_world() -> ToolFn {
    Box::new(|name: &str, params: &Value| match name {
        "crm_lookup" => ToolOutcome::text(
            true,
            format!("Ada Lovelace <{}>", params["email"].as_str().unwrap_or("")),
        ),
        "crm_note" => ToolOutcome::text(true, "Note added."),
        other => ToolOutcome::text(false, format!("unknown tool {other}")),
    })
}

/// How many times the world saw `name` run.
fn ran(sim: &Sim, name: &str) -> usize {
    sim.dispatches.iter().filter(|d| d.name == name).count()
}

fn waiting_for_the_note(seed: u64) -> (Sim, u64, String, sw_agent::model::ApprovalRecord) {
    let mut sim = Sim::new(seed, policy(), host_world());
    sim.config.registry = registry();
    sim.reconfigure();
    sim.auto_approve = None;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Note that Ada is a VIP"));
    sim.run(10_000);
    let run = sim.store.runs.values().next().unwrap().clone();
    assert_eq!(
        run.state,
        RunState::WaitingApproval,
        "the write waits for the user"
    );
    let approval = sim
        .events
        .iter()
        .filter_map(|(_, e)| match &e.event {
            Event::ApprovalRequest { approval, .. } => Some(approval.clone()),
            _ => None,
        })
        .next_back()
        .expect("asked");
    (sim, conn, run.thread_id, approval)
}

#[test]
fn host_tools_join_the_catalog_run_without_a_page_and_every_write_asks() {
    let (mut sim, conn, thread, approval) = waiting_for_the_note(401);
    // The model was offered them, with their own schemas.
    let offered: Vec<&str> = sim.requests[0]
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        offered.contains(&"crm_lookup") && offered.contains(&"crm_note"),
        "{offered:?}"
    );
    // The read ran without asking and without a page.
    let lookup = sim
        .dispatches
        .iter()
        .find(|d| d.name == "crm_lookup")
        .expect("ran");
    assert_eq!(lookup.target, None, "a host tool acts on no page");
    assert_eq!(lookup.params, json!({ "email": "ada@example.com" }));
    // The write asks, with its parameters and no site.
    assert_eq!(approval.tool_name, "crm_note");
    assert_eq!(approval.label, "Add a note");
    assert_eq!(approval.origin, "");
    assert_eq!(
        approval.params,
        json!({ "email": "ada@example.com", "text": "VIP" })
    );
    assert!(
        !sim.dispatches.iter().any(|d| d.name == "crm_note"),
        "not before the answer"
    );

    // "Allow on this site" has no site to name: refused, nothing changes.
    sim.send(
        conn,
        approval_response("r1", &thread, &approval.id, ApprovalDecision::AcceptForSite),
    );
    sim.run(10_000);
    let error = answer(&sim, conn, "r1").expect("answered").unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidCommand);
    assert!(error.message.contains("not on a site"), "{}", error.message);
    assert!(
        sim.store.site_rules.is_empty(),
        "no rule for an empty origin"
    );
    assert_eq!(
        sim.store.approvals[&approval.id].status,
        ApprovalStatus::Pending
    );

    // Allowed once: it runs once, and the turn ends.
    sim.send(
        conn,
        approval_response("r2", &thread, &approval.id, ApprovalDecision::AcceptOnce),
    );
    sim.run(10_000);
    assert_eq!(ran(&sim, "crm_note"), 1);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_declined_host_write_names_no_site_to_the_model() {
    let (mut sim, conn, thread, approval) = waiting_for_the_note(402);
    sim.send(
        conn,
        approval_response("r1", &thread, &approval.id, ApprovalDecision::Decline),
    );
    sim.run(10_000);
    let declined = paths(&sim)[0]
        .iter()
        .find_map(|n| match &n.body {
            NodeBody::ToolResult {
                name,
                status,
                content,
                ..
            } if name == "crm_note" => Some((*status, content.clone())),
            _ => None,
        })
        .expect("a result for the model");
    assert_eq!(declined.0, ToolStatus::Denied);
    assert!(
        declined
            .1
            .starts_with("The user declined this action (Add a note)."),
        "{}",
        declined.1
    );
    assert!(!sim.dispatches.iter().any(|d| d.name == "crm_note"));
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_host_tool_definition_is_checked_field_by_field() {
    let parsed = HostDefinition::parse(&json!({
        "name": "crm_note", "description": "Add a note.", "effects": "write", "execute": {}
    }))
    .unwrap();
    assert_eq!(
        parsed.time_limit_ms, TOOL_TIME_LIMIT_MS,
        "the page tools' limit by default"
    );
    let ok = parsed.descriptor;
    assert_eq!(ok.binding, Binding::Host);
    assert_eq!(ok.label, "crm_note", "the label defaults to the name");
    assert_eq!(
        ok.recovery,
        Recovery::NeverRetry,
        "a write is never retried by default"
    );
    assert_eq!(
        ok.parameters["type"], "object",
        "no parameters: an empty object schema"
    );
    let read = HostDefinition::parse(&json!({
        "name": "crm_lookup", "description": "Find.", "effects": "read", "recovery": "inspect-first",
        "timeoutMs": 300000
    }))
    .unwrap();
    assert_eq!(read.descriptor.recovery, Recovery::InspectFirst);
    assert_eq!(read.time_limit_ms, 300_000);
    let quick = HostDefinition::parse(&json!({
        "name": "crm_ping", "description": "Ping.", "effects": "read", "timeoutMs": 1
    }))
    .unwrap();
    assert_eq!(quick.time_limit_ms, 1);
    // How a limit reads in the error result the model gets.
    assert_eq!(time_limit_text(TOOL_TIME_LIMIT_MS), "60 seconds");
    assert_eq!(time_limit_text(1000), "1 second");
    assert_eq!(time_limit_text(1500), "1500 ms");
    assert_eq!(
        quick.descriptor,
        HostDefinition::parse(
            &json!({ "name": "crm_ping", "description": "Ping.", "effects": "read" })
        )
        .unwrap()
        .descriptor,
        "the limit is not part of the tool's descriptor (nor its digest)"
    );

    let refused = |definition: Value| HostDefinition::parse(&definition).unwrap_err().0;
    assert!(refused(json!("crm")).contains("must be an object"));
    assert!(refused(json!({ "description": "x", "effects": "read" })).contains("string `name`"));
    assert!(refused(json!({ "name": "t", "effects": "read" })).contains("needs a `description`"));
    let missing = refused(json!({ "name": "t", "description": "x" }));
    assert!(
        missing.contains("\"t\"") && missing.contains("`effects` must be"),
        "{missing}"
    );
    assert!(
        refused(json!({ "name": "t", "description": "x", "effects": "delete" }))
            .contains("`effects` must be")
    );
    assert!(
        refused(json!({ "name": "t", "description": "x", "effect": "read" }))
            .contains("unknown field `effect`")
    );
    assert!(
        refused(json!({ "name": "t", "description": 3, "effects": "read" }))
            .contains("`description` must be a string")
    );
    assert!(refused(
        json!({ "name": "t", "description": "x", "effects": "read", "recovery": "maybe" })
    )
    .contains("`recovery` must be"));
    for limit in [json!(0), json!(-5), json!(1.5), json!(300_001), json!(1e12)] {
        let message = refused(
            json!({ "name": "t", "description": "x", "effects": "read", "timeoutMs": limit }),
        );
        assert!(
            message.contains("\"t\"")
                && message.contains(
                    "`timeoutMs` must be a whole number of milliseconds from 1 to 300000"
                ),
            "{limit}: {message}"
        );
    }
    assert!(refused(
        json!({ "name": "t", "description": "x", "effects": "read", "timeoutMs": "60s" })
    )
    .contains("`timeoutMs` must be a number"));
    for definition in [
        json!({ "name": "t", "description": "x", "effects": "write", "parallelSafe": true }),
        json!({ "name": "t", "description": "x", "effects": "read", "recovery": "inspect-first", "parallelSafe": true }),
    ] {
        assert!(
            refused(definition).contains("`parallelSafe` is for reads that are safe to run again"),
        );
    }
    assert!(refused(
        json!({ "name": "t", "description": "x", "effects": "read", "parallelSafe": "yes" })
    )
    .contains("`parallelSafe` must be true or false"));
    let parallel = HostDefinition::parse(
        &json!({ "name": "t", "description": "x", "effects": "read", "parallelSafe": true }),
    )
    .unwrap()
    .descriptor;
    assert!(parallel.parallel_safe);

    // The registry checks what every tool must satisfy: the name, the
    // schema, and no clash with a built-in tool.
    let mut registry = ToolRegistry::page_tools();
    let register = |registry: &mut ToolRegistry, definition: Value| {
        registry
            .register(HostDefinition::parse(&definition).unwrap().descriptor)
            .unwrap_err()
            .0
    };
    assert!(register(
        &mut registry,
        json!({ "name": "click", "description": "x", "effects": "read" })
    )
    .contains("already registered"));
    assert!(register(
        &mut registry,
        json!({ "name": "bad name", "description": "x", "effects": "read" })
    )
    .contains("must be 1-64 characters"));
    assert!(register(&mut registry, json!({ "name": "t", "description": "x", "effects": "read", "parameters": { "type": "string" } })).contains("JSON Schema of type object"));
}

#[test]
fn never_retry_at_most_once_a_host_write_running_at_a_crash_is_never_run_again() {
    let (mut sim, conn, thread, approval) = waiting_for_the_note(403);
    sim.send(
        conn,
        approval_response("r1", &thread, &approval.id, ApprovalDecision::AcceptOnce),
    );
    while !sim.dispatches.iter().any(|d| d.name == "crm_note") {
        assert!(sim.step());
    }
    // The extension's function ran; its result never reached the store.
    sim.crash();
    sim.run(10_000);
    assert_eq!(ran(&sim, "crm_note"), 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(
        run.state,
        RunState::PausedUncertain,
        "the user says whether it happened"
    );
    assert_eq!(
        run.in_flight_tool.as_ref().map(|t| t.name.as_str()),
        Some("crm_note")
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn a_run_is_not_resumed_by_a_worker_whose_host_tools_changed() {
    let (mut sim, _, _, _) = waiting_for_the_note(404);
    // An update changed the extension's note tool (now a read).
    let mut registry = ToolRegistry::page_tools();
    for definition in [
        json!({ "name": "crm_lookup", "label": "Look up a customer", "description": "Find a customer record by e-mail.",
                "parameters": { "type": "object", "properties": { "email": { "type": "string" } }, "required": ["email"], "additionalProperties": false },
                "effects": "read" }),
        json!({ "name": "crm_note", "label": "Add a note", "description": "Add a note to a customer record.",
                "parameters": { "type": "object", "properties": { "email": { "type": "string" }, "text": { "type": "string" } }, "required": ["email", "text"] },
                "effects": "read" }),
    ] {
        registry
            .register(HostDefinition::parse(&definition).unwrap().descriptor)
            .unwrap();
    }
    sim.config.registry = registry;
    sim.crash();
    sim.run(10_000);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.state, RunState::Failed);
    let error = run.error.as_ref().expect("says why");
    assert_eq!(error.kind, ErrorKind::EnvironmentDrift);
    assert!(error.message.contains("crm_note"), "{}", error.message);
    assert!(
        !sim.dispatches.iter().any(|d| d.name == "crm_note"),
        "never run in the changed environment"
    );
}

#[test]
fn an_approved_host_write_runs_once_after_a_crash_right_after_the_decision() {
    let (mut sim, conn, thread, approval) = waiting_for_the_note(405);
    sim.send(
        conn,
        approval_response("r1", &thread, &approval.id, ApprovalDecision::AcceptOnce),
    );
    while sim.store.approvals[&approval.id].status != ApprovalStatus::AcceptedOnce {
        assert!(sim.step());
    }
    assert!(!sim.dispatches.iter().any(|d| d.name == "crm_note"));
    sim.crash();
    sim.run(10_000);
    assert_eq!(ran(&sim, "crm_note"), 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(
        run.state,
        RunState::Completed,
        "the turn went on to the end"
    );
    check_invariants(&sim, &[]).unwrap();
}

#[test]
fn parallel_safe_host_reads_run_together_with_page_reads_and_writes_stay_barriers() {
    let mut registry = registry();
    for name in ["crm_orders", "crm_tickets"] {
        registry
            .register(
                HostDefinition::parse(&json!({
                    "name": name, "description": "List them.", "effects": "read", "parallelSafe": true
                }))
                .unwrap()
                .descriptor,
            )
            .unwrap();
    }
    let calls = vec![
        call("a", "crm_orders", "{}"),
        call("b", "page_snapshot", "{}"),
        call("c", "crm_tickets", "{}"),
        // Not parallel-safe: after the batch, alone.
        call("d", "crm_lookup", r#"{"email":"ada@example.com"}"#),
        call("e", "crm_orders", "{}"),
    ];
    let world = || -> ToolFn {
        Box::new(|name: &str, _: &Value| ToolOutcome::text(true, format!("{name} ok")))
    };
    let mut sim = Sim::new(405, once(calls), world());
    sim.config.registry = registry.clone();
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "What does Ada have open?"));
    // Until the first result is durable, the three reads were all out.
    while result_ids(&sim).is_empty() {
        assert!(sim.step());
    }
    let out: Vec<(&str, bool)> = sim
        .dispatches
        .iter()
        .map(|d| (d.call_id.as_str(), d.target.is_some()))
        .collect();
    assert_eq!(
        out,
        vec![("a", false), ("b", true), ("c", false)],
        "one batch: the extension's reads without a page, the page read on it"
    );
    assert_eq!(result_ids(&sim), vec!["a", "b", "c"], "model order");
    sim.run(10_000);
    let order: Vec<&str> = sim.dispatches.iter().map(|d| d.call_id.as_str()).collect();
    assert_eq!(order, vec!["a", "b", "c", "d", "e"]);
    assert_eq!(result_ids(&sim), vec!["a", "b", "c", "d", "e"]);
    check_invariants(&sim, &[]).unwrap();

    // Only the extension's reads in a row: a batch without asking for a page.
    let only_host = vec![
        call("x", "crm_orders", "{}"),
        call("y", "crm_tickets", "{}"),
    ];
    let mut sim2 = Sim::new(406, once(only_host), world());
    sim2.config.registry = registry;
    sim2.reconfigure();
    let conn = sim2.connect();
    sim2.send(conn, submit("s1", None, "go"));
    while result_ids(&sim2).is_empty() {
        assert!(sim2.step());
    }
    assert_eq!(sim2.dispatches.len(), 2, "both out before either result");
    assert!(sim2.dispatches.iter().all(|d| d.target.is_none()));
    sim2.run(10_000);
    assert_eq!(result_ids(&sim2), vec!["x", "y"]);
    check_invariants(&sim2, &[]).unwrap();
}

#[test]
fn an_extension_keeps_only_the_built_in_tools_it_names_and_may_reuse_a_freed_name() {
    let mut registry = ToolRegistry::page_tools();
    let unknown = registry.retain_named(&[
        "read_page".to_string(),
        "ask_user".to_string(),
        "clik".to_string(),
    ]);
    assert_eq!(unknown, vec!["clik".to_string()], "named for the console");
    let names: Vec<&str> = registry
        .descriptors()
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, vec!["read_page", "ask_user"]);
    // The extension's own `click` may take the freed name; it asks as a
    // write of the extension's, not as a page click.
    let own_click = HostDefinition::parse(&json!({
        "name": "click", "description": "Click in our own app.", "effects": "write"
    }))
    .unwrap()
    .descriptor;
    registry.register(own_click).unwrap();
    assert_eq!(registry.get("click").unwrap().binding, Binding::Host);
    // None named: only the extension's own tools remain.
    let mut none = ToolRegistry::page_tools();
    assert!(none.retain_named(&[]).is_empty());
    assert!(none.descriptors().is_empty());
}

#[test]
fn a_host_tool_s_details_are_kept_for_the_ui_and_oversized_ones_become_a_note() {
    use sw_agent::engine::MAX_RESULT_DETAILS_BYTES;
    let world: ToolFn = Box::new(|name: &str, _params: &Value| {
        let mut outcome = ToolOutcome::text(true, format!("{name} done."));
        outcome.details = Some(match name {
            // Just within the limit once written as JSON (the quotes and
            // the key take 11 bytes).
            "crm_lookup" => json!({ "card": "x".repeat(MAX_RESULT_DETAILS_BYTES - 11) }),
            _ => json!({ "card": "y".repeat(MAX_RESULT_DETAILS_BYTES) }),
        });
        outcome
    });
    let mut sim = Sim::new(160, policy(), world);
    sim.config.registry = registry();
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "Note that Ada is a VIP"));
    sim.run(10_000);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    let details = |tool: &str| {
        sim.store
            .nodes
            .values()
            .find_map(|n| match &n.body {
                NodeBody::ToolResult { name, details, .. } if name == tool => details.clone(),
                _ => None,
            })
            .expect("a result with details")
    };
    let lookup = details("crm_lookup");
    assert_eq!(
        serde_json::to_string(&lookup).unwrap().len(),
        MAX_RESULT_DETAILS_BYTES
    );
    assert_eq!(
        lookup["card"].as_str().unwrap().len(),
        MAX_RESULT_DETAILS_BYTES - 11
    );
    let note = details("crm_note");
    let omitted = note["omitted"].as_str().expect("a note instead");
    assert!(
        omitted.contains(&format!("{}", MAX_RESULT_DETAILS_BYTES + 11))
            && omitted.contains("left out"),
        "{omitted}"
    );
    // Never sent to the model.
    for request in &sim.requests {
        let sent = format!("{:?}", request.messages);
        assert!(!sent.contains("xxxxxxxx") && !sent.contains("omitted"));
    }
    // The node a reload reads is the node memory held.
    sim.crash();
    let conn = reconnect(&mut sim);
    sim.run(10_000);
    let _ = conn;
    check_invariants(&sim, &[]).unwrap();
}
