//! Browser tests of the platform glue, run by `scripts/test-wasm.sh` inside a
//! real service worker in Chrome and Firefox: IndexedDB units, an engine
//! against IndexedDB, and provider requests over real `fetch` (streaming,
//! typed errors, idle timeout, abort, retries) against the local mock LLM
//! whose URL the script compiles in as `MOCK_LLM_URL`.

#![cfg(target_arch = "wasm32")]

use sw_agent::engine::{Effect, Engine, EngineConfig, ToolOutcome};
use sw_agent::gatekeeper::TargetInfo;
use sw_agent::model::{
    Attachment, NodeBody, ProviderProfile, Run, RunState, StopReason, Thread, Usage,
    MAX_ATTACHMENT_IMAGE_CHARS, MAX_ATTACHMENT_TEXT_CHARS,
};
use sw_agent::platform::idb::IdbStore;
use sw_agent::platform::stream::stream_response;
use sw_agent::protocol::{ClientKind, ErrorKind, Event, Op, Submission, UserInput};
use sw_agent::provider::{
    http_request, ChatMessage, ProviderError, ProviderRequest, ProviderResponse, RawToolCall,
    StreamEvent, ToolSpec, Transport,
};
use sw_agent::store::{stores, Record, UnitOfWork};
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;
use web_sys::AbortController;

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
        path_len: None,
    }
}

/// A run record in `state`, created (and last updated) at `created_at`.
fn run(id: &str, thread_id: &str, state: RunState, created_at: u64) -> Run {
    Run {
        state,
        step: 1,
        ..Run::new(
            id.into(),
            thread_id.into(),
            ProviderProfile::default(),
            None,
            created_at,
        )
    }
}

/// A provider profile with tool use on, no vision and no limits.
fn profile(kind: &str, base_url: &str, model: &str) -> ProviderProfile {
    ProviderProfile {
        kind: kind.into(),
        base_url: base_url.into(),
        model: model.into(),
        tool_use: true,
        ..ProviderProfile::default()
    }
}

/// An empty database of this name (a previous run's is deleted first).
async fn fresh_store(name: &str) -> IdbStore {
    let _ = IdbStore::delete(name).await;
    IdbStore::open(name).await.unwrap()
}

/// A fresh database `name` as an older engine created it at `version`:
/// every store of `stores::ALL` with its key path and, with `by_thread`,
/// the `threadId` indexes (version 4 on); no index newer than that.
async fn older_database(name: &str, version: u32, by_thread: bool) -> rexie::Rexie {
    let _ = IdbStore::delete(name).await;
    let mut builder = rexie::Rexie::builder(name).version(version);
    for store in stores::ALL {
        let key = match store {
            "receipts" => "key",
            "site_rules" => "origin",
            "environments" => "runId",
            "snapshots" => "threadId",
            _ => "id",
        };
        let mut s = rexie::ObjectStore::new(store).key_path(key);
        if by_thread
            && matches!(
                store,
                "nodes" | "runs" | "steers" | "queue" | "approvals" | "interactions"
            )
        {
            s = s.add_index(rexie::Index::new("threadId", "threadId"));
        }
        builder = builder.add_object_store(s);
    }
    builder.build().await.unwrap()
}

#[wasm_bindgen_test]
async fn idb_multi_store_unit_survives_close_and_reopen() {
    let name = "sw-agent-test-roundtrip";
    let store = fresh_store(name).await;
    let mut run = run("r1", "t1", RunState::StreamingModel, 1);
    run.step = 0;
    let node = sw_agent::model::Node {
        id: "n1".into(),
        thread_id: "t1".into(),
        parent_id: None,
        created_at: 3,
        body: NodeBody::UserMessage {
            text: "héllo 😀".into(),
            steered: false,
            // Files at the engine's bounds come back whole: an image of
            // 1 MiB of base64 and a text file of 200,000 characters.
            attachments: vec![
                Attachment::Image {
                    name: "cart 😀.png".into(),
                    media_type: "image/png".into(),
                    data: "QUJD".repeat(MAX_ATTACHMENT_IMAGE_CHARS / 4),
                },
                Attachment::Text {
                    name: "list.csv".into(),
                    media_type: "text/csv".into(),
                    text: "é\n\u{2028}\"".repeat(MAX_ATTACHMENT_TEXT_CHARS / 4),
                },
            ],
        },
    };
    // A steer's and a queued turn's files are written with them.
    let file = vec![Attachment::Text {
        name: "size.txt".into(),
        media_type: "text/plain".into(),
        text: "EU 42".into(),
    }];
    let steer = sw_agent::model::PendingSteer {
        id: "s1".into(),
        thread_id: "t1".into(),
        run_id: "r1".into(),
        admission_seq: 1,
        text: "this size".into(),
        attachments: file.clone(),
        created_at: 4,
    };
    let queued = sw_agent::model::QueueItem {
        id: "q1".into(),
        thread_id: "t1".into(),
        position: 1,
        text: String::new(),
        attachments: file,
        created_at: 4,
    };
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread("t1")))
        .put(Record::Node(node.clone()))
        .put(Record::Run(run.clone()))
        .put(Record::Steer(steer.clone()))
        .put(Record::QueueItem(queued.clone()));
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
    assert_eq!(image.steers, vec![steer]);
    assert_eq!(image.queue, vec![queued]);
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
async fn idb_environment_is_stored_once_and_read_back_only_for_unfinished_runs() {
    let name = "sw-agent-test-environment";
    let store = fresh_store(name).await;
    let profile = ProviderProfile {
        kind: "openai".into(),
        base_url: "http://127.0.0.1:9/v1".into(),
        model: "m".into(),
        ..ProviderProfile::default()
    };
    let environment = sw_agent::engine::build_environment(
        &EngineConfig::default(),
        &profile,
        &Default::default(),
    )
    .unwrap();
    let run = |id: &str, thread_id: &str, state: RunState| Run {
        step: 0,
        profile: profile.clone(),
        environment: Some(environment.clone()),
        ..run(id, thread_id, state, 1)
    };
    let mut unit = UnitOfWork::new();
    for (run, thread_id) in [
        (run("r-open", "t1", RunState::StreamingModel), "t1"),
        (run("r-done", "t2", RunState::Completed), "t2"),
    ] {
        unit.put(Record::Thread(thread(thread_id)))
            .put(Record::Environment(sw_agent::model::EnvironmentRecord {
                run_id: run.id.clone(),
                thread_id: thread_id.into(),
                environment: environment.clone(),
            }))
            .put(Record::Run(run));
    }
    store.commit(&unit).await.unwrap();
    // The run record itself does not carry it.
    for record in store.dump(stores::RUNS).await.unwrap() {
        let has = js_sys::Reflect::has(&record, &"environment".into()).unwrap();
        assert!(!has, "a run record holds no environment");
    }
    store.close();
    let store = IdbStore::open(name).await.unwrap();
    let (image, skipped) = store.load_image().await.unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(image.environments.len(), 1, "only the unfinished run's");
    assert_eq!(image.environments[0].run_id, "r-open");
    assert_eq!(image.environments[0].environment, environment);
    assert_eq!(store.dump(stores::ENVIRONMENTS).await.unwrap().len(), 2);
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
async fn idb_undecodable_record_is_skipped_not_fatal() {
    let name = "sw-agent-test-corrupt";
    let store = fresh_store(name).await;
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
    // Decoded by hand (`model::FromRecord`), the report names the field.
    assert!(
        skipped[0].starts_with("threads: field `title`: invalid type"),
        "{skipped:?}"
    );
    assert_eq!(
        store.dump(stores::THREADS).await.unwrap().len(),
        2,
        "nothing was deleted"
    );
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
async fn idb_many_records_decode_through_one_json_text_as_one_by_one() {
    let name = "sw-agent-test-bulk-decode";
    let store = fresh_store(name).await;
    let mut unit = UnitOfWork::new();
    let mut good: Vec<Thread> = (0..40).map(|i| thread(&format!("t{i:02}"))).collect();
    good[7].title = "Ünïcødé \u{1F600} \"quoted\"\n".into();
    good[9].parent_thread_id = Some("t01".into());
    for t in &good {
        unit.put(Record::Thread(t.clone()));
    }
    store.commit(&unit).await.unwrap();
    store
        .put_raw_for_tests(stores::THREADS, r#"{"id":"t50-bad","title":42}"#)
        .await
        .unwrap();
    // More than `BULK_DECODE_MIN` records: one JSON text; the same records
    // as one by one, and the damaged one skipped with its field named.
    let (image, skipped) = store.load_image().await.unwrap();
    assert_eq!(image.threads, good);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].starts_with("threads: field `title`: invalid type"),
        "{skipped:?}"
    );
    // A record JSON cannot carry (a BigInt makes `JSON.stringify` throw):
    // every record is then decoded on its own, with the same result for
    // the others.
    let odd = js_sys::JSON::parse(
        r#"{"id":"t60-odd","title":"t","createdAt":1,"updatedAt":2,"revision":1}"#,
    )
    .unwrap();
    js_sys::Reflect::set(&odd, &"revision".into(), &js_sys::BigInt::from(1u32).into()).unwrap();
    store
        .put_value_for_tests(stores::THREADS, &odd)
        .await
        .unwrap();
    let (image, skipped) = store.load_image().await.unwrap();
    let ids: Vec<&str> = image.threads.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(&image.threads[..40], &good[..], "{ids:?}");
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("threads: field `title`")),
        "{skipped:?}"
    );
    assert_eq!(
        image.threads.len() + skipped.len(),
        42,
        "{ids:?} {skipped:?}"
    );
    assert_eq!(
        store.dump(stores::THREADS).await.unwrap().len(),
        42,
        "nothing was deleted"
    );
    // receipt_replay_or_reject: a long-used profile's receipts, read right
    // after a start (not in its image) through the same one JSON text, come
    // back exactly as written (the engine replays a repeated command's
    // outcome from them).
    let mut unit = UnitOfWork::new();
    let receipts: Vec<sw_agent::model::Receipt> = (0..40u64)
        .map(|i| sw_agent::model::Receipt {
            key: format!("client\u{1f}s{i:02}"),
            op_type: "turn.submit".into(),
            fingerprint: format!("{i:064x}"),
            result: serde_json::json!({ "threadId": "t01", "turnId": format!("r{i}"), "n": i }),
            created_at: 1_700_000_000_000 + i,
        })
        .collect();
    for r in &receipts {
        unit.put(Record::Receipt(r.clone()));
    }
    store.commit(&unit).await.unwrap();
    let (image, _) = store.load_image().await.unwrap();
    assert!(image.receipts.is_empty() && image.receipts_deferred);
    let (read, skipped) = store.receipts().await.unwrap();
    assert_eq!(read, receipts);
    assert!(skipped.is_empty(), "{skipped:?}");
    store.close();
    IdbStore::delete(name).await.unwrap();
}

