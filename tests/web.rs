//! Browser tests of the platform glue, run by `scripts/test-wasm.sh` inside a
//! real service worker in Chrome and Firefox.

#![cfg(target_arch = "wasm32")]

use sw_agent::engine::{Effect, Engine, EngineConfig, ToolOutcome};
use sw_agent::model::{NodeBody, ProviderProfile, Run, RunState, StopReason, Thread, Usage};
use sw_agent::platform::idb::IdbStore;
use sw_agent::protocol::{ClientKind, Event, Op, Submission, UserInput};
use sw_agent::provider::{ProviderResponse, RawToolCall, StreamEvent};
use sw_agent::store::{stores, Record, UnitOfWork};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_service_worker);

fn thread(id: &str) -> Thread {
    Thread {
        id: id.into(),
        title: "t".into(),
        leaf_id: None,
        created_at: 1,
        updated_at: 2,
        revision: 1,
        parent_thread_id: None,
        usage: Usage::default(),
    }
}

#[wasm_bindgen_test]
async fn idb_multi_store_unit_survives_close_and_reopen() {
    let name = "sw-agent-test-roundtrip";
    let _ = IdbStore::delete(name).await;
    let store = IdbStore::open(name).await.unwrap();
    let run = Run {
        id: "r1".into(),
        thread_id: "t1".into(),
        state: RunState::StreamingModel,
        created_at: 1,
        updated_at: 1,
        revision: 1,
        step: 0,
        profile: ProviderProfile::default(),
        consecutive_failures: 0,
        tools_disabled: false,
        in_flight_tool: None,
        pending_approval: None,
        pending_interaction: None,
        stop_reason: None,
        error: None,
        usage: Usage::default(),
        environment: None,
    };
    let node = sw_agent::model::Node {
        id: "n1".into(),
        thread_id: "t1".into(),
        parent_id: None,
        created_at: 3,
        body: NodeBody::UserMessage {
            text: "héllo 😀".into(),
            steered: false,
        },
    };
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread("t1")))
        .put(Record::Node(node.clone()))
        .put(Record::Run(run.clone()));
    store.commit(&unit).await.unwrap();
    // A second unit deletes and puts across stores atomically.
    let mut second = UnitOfWork::new();
    second
        .put(Record::Thread(thread("t2")))
        .delete(stores::THREADS, "t1");
    store.commit(&second).await.unwrap();
    store.close();

    let store = IdbStore::open(name).await.unwrap();
    let (image, skipped) = store.load_image().await.unwrap();
    assert!(skipped.is_empty());
    assert_eq!(image.threads.len(), 1);
    assert_eq!(image.threads[0].id, "t2");
    assert_eq!(image.runs, vec![run]);
    assert_eq!(image.loaded_threads, vec!["t1".to_string()]);
    assert_eq!(image.nodes, vec![node]);
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
async fn idb_undecodable_record_is_skipped_not_fatal() {
    let name = "sw-agent-test-corrupt";
    let _ = IdbStore::delete(name).await;
    let store = IdbStore::open(name).await.unwrap();
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread("good")));
    store.commit(&unit).await.unwrap();
    // A record written by something else, with the wrong shape.
    store
        .put_raw_for_tests(stores::THREADS, r#"{"id":"bad","title":42}"#)
        .await
        .unwrap();
    let (image, skipped) = store.load_image().await.unwrap();
    assert_eq!(image.threads.len(), 1);
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        store.dump(stores::THREADS).await.unwrap().len(),
        2,
        "nothing was deleted"
    );
    store.close();
    IdbStore::delete(name).await.unwrap();
}

/// Drive an engine against IndexedDB with a scripted model and tools.
async fn drive(
    engine: &mut Engine,
    store: &IdbStore,
    script: &mut Vec<ProviderResponse>,
    events: &mut Vec<Event>,
) {
    let mut now = 100;
    while let Some(effect) = engine.poll_effect() {
        now += 1;
        match effect {
            Effect::Persist { token, unit } => {
                store.commit(&unit).await.unwrap();
                engine.handle_store_ack(now, token);
            }
            Effect::CallProvider { request_id, .. } => {
                let response = script.remove(0);
                engine.handle_provider_delta(
                    now,
                    request_id,
                    StreamEvent::TextDelta(response.text.clone()),
                );
                engine.handle_provider_done(now, request_id, Ok(response));
            }
            Effect::DispatchTool { dispatch_id, .. } => {
                engine.handle_tool_result(now, dispatch_id, ToolOutcome::text(true, "PAGE"))
            }
            Effect::LoadThread { thread_id } => {
                let (nodes, _) = store.thread_nodes(&thread_id).await.unwrap();
                engine.handle_thread_loaded(now, &thread_id, nodes);
            }
            Effect::Send { event, .. } => events.push(event.event),
            _ => {}
        }
    }
}

