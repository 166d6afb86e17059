//! The wasm platform layer: the only code that does IO.
//!
//! Owns: the driver that executes engine effects in the service worker
//! (IndexedDB commits, streaming fetch, Ports to the panel and to content
//! scripts, timers, alarms) and feeds results back; the `Engine` class that
//! `extension/sw.js` calls.
//!
//! Must not: make engine decisions. `JsValue` errors become typed errors in
//! `error::js_to_error`.

pub mod browser_tools;
pub mod chrome;
pub mod error;
pub mod fetch;
pub mod idb;
pub mod metrics;
pub mod port;
pub mod stream;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use gloo_timers::callback::Timeout;
use gloo_timers::future::TimeoutFuture;
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::AbortController;

use crate::engine::{Approver, ConnId, Effect, Engine, EngineConfig, ToolOutcome};
use crate::gatekeeper::{origin_of, TargetInfo};
use crate::model::ProviderProfile;
use crate::protocol::{classify_sender, ErrorKind, PageMessage, PageRequest};
use crate::provider::{
    add_dynamic_context, http_request, DynamicContext, ProviderError, ProviderRequest,
    ProviderResponse, Transport,
};
use crate::store::UnitOfWork;
use crate::tools::Binding;
use error::JsError;
use idb::IdbStore;
use port::Port;

/// IndexedDB database name.
pub const DB_NAME: &str = "sw-agent";
/// The alarm that wakes a killed worker while a run is active.
pub const HEARTBEAT_ALARM: &str = "sw-agent-heartbeat";
/// A page tool that does not answer within this time fails (ms).
const TOOL_TIMEOUT_MS: u32 = 60_000;

fn now() -> u64 {
    js_sys::Date::now() as u64
}

fn warn(message: &str) {
    web_sys::console::warn_1(&JsValue::from_str(&format!("[sw-agent] {message}")));
}

/// Provider settings from `chrome.storage.local.settings`, split into the
/// profile the engine may see and the API key only fetch may see.
pub fn parse_settings(settings: &JsValue) -> (ProviderProfile, String) {
    let value: Value = serde_wasm_bindgen::from_value(settings.clone()).unwrap_or(Value::Null);
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let kind = match text("provider").as_str() {
        "anthropic" => "anthropic".to_string(),
        _ => "openai".to_string(),
    };
    let max_output_tokens = value
        .get("maxOutputTokens")
        .and_then(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        })
        .filter(|n| *n >= 1.0 && *n <= 1_000_000.0)
        .map(|n| n as u32);
    let temperature_centi = value
        .get("temperature")
        .and_then(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        })
        .filter(|t| (0.0..=2.0).contains(t))
        .map(|t| (t * 100.0).round() as u32);
    let number = |k: &str| {
        value.get(k).and_then(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        })
    };
    let flag = |k: &str, default: bool| value.get(k).and_then(Value::as_bool).unwrap_or(default);
    let profile = ProviderProfile {
        kind,
        base_url: text("baseUrl"),
        model: text("model"),
        max_output_tokens,
        temperature_centi,
        // Safe defaults: no images unless the user says the model sees them.
        vision: flag("vision", false),
        tool_use: flag("toolUse", true),
        token_budget: value
            .get("tokenBudget")
            .and_then(|v| {
                v.as_f64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            })
            .filter(|n| *n >= 1.0)
            .map(|n| n as u64),
        context_window: number("contextWindow")
            .filter(|n| *n >= 1_000.0)
            .map(|n| n as u64),
    };
    (profile, text("apiKey"))
}

struct Driver {
    engine: RefCell<Engine>,
    store: IdbStore,
    own_origin: String,
    ports: RefCell<HashMap<ConnId, Port>>,
    provider_aborts: RefCell<HashMap<u64, AbortController>>,
    page_ports: RefCell<HashMap<u64, Port>>,
    timer: RefCell<Option<(u64, Timeout)>>,
    metrics: RefCell<metrics::Metrics>,
    me: Weak<Driver>,
}

impl Driver {
    /// Feed one input to the engine, then execute what it produced.
    fn input(&self, f: impl FnOnce(&mut Engine, u64)) {
        let started = metrics::precise_now();
        f(&mut self.engine.borrow_mut(), now());
        self.metrics
            .borrow_mut()
            .engine
            .add(metrics::precise_now() - started);
        self.pump();
    }