#[wasm_bindgen_test]
fn boundary_encodes_plain_json_objects_that_decode_back_to_the_same_record() {
    use sw_agent::platform::boundary::{from_js, to_js};
    let mut record = run("r-1", "t-1", RunState::ExecutingTools, 7);
    record.stop_reason = None;
    let value = to_js(&record).unwrap();
    // A plain object, as the panel, content scripts and IndexedDB expect: the
    // fields by their wire names, a missing value as null, nested objects as
    // objects (not Maps).
    assert!(value.is_object());
    assert_eq!(
        js_sys::Object::get_prototype_of(&value),
        js_sys::Object::get_prototype_of(&js_sys::Object::new().into())
    );
    let field = |v: &JsValue, k: &str| js_sys::Reflect::get(v, &JsValue::from_str(k)).unwrap();
    assert_eq!(
        field(&value, "threadId").as_string().as_deref(),
        Some("t-1")
    );
    assert_eq!(
        field(&value, "state").as_string().as_deref(),
        Some("executing_tools")
    );
    assert!(field(&value, "profile").is_object());
    assert_eq!(from_js::<Run>(value).unwrap(), record);
    // What JSON cannot carry is an error, not a record.
    assert!(from_js::<Run>(JsValue::from_str("not a run")).is_err());
}

#[wasm_bindgen_test]
fn boundary_reads_a_page_message_with_a_lone_surrogate_lossily() {
    use sw_agent::platform::boundary::from_js_value;
    use sw_agent::protocol::PageMessage;
    // Page text can hold half of a surrogate pair (a cut emoji); it must not
    // make a tool's result unreadable.
    let text = js_sys::JsString::from("a").concat(&js_sys::JsString::from_char_code1(0xD800));
    let message = js_sys::Object::new();
    let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&message, &JsValue::from_str(k), v);
    set("type", &JsValue::from_str("tool.progress")).unwrap();
    set("callId", &JsValue::from_str("c-1")).unwrap();
    set("text", &text.into()).unwrap();
    let decoded = serde_json::from_value::<PageMessage>(from_js_value(message.into())).unwrap();
    assert_eq!(
        decoded,
        PageMessage::ToolProgress {
            call_id: "c-1".into(),
            text: "a\u{FFFD}".into()
        }
    );
    // Something that is not JSON data is null, which no message type accepts.
    let not_data = from_js_value(JsValue::symbol(Some("not data")));
    assert_eq!(not_data, serde_json::Value::Null);
}

/// The web page page tools act on in these tests.
fn test_target() -> TargetInfo {
    TargetInfo {
        tab_id: 1,
        url: "https://shop.example/".into(),
        origin: "https://shop.example".into(),
        title: "Shop".into(),
        host_permission: true,
        ..TargetInfo::default()
    }
}

/// The default engine, without the background title request (the scripted
/// provider below answers requests in order).
fn quiet_config() -> EngineConfig {
    EngineConfig {
        model_titles: false,
        ..EngineConfig::default()
    }
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
            Effect::ResolveTarget { resolve_id, .. } => {
                engine.handle_target_resolved(now, resolve_id, Ok(test_target()))
            }
            Effect::DispatchTool(call) => engine.handle_tool_result(
                now,
                call.dispatch_id,
                ToolOutcome {
                    ok: true,
                    content: "PAGE".into(),
                    details: None,
                    images: vec![],
                },
            ),
            Effect::LoadReceipts => {
                let read = store.receipts().await.map(|(receipts, _)| receipts);
                engine.handle_receipts_loaded(now, read);
            }
            Effect::LoadThread { thread_id } => {
                let (runs, _) = store.thread_runs(&thread_id).await.unwrap();
                let (nodes, _) = store.thread_nodes(&thread_id).await.unwrap();
                engine.handle_thread_loaded(now, &thread_id, nodes, runs);
            }
            Effect::LoadThreadTail { thread_id, nodes } => {
                let (runs, _) = store.thread_runs(&thread_id).await.unwrap();
                let (values, complete) = store.thread_tail_values(&thread_id, nodes).await.unwrap();
                let (nodes, _) = IdbStore::decode_nodes(values);
                engine.handle_thread_tail_loaded(now, &thread_id, nodes, runs, complete);
            }
            Effect::Send { event, .. } => events.push(event.event),
            _ => {}
        }
    }
}

#[wasm_bindgen_test]
async fn engine_turn_persists_to_idb_and_a_new_engine_recovers_it() {
    let name = "sw-agent-test-engine";
    let store = fresh_store(name).await;
    let profile = profile("openai", "http://127.0.0.1:1/v1", "m");
    let (image, _) = store.load_image().await.unwrap();
    let mut engine = Engine::new(quiet_config(), profile.clone(), 1, image, 100);
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
            input: UserInput::text("go"),
            replaces: None,
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
    let mut engine = Engine::new(quiet_config(), profile, 2, image, 200);
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
    let (profile, key) = sw_agent::platform::parse_settings(&settings, &Default::default());
    assert_eq!(key, "sk-secret");
    assert_eq!(profile.base_url, "http://x/v1");
    assert_eq!(profile.max_output_tokens, None);
    assert_eq!(profile.temperature_centi, Some(30));
    // The extension's defaults fill what the user left unset (null), and a
    // key among them never reaches fetch (`crate::settings`).
    let (defaults, refused) = sw_agent::settings::check_defaults(&serde_json::json!({
        "maxOutputTokens": 512, "model": "default-model", "apiKey": "sk-shipped"
    }));
    assert_eq!(refused.len(), 1, "{refused:?}");
    let (profile, key) = sw_agent::platform::parse_settings(&settings, &defaults);
    assert_eq!(key, "sk-secret");
    assert_eq!(profile.model, "m", "the stored value wins");
    assert_eq!(profile.max_output_tokens, Some(512));
    let (_, key) = sw_agent::platform::parse_settings(&JsValue::UNDEFINED, &defaults);
    assert_eq!(key, "", "no key stored, none shipped");
    assert!(!serde_json::to_string(&profile)
        .unwrap()
        .contains("sk-secret"));
}

// ---------------------------------------------------------------------------
// Provider requests over real fetch inside the service worker, against the
// mock LLM (tests/mock-llm/server.mjs) that scripts/test-wasm.sh starts.

const API_KEY: &str = "sk-wasm-test-key";
const MODEL: &str = "mock-model";

/// The mock LLM's base URL (`http://127.0.0.1:<port>/v1`), compiled in by
/// scripts/test-wasm.sh. Missing means the tests were built without the
/// server: they fail instead of silently skipping.
fn mock_url() -> &'static str {
    match option_env!("MOCK_LLM_URL") {
        Some(url) if !url.trim().is_empty() => url.trim(),
        _ => panic!(
            "MOCK_LLM_URL was not set when tests/web.rs was compiled, so the fetch tests \
             have no mock LLM to talk to. Run `bash scripts/test-wasm.sh`, which starts \
             tests/mock-llm/server.mjs and passes its URL, or start the server yourself and \
             build with MOCK_LLM_URL=http://127.0.0.1:<port>/v1."
        ),
    }
}

fn mock_origin() -> String {
    let url = mock_url().trim_end_matches('/');
    url.strip_suffix("/v1").unwrap_or(url).to_string()
}

fn now_ms() -> f64 {
    js_sys::Date::now()
}

async fn sleep_ms(ms: u32) {
    gloo_timers::future::TimeoutFuture::new(ms).await;
}

/// A plain fetch (GET or POST) of the mock's control API: (status, body text).
async fn control_fetch(method: &str, path: &str, body: Option<String>) -> (u16, String) {
    use wasm_bindgen::JsCast;
    let url = format!("{}{path}", mock_origin());
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    if let Some(body) = body {
        // text/plain keeps it a simple request (no preflight); the mock parses JSON anyway.
        init.set_body(&wasm_bindgen::JsValue::from_str(&body));
    }
    let request = web_sys::Request::new_with_str_and_init(&url, &init).unwrap();
    let global = js_sys::global();
    let fetch: js_sys::Function = js_sys::Reflect::get(&global, &"fetch".into())
        .unwrap()
        .unchecked_into();
    let promise: js_sys::Promise = fetch.call1(&global, &request).unwrap().unchecked_into();
    let response: web_sys::Response = wasm_bindgen_futures::JsFuture::from(promise)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the mock LLM at {url} is unreachable ({e:?}); is scripts/test-wasm.sh running it?"
            )
        })
        .unchecked_into();
    let text = wasm_bindgen_futures::JsFuture::from(response.text().unwrap())
        .await
        .unwrap()
        .as_string()
        .unwrap_or_default();
    (response.status(), text)
}

/// Empty the mock's request log and queue, then script the next responses.
async fn mock_script(steps: serde_json::Value) {
    let (status, body) = control_fetch("POST", "/__control/reset", None).await;
    assert_eq!(status, 200, "reset: {body}");
    let script = serde_json::json!({ "steps": steps }).to_string();
    let (status, body) = control_fetch("POST", "/__control/script", Some(script)).await;
    assert_eq!(status, 200, "script: {body}");
}