#[wasm_bindgen_test]
async fn engine_turn_persists_to_idb_and_a_new_engine_recovers_it() {
    let name = "sw-agent-test-engine";
    let _ = IdbStore::delete(name).await;
    let store = IdbStore::open(name).await.unwrap();
    let profile = ProviderProfile {
        kind: "openai".into(),
        base_url: "http://127.0.0.1:1/v1".into(),
        model: "m".into(),
        max_output_tokens: None,
        temperature_centi: None,
        vision: false,
        tool_use: true,
        token_budget: None,
    };
    let (image, _) = store.load_image().await.unwrap();
    let mut engine = Engine::new(EngineConfig::default(), profile.clone(), 1, image, 100);
    engine.handle_connect(1, ClientKind::ExtensionPage);
    engine.handle_op(
        100,
        1,
        Op::TurnSubmit {
            submission: Submission {
                client_id: "c".into(),
                submission_id: "s".into(),
            },
            thread_id: None,
            input: UserInput { text: "go".into() },
        },
    );
    let response = |text: &str, calls: Vec<RawToolCall>, stop| ProviderResponse {
        text: text.into(),
        reasoning: String::new(),
        tool_calls: calls,
        stop_reason: stop,
        usage: None,
        model: "m".into(),
        private: None,
    };
    let mut script = vec![
        response(
            "",
            vec![RawToolCall {
                id: "c1".into(),
                name: "read_page".into(),
                arguments: "{}".into(),
            }],
            StopReason::ToolUse,
        ),
        response("done", vec![], StopReason::End),
    ];
    let mut events = Vec::new();
    drive(&mut engine, &store, &mut script, &mut events).await;
    assert!(events.iter().any(|e| matches!(
        e,
        Event::TurnComplete {
            stop_reason: StopReason::End,
            ..
        }
    )));
    drop(engine);
    store.close();

    // A fresh worker: reopen, reload, subscribe; the thread is intact.
    let store = IdbStore::open(name).await.unwrap();
    let (image, _) = store.load_image().await.unwrap();
    let mut engine = Engine::new(EngineConfig::default(), profile, 2, image, 200);
    engine.handle_connect(7, ClientKind::ExtensionPage);
    engine.handle_op(
        200,
        7,
        Op::Initialize {
            submission: Submission {
                client_id: "c".into(),
                submission_id: "i".into(),
            },
            thread_id: None,
        },
    );
    let mut events = Vec::new();
    drive(&mut engine, &store, &mut Vec::new(), &mut events).await;
    let snapshot = events.iter().find_map(|e| match e {
        Event::Initialized { snapshot } => Some(snapshot.clone()),
        _ => None,
    });
    let thread = snapshot.unwrap().thread.unwrap();
    let kinds: Vec<&str> = thread.nodes.iter().map(|n| n.kind_name()).collect();
    assert_eq!(
        kinds,
        vec![
            "turn_context",
            "user_message",
            "assistant_message",
            "tool_call",
            "tool_result",
            "assistant_message"
        ]
    );
    assert_eq!(thread.run.unwrap().state, RunState::Completed);
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
fn api_key_never_persisted_settings_split_keeps_key_out_of_profile() {
    let settings = js_sys::JSON::parse(
        r#"{"provider":"openai","baseUrl":" http://x/v1 ","model":"m","apiKey":"sk-secret","maxOutputTokens":null,"temperature":0.3}"#,
    )
    .unwrap();
    let (profile, key) = sw_agent::platform::parse_settings(&settings);
    assert_eq!(key, "sk-secret");
    assert_eq!(profile.base_url, "http://x/v1");
    assert_eq!(profile.max_output_tokens, None);
    assert_eq!(profile.temperature_centi, Some(30));
    assert!(!serde_json::to_string(&profile)
        .unwrap()
        .contains("sk-secret"));
}
