//! Run environment snapshots and resume_refuses_drift.

use serde_json::json;
use sw_agent::engine::{build_environment, EngineConfig, EnvironmentLimits};
use sw_agent::model::{NodeBody, RunState};
use sw_agent::protocol::ErrorKind;
use sw_agent::sim::Sim;
use sw_agent::tools::{Binding, Effects, Level, Recovery, ToolDescriptor, ToolRegistry};

use super::support::*;

/// Start a turn and crash while the first request streams.
fn crashed_mid_stream(seed: u64) -> Sim {
    let mut sim = Sim::new(seed, agent_policy(), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    sim
}

/// Restart the worker with `config` (the registry or prompt changed meanwhile).
fn resume_with(sim: &mut Sim, config: EngineConfig) -> RunState {
    sim.config = config;
    sim.crash();
    sim.run(10_000);
    sim.store.runs.values().next().unwrap().state
}

fn drift_message(sim: &Sim) -> String {
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(
        run.error.as_ref().unwrap().kind,
        ErrorKind::EnvironmentDrift
    );
    run.error.as_ref().unwrap().message.clone()
}

#[test]
fn environment_is_frozen_with_the_run_without_the_key() {
    let (sim, _) = one_turn(60, "go");
    // Written once, in its own record, with the checkpoint that started the
    // run; the step checkpoints rewrite only the (small) run record.
    let run = sim.store.runs.values().next().unwrap();
    assert!(run.environment.is_none());
    assert!(serde_json::to_value(run)
        .unwrap()
        .get("environment")
        .is_none());
    assert_eq!(sim.store.environments.len(), 1);
    assert_eq!(sim.store.environments[&run.id].thread_id, run.thread_id);
    let env = sim
        .store
        .environments
        .values()
        .next()
        .unwrap()
        .environment
        .clone();
    // The simulated model has no vision: the screenshot tool is not in its catalog.
    assert_eq!(
        env.tools.len(),
        ToolRegistry::page_tools().descriptors().len() - 1
    );
    assert!(!env.tools.iter().any(|t| t.name == "screenshot"));
    assert!(env.tools.iter().all(|t| t.digest.len() == 64));
    assert_eq!(env.transport, "openai");
    assert!(env.credential_ref.contains("settings.apiKey"));
}

#[test]
fn resume_refuses_drift_changed_tool_schema() {
    let mut sim = crashed_mid_stream(61);
    let config = EngineConfig {
        registry: registry_with_changed_click(),
        ..EngineConfig::default()
    };
    assert_eq!(resume_with(&mut sim, config), RunState::Failed);
    assert!(drift_message(&sim).contains("the tool click changed"));
    assert_eq!(
        sim.requests.len(),
        1,
        "nothing ran in the drifted environment"
    );
    let path = &paths(&sim)[0];
    assert!(
        matches!(&path.last().unwrap().body, NodeBody::Notice { text, .. } if text.contains("cannot resume"))
    );
}

#[test]
fn resume_refuses_drift_changed_security_metadata() {
    let mut sim = crashed_mid_stream(62);
    let mut config = EngineConfig::default();
    let mut registry = ToolRegistry::new();
    for d in ToolRegistry::page_tools().descriptors() {
        let mut d = d.clone();
        if d.name == "click" {
            d.recovery = Recovery::RetrySafe;
        }
        registry.register(d).unwrap();
    }
    config.registry = registry;
    assert_eq!(resume_with(&mut sim, config), RunState::Failed);
    assert!(drift_message(&sim).contains("click"));
}

#[test]
fn resume_refuses_drift_changed_prompt_and_removed_tool() {
    let mut sim = crashed_mid_stream(63);
    let mut config = EngineConfig::default();
    config.system_prompt.push_str(" Be terse.");
    let mut registry = ToolRegistry::new();
    registry
        .register(ToolRegistry::page_tools().get("read_page").unwrap().clone())
        .unwrap();
    config.registry = registry;
    assert_eq!(resume_with(&mut sim, config), RunState::Failed);
    let message = drift_message(&sim);
    assert!(message.contains("system prompt changed"), "{message}");
    assert!(
        message.contains("click is no longer available"),
        "{message}"
    );
}

#[test]
fn resume_refuses_drift_changed_transport_but_accepts_same_environment() {
    let mut sim = crashed_mid_stream(64);
    sim.profile.kind = "anthropic".into();
    assert_eq!(
        resume_with(&mut sim, EngineConfig::default()),
        RunState::Failed
    );
    assert!(drift_message(&sim).contains("transport changed (openai → anthropic)"));

    let mut sim = crashed_mid_stream(65);
    // The key may rotate and the base URL may move: not part of the drift
    // check (the platform sends the saved key only to the address Settings
    // name: provider::key_may_go_to; the run then fails asking for Continue).
    sim.profile.base_url = "http://127.0.0.1:2/v1".into();
    assert_eq!(
        resume_with(&mut sim, EngineConfig::default()),
        RunState::Completed
    );
}

#[test]
fn environment_over_limit_is_a_clear_error_not_a_truncation() {
    let config = EngineConfig::default();
    let profile = sw_agent::model::ProviderProfile {
        kind: "openai".into(),
        base_url: "http://x/v1".into(),
        model: "m".into(),
        max_output_tokens: None,
        temperature_centi: None,
        vision: false,
        tool_use: true,
        token_budget: None,
        context_window: None,
    };
    let tight = EnvironmentLimits {
        max_entries: 1,
        ..EnvironmentLimits::default()
    };
    let err = build_environment(&config, &profile, &tight).unwrap_err();
    assert_eq!(err.kind, ErrorKind::EnvironmentTooLarge);
    assert!(err.message.contains("at most 1"));

    let mut deep = json!({ "type": "string" });
    for _ in 0..40 {
        deep = json!({ "type": "object", "properties": { "x": deep } });
    }
    let mut registry = ToolRegistry::page_tools();
    registry
        .register(ToolDescriptor {
            name: "deep".into(),
            label: "Deep".into(),
            description: "nested".into(),
            parameters: deep,
            level: Level::Builtin,
            effects: Effects::Read,
            recovery: Recovery::RetrySafe,
            binding: Binding::Page,
            parallel_safe: false,
            requires_vision: false,
            diff_details: false,
        })
        .unwrap();
    let config = EngineConfig {
        registry,
        ..EngineConfig::default()
    };
    let err = build_environment(&config, &profile, &EnvironmentLimits::default()).unwrap_err();
    assert!(err.message.contains("nested"), "{}", err.message);

    // A run started with such a catalog fails at once and says why.
    let mut sim = Sim::new(66, agent_policy(), page_tools());
    sim.config = config;
    sim.crash(); // rebuild the engine with the new config
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(
        run.error.as_ref().unwrap().kind,
        ErrorKind::EnvironmentTooLarge
    );
    assert!(sim.requests.is_empty());
}

#[test]
fn model_capabilities_shape_the_catalog_on_new_and_resumed_runs() {
    // Without tool use: no schema is sent at all, also after a restart.
    let mut sim = Sim::new(67, agent_policy(), page_tools());
    sim.profile.tool_use = false;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    while sim.requests.is_empty() {
        assert!(sim.step());
    }
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    assert!(sim.requests.len() >= 2);
    assert!(sim.requests.iter().all(|r| r.tools.is_empty()));
    let env = sim
        .store
        .environments
        .values()
        .next()
        .unwrap()
        .environment
        .clone();
    assert!(env.tools.is_empty());

    // With vision the screenshot tool is offered.
    let mut sim = Sim::new(68, agent_policy(), page_tools());
    sim.profile.vision = true;
    sim.crash();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert!(sim.requests[0].tools.iter().any(|t| t.name == "screenshot"));
}

#[test]
fn resume_refuses_drift_for_a_run_left_unfinished_by_the_previous_record_shape() {
    // A run written while the environment lived in the run record (DB
    // version 3): the restarted engine moves it to its own record at once,
    // so the drift check survives the run's next checkpoints and restarts.
    let mut sim = crashed_mid_stream(69);
    let run_id = sim.store.runs.keys().next().unwrap().clone();
    let environment = sim.store.environments.remove(&run_id).unwrap().environment;
    sim.store.runs.get_mut(&run_id).unwrap().environment = Some(environment.clone());
    sim.crash();
    sim.step();
    assert_eq!(sim.store.environments[&run_id].environment, environment);
    // The registry changes before a second restart: still refused.
    let config = EngineConfig {
        registry: registry_with_changed_click(),
        ..EngineConfig::default()
    };
    assert_eq!(resume_with(&mut sim, config), RunState::Failed);
    assert!(drift_message(&sim).contains("click"));
}

#[test]
fn steps_of_a_run_share_one_system_prompt_and_one_tool_list() {
    // The body cache reuses the body around the messages while a request
    // points at the same prompt and tools (`provider::body`); the engine
    // builds them once instead of copying every schema at every step.
    let mut sim = Sim::new(71, agent_policy(), page_tools());
    sim.keep_request_messages = false;
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    let steps: Vec<_> = sim
        .requests
        .iter()
        .filter(|r| !r.tools.is_empty())
        .cloned()
        .collect();
    assert!(steps.len() >= 3, "{} step requests", steps.len());
    for r in &steps[1..] {
        assert!(std::rc::Rc::ptr_eq(&r.tools, &steps[0].tools));
        assert!(std::rc::Rc::ptr_eq(&r.system, &steps[0].system));
    }
    // A restarted worker builds its own, equal to the first.
    sim.send(conn, submit("s2", None, "again"));
    sim.crash();
    reconnect(&mut sim);
    sim.run(10_000);
    let after = sim.requests.last().unwrap();
    assert_eq!(after.tools, steps[0].tools);
    assert_eq!(after.system, steps[0].system);
}

#[test]
fn an_extension_s_instructions_extend_the_system_prompt_and_a_change_is_drift() {
    use sw_agent::engine::{DEFAULT_SYSTEM_PROMPT, MAX_INSTRUCTIONS_BYTES};
    let instructions = "You work for Acme support. Look customers up with crm_lookup.";
    let mut config = EngineConfig::default();
    config
        .add_instructions(&format!("\n  {instructions}\n"))
        .unwrap();
    assert_eq!(
        config.system_prompt,
        format!("{DEFAULT_SYSTEM_PROMPT}\n\n{instructions}"),
        "after the engine's own prompt, trimmed: its page-text rule stays"
    );

    // Blank adds nothing; too long is refused and changes nothing.
    let mut blank = EngineConfig::default();
    blank.add_instructions(" \n ").unwrap();
    assert_eq!(blank.system_prompt, DEFAULT_SYSTEM_PROMPT);
    let mut long = EngineConfig::default();
    let error = long
        .add_instructions(&"x".repeat(MAX_INSTRUCTIONS_BYTES + 1))
        .unwrap_err();
    assert!(error.contains("at most 32768"), "{error}");
    assert_eq!(long.system_prompt, DEFAULT_SYSTEM_PROMPT);

    // The model gets them with every request of a run.
    let mut sim = Sim::new(73, agent_policy(), page_tools());
    sim.config = config.clone();
    sim.reconfigure();
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    // (Every step request; a title request has its own prompt.)
    let steps: Vec<_> = sim
        .requests
        .iter()
        .filter(|r| !r.tools.is_empty())
        .collect();
    assert!(steps.len() >= 2, "{} step requests", steps.len());
    for request in steps {
        assert!(request.system.ends_with(instructions), "{}", request.system);
    }

    // A run that started with them resumes under the same ones, and not
    // under others (an update changed instructions.js).
    let started_with = |seed: u64| {
        let mut sim = Sim::new(seed, agent_policy(), page_tools());
        sim.config = config.clone();
        sim.reconfigure();
        let conn = sim.connect();
        sim.send(conn, submit("s1", None, "go"));
        while sim.requests.is_empty() {
            assert!(sim.step());
        }
        sim
    };
    let mut same = started_with(74);
    assert_eq!(resume_with(&mut same, config.clone()), RunState::Completed);
    let mut changed = EngineConfig::default();
    changed.add_instructions("You work for Globex.").unwrap();
    let mut other = started_with(75);
    assert_eq!(resume_with(&mut other, changed), RunState::Failed);
    assert!(drift_message(&other).contains("system prompt changed"));
}