/// Every provider request the mock received since the last reset.
async fn mock_requests() -> Vec<serde_json::Value> {
    let (status, body) = control_fetch("GET", "/__control/requests", None).await;
    assert_eq!(status, 200, "requests: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Wait until the mock's request `index` has `outcome` (the server notices a
/// closed connection asynchronously). The bound is generous: on a loaded
/// two-core machine the close once took more than 5 s to be seen, while the
/// responses these tests wait on stay open for 60 s.
async fn wait_for_outcome(index: usize, outcome: &str) {
    let deadline = now_ms() + 20_000.0;
    loop {
        let requests = mock_requests().await;
        let seen = requests
            .get(index)
            .and_then(|r| r["outcome"].as_str())
            .unwrap_or("")
            .to_string();
        if seen == outcome {
            return;
        }
        assert!(
            now_ms() < deadline,
            "request {index} has outcome {seen:?}, expected {outcome:?}; log: {requests:?}"
        );
        sleep_ms(25).await;
    }
}

fn provider_request(transport: Transport) -> ProviderRequest {
    let kind = match transport {
        Transport::OpenAi => "openai",
        Transport::Anthropic => "anthropic",
    };
    ProviderRequest {
        lineage: None,
        profile: profile(kind, mock_url(), MODEL),
        system: "You are a test.".into(),
        messages: vec![ChatMessage::user("Subscribe to the newsletter")].into(),
        tools: vec![ToolSpec {
            name: "read_page".into(),
            description: "Read the page".into(),
            parameters: serde_json::json!({ "type": "object", "properties": {} }),
        }]
        .into(),
    }
}

/// `stream_response` for `request` with the test key, its body sent as
/// the platform sends a body it did not plan.
async fn stream_request(
    request: &ProviderRequest,
    controller: &AbortController,
    idle_timeout_ms: u64,
    on_delta: impl FnMut(StreamEvent),
) -> Result<ProviderResponse, ProviderError> {
    let http = http_request(request, API_KEY);
    let body = sw_agent::platform::fetch::request_body(&http.body).unwrap();
    let transport = Transport::from_kind(&request.profile.kind);
    stream_response(
        &http.url,
        &http.headers,
        &body,
        transport,
        controller,
        idle_timeout_ms,
        on_delta,
    )
    .await
}

/// What one `stream_response` call produced.
struct Streamed {
    result: Result<ProviderResponse, ProviderError>,
    /// Every delta with the time it arrived (ms after the call started).
    deltas: Vec<(f64, StreamEvent)>,
    /// How long the call took (ms).
    elapsed: f64,
}

impl Streamed {
    fn texts(&self) -> Vec<String> {
        self.deltas
            .iter()
            .filter_map(|(_, d)| match d {
                StreamEvent::TextDelta(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    fn reasoning(&self) -> Vec<String> {
        self.deltas
            .iter()
            .filter_map(|(_, d)| match d {
                StreamEvent::ReasoningDelta(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    fn error(&self) -> &ProviderError {
        match &self.result {
            Err(e) => e,
            Ok(r) => panic!("expected an error, got a response: {r:?}"),
        }
    }
}

async fn stream_with(
    transport: Transport,
    idle_timeout_ms: u64,
    controller: &AbortController,
) -> Streamed {
    let started = now_ms();
    let mut deltas = Vec::new();
    let result = stream_request(
        &provider_request(transport),
        controller,
        idle_timeout_ms,
        |d| deltas.push((now_ms() - started, d)),
    )
    .await;
    Streamed {
        result,
        deltas,
        elapsed: now_ms() - started,
    }
}

async fn stream(transport: Transport, idle_timeout_ms: u64) -> Streamed {
    stream_with(transport, idle_timeout_ms, &AbortController::new().unwrap()).await
}

fn json_args(raw: &str) -> serde_json::Value {
    serde_json::from_str(raw).unwrap_or_else(|e| panic!("arguments {raw:?} are not JSON: {e}"))
}

#[wasm_bindgen_test]
async fn fetch_streams_openai_text_and_parallel_tool_calls_incrementally() {
    let text = "I will read the page and then click the button.";
    mock_script(serde_json::json!([{
        "text": text,
        "chunkDelayMs": 20,
        "toolCalls": [
            { "name": "read_page", "arguments": {} },
            { "name": "click", "arguments": { "ref": "e12", "note": "an argument long enough to be split" }, "id": "call_fixed" }
        ],
        "usage": { "prompt_tokens": 31, "completion_tokens": 17 }
    }]))
    .await;
    let s = stream(Transport::OpenAi, 10_000).await;
    let response = s.result.as_ref().expect("the stream succeeds").clone();
    assert_eq!(response.text, text);
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.model, MODEL);
    assert_eq!(
        response.usage,
        Some(Usage {
            input: 31,
            output: 17,
            ..Usage::default()
        })
    );
    assert_eq!(response.private, None);
    assert_eq!(response.tool_calls.len(), 2, "{:?}", response.tool_calls);
    assert!(response.tool_calls[0].id.starts_with("call_mock_"));
    assert_eq!(response.tool_calls[0].name, "read_page");
    assert_eq!(
        json_args(&response.tool_calls[0].arguments),
        serde_json::json!({})
    );
    assert_eq!(response.tool_calls[1].id, "call_fixed");
    assert_eq!(response.tool_calls[1].name, "click");
    assert_eq!(
        json_args(&response.tool_calls[1].arguments),
        serde_json::json!({ "ref": "e12", "note": "an argument long enough to be split" })
    );

    // Deltas reached the callback one by one while the body was still
    // streaming (20 ms between chunks), not all at the end.
    let texts = s.texts();
    assert!(texts.len() >= 5, "text split into deltas: {texts:?}");
    assert_eq!(texts.concat(), text);
    let first = s.deltas.first().unwrap().0;
    let last_text = s
        .deltas
        .iter()
        .rev()
        .find(|(_, d)| matches!(d, StreamEvent::TextDelta(_)))
        .unwrap()
        .0;
    assert!(
        last_text - first >= 60.0,
        "text deltas arrived within {} ms: the body was not read incrementally",
        last_text - first
    );
    assert!(
        s.elapsed - last_text >= 60.0,
        "the last text delta arrived {} ms before the end, after the tool-call chunks",
        s.elapsed - last_text
    );

    let requests = mock_requests().await;
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r["format"], "openai");
    assert_eq!(r["path"], "/v1/chat/completions");
    assert_eq!(r["headers"]["authorization"], format!("Bearer {API_KEY}"));
    assert_eq!(r["body"]["stream"], true);
    assert_eq!(r["body"]["model"], MODEL);
    assert_eq!(r["outcome"], "completed");
}

#[wasm_bindgen_test]
async fn fetch_streams_anthropic_thinking_text_and_tool_use_keeping_the_signature_private() {
    let thinking = "The user wants the page read before anything is clicked.";
    let signature = "EqSIGNATURE/mock+1==";
    mock_script(serde_json::json!([{
        "thinking": thinking,
        "signature": signature,
        "text": "Reading the page first.",
        "chunkDelayMs": 5,
        "toolCalls": [
            { "name": "read_page", "arguments": {} },
            { "name": "click", "arguments": { "ref": "e3" } }
        ],
        "usage": { "input_tokens": 40, "output_tokens": 12 }
    }]))
    .await;
    let s = stream(Transport::Anthropic, 10_000).await;
    let response = s.result.as_ref().expect("the stream succeeds").clone();
    assert_eq!(response.text, "Reading the page first.");
    assert_eq!(response.reasoning, thinking);
    // Bound to the host that streamed it (replayed to that host only).
    assert_eq!(
        response.private,
        Some(serde_json::json!({
            "anthropic": {
                "thinking": [{ "type": "thinking", "thinking": thinking, "signature": signature }],
                "endpoint": sw_agent::provider::endpoint_host(mock_url()),
            }
        }))
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.model, MODEL);
    assert_eq!(
        response.usage,
        Some(Usage {
            input: 40,
            output: 12,
            ..Usage::default()
        })
    );
    let calls: Vec<(&str, serde_json::Value)> = response
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), json_args(&c.arguments)))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("read_page", serde_json::json!({})),
            ("click", serde_json::json!({ "ref": "e3" }))
        ]
    );
    assert!(response
        .tool_calls
        .iter()
        .all(|c| c.id.starts_with("toolu_mock_")));
    assert_ne!(response.tool_calls[0].id, response.tool_calls[1].id);
    let reasoning = s.reasoning();
    assert!(reasoning.len() >= 2, "{reasoning:?}");
    assert_eq!(reasoning.concat(), thinking);
    assert_eq!(s.texts().concat(), "Reading the page first.");
    // Reasoning is shown before the text, as it was streamed.
    let first_text = s
        .deltas
        .iter()
        .position(|(_, d)| matches!(d, StreamEvent::TextDelta(_)))
        .unwrap();
    assert!(s.deltas[..first_text]
        .iter()
        .all(|(_, d)| matches!(d, StreamEvent::ReasoningDelta(_))));

    let requests = mock_requests().await;
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r["format"], "anthropic");
    assert_eq!(r["path"], "/v1/messages");
    assert_eq!(r["outcome"], "completed");
    assert_eq!(r["headers"]["x-api-key"], API_KEY);
    assert_eq!(r["headers"]["anthropic-version"], "2023-06-01");
    assert_eq!(
        r["headers"]["anthropic-dangerous-direct-browser-access"],
        "true"
    );
    assert!(r["headers"].get("authorization").is_none());
    assert_eq!(r["body"]["system"], "You are a test.");
    assert_eq!(r["body"]["stream"], true);
    assert!(r["body"]["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(r["body"]["tools"][0]["name"], "read_page");
    assert!(r["body"]["tools"][0]["input_schema"].is_object());
}

#[wasm_bindgen_test]
async fn invalid_tool_arguments_arrive_raw_in_both_formats() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        mock_script(serde_json::json!([{
            "toolCalls": [{ "name": "click", "arguments": { "ref": "e1" }, "invalidArguments": true }]
        }]))
        .await;
        let s = stream(transport, 10_000).await;
        let response = s.result.expect("invalid arguments are not a stream error");
        assert_eq!(response.stop_reason, StopReason::ToolUse);
        assert_eq!(response.tool_calls.len(), 1);
        assert_eq!(response.tool_calls[0].arguments, r#"{"ref":"e1",}"#);
        assert!(
            serde_json::from_str::<serde_json::Value>(&response.tool_calls[0].arguments).is_err()
        );
    }
}

#[wasm_bindgen_test]
async fn http_errors_become_typed_errors_with_retry_after() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        mock_script(serde_json::json!([
            { "error": { "status": 429, "headers": { "retry-after": "1" } } },
            { "error": { "status": 429, "headers": { "retry-after-ms": "250" } } },
            { "error": { "status": 401 } },
            { "error": { "status": 500 } },
            { "error": { "status": 404 } }
        ]))
        .await;
        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(e.kind, ErrorKind::RateLimited, "{transport:?}: {e}");
        assert!(e.retryable);
        assert_eq!(
            e.retry_after_ms,
            Some(1_000),
            "{transport:?}: Retry-After: 1"
        );
        assert!(e.message.contains("Mock error 429"), "{}", e.message);

        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(e.kind, ErrorKind::RateLimited);
        assert_eq!(e.retry_after_ms, Some(250), "{transport:?}: retry-after-ms");

        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(e.kind, ErrorKind::Auth, "{transport:?}: {e}");
        assert!(!e.retryable);
        assert_eq!(e.retry_after_ms, None);
        assert!(
            !e.message.contains(API_KEY),
            "the key never appears in an error"
        );

        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(e.kind, ErrorKind::ProviderUnavailable, "{transport:?}: {e}");
        assert!(e.retryable);

        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(e.kind, ErrorKind::ModelNotFound, "{transport:?}: {e}");
        assert!(!e.retryable);

        let outcomes: Vec<String> = mock_requests()
            .await
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(outcomes, vec!["error"; 5]);
    }
}

#[wasm_bindgen_test]
async fn mid_stream_error_events_become_typed_errors_after_the_streamed_prefix() {
    mock_script(serde_json::json!([
        { "text": "Partial answer", "midStreamError": { "message": "The server had an error while processing your request." } },
        { "text": "Partial answer", "midStreamError": true }
    ]))
    .await;
    let s = stream(Transport::OpenAi, 10_000).await;
    assert_eq!(s.texts().concat(), "Partial answer");
    let e = s.error();
    assert_eq!(e.kind, ErrorKind::ProviderUnavailable, "{e}");
    assert!(e.retryable);
    assert!(
        e.message.contains("The server had an error"),
        "{}",
        e.message
    );

    let s = stream(Transport::Anthropic, 10_000).await;
    assert_eq!(s.texts().concat(), "Partial answer");
    let e = s.error();
    assert_eq!(
        e.kind,
        ErrorKind::ProviderUnavailable,
        "overloaded_error: {e}"
    );
    assert!(e.retryable);
    assert!(e.message.contains("Overloaded"), "{}", e.message);
}

#[wasm_bindgen_test]
async fn a_stream_left_open_after_an_error_event_is_closed_by_the_client() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        mock_script(serde_json::json!([
            { "text": "Partial", "midStreamError": { "keepOpenMs": 60_000 } }
        ]))
        .await;
        let s = stream(transport, 60_000).await;
        assert_eq!(
            s.error().kind,
            ErrorKind::ProviderUnavailable,
            "{transport:?}"
        );
        assert!(s.elapsed < 2_000.0, "returned after {} ms", s.elapsed);
        // The server kept the connection open: only the client could close it.
        wait_for_outcome(0, "aborted").await;
    }
}