    fn pump(&self) {
        loop {
            let started = metrics::precise_now();
            let effect = self.engine.borrow_mut().poll_effect();
            self.metrics
                .borrow_mut()
                .engine
                .add(metrics::precise_now() - started);
            match effect {
                Some(effect) => self.execute(effect),
                None => break,
            }
        }
        self.schedule_timer();
    }

    fn rc(&self) -> Rc<Driver> {
        self.me
            .upgrade()
            .expect("driver lives as long as the worker")
    }

    fn execute(&self, effect: Effect) {
        match effect {
            Effect::Persist { token, unit } => {
                let d = self.rc();
                spawn_local(async move { d.persist(token, unit).await });
            }
            Effect::LoadThread { thread_id } => {
                let d = self.rc();
                spawn_local(async move {
                    match d.store.thread_nodes(&thread_id).await {
                        Ok((nodes, skipped)) => {
                            for s in skipped {
                                warn(&format!("skipped an undecodable record: {s}"));
                            }
                            d.input(|e, now| e.handle_thread_loaded(now, &thread_id, nodes));
                        }
                        Err(err) => d.input(|e, _| e.handle_thread_load_error(&thread_id, err)),
                    }
                });
            }
            Effect::CallProvider {
                request_id,
                request,
                idle_timeout_ms,
            } => {
                let d = self.rc();
                spawn_local(
                    async move { d.call_provider(request_id, request, idle_timeout_ms).await },
                );
            }
            Effect::AbortProvider { request_id } => {
                if let Some(controller) = self.provider_aborts.borrow_mut().remove(&request_id) {
                    controller.abort();
                }
            }
            Effect::ResolveTarget { resolve_id, .. } => {
                let d = self.rc();
                spawn_local(async move {
                    let target = target_tab().await.map(chrome::TabInfo::into_target);
                    d.input(|e, now| e.handle_target_resolved(now, resolve_id, target));
                });
            }
            Effect::DispatchTool {
                dispatch_id,
                call_id,
                name,
                params,
                target,
                binding,
                ..
            } => {
                let d = self.rc();
                spawn_local(async move {
                    d.run_tool(dispatch_id, call_id, name, params, target, binding)
                        .await
                });
            }
            Effect::AbortTool { dispatch_id } => {
                if let Some(port) = self.page_ports.borrow_mut().remove(&dispatch_id) {
                    port.disconnect();
                }
            }
            Effect::Send { conn, event } => {
                let message =
                    match event.serialize(&serde_wasm_bindgen::Serializer::json_compatible()) {
                        Ok(m) => m,
                        Err(e) => return warn(&format!("could not encode an event: {e}")),
                    };
                {
                    let mut m = self.metrics.borrow_mut();
                    m.events_sent += 1;
                    if matches!(event.event, crate::protocol::Event::ItemDelta { .. }) {
                        m.deltas_sent += 1;
                    }
                }
                let port = self.ports.borrow().get(&conn).cloned();
                if let Some(port) = port {
                    if port.post(&message).is_err() {
                        self.ports.borrow_mut().remove(&conn);
                    }
                }
            }
            Effect::SetHeartbeat { active } => spawn_local(async move {
                let result = if active {
                    chrome::set_alarm(HEARTBEAT_ALARM, 0.5).await
                } else {
                    chrome::clear_alarm(HEARTBEAT_ALARM).await
                };
                if let Err(e) = result {
                    warn(&format!("heartbeat alarm: {e}"));
                }
            }),
        }
    }

    async fn persist(&self, token: u64, unit: UnitOfWork) {
        let started = metrics::precise_now();
        let result = self.store.commit(&unit).await;
        self.metrics
            .borrow_mut()
            .commits
            .add(metrics::precise_now() - started);
        match result {
            Ok(()) => self.input(|e, now| e.handle_store_ack(now, token)),
            Err(err) => self.input(|e, now| e.handle_store_error(now, token, err)),
        }
    }