#[wasm_bindgen_test]
async fn idle_timeout_also_bounds_a_stalled_error_body() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        mock_script(serde_json::json!([
            { "error": { "status": 503, "stallMs": 60_000, "headers": { "retry-after": "2" } } }
        ]))
        .await;
        let s = stream(transport, 300).await;
        let e = s.error();
        // The status is known: the error keeps its type without the body.
        assert_eq!(e.kind, ErrorKind::ProviderUnavailable, "{transport:?}: {e}");
        assert!(e.retryable);
        assert_eq!(e.retry_after_ms, Some(2_000));
        assert!(
            s.elapsed >= 290.0 && s.elapsed < 3_000.0,
            "{transport:?}: returned after {} ms",
            s.elapsed
        );
        wait_for_outcome(0, "aborted").await;
    }
}

/// The path of a transport's endpoint on the mock (after its `/v1`).
fn endpoint(transport: Transport) -> &'static str {
    match transport {
        Transport::OpenAi => "/chat/completions",
        Transport::Anthropic => "/messages",
    }
}

#[wasm_bindgen_test]
async fn a_2xx_json_error_is_read_and_typed_by_its_words_not_as_a_missing_stream() {
    // A gateway's `200 {"error":…}` to a streaming request: its body is
    // locked to the reader taken for every success, and must be read there.
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        mock_script(serde_json::json!([
            { "json": { "error": {
                "message": "Incorrect API key provided",
                "type": "invalid_request_error",
                "code": "invalid_api_key"
            } } },
            { "json": { "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" } } },
            { "json": { "id": "done", "object": "chat.completion", "choices": [] } }
        ]))
        .await;
        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(
            (e.kind, e.retryable),
            (ErrorKind::Auth, false),
            "{transport:?}: {e}"
        );
        assert!(
            e.message.contains("Incorrect API key provided"),
            "{}",
            e.message
        );

        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(
            (e.kind, e.retryable),
            (ErrorKind::ProviderUnavailable, true),
            "{transport:?}: {e}"
        );

        // A document that is no error: the server ignored `stream: true`.
        let e = stream(transport, 10_000).await.error().clone();
        assert_eq!(
            (e.kind, e.retryable),
            (ErrorKind::ProviderProtocol, false),
            "{transport:?}: {e}"
        );
        assert!(
            e.message.contains("may not support streaming"),
            "{}",
            e.message
        );
    }
}

#[wasm_bindgen_test]
async fn a_redirect_is_not_followed_with_the_key_and_is_a_protocol_error() {
    for (transport, status) in [(Transport::OpenAi, 307), (Transport::Anthropic, 308)] {
        // Redirected to the same endpoint, whose next step would answer:
        // followed, the second step is consumed and the call succeeds.
        let location = format!("{}{}", mock_url(), endpoint(transport));
        mock_script(serde_json::json!([
            { "redirect": { "status": status, "location": location } },
            { "text": "Answered at the address redirected to." }
        ]))
        .await;
        let s = stream(transport, 10_000).await;
        let e = s.error();
        assert_eq!(
            (e.kind, e.retryable),
            (ErrorKind::ProviderProtocol, false),
            "{transport:?}: {e}"
        );
        assert!(e.message.contains("redirect"), "{}", e.message);
        let url = format!("{}{}", mock_url(), endpoint(transport));
        assert!(e.message.contains(&url), "names the address: {}", e.message);
        assert!(!e.message.contains(API_KEY), "{}", e.message);
        let outcomes: Vec<String> = mock_requests()
            .await
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(outcomes, ["redirected"], "{transport:?}: sent once, not on");
    }
}

#[wasm_bindgen_test]
async fn an_error_body_is_read_only_up_to_its_limit() {
    // 32 MiB: far more than the connection buffers on the way, so a client
    // that reads all of it is seen to (the server writes only as fast as
    // it is read), and one that stops reading is seen to close.
    mock_script(serde_json::json!([
        { "error": { "status": 500, "bodyBytes": 32 * 1024 * 1024 } }
    ]))
    .await;
    let s = stream(Transport::OpenAi, 60_000).await;
    let e = s.error();
    // The status types the error without the body.
    assert_eq!(
        (e.kind, e.retryable),
        (ErrorKind::ProviderUnavailable, true),
        "{e}"
    );
    // The server sees how the body ended: all of it sent (`error`), or the
    // client closed the connection first (`aborted`).
    let deadline = now_ms() + 20_000.0;
    let outcome = loop {
        let requests = mock_requests().await;
        let outcome = requests[0]["outcome"].as_str().unwrap_or("").to_string();
        if outcome == "aborted" || outcome == "error" || now_ms() > deadline {
            break outcome;
        }
        sleep_ms(25).await;
    };
    assert_eq!(outcome, "aborted", "the client read the whole body");
}

#[wasm_bindgen_test]
async fn truncated_body_is_a_retryable_network_error() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        // `true`: the connection drops mid-chunk; "end": the body ends mid-chunk.
        // The chunks are spaced out: an errored body stream discards what
        // the page has not read yet, so a prefix sent just before the drop
        // may legitimately never be seen.
        for mode in [serde_json::json!(true), serde_json::json!("end")] {
            mock_script(serde_json::json!([
                { "text": "Some text first", "truncate": mode, "chunkDelayMs": 30 }
            ]))
            .await;
            let s = stream(transport, 10_000).await;
            assert_eq!(
                s.texts().concat(),
                "Some text first",
                "{transport:?} {mode}"
            );
            let e = s.error();
            assert_eq!(e.kind, ErrorKind::Network, "{transport:?} {mode}: {e}");
            assert!(e.retryable, "{transport:?} {mode}: {e}");
            assert!(
                !e.message.contains("Could not reach"),
                "{transport:?} {mode}: the provider was reached; the message must not say otherwise: {}",
                e.message
            );
        }
    }
}

#[wasm_bindgen_test]
async fn idle_timeout_aborts_a_stalled_stream_as_retryable() {
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        // Before the response headers, after them, and after a first delta.
        for stall_at in ["request", "headers", "delta"] {
            mock_script(serde_json::json!([{ "stallMs": 60_000, "stallAt": stall_at }])).await;
            let s = stream(transport, 300).await;
            let e = s.error();
            assert_eq!(e.kind, ErrorKind::Network, "{transport:?} {stall_at}: {e}");
            assert!(e.retryable, "{transport:?} {stall_at}: {e}");
            assert!(e.message.contains("sent nothing"), "{}", e.message);
            assert!(
                s.elapsed >= 290.0 && s.elapsed < 3_000.0,
                "{transport:?} {stall_at}: returned after {} ms",
                s.elapsed
            );
            if stall_at == "delta" {
                assert_eq!(s.texts().concat(), "Thinking");
            }
            wait_for_outcome(0, "aborted").await;
        }
    }
}

#[wasm_bindgen_test]
async fn abort_ends_a_request_promptly_at_any_point() {
    use gloo_timers::callback::Timeout;
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        for stall_at in ["request", "headers", "delta"] {
            mock_script(serde_json::json!([{ "stallMs": 60_000, "stallAt": stall_at }])).await;
            let controller = AbortController::new().unwrap();
            let timer = {
                let controller = controller.clone();
                Timeout::new(200, move || controller.abort())
            };
            // The idle timeout is far away: only the abort can end this call.
            let s = stream_with(transport, 60_000, &controller).await;
            drop(timer);
            let e = s.error();
            assert_eq!(e.kind, ErrorKind::Network, "{transport:?} {stall_at}: {e}");
            assert!(!e.retryable, "an abort is not retried: {e}");
            assert!(e.message.contains("aborted"), "{}", e.message);
            assert!(
                s.elapsed >= 190.0 && s.elapsed < 2_000.0,
                "{transport:?} {stall_at}: returned after {} ms",
                s.elapsed
            );
            if stall_at == "delta" {
                assert_eq!(s.texts().concat(), "Thinking");
            }
            wait_for_outcome(0, "aborted").await;
        }
    }
}

/// Drive an engine with real fetch against the mock: every effect is
/// executed, `CallProvider` with `stream_response`, and the engine's timers
/// (delta flushes, retry backoff) with gloo timers, until nothing is left.
async fn drive_live(engine: &mut Engine, store: &IdbStore, events: &mut Vec<Event>) {
    let now = || js_sys::Date::now() as u64;
    let deadline = now_ms() + 20_000.0;
    loop {
        assert!(
            now_ms() < deadline,
            "the engine did not settle within 20 s; events: {events:?}"
        );
        while let Some(effect) = engine.poll_effect() {
            match effect {
                Effect::Persist { token, unit } => {
                    store.commit(&unit).await.unwrap();
                    engine.handle_store_ack(now(), token);
                }
                Effect::LoadReceipts => {
                    let read = store.receipts().await.map(|(receipts, _)| receipts);
                    engine.handle_receipts_loaded(now(), read);
                }
                Effect::LoadThread { thread_id } => {
                    let (runs, _) = store.thread_runs(&thread_id).await.unwrap();
                    let (nodes, _) = store.thread_nodes(&thread_id).await.unwrap();
                    engine.handle_thread_loaded(now(), &thread_id, nodes, runs);
                }
                Effect::LoadThreadTail { thread_id, nodes } => {
                    let (runs, _) = store.thread_runs(&thread_id).await.unwrap();
                    let (values, complete) =
                        store.thread_tail_values(&thread_id, nodes).await.unwrap();
                    let (nodes, _) = IdbStore::decode_nodes(values);
                    engine.handle_thread_tail_loaded(now(), &thread_id, nodes, runs, complete);
                }
                Effect::CallProvider {
                    request_id,
                    request,
                    idle_timeout_ms,
                } => {
                    let controller = AbortController::new().unwrap();
                    let result = stream_request(&request, &controller, idle_timeout_ms, |d| {
                        engine.handle_provider_delta(now(), request_id, d)
                    })
                    .await;
                    engine.handle_provider_done(now(), request_id, result);
                }
                Effect::Send { event, .. } => events.push(event.event),
                _ => {}
            }
        }
        match engine.poll_timeout() {
            Some(at) => {
                let delay = at.saturating_sub(now()).min(60_000) as u32;
                sleep_ms(delay).await;
                engine.handle_timeout(now());
            }
            None => return,
        }
    }
}

/// Submit one turn to a fresh engine whose retry policy has a small base
/// delay, drive it against the mock, and return its events.
async fn run_turn_with_retries(db: &str) -> Vec<Event> {
    use sw_agent::engine::RetryPolicy;
    let store = fresh_store(db).await;
    let profile = profile("openai", mock_url(), MODEL);
    let config = EngineConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            base_delay_ms: 50,
            max_delay_ms: 2_000,
        },
        stream_idle_timeout_ms: 5_000,
        ..quiet_config()
    };
    let (image, _) = store.load_image().await.unwrap();
    let start = js_sys::Date::now() as u64;
    let mut engine = Engine::new(config, profile, 3, image, start);
    engine.handle_connect(1, ClientKind::ExtensionPage);
    engine.handle_op(
        start,
        1,
        Op::TurnSubmit {
            submission: Submission {
                client_id: "c".into(),
                submission_id: "s".into(),
            },
            thread_id: None,
            input: UserInput::text("Say something"),
            replaces: None,
        },
    );
    let mut events = Vec::new();
    drive_live(&mut engine, &store, &mut events).await;
    drop(engine);
    store.close();
    IdbStore::delete(db).await.unwrap();
    events
}

fn retries(events: &[Event]) -> Vec<(u32, u64, ErrorKind)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::RunRetry {
                attempt,
                delay_ms,
                error,
                ..
            } => Some((*attempt, *delay_ms, error.kind)),
            _ => None,
        })
        .collect()
}

fn final_assistant_text(events: &[Event]) -> Option<String> {
    events.iter().rev().find_map(|e| match e {
        Event::ItemComplete { node, .. } => match &node.body {
            NodeBody::AssistantMessage { text, .. } => Some(text.clone()),
            _ => None,
        },
        _ => None,
    })
}

fn completed_with(events: &[Event]) -> Option<StopReason> {
    events.iter().find_map(|e| match e {
        Event::TurnComplete { stop_reason, .. } => Some(*stop_reason),
        _ => None,
    })
}

#[wasm_bindgen_test]
async fn engine_retries_a_500_with_backoff_over_real_fetch_and_completes() {
    mock_script(serde_json::json!([
        { "error": { "status": 500 } },
        { "text": "Recovered after a retry." }
    ]))
    .await;
    let events = run_turn_with_retries("sw-agent-test-retry-500").await;
    let retries = retries(&events);
    assert_eq!(retries.len(), 1, "one run.retry event: {events:?}");
    let (attempt, delay, kind) = retries[0];
    assert_eq!(attempt, 1);
    assert_eq!(kind, ErrorKind::ProviderUnavailable);
    assert!(
        (50..=63).contains(&delay),
        "base delay 50 ms plus at most 25% jitter, got {delay}"
    );
    assert_eq!(completed_with(&events), Some(StopReason::End), "{events:?}");
    assert_eq!(
        final_assistant_text(&events).as_deref(),
        Some("Recovered after a retry.")
    );

    let requests = mock_requests().await;
    assert_eq!(requests.len(), 2, "two requests reached the mock");
    assert_eq!(requests[0]["outcome"], "error");
    assert_eq!(requests[1]["outcome"], "completed");
    let gap =
        requests[1]["receivedAt"].as_f64().unwrap() - requests[0]["receivedAt"].as_f64().unwrap();
    assert!(gap >= 45.0, "the retry waited for the backoff ({gap} ms)");
    assert_eq!(
        requests[0]["body"], requests[1]["body"],
        "the same request was sent again"
    );
}

#[wasm_bindgen_test]
async fn engine_honours_retry_after_ms_from_a_429() {
    mock_script(serde_json::json!([
        { "error": { "status": 429, "headers": { "retry-after-ms": "300" } } },
        { "text": "Done after waiting." }
    ]))
    .await;
    let events = run_turn_with_retries("sw-agent-test-retry-429").await;
    assert_eq!(retries(&events), vec![(1, 300, ErrorKind::RateLimited)]);
    assert_eq!(completed_with(&events), Some(StopReason::End), "{events:?}");
    let requests = mock_requests().await;
    assert_eq!(requests.len(), 2);
    let gap =
        requests[1]["receivedAt"].as_f64().unwrap() - requests[0]["receivedAt"].as_f64().unwrap();
    assert!(gap >= 290.0, "the retry waited for Retry-After ({gap} ms)");
}

#[wasm_bindgen_test]
async fn idb_thread_tail_reads_the_newest_nodes_by_creation_time() {
    let name = "sw-agent-test-tail";
    let store = fresh_store(name).await;
    let node = |thread: &str, i: u64, created_at: u64| sw_agent::model::Node {
        id: format!("{thread}-n{i:03}"),
        thread_id: thread.into(),
        parent_id: (i > 0).then(|| format!("{thread}-n{:03}", i - 1)),
        created_at,
        body: NodeBody::UserMessage {
            text: format!("message {i}"),
            steered: false,
            attachments: Vec::new(),
        },
    };
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread("t1")))
        .put(Record::Thread(thread("t2")));
    // t1: 30 nodes, two per millisecond (ties at every time); t2: 5 nodes
    // created later than all of t1's.
    for i in 0..30 {
        unit.put(Record::Node(node("t1", i, 1000 + i / 2)));
    }
    for i in 0..5 {
        unit.put(Record::Node(node("t2", i, 9000 + i)));
    }
    store.commit(&unit).await.unwrap();

    let decode = |values: Vec<wasm_bindgen::JsValue>| {
        let (nodes, skipped) = IdbStore::decode_nodes(values);
        assert!(skipped.is_empty());
        let mut ids: Vec<String> = nodes.into_iter().map(|n| n.id).collect();
        sw_agent::sorting::sort(&mut ids);
        ids
    };
    // The 9 newest end at time 1010 (nodes 21 and 20 share it): both come.
    let (values, complete) = store.thread_tail_values("t1", 9).await.unwrap();
    assert!(!complete);
    let expected: Vec<String> = (20..30).map(|i| format!("t1-n{i:03}")).collect();
    assert_eq!(decode(values), expected);
    // As many as it has, or more: all of it, complete.
    for count in [30, 100] {
        let (values, complete) = store.thread_tail_values("t1", count).await.unwrap();
        assert!(complete, "count {count}");
        assert_eq!(decode(values).len(), 30);
    }
    let (values, complete) = store.thread_tail_values("t2", 2).await.unwrap();
    assert!(!complete);
    assert_eq!(decode(values), vec!["t2-n003", "t2-n004"]);
    let (values, complete) = store.thread_tail_values("nobody", 10).await.unwrap();
    assert!(complete && values.is_empty());

    // Both ways of reading agree wherever the one-request way answers; it
    // leaves ties across the boundary to the cursor.
    let by_records = store.tail_by_records("t1", 9).await.unwrap();
    let supported = store.tail_by_records("t1", 100).await.unwrap().is_some();
    if supported {
        assert!(
            by_records.is_none(),
            "nodes 20 and 21 share the boundary's time"
        );
        for (thread, count, length, complete) in [
            ("t1", 8, 8, false),
            ("t1", 30, 30, true),
            ("t1", 100, 30, true),
            ("t2", 2, 2, false),
            ("nobody", 3, 0, true),
        ] {
            let (values, whole) = store
                .tail_by_records(thread, count)
                .await
                .unwrap()
                .expect("no tie at this boundary");
            assert_eq!(whole, complete, "{thread} {count}");
            let (nodes, _) = IdbStore::decode_nodes(values.clone());
            let times: Vec<u64> = nodes.iter().map(|n| n.created_at).collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
            let by_cursor = store.tail_by_cursor(thread, count).await.unwrap();
            assert_eq!(decode(values).len(), length);
            assert_eq!(
                decode(store.thread_tail_values(thread, count).await.unwrap().0),
                decode(by_cursor.0),
                "{thread} {count}"
            );
        }
    }
    // Both browsers the tests run in have IDBIndex.getAllRecords (Chrome
    // 141+, Firefox 153 ESR); an older one reads with the cursor.
    assert!(supported, "getAllRecords is available");
    store.close();
    let _ = IdbStore::delete(name).await;
}