    fn schedule_timer(&self) {
        let next = self.engine.borrow().poll_timeout();
        let mut timer = self.timer.borrow_mut();
        match next {
            None => *timer = None,
            Some(at) if timer.as_ref().is_some_and(|(t, _)| *t == at) => {}
            Some(at) => {
                let delay = at.saturating_sub(now()).min(u64::from(u32::MAX)) as u32;
                let weak = self.me.clone();
                *timer = Some((
                    at,
                    Timeout::new(delay, move || {
                        if let Some(d) = weak.upgrade() {
                            d.timer.borrow_mut().take();
                            d.input(|e, now| e.handle_timeout(now));
                        }
                    }),
                ));
            }
        }
    }

    async fn call_provider(&self, request_id: u64, request: ProviderRequest, idle_timeout_ms: u64) {
        let controller = match AbortController::new() {
            Ok(c) => c,
            Err(e) => {
                let err = ProviderError::new(
                    ErrorKind::Internal,
                    error::js_to_error(e).to_string(),
                    false,
                );
                return self.input(|e, now| e.handle_provider_done(now, request_id, Err(err)));
            }
        };
        self.provider_aborts
            .borrow_mut()
            .insert(request_id, controller.clone());
        let started = metrics::precise_now();
        let result = self
            .stream_provider(request_id, &request, &controller, idle_timeout_ms)
            .await;
        self.metrics
            .borrow_mut()
            .provider
            .add(metrics::precise_now() - started);
        let aborted_by_engine = self
            .provider_aborts
            .borrow_mut()
            .remove(&request_id)
            .is_none();
        if aborted_by_engine {
            return; // the engine asked for the abort and expects nothing more
        }
        self.input(|e, now| e.handle_provider_done(now, request_id, result));
    }

    async fn stream_provider(
        &self,
        request_id: u64,
        request: &ProviderRequest,
        controller: &AbortController,
        idle_timeout_ms: u64,
    ) -> Result<ProviderResponse, ProviderError> {
        // The key is read fresh for each request (it may rotate) and only
        // ever goes into a request header.
        let settings = chrome::load_settings().await.unwrap_or(JsValue::UNDEFINED);
        let (_, api_key) = parse_settings(&settings);
        let transport = Transport::from_kind(&request.profile.kind);
        let mut request = request.clone();
        let context = DynamicContext {
            now_ms: now(),
            tab: target_tab().await.ok().map(|t| (t.title, t.url)),
        };
        add_dynamic_context(&mut request, &context);
        let http = http_request(&request, &api_key);
        stream::stream_response(&http, transport, controller, idle_timeout_ms, |delta| {
            self.input(|e, now| e.handle_provider_delta(now, request_id, delta));
        })
        .await
    }

    async fn run_tool(
        &self,
        dispatch_id: u64,
        call_id: String,
        name: String,
        params: Value,
        target: Option<TargetInfo>,
        binding: Binding,
    ) {
        let work = async {
            match (binding, &target) {
                (Binding::Page, _) => {
                    self.page_tool(dispatch_id, &call_id, &name, params, target.clone())
                        .await
                }
                (Binding::Tab, Some(target)) => {
                    check_origin(target).await?;
                    browser_tools::tab_tool(&name, &params, target).await
                }
                (Binding::Tab, None) => Err("No page was resolved for this tool.".to_string()),
                (Binding::Browser, _) => browser_tools::browser_tool(&name, &params).await,
                (Binding::Engine, _) => {
                    Err(format!("{name} is run by the engine, not the browser."))
                }
            }
        }
        .fuse();
        let timeout = TimeoutFuture::new(TOOL_TIMEOUT_MS).fuse();
        let started = metrics::precise_now();
        futures::pin_mut!(work, timeout);
        let result = futures::select! {
            r = work => r,
            _ = timeout => Err(format!("The page did not answer within {} seconds.", TOOL_TIMEOUT_MS / 1000)),
        };
        self.metrics
            .borrow_mut()
            .tools
            .add(metrics::precise_now() - started);
        if let Some(port) = self.page_ports.borrow_mut().remove(&dispatch_id) {
            port.disconnect();
        }
        let outcome = result.unwrap_or_else(|message| ToolOutcome::text(false, message));
        self.input(|e, now| e.handle_tool_result(now, dispatch_id, outcome));
    }