#[wasm_bindgen_test]
async fn idb_commit_is_all_or_nothing_and_a_refused_record_is_a_typed_error() {
    let name = "sw-agent-test-commit-refused";
    let store = fresh_store(name).await;
    let good = js_sys::JSON::parse(
        r#"{"id": "t-good", "title": "kept?", "leafId": null, "createdAt": 1, "updatedAt": 1, "revision": 1}"#,
    )
    .unwrap();
    // A record IndexedDB cannot clone (a function inside): the put throws.
    let bad = js_sys::Object::new();
    js_sys::Reflect::set(&bad, &"id".into(), &"t-bad".into()).unwrap();
    js_sys::Reflect::set(
        &bad,
        &"f".into(),
        &js_sys::Function::new_no_args("return 1"),
    )
    .unwrap();
    let error = store
        .commit_values(
            &["threads"],
            &[("threads", good.clone()), ("threads", bad.into())],
            &[],
        )
        .await
        .unwrap_err();
    assert!(!error.retryable, "{error}");
    assert!(error.message.contains("DataCloneError"), "{error}");
    // A record without its key: DataError, the same way.
    let keyless = js_sys::JSON::parse(r#"{"title": "no id"}"#).unwrap();
    let error = store
        .commit_values(
            &["threads"],
            &[("threads", good.clone()), ("threads", keyless)],
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        !error.retryable && error.message.contains("DataError"),
        "{error}"
    );
    assert!(
        store.dump("threads").await.unwrap().is_empty(),
        "nothing of either unit was written"
    );
    // The connection is still good for the next unit.
    store
        .commit_values(&["threads"], &[("threads", good)], &[])
        .await
        .unwrap();
    assert_eq!(store.dump("threads").await.unwrap().len(), 1);
    store.close();
    let _ = IdbStore::delete(name).await;
}

/// A database written by the previous version (4: no `threadTime` index,
/// thread records without `pathLen`) opens as version 5: the index is built
/// over the existing nodes, the old thread is read whole, a new write stamps
/// its path length and a later cold start reads only its tail.
#[wasm_bindgen_test]
async fn idb_version_4_database_upgrades_and_its_threads_stay_readable() {
    use rexie::TransactionMode;
    let name = "sw-agent-test-upgrade-4";
    let old = older_database(name, 4, true).await;
    let tx = old
        .transaction(&["threads", "nodes"], TransactionMode::ReadWrite)
        .unwrap();
    let threads = tx.store("threads").unwrap();
    let nodes = tx.store("nodes").unwrap();
    threads
        .put(
            &js_sys::JSON::parse(
                r#"{"id":"t1","title":"old","leafId":"n119","createdAt":1,"updatedAt":2,"revision":3,"parentThreadId":null,"usage":{"input":0,"output":0}}"#,
            )
            .unwrap(),
            None,
        )
        .await
        .unwrap();
    for i in 0..120 {
        let parent = if i == 0 {
            "null".to_string()
        } else {
            format!("\"n{:03}\"", i - 1)
        };
        let record = format!(
            r#"{{"id":"n{i:03}","threadId":"t1","parentId":{parent},"createdAt":{},"kind":"user_message","text":"m{i}"}}"#,
            1000 + i
        );
        nodes
            .put(&js_sys::JSON::parse(&record).unwrap(), None)
            .await
            .unwrap();
    }
    tx.done().await.unwrap();
    old.close();

    let config = EngineConfig {
        snapshot_nodes: 10,
        ..quiet_config()
    };
    let open_and_initialize = |now: u64| {
        let config = config.clone();
        async move {
            let store = IdbStore::open(name).await.unwrap();
            let (image, skipped) = store.load_image().await.unwrap();
            assert!(skipped.is_empty(), "{skipped:?}");
            let mut engine = Engine::new(config, ProviderProfile::default(), now, image, now);
            engine.handle_connect(1, ClientKind::ExtensionPage);
            engine.handle_op(
                now,
                1,
                Op::Initialize {
                    submission: Submission {
                        client_id: "c".into(),
                        submission_id: format!("i{now}"),
                    },
                    thread_id: Some("t1".into()),
                },
            );
            let mut effects = Vec::new();
            while let Some(effect) = engine.poll_effect() {
                effects.push(effect);
            }
            (store, engine, effects)
        }
    };
    // First start on the upgraded database: no pathLen yet, read whole.
    let (store, mut engine, effects) = open_and_initialize(100).await;
    assert!(effects
        .iter()
        .any(|e| matches!(e, Effect::LoadThread { thread_id } if thread_id == "t1")));
    let (tail, complete) = store.thread_tail_values("t1", 20).await.unwrap();
    assert!(
        !complete && tail.len() == 20,
        "the new index covers the old nodes"
    );
    let (nodes, _) = store.thread_nodes("t1").await.unwrap();
    assert_eq!(nodes.len(), 120);
    engine.handle_thread_loaded(100, "t1", nodes, Vec::new());
    assert!(std::iter::from_fn(|| engine.poll_effect()).any(|e| matches!(
        e,
        Effect::Send { event, .. } if matches!(&event.event, Event::Initialized { snapshot }
            if snapshot.thread.as_ref().is_some_and(|t| t.older_nodes == 110 && t.nodes.len() == 10))
    )));
    store.close();
    drop(engine);

    // Any checkpoint of the thread stamps its path length (the engine's part
    // is checked by the simulation); here the record is written directly.
    let store = IdbStore::open(name).await.unwrap();
    let (image, _) = store.load_image().await.unwrap();
    let mut thread = image.threads.iter().find(|t| t.id == "t1").unwrap().clone();
    assert_eq!(thread.path_len, None);
    thread.path_len = Some(120);
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread));
    store.commit(&unit).await.unwrap();
    store.close();
    let (store, mut engine, effects) = open_and_initialize(200).await;
    let tail_read = effects.iter().find_map(|e| match e {
        Effect::LoadThreadTail { thread_id, nodes } if thread_id == "t1" => Some(*nodes),
        _ => None,
    });
    let count = tail_read.expect("a tail read");
    let (values, complete) = store.thread_tail_values("t1", count).await.unwrap();
    assert!(!complete);
    let (nodes, _) = IdbStore::decode_nodes(values);
    engine.handle_thread_tail_loaded(200, "t1", nodes, Vec::new(), false);
    let mut view = None;
    while let Some(effect) = engine.poll_effect() {
        if let Effect::Send { event, .. } = effect {
            if let Event::Initialized { snapshot } = event.event {
                view = snapshot.thread;
            }
        }
    }
    let view = view.expect("initialized from the tail");
    assert_eq!(view.older_nodes, 110);
    assert_eq!(view.nodes.len(), 10);
    assert_eq!(view.nodes[9].id, "n119");
    store.close();
    let _ = IdbStore::delete(name).await;
}

#[wasm_bindgen(module = "/extension/store-prefetch.js")]
extern "C" {
    #[wasm_bindgen(js_name = prefetchStore)]
    fn prefetch_store(spec: &JsValue, build: &JsValue, hooks: &JsValue) -> js_sys::Promise;
    #[wasm_bindgen(js_name = readCachedSnapshot)]
    fn read_cached_snapshot(db: &JsValue, thread_id: &str) -> js_sys::Promise;
    #[wasm_bindgen(thread_local_v2, js_name = ENGINE_STORE)]
    static ENGINE_STORE: JsValue;
}

/// `extension/store-prefetch.js` run for database `name` (as sw.js runs it
/// for the engine's) by build "b1", awaited: its result or null.
async fn prefetch(name: &str) -> JsValue {
    prefetch_for(name, Some("b1")).await
}

/// The same by `build` (None: a worker without a build id). Also checks
/// the early hand-over sw.js answers a reconnect from before the start
/// image is read: with a build, the most recent record, once, the one the
/// prefetch returns; without a prefetch or a build, none.
async fn prefetch_for(name: &str, build: Option<&str>) -> JsValue {
    let (result, wanted) = prefetch_wanting(name, build, None).await;
    assert!(wanted.is_empty(), "no thread asked for, none read early");
    result
}

/// The same, with `wanted` named by `hooks.wanted()` (a panel that asked
/// for that thread before the cache's keys were read): also what
/// `hooks.onWanted` got.
async fn prefetch_wanting(
    name: &str,
    build: Option<&str>,
    wanted: Option<&str>,
) -> (JsValue, Vec<(String, JsValue)>) {
    let spec = js_sys::Object::new();
    let set = |key: &str, value: JsValue| js_sys::Reflect::set(&spec, &key.into(), &value).unwrap();
    set("name", name.into());
    set("version", sw_agent::store::DB_VERSION.into());
    let image: js_sys::Array = stores::START_IMAGE
        .iter()
        .map(|s| JsValue::from_str(s))
        .collect();
    set("image", image.into());
    set("snapshots", stores::SNAPSHOTS.into());
    let indexes = js_sys::Object::new();
    js_sys::Reflect::set(
        &indexes,
        &"build".into(),
        &stores::SNAPSHOTS_BY_BUILD.into(),
    )
    .unwrap();
    js_sys::Reflect::set(&indexes, &"recent".into(), &stores::SNAPSHOTS_RECENT.into()).unwrap();
    set("snapshotIndexes", indexes.into());
    let by_state = js_sys::Object::new();
    let terminal: js_sys::Array = RunState::TERMINAL_NAMES
        .iter()
        .map(|s| JsValue::from_str(s))
        .collect();
    for (key, value) in [
        ("store", JsValue::from_str(stores::RUNS)),
        ("index", JsValue::from_str(stores::RUNS_BY_STATE)),
        ("terminal", terminal.into()),
    ] {
        js_sys::Reflect::set(&by_state, &key.into(), &value).unwrap();
    }
    set("runsByState", by_state.into());
    let records = std::rc::Rc::new(std::cell::RefCell::new(Vec::<JsValue>::new()));
    let early = std::rc::Rc::new(std::cell::RefCell::new(Vec::<(String, JsValue)>::new()));
    let on_recent = {
        let records = records.clone();
        Closure::<dyn FnMut(JsValue)>::new(move |record: JsValue| records.borrow_mut().push(record))
    };
    let on_wanted = {
        let early = early.clone();
        Closure::<dyn FnMut(String, JsValue)>::new(move |thread: String, record: JsValue| {
            early.borrow_mut().push((thread, record))
        })
    };
    let wanted = wanted.map_or(JsValue::NULL, JsValue::from_str);
    let asked = Closure::<dyn FnMut() -> JsValue>::new(move || wanted.clone());
    let hooks = js_sys::Object::new();
    js_sys::Reflect::set(&hooks, &"onRecent".into(), on_recent.as_ref()).unwrap();
    js_sys::Reflect::set(&hooks, &"onWanted".into(), on_wanted.as_ref()).unwrap();
    js_sys::Reflect::set(&hooks, &"wanted".into(), asked.as_ref()).unwrap();
    let built = build.map_or(JsValue::NULL, JsValue::from_str);
    let result = wasm_bindgen_futures::JsFuture::from(prefetch_store(&spec.into(), &built, &hooks))
        .await
        .unwrap();
    let records = records.borrow();
    if result.is_null() || build.is_none() {
        assert!(
            records.is_empty(),
            "no early record without a prefetch or a build"
        );
        assert!(early.borrow().is_empty());
    } else {
        let recent = js_sys::Reflect::get(&result, &"recent".into()).unwrap();
        let text = |v: &JsValue| js_sys::JSON::stringify(v).ok().map(String::from);
        assert_eq!(
            records.len(),
            1,
            "the most recent record is handed over once"
        );
        assert_eq!(text(&records[0]), text(&recent));
    }
    let early = early.borrow().clone();
    (result, early)
}

/// Names of the databases this origin has.
async fn database_names() -> Vec<String> {
    let factory = js_sys::Reflect::get(&js_sys::global(), &"indexedDB".into()).unwrap();
    let databases: js_sys::Function = js_sys::Reflect::get(&factory, &"databases".into())
        .unwrap()
        .into();
    let list = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(
        databases.call0(&factory).unwrap(),
    ))
    .await
    .unwrap();
    js_sys::Array::from(&list)
        .iter()
        .filter_map(|d| js_sys::Reflect::get(&d, &"name".into()).ok()?.as_string())
        .collect()
}

#[wasm_bindgen_test]
fn store_prefetch_reads_the_engines_database_version_and_start_image() {
    let spec = ENGINE_STORE.with(JsValue::clone);
    let field = |key: &str| js_sys::Reflect::get(&spec, &key.into()).unwrap();
    assert_eq!(
        field("name").as_string().as_deref(),
        Some(sw_agent::store::DB_NAME)
    );
    assert_eq!(
        field("version").as_f64(),
        Some(f64::from(sw_agent::store::DB_VERSION))
    );
    let image: Vec<String> = js_sys::Array::from(&field("image"))
        .iter()
        .filter_map(|s| s.as_string())
        .collect();
    assert_eq!(image, stores::START_IMAGE);
    assert_eq!(
        field("snapshots").as_string().as_deref(),
        Some(stores::SNAPSHOTS)
    );
    let index = |key: &str| {
        js_sys::Reflect::get(&field("snapshotIndexes"), &key.into())
            .unwrap()
            .as_string()
    };
    assert_eq!(index("build").as_deref(), Some(stores::SNAPSHOTS_BY_BUILD));
    assert_eq!(index("recent").as_deref(), Some(stores::SNAPSHOTS_RECENT));
    let by_state = |key: &str| js_sys::Reflect::get(&field("runsByState"), &key.into()).unwrap();
    assert_eq!(by_state("store").as_string().as_deref(), Some(stores::RUNS));
    assert_eq!(
        by_state("index").as_string().as_deref(),
        Some(stores::RUNS_BY_STATE)
    );
    let terminal: Vec<String> = js_sys::Array::from(&by_state("terminal"))
        .iter()
        .filter_map(|s| s.as_string())
        .collect();
    assert_eq!(terminal, RunState::TERMINAL_NAMES);
}

/// A version-7 database (runs without the `state` index) holding finished,
/// unfinished and damaged runs opens as version 8: the index is built over
/// the existing runs, and a start, prefetched or not, reads the unfinished
/// ones and those whose state is no valid state name (decoded, reported),
/// never the finished ones; a run without a `state` key comes with its
/// thread. A run that finishes leaves the start's reads.
#[wasm_bindgen_test]
async fn idb_start_reads_only_unfinished_runs_through_the_state_index_also_after_the_upgrade_to_8()
{
    let name = "sw-agent-test-runs-by-state";
    let v7 = older_database(name, 7, true).await;
    let tx = v7
        .transaction(
            &[stores::THREADS, stores::RUNS],
            rexie::TransactionMode::ReadWrite,
        )
        .unwrap();
    let put = |store: &str, value: serde_json::Value| {
        let store = tx.store(store).unwrap();
        async move {
            store
                .put(&js_sys::JSON::parse(&value.to_string()).unwrap(), None)
                .await
                .unwrap();
        }
    };
    for t in ["t1", "t2", "t3", "t4"] {
        put(stores::THREADS, serde_json::to_value(thread(t)).unwrap()).await;
    }
    let runs = [
        run("r1", "t2", RunState::Completed, 1),
        run("r2", "t1", RunState::StreamingModel, 2),
        run("r3", "t2", RunState::Interrupted, 3),
        run("r4", "t3", RunState::WaitingApproval, 4),
        run("r7", "t2", RunState::BudgetPaused, 7),
        run("r8", "t2", RunState::Failed, 8),
    ];
    for r in &runs {
        put(stores::RUNS, serde_json::to_value(r).unwrap()).await;
    }
    let mut damaged = serde_json::to_value(run("r5", "t4", RunState::Queued, 5)).unwrap();
    damaged["state"] = serde_json::json!(42);
    put(stores::RUNS, damaged).await;
    let mut stateless = serde_json::to_value(run("r6", "t2", RunState::Queued, 6)).unwrap();
    stateless.as_object_mut().unwrap().remove("state");
    put(stores::RUNS, stateless).await;
    tx.done().await.unwrap();
    v7.close();
    assert!(
        prefetch(name).await.is_null(),
        "left for the engine to upgrade"
    );

    let store = IdbStore::open(name).await.expect("the engine upgrades it");
    let ids = |runs: &[Run]| {
        let mut ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
        sw_agent::sorting::sort(&mut ids);
        ids
    };
    let (image, skipped) = store.load_image().await.unwrap();
    assert_eq!(ids(&image.runs), ["r2", "r4"]);
    assert_eq!(
        skipped.len(),
        1,
        "the run with a damaged state: {skipped:?}"
    );
    assert!(skipped[0].contains("runs"), "{skipped:?}");
    store.close();

    let early = prefetch(name).await;
    let read: Vec<String> = js_sys::Array::from(
        &js_sys::Reflect::get(
            &js_sys::Reflect::get(&early, &"image".into()).unwrap(),
            &"runs".into(),
        )
        .unwrap(),
    )
    .iter()
    .filter_map(|r| js_sys::Reflect::get(&r, &"id".into()).ok()?.as_string())
    .collect();
    let mut read = read;
    sw_agent::sorting::sort(&mut read);
    assert_eq!(
        read,
        ["r2", "r4", "r5"],
        "the prefetch reads through the index"
    );
    let (store, values, keys) = IdbStore::prefetched(name, &early).unwrap();
    let (image, skipped) = store.image_from(values, keys).await.unwrap();
    assert_eq!(ids(&image.runs), ["r2", "r4"]);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    // The finished ones, and the one without a state, come with their thread.
    let (with_thread, skipped) = store.thread_runs("t2").await.unwrap();
    assert_eq!(ids(&with_thread), ["r1", "r3", "r7", "r8"]);
    assert_eq!(skipped.len(), 1, "the run without a state: {skipped:?}");

    // r2 finishes: a start no longer reads it.
    let mut finished = runs[1].clone();
    finished.state = RunState::Completed;
    let mut unit = UnitOfWork::new();
    unit.put(Record::Run(finished));
    store.commit(&unit).await.unwrap();
    let (image, _) = store.load_image().await.unwrap();
    assert_eq!(ids(&image.runs), ["r4"]);
    store.close();
    let _ = IdbStore::delete(name).await;
}