    async fn page_tool(
        &self,
        dispatch_id: u64,
        call_id: &str,
        name: &str,
        params: Value,
        target: Option<TargetInfo>,
    ) -> Result<ToolOutcome, String> {
        let target = target.ok_or("No page was resolved for this tool.")?;
        let tab = check_origin(&target).await?;
        chrome::inject_content_script(tab).await.map_err(|e| {
            format!(
                "Cannot run page tools in this tab ({}). Browser pages (chrome://, the Web Store) cannot be automated; open a normal web page.",
                e.message
            )
        })?;
        let port = Port(
            chrome::connect_tab(tab, "page")
                .map_err(|e| format!("Could not reach the page: {e}"))?,
        );
        let (sender, mut receiver) = mpsc::unbounded::<Option<JsValue>>();
        let on_message = {
            let sender = sender.clone();
            Closure::<dyn FnMut(JsValue)>::new(move |m: JsValue| {
                let _ = sender.unbounded_send(Some(m));
            })
        };
        let on_disconnect = Closure::<dyn FnMut(JsValue)>::new(move |_| {
            let _ = sender.unbounded_send(None);
        });
        port.on_message(&on_message).map_err(|e| e.to_string())?;
        port.on_disconnect(&on_disconnect)
            .map_err(|e| e.to_string())?;
        self.page_ports
            .borrow_mut()
            .insert(dispatch_id, port.clone());
        let request = PageRequest::ToolExecute {
            call_id: call_id.to_string(),
            name: name.to_string(),
            params,
        };
        let message = request
            .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
            .map_err(|e| e.to_string())?;
        port.post(&message)
            .map_err(|e| format!("Could not reach the page: {e}"))?;
        while let Some(item) = receiver.next().await {
            let Some(raw) = item else {
                return Err("The page closed or navigated away before the tool finished.".into());
            };
            let Ok(message) = serde_wasm_bindgen::from_value::<PageMessage>(raw) else {
                warn("ignored a malformed message from a content script");
                continue;
            };
            match message {
                PageMessage::ToolProgress { call_id: c, text } if c == call_id => {
                    self.input(|e, now| e.handle_tool_progress(now, dispatch_id, text));
                }
                PageMessage::ToolResult {
                    call_id: c,
                    ok,
                    content,
                    details,
                } if c == call_id => {
                    return Ok(ToolOutcome {
                        ok,
                        content,
                        details,
                        images: Vec::new(),
                    });
                }
                _ => {}
            }
        }
        Err("The page closed before the tool finished.".into())
    }
}

/// Act only on the page the gatekeeper approved: if the tab moved to
/// another origin meanwhile, nothing is done. Returns the tab id.
async fn check_origin(target: &TargetInfo) -> Result<i32, String> {
    let tab = chrome::get_tab(target.tab_id as i32)
        .await
        .map_err(|e| format!("The tab is gone ({e}); call page_snapshot on the current page."))?;
    let now_origin = origin_of(&tab.url);
    if now_origin != target.origin {
        return Err(format!(
            "The tab changed from {} to {} before the action ran; nothing was done. Call page_snapshot to look at the new page.",
            target.origin, now_origin
        ));
    }
    Ok(tab.id)
}

/// The tab page tools act on: the active tab of the focused window, unless
/// that is this extension's own page (the side panel opened as a tab), in
/// which case the most recently used other web tab. A browser page is
/// returned as it is: the gatekeeper refuses it with a clear reason.
async fn target_tab() -> Result<chrome::TabInfo, String> {
    let own = chrome::own_origin();
    let ours = |url: &str| !own.is_empty() && url.starts_with(&own);
    let is_web = |url: &str| {
        url.starts_with("http://") || url.starts_with("https://") || url.starts_with("file://")
    };
    let failed = |e: JsError| format!("Could not list tabs: {e}");
    let active = chrome::query_tabs(true).await.map_err(failed)?;
    if let Some(tab) = active.into_iter().find(|t| !ours(&t.url)) {
        return Ok(tab);
    }
    let all = chrome::query_tabs(false).await.map_err(failed)?;
    all.into_iter()
        .filter(|t| is_web(&t.url))
        .max_by(|a, b| a.last_accessed.total_cmp(&b.last_accessed))
        .ok_or_else(|| {
            "No web page is open. Open the page you want me to work on in a tab, then try again."
                .to_string()
        })
}