#[wasm_bindgen_test]
async fn idb_prefetched_start_image_is_the_image_the_store_reads_itself() {
    let name = "sw-agent-test-prefetch";
    let store = fresh_store(name).await;
    let mut t = thread("t1");
    t.leaf_id = Some("n1".into());
    let node = sw_agent::model::Node {
        id: "n1".into(),
        thread_id: "t1".into(),
        parent_id: None,
        created_at: 5,
        body: NodeBody::UserMessage {
            text: "hello".into(),
            steered: false,
            attachments: Vec::new(),
        },
    };
    let receipt = sw_agent::model::Receipt {
        key: "c1:s1".into(),
        fingerprint: "f".into(),
        op_type: "turn.submit".into(),
        result: serde_json::json!({"threadId": "t1"}),
        created_at: 5,
    };
    let cached = |thread_id: &str, build: &str, recent: bool| sw_agent::store::CachedSnapshot {
        thread_id: thread_id.into(),
        build: build.into(),
        recent_of: recent.then(|| build.to_string()),
        snapshot: sw_agent::protocol::Snapshot {
            protocol_version: sw_agent::protocol::PROTOCOL_VERSION,
            threads: vec![t.summary()],
            thread: None,
        },
    };
    // This build's most recent thread, another of its threads, and an
    // older build's most recent thread.
    let recent = cached("t1", "b1", true);
    let other = cached("t2", "b1", false);
    let old = cached("t3", "b0", true);
    let record = |c: &sw_agent::store::CachedSnapshot| {
        Record::Snapshot(sw_agent::store::SnapshotRecord {
            thread_id: c.thread_id.clone(),
            json: serde_json::to_string(c).unwrap(),
        })
    };
    store
        .commit(&UnitOfWork {
            puts: vec![
                Record::Thread(t.clone()),
                Record::Node(node.clone()),
                Record::Receipt(receipt),
                record(&recent),
                record(&other),
                record(&old),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
    let key = |thread_id: &str, build: Option<&str>| sw_agent::store::CachedKey {
        thread_id: thread_id.into(),
        build: build.map(str::to_string),
    };
    let (mut expected, skipped) = store.load_image().await.unwrap();
    assert!(skipped.is_empty());
    // Read by the engine itself: the cache's keys only, none current.
    assert_eq!(
        expected.snapshots,
        vec![key("t1", None), key("t2", None), key("t3", None)]
    );
    store.close();

    let early = prefetch(name).await;
    assert!(early.is_object(), "an up-to-date database is prefetched");
    // The worker script gets one record, this build's most recent thread's,
    // as the engine wrote it...
    let got = |of: &JsValue, key: &str| js_sys::Reflect::get(of, &key.into()).unwrap();
    let first: serde_json::Value = serde_wasm_bindgen::from_value(got(&early, "recent")).unwrap();
    assert_eq!(first, serde_json::to_value(&recent).unwrap());
    // ...and every other one when it asks for it.
    let db = got(&early, "db");
    let read = |thread_id: &'static str| {
        let db = db.clone();
        async move {
            let record = wasm_bindgen_futures::JsFuture::from(read_cached_snapshot(&db, thread_id))
                .await
                .unwrap();
            serde_wasm_bindgen::from_value::<Option<serde_json::Value>>(record).unwrap()
        }
    };
    assert_eq!(
        read("t2").await,
        Some(serde_json::to_value(&other).unwrap())
    );
    assert_eq!(read("t9").await, None);
    // A thread a panel asked for before the cache's keys were read comes
    // with the prefetch, read before the start image, as stored (whoever's
    // it is: the worker script serves only its build's); the most recent
    // thread's is not read twice.
    for thread_id in ["t2", "t3", "t9", "t1"] {
        let (again, wanted) = prefetch_wanting(name, Some("b1"), Some(thread_id)).await;
        let db = got(&again, "db");
        if thread_id == "t1" {
            assert!(wanted.is_empty(), "the most recent thread came first");
        } else {
            assert_eq!(wanted.len(), 1, "{thread_id}");
            assert_eq!(wanted[0].0, thread_id);
            let record: Option<serde_json::Value> =
                serde_wasm_bindgen::from_value(wanted[0].1.clone()).unwrap();
            assert_eq!(record, read(thread_id).await, "{thread_id}");
        }
        let close: js_sys::Function = got(&db, "close").into();
        close.call0(&db).unwrap();
    }
    let (store, values, keys) =
        IdbStore::prefetched(name, &early).expect("the prefetch checks out");
    let (image, skipped) = store.image_from(values, keys).await.unwrap();
    assert!(skipped.is_empty());
    // Prefetched, the build of this build's snapshots is known too.
    assert_eq!(
        image.snapshots,
        vec![
            key("t1", Some("b1")),
            key("t2", Some("b1")),
            key("t3", None)
        ]
    );
    expected.snapshots = image.snapshots.clone();
    assert_eq!(image, expected);
    assert_eq!(image.threads, vec![t]);
    // A unit deletes cached snapshots like any record.
    let mut unit = UnitOfWork::new();
    unit.delete(stores::SNAPSHOTS, "t1")
        .delete(stores::SNAPSHOTS, "t2")
        .delete(stores::SNAPSHOTS, "t3");
    store.commit(&unit).await.unwrap();
    assert!(store.dump(stores::SNAPSHOTS).await.unwrap().is_empty());
    // The prefetched connection commits, and reads open their own.
    let mut t2 = thread("t2");
    t2.title = "after".into();
    store
        .commit(&UnitOfWork {
            puts: vec![Record::Thread(t2)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(store.dump("threads").await.unwrap().len(), 2);
    let (tail, complete) = store.thread_tail_values("t1", 10).await.unwrap();
    assert!(complete);
    assert_eq!(IdbStore::decode_nodes(tail).0, vec![node]);
    store.close();
}

#[wasm_bindgen_test]
async fn idb_prefetch_reads_only_its_builds_most_recent_snapshot_also_after_the_upgrade_to_7() {
    // A version-6 database: the snapshot cache without its indexes, holding
    // a record the version-6 engine wrote (the `recent` flag).
    let name = "sw-agent-test-prefetch-v6";
    let v6 = older_database(name, 6, false).await;
    let tx = v6
        .transaction(&[stores::SNAPSHOTS], rexie::TransactionMode::ReadWrite)
        .unwrap();
    let old = serde_json::json!({"threadId": "t1", "build": "b1", "recent": true, "snapshot": {}});
    tx.store(stores::SNAPSHOTS)
        .unwrap()
        .put(&js_sys::JSON::parse(&old.to_string()).unwrap(), None)
        .await
        .unwrap();
    tx.done().await.unwrap();
    v6.close();
    assert!(
        prefetch(name).await.is_null(),
        "left for the engine to upgrade"
    );
    let store = IdbStore::open(name).await.expect("the engine upgrades it");
    let key = |thread_id: &str, build: Option<&str>| sw_agent::store::CachedKey {
        thread_id: thread_id.into(),
        build: build.map(str::to_string),
    };
    // What a prefetch by `build` gives: its `recent` record (as JSON, or
    // Null) and the cache's keys as the engine reads them.
    let prefetched = |build: Option<&'static str>| async move {
        let early = prefetch_for(name, build).await;
        assert!(early.is_object());
        let recent: serde_json::Value =
            serde_wasm_bindgen::from_value(js_sys::Reflect::get(&early, &"recent".into()).unwrap())
                .unwrap();
        let (store, values, keys) = IdbStore::prefetched(name, &early).unwrap();
        let snapshots = store.image_from(values, keys).await.unwrap().0.snapshots;
        store.close();
        (recent, snapshots)
    };
    // The old record is indexed by build, but it is nobody's most recent.
    assert_eq!(
        prefetched(Some("b1")).await,
        (serde_json::Value::Null, vec![key("t1", Some("b1"))])
    );
    // What the engine writes now is found by either index.
    let cached = sw_agent::store::CachedSnapshot {
        thread_id: "t2".into(),
        build: "b1".into(),
        recent_of: Some("b1".into()),
        snapshot: sw_agent::protocol::Snapshot {
            protocol_version: sw_agent::protocol::PROTOCOL_VERSION,
            threads: vec![],
            thread: None,
        },
    };
    let mut unit = UnitOfWork::new();
    unit.put(Record::Snapshot(sw_agent::store::SnapshotRecord {
        thread_id: "t2".into(),
        json: serde_json::to_string(&cached).unwrap(),
    }));
    store.commit(&unit).await.unwrap();
    store.close();
    assert_eq!(
        prefetched(Some("b1")).await,
        (
            serde_json::to_value(&cached).unwrap(),
            vec![key("t1", Some("b1")), key("t2", Some("b1"))]
        )
    );
    // Another build reads no record and knows none as its own; so does a
    // worker without a build id.
    for build in [Some("b2"), None] {
        assert_eq!(
            prefetched(build).await,
            (
                serde_json::Value::Null,
                vec![key("t1", None), key("t2", None)]
            )
        );
    }
    let _ = IdbStore::delete(name).await;
}

#[wasm_bindgen_test]
async fn idb_prefetch_never_creates_or_upgrades_and_a_stale_one_is_refused() {
    // No database: nothing is created (the engine creates it, with its schema).
    let name = "sw-agent-test-prefetch-none";
    let _ = IdbStore::delete(name).await;
    assert!(prefetch(name).await.is_null());
    assert!(!database_names().await.contains(&name.to_string()));

    // An older version: left as it is, for the engine to upgrade.
    let name = "sw-agent-test-prefetch-old";
    let _ = IdbStore::delete(name).await;
    let old = rexie::Rexie::builder(name)
        .version(4)
        .add_object_store(rexie::ObjectStore::new("threads").key_path("id"))
        .build()
        .await
        .unwrap();
    old.close();
    assert!(prefetch(name).await.is_null());
    let store = IdbStore::open(name).await.expect("the engine upgrades it");
    store.close();

    // What does not check out is refused and the engine reads itself.
    let name = "sw-agent-test-prefetch-shape";
    fresh_store(name).await.close();
    let early = prefetch(name).await;
    assert!(IdbStore::prefetched("another-name", &early).is_none());
    let early = prefetch(name).await;
    let image = js_sys::Reflect::get(&early, &"image".into()).unwrap();
    js_sys::Reflect::delete_property(&image.into(), &"interactions".into()).unwrap();
    assert!(
        IdbStore::prefetched(name, &early).is_none(),
        "a store missing from the image"
    );
    let early = prefetch(name).await;
    js_sys::Reflect::delete_property(&early.clone().into(), &"snapshots".into()).unwrap();
    assert!(
        IdbStore::prefetched(name, &early).is_none(),
        "the snapshot cache not read"
    );
    assert!(IdbStore::prefetched(name, &JsValue::NULL).is_none());
    assert!(IdbStore::prefetched(name, &js_sys::Object::new().into()).is_none());
}

#[wasm_bindgen_test]
async fn idb_start_decodes_unfinished_runs_and_a_thread_brings_its_own() {
    let name = "sw-agent-test-lazy-runs";
    let store = fresh_store(name).await;
    let done = run("r1", "t1", RunState::Completed, 1);
    let older = run("r2", "t2", RunState::Interrupted, 2);
    let active = run("r3", "t2", RunState::StreamingModel, 3);
    let mut unit = UnitOfWork::new();
    unit.put(Record::Thread(thread("t1")))
        .put(Record::Thread(thread("t2")))
        .put(Record::Run(done.clone()))
        .put(Record::Run(older.clone()))
        .put(Record::Run(active.clone()));
    store.commit(&unit).await.unwrap();
    // A finished run whose record is damaged is not even decoded at start.
    store
        .put_raw_for_tests(
            stores::RUNS,
            r#"{"id":"r9","threadId":"t1","state":"completed","createdAt":"yesterday"}"#,
        )
        .await
        .unwrap();

    let (image, skipped) = store.load_image().await.unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let mut ids: Vec<&str> = image.runs.iter().map(|r| r.id.as_str()).collect();
    sw_agent::sorting::sort(&mut ids);
    // t2 has an unfinished run: it loads at start with all its runs; t1's
    // finished ones wait for t1.
    assert_eq!(ids, vec!["r2", "r3"]);
    assert_eq!(image.loaded_threads, vec!["t2".to_string()]);
    let (runs, skipped) = store.thread_runs("t1").await.unwrap();
    assert_eq!(runs, vec![done]);
    assert_eq!(skipped.len(), 1, "the damaged one is reported when read");
    let (runs, _) = store.thread_runs("nobody").await.unwrap();
    assert!(runs.is_empty());
    store.close();
    let _ = IdbStore::delete(name).await;
}

#[wasm_bindgen_test]
async fn request_body_composed_of_kept_blobs_is_byte_identical_step_after_step() {
    use sw_agent::platform::fetch::{compose, BLOB_BODY_MIN_BYTES};
    use sw_agent::provider::body::BodyCache;
    use sw_agent::provider::{DynamicContext, OutboundToolCall};
    for transport in [Transport::OpenAi, Transport::Anthropic] {
        let mut messages = vec![ChatMessage::user("Read the page, über and over.")];
        let mut cache = BodyCache::new();
        let mut slots: Vec<web_sys::Blob> = Vec::new();
        let mut composed = 0;
        for step in 0..24 {
            // A step: a call and its (large) result; a steer now and then.
            messages.push(ChatMessage::Assistant {
                text: format!("Step {step}."),
                tool_calls: vec![OutboundToolCall {
                    id: format!("call_{step}"),
                    name: "read_page".into(),
                    arguments: serde_json::json!({ "n": step }),
                }],
                private: None,
            });
            messages.push(ChatMessage::ToolResult {
                call_id: format!("call_{step}"),
                content: format!("[e{step}] \"text\" ü ").repeat(1500).into(),
                is_error: false,
                images: Vec::new(),
            });
            if step % 7 == 3 {
                messages.push(ChatMessage::user(format!("Steer {step}")));
            }
            let mut request = provider_request(transport);
            request.messages = messages.clone().into();
            let context = DynamicContext {
                now_ms: 1_700_000_000_000 + step * 1000,
                tab: Some(("Shop".into(), "https://example.com/".into())),
            };
            let plan = cache.plan_with(&request, Some(&context));
            let expected = BodyCache::new().body_with(&request, Some(&context));
            assert_eq!(plan.len, expected.len());
            if plan.len < BLOB_BODY_MIN_BYTES {
                cache.forget_slots();
                slots.clear();
                continue;
            }
            let (kept, body) = compose(&plan, &slots).unwrap();
            slots = kept;
            composed += 1;
            let text = wasm_bindgen_futures::JsFuture::from(body.text())
                .await
                .unwrap()
                .as_string()
                .unwrap();
            assert_eq!(text, expected, "{transport:?} step {step}");
        }
        assert!(composed > 10, "{composed} bodies composed");
    }
    // A plan naming a slot the caller does not hold is an error, not a wrong body.
    let mut cache = BodyCache::new();
    let mut request = provider_request(Transport::OpenAi);
    let mut messages = Vec::new();
    for i in 0..4 {
        messages.push(ChatMessage::user(format!("{i}")));
        messages.push(ChatMessage::Assistant {
            text: "ok".into(),
            tool_calls: Vec::new(),
            private: None,
        });
    }
    request.messages = messages.clone().into();
    cache.plan_with(&request, None);
    messages.push(ChatMessage::user("5"));
    request.messages = messages.into();
    let plan = cache.plan_with(&request, None);
    assert!(compose(&plan, &[]).is_err());
}