/// The engine as `extension/sw.js` sees it.
#[wasm_bindgen(js_name = Engine)]
pub struct EngineHandle {
    driver: Rc<Driver>,
}

#[wasm_bindgen(js_class = Engine)]
impl EngineHandle {
    /// Open the database, recover unfinished runs and start driving them.
    pub async fn start() -> Result<EngineHandle, wasm_bindgen::JsError> {
        let started = metrics::precise_now();
        let store = IdbStore::open(DB_NAME)
            .await
            .map_err(|e| wasm_bindgen::JsError::new(&e.message))?;
        let (image, skipped) = store
            .load_image()
            .await
            .map_err(|e| wasm_bindgen::JsError::new(&e.message))?;
        for s in skipped {
            warn(&format!("skipped an undecodable record: {s}"));
        }
        let settings = chrome::load_settings().await.unwrap_or(JsValue::UNDEFINED);
        let (profile, _) = parse_settings(&settings);
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| wasm_bindgen::JsError::new(&e.to_string()))?;
        // The side panel answers approval requests.
        let config = EngineConfig {
            approver: Approver::Interactive,
            ..EngineConfig::default()
        };
        let engine = Engine::new(config, profile, u64::from_le_bytes(seed), image, now());
        let driver = Rc::new_cyclic(|me| Driver {
            engine: RefCell::new(engine),
            store,
            own_origin: chrome::own_origin(),
            ports: RefCell::new(HashMap::new()),
            provider_aborts: RefCell::new(HashMap::new()),
            page_ports: RefCell::new(HashMap::new()),
            timer: RefCell::new(None),
            metrics: RefCell::new(metrics::Metrics::default()),
            me: me.clone(),
        });
        let weak = Rc::downgrade(&driver);
        chrome::on_settings_changed(move |settings| {
            if let Some(d) = weak.upgrade() {
                let (profile, _) = parse_settings(&settings);
                d.input(|e, _| e.handle_settings(profile));
            }
        });
        driver.pump();
        driver.metrics.borrow_mut().start_ms = metrics::precise_now() - started;
        Ok(EngineHandle { driver })
    }

    /// A Port connected (`id` is assigned by sw.js).
    pub fn on_connect(&self, id: f64, port: JsValue) {
        let port = Port(port);
        let (url, origin) = port.sender();
        let kind = classify_sender(&self.driver.own_origin, url.as_deref(), origin.as_deref());
        self.driver.ports.borrow_mut().insert(id as ConnId, port);
        self.driver
            .input(|e, _| e.handle_connect(id as ConnId, kind));
    }

    pub fn on_message(&self, id: f64, message: JsValue) {
        let value: Value = serde_wasm_bindgen::from_value(message).unwrap_or(Value::Null);
        self.driver
            .input(|e, now| e.handle_message(now, id as ConnId, value));
    }

    pub fn on_disconnect(&self, id: f64) {
        self.driver.ports.borrow_mut().remove(&(id as ConnId));
        self.driver.input(|e, _| e.handle_disconnect(id as ConnId));
    }

    /// The heartbeat alarm woke the worker; starting the engine already resumed runs.
    pub fn on_alarm(&self, _name: String) {
        self.driver.pump();
    }

    pub fn on_installed(&self) {
        spawn_local(async {
            if let Err(e) = chrome::open_panel_on_action_click().await {
                warn(&format!("could not set the side panel behaviour: {e}"));
            }
        });
    }

    pub fn on_startup(&self) {
        self.driver.pump();
    }

    /// What the driver measured (benchmarks, diagnostics): engine time,
    /// commits, provider and tool time, events sent.
    pub fn metrics(&self) -> Result<JsValue, wasm_bindgen::JsError> {
        self.driver
            .metrics
            .borrow()
            .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
            .map_err(|e| wasm_bindgen::JsError::new(&e.to_string()))
    }

    /// Start measuring afresh (the start time is kept).
    pub fn reset_metrics(&self) {
        let mut m = self.driver.metrics.borrow_mut();
        let start_ms = m.start_ms;
        *m = metrics::Metrics::default();
        m.start_ms = start_ms;
    }
}
