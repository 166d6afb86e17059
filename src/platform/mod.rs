//! The wasm platform layer: the only code that does IO.
//!
//! Owns: the driver that executes engine effects in the service worker
//! (IndexedDB commits, streaming fetch, Ports to the panel and to content
//! scripts, timers, alarms) and feeds results back; the `Engine` class that
//! `extension/sw.js` calls.
//!
//! Must not: make engine decisions. `JsValue` errors become typed errors in
//! `error::js_to_error`.

pub mod boundary;
pub mod browser_tools;
pub mod chrome;
pub mod error;
pub mod fetch;
pub mod host_tools;
pub mod idb;
pub mod image;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod metrics;
#[cfg(not(feature = "mcp"))]
mod no_mcp;
#[cfg(feature = "mcp")]
pub mod oauth;
pub mod port;
pub mod stream;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use gloo_timers::callback::Timeout;
use gloo_timers::future::TimeoutFuture;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::AbortController;

use crate::engine::{
    Approver, ConnId, Effect, Engine, EngineConfig, Heartbeat, ToolDispatch, ToolOutcome,
};
use crate::frames::{self, ChildFrame, FrameOutline, Placeholder};
use crate::gatekeeper::{self, origin_of, TargetElement, TargetInfo};
use crate::model::ProviderProfile;
#[cfg(feature = "mcp")]
use crate::model::{McpServerOrigin, McpServerState};
use crate::protocol::{classify_sender, ClientKind, ErrorKind, PageMessage, PageRequest};
use crate::provider::{
    http_target, DynamicContext, ProviderError, ProviderRequest, ProviderResponse, Transport,
};
use crate::settings;
use crate::store::UnitOfWork;
use crate::tools::{time_limit_text, Binding, TOOL_TIME_LIMIT_MS};
use crate::vecmap::VecMap;
use error::JsError;
use idb::IdbStore;
use port::Port;

pub use crate::store::DB_NAME;
/// The alarm that wakes a killed worker while a run is active.
pub const HEARTBEAT_ALARM: &str = "sw-agent-heartbeat";
/// How often a worker kept alive makes its keepalive call (ms). Chrome
/// stops a worker 30 s after its last event or extension-API call; 20 s
/// leaves a third of that as margin (the alarm's own 30 s period, Chrome's
/// minimum, leaves none).
const KEEPALIVE_MS: u32 = 20_000;

fn now() -> u64 {
    js_sys::Date::now() as u64
}

fn warn(message: &str) {
    web_sys::console::warn_1(&JsValue::from_str(&format!("[sw-agent] {message}")));
}

/// What the embedding extension must fix, in the worker's console.
fn console_error(message: &str) {
    web_sys::console::error_1(&JsValue::from_str(&format!("[sw-agent] {message}")));
}

/// Provider settings from `chrome.storage.local.settings` over the
/// extension's checked defaults (`crate::settings`), split into the profile
/// the engine may see and the API key only fetch may see.
pub fn parse_settings(
    stored: &JsValue,
    defaults: &serde_json::Map<String, Value>,
) -> (ProviderProfile, String) {
    let stored = boundary::from_js_value(stored.clone());
    settings::profile_of(&settings::effective(&stored, defaults))
}

/// How many outbound views keep their request bodies (see `Driver::bodies`).
const KEPT_BODIES: usize = 4;

/// One outbound view's kept request body.
struct KeptBody {
    view: u64,
    cache: crate::provider::body::BodyCache,
    slots: Vec<web_sys::Blob>,
}

/// The first id of a worker client (`Engine.connectClient`); sw.js numbers
/// Ports from 1, far below it.
const WORKER_CLIENT_IDS: ConnId = 1 << 40;

/// An MCP server's request for input waiting for the user: the server,
/// the request's JSON-RPC id and which of the call's requests it is
/// (`ToolClock::asked`).
#[cfg(feature = "mcp")]
type WaitingRequest = (Rc<mcp::Server>, Value, u32);

/// How long an MCP server's request for the user's input waits for an
/// answer (10 minutes) before it is withdrawn and the server told `cancel`.
#[cfg(feature = "mcp")]
const ELICITATION_WAIT_MS: u32 = 10 * 60 * 1000;

/// How many times one call's server may ask the user for input; later
/// requests are refused to the server (invalid params).
#[cfg(feature = "mcp")]
const MAX_ELICITATIONS_PER_CALL: u32 = 5;

/// A running tool call's time limit. It waits while the user is asked
/// for input (`paused`), and starts again, whole, once the answer is sent:
/// the limit measures the tool, not the user. (Only an MCP server asks:
/// without the feature `mcp` the clock is never paused.)
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
struct ToolClock {
    limit_ms: u32,
    /// When the limit is reached (`Date.now()` ms).
    deadline: Cell<f64>,
    paused: Cell<bool>,
    /// Wakes `expired` when the clock starts again after a pause.
    resumed: RefCell<Option<futures::channel::oneshot::Sender<()>>>,
    /// How many times the call's server asked the user for input.
    asked: Cell<u32>,
}

#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
impl ToolClock {
    fn start(limit_ms: u32) -> Rc<Self> {
        Rc::new(ToolClock {
            limit_ms,
            deadline: Cell::new(js_sys::Date::now() + f64::from(limit_ms)),
            paused: Cell::new(false),
            resumed: RefCell::new(None),
            asked: Cell::new(0),
        })
    }

    fn pause(&self) {
        self.paused.set(true);
    }

    fn restart(&self) {
        self.deadline
            .set(js_sys::Date::now() + f64::from(self.limit_ms));
        self.paused.set(false);
        if let Some(wake) = self.resumed.borrow_mut().take() {
            let _ = wake.send(());
        }
    }

    /// Ends when the limit is reached.
    async fn expired(self: Rc<Self>) {
        loop {
            if self.paused.get() {
                let (wake, woken) = futures::channel::oneshot::channel();
                *self.resumed.borrow_mut() = Some(wake);
                // Only `restart` sends; the sender lives as long as the clock.
                let _ = woken.await;
                continue;
            }
            let left = self.deadline.get() - js_sys::Date::now();
            if left <= 0.0 {
                return;
            }
            TimeoutFuture::new(left.ceil().min(f64::from(u32::MAX)) as u32).await;
        }
    }
}

struct Driver {
    engine: RefCell<Engine>,
    store: IdbStore,
    own_origin: String,
    ports: RefCell<VecMap<ConnId, Port>>,
    /// Clients in the worker itself (`Engine.connectClient`): the function
    /// each one's events are handed to.
    worker_clients: RefCell<VecMap<ConnId, js_sys::Function>>,
    /// The next worker client's id: from `WORKER_CLIENT_IDS` up, apart
    /// from the Port ids sw.js counts from 1.
    next_worker_client: Cell<ConnId>,
    provider_aborts: RefCell<VecMap<u64, AbortController>>,
    page_ports: RefCell<VecMap<u64, Port>>,
    /// The tools the embedding extension defined (`extension/host-tools.js`)
    /// and, per running call, the controller of the signal it was given.
    host_tools: host_tools::HostTools,
    /// What gives up a running host or MCP tool call, by dispatch.
    host_aborts: RefCell<VecMap<u64, AbortController>>,
    /// The time limit of each running tool call, by dispatch (it waits
    /// while the user is asked for input).
    clocks: RefCell<VecMap<u64, Rc<ToolClock>>>,
    /// An MCP server's request for input waiting for the user, by the
    /// dispatch of the call it came with.
    #[cfg(feature = "mcp")]
    elicitations: RefCell<VecMap<u64, WaitingRequest>>,
    /// The embedding extension's MCP servers (`extension/mcp-servers.js`).
    #[cfg(feature = "mcp")]
    mcp: mcp::McpServers,
    /// The tools each server listed last (`chrome.storage.local.mcpCatalog`:
    /// name → `{ url, tools }`): a new worker offers them at once, so a run
    /// that started with them resumes before the servers answer.
    #[cfg(feature = "mcp")]
    mcp_catalog: RefCell<serde_json::Map<String, Value>>,
    timer: RefCell<Option<(u64, Timeout)>>,
    metrics: RefCell<metrics::Metrics>,
    /// Request bodies kept between steps, one per outbound view (a thread's
    /// run, `ProviderRequest::lineage`), the most recent first, at most
    /// `KEPT_BODIES`: the encoded message groups (a step re-encodes only
    /// what changed, `provider::body`) and the `Blob`s the last plan left
    /// (see `request_body`). Two threads running at once keep theirs; a
    /// side request (title, compaction, connection test) keeps none.
    bodies: RefCell<Vec<KeptBody>>,
    /// What was last asked of the wake-up alarm (set or cleared); `None`
    /// before the first call. Going between `Off` and `Awake` (a panel's
    /// connect or disconnect) needs no `chrome.alarms` call.
    alarm: Cell<Option<bool>>,
    /// Whether the keepalive loop runs (`keep_alive`).
    keeping_alive: Cell<bool>,
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

    /// Decode a thread read (all of it, or its tail when not `complete`,
    /// with every run of the thread) and hand it to the engine, timing each
    /// part; either read failing fails the load.
    fn thread_read(
        &self,
        thread_id: &str,
        read_started: f64,
        read: Result<(Vec<JsValue>, bool), crate::store::StoreError>,
        runs: Result<(Vec<crate::model::Run>, idb::Skipped), crate::store::StoreError>,
    ) {
        let ((values, complete), (runs, skipped_runs)) = match read.and_then(|r| Ok((r, runs?))) {
            Ok(read) => read,
            Err(err) => {
                return self.input(|e, now| e.handle_thread_load_error(now, thread_id, err))
            }
        };
        let started = metrics::precise_now();
        {
            let mut m = self.metrics.borrow_mut();
            m.thread_read.add(started - read_started);
            m.thread_records += values.len() as u64;
        }
        let (nodes, skipped) = IdbStore::decode_nodes(values);
        let decoded = metrics::precise_now();
        for s in skipped.into_iter().chain(skipped_runs) {
            warn(&format!("skipped an undecodable record: {s}"));
        }
        self.input(|e, now| e.handle_thread_tail_loaded(now, thread_id, nodes, runs, complete));
        let mut m = self.metrics.borrow_mut();
        m.thread_decode.add(decoded - started);
        m.thread_build.add(metrics::precise_now() - decoded);
    }

    /// Read a thread's runs and its nodes (all of them, or the newest
    /// `tail` by creation time) together, then hand them to the engine.
    fn load_thread(&self, thread_id: String, tail: Option<usize>) {
        let d = self.rc();
        spawn_local(async move {
            let started = metrics::precise_now();
            let nodes = async {
                match tail {
                    Some(count) => d.store.thread_tail_values(&thread_id, count).await,
                    None => d
                        .store
                        .thread_node_values(&thread_id)
                        .await
                        .map(|v| (v, true)),
                }
            };
            let (runs, read) = futures::join!(d.store.thread_runs(&thread_id), nodes);
            d.thread_read(&thread_id, started, read, runs)
        });
    }

    fn rc(&self) -> Rc<Driver> {
        self.me
            .upgrade()
            .expect("driver lives as long as the worker")
    }

    fn execute(&self, effect: Effect) {
        match effect {
            Effect::LoadReceipts => {
                let d = self.rc();
                spawn_local(async move {
                    // After a macrotask: the `initialize`s sw.js queued
                    // during the start are delivered, and their threads'
                    // reads issued, first. Issued before them, the receipts
                    // of a long-used profile (3,000) held a thread's read
                    // back by ~60 ms (BENCHMARKS.md item 33).
                    TimeoutFuture::new(0).await;
                    let read = d.store.receipts().await.map(|(receipts, skipped)| {
                        for s in skipped {
                            warn(&format!("skipped an undecodable record: {s}"));
                        }
                        receipts
                    });
                    d.input(|e, now| e.handle_receipts_loaded(now, read));
                });
            }
            Effect::Persist { token, unit } => {
                let d = self.rc();
                spawn_local(async move { d.persist(token, unit).await });
            }
            Effect::LoadThread { thread_id } => self.load_thread(thread_id, None),
            Effect::LoadThreadTail { thread_id, nodes } => self.load_thread(thread_id, Some(nodes)),
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
            Effect::ResolveTarget {
                resolve_id,
                params,
                write,
                describe,
                ..
            } => {
                let d = self.rc();
                spawn_local(async move {
                    let mut target = resolve_target(params.as_ref(), write).await;
                    if let (true, Ok(found), Some(params)) = (describe, &mut target, &params) {
                        // Fail closed: a write whose element the page cannot
                        // describe is not asked about (the user would approve
                        // an element nobody named) and not run.
                        match d.describe_element(resolve_id, found, params).await {
                            Ok(element) => found.element = element,
                            Err(problem) => target = Err(problem),
                        }
                    }
                    d.input(|e, now| e.handle_target_resolved(now, resolve_id, target));
                });
            }
            Effect::DispatchTool(call) => {
                let d = self.rc();
                spawn_local(async move { d.run_tool(call).await });
            }
            Effect::AbortTool { dispatch_id } => {
                self.close_page_port(dispatch_id);
                self.abort_host_tool(dispatch_id);
            }
            #[cfg(feature = "mcp")]
            Effect::AnswerElicitation {
                dispatch_id,
                action,
                content,
            } => {
                let waiting = self.elicitations.borrow_mut().remove(&dispatch_id);
                if let Some((server, id, _)) = waiting {
                    server.send(crate::elicitation::answer(&id, action, content.as_ref()));
                }
                if let Some(clock) = self.clocks.borrow().get(&dispatch_id) {
                    clock.restart();
                }
            }
            #[cfg(feature = "mcp")]
            Effect::ListMcpTools { names } => {
                for name in names {
                    if let Some(server) = self.mcp.get(&name) {
                        self.relist_mcp(server);
                    }
                }
            }
            #[cfg(feature = "mcp")]
            Effect::SignInMcp { name } => {
                if let Some(server) = self.mcp.get(&name) {
                    let driver = self.rc();
                    spawn_local(async move { driver.sign_in_mcp(server).await });
                }
            }
            #[cfg(feature = "mcp")]
            Effect::SignOutMcp { name } => {
                if let Some(server) = self.mcp.get(&name) {
                    let driver = self.rc();
                    spawn_local(async move {
                        server.sign_out().await;
                        if server.takes_grant() {
                            driver.signed_in_or_out(&server);
                        } else {
                            driver.relist_mcp(server);
                        }
                    });
                }
            }
            // Only for a server in use, and this build uses none
            // (`mcpServers.refresh` of every server asks no one).
            #[cfg(not(feature = "mcp"))]
            Effect::ListMcpTools { names } if names.is_empty() => {}
            #[cfg(not(feature = "mcp"))]
            Effect::AnswerElicitation { .. }
            | Effect::ListMcpTools { .. }
            | Effect::SignInMcp { .. }
            | Effect::SignOutMcp { .. } => no_mcp::unsupported_effect(),
            Effect::Send { conn, event } => {
                let message = match boundary::to_js(&event) {
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
                    return;
                }
                let client = self.worker_clients.borrow().get(&conn).cloned();
                if let Some(on_event) = client {
                    // Its own handler's error is the embedder's to see; the
                    // client stays connected.
                    if let Err(e) = on_event.call1(&JsValue::NULL, &message) {
                        let e = error::js_to_error(e);
                        warn(&format!("a worker client's event handler threw: {e}"));
                    }
                }
            }
            Effect::SetHeartbeat { level } => self.set_heartbeat(level),
        }
    }

    /// Follow the engine's heartbeat (README, "Worker lifetime"): the
    /// wake-up alarm exists while the level is `Working`, and the keepalive
    /// loop runs while it is `Awake` or `Working`.
    fn set_heartbeat(&self, level: Heartbeat) {
        let wakes = level.wakes();
        if self.alarm.replace(Some(wakes)) != Some(wakes) {
            spawn_local(async move {
                let result = if wakes {
                    chrome::set_alarm(HEARTBEAT_ALARM, 0.5).await
                } else {
                    chrome::clear_alarm(HEARTBEAT_ALARM).await
                };
                if let Err(e) = result {
                    warn(&format!("heartbeat alarm: {e}"));
                }
            });
        }
        if level.keeps_alive() && !self.keeping_alive.replace(true) {
            let d = self.rc();
            spawn_local(async move { d.keep_alive().await });
        }
    }

    /// While the heartbeat keeps the worker alive, call an extension API
    /// every `KEEPALIVE_MS`: each call resets Chrome's 30 s idle timer
    /// (Chrome 110+), which a Port does not. Ends at the first tick after
    /// the engine's level went `Off`.
    async fn keep_alive(&self) {
        loop {
            TimeoutFuture::new(KEEPALIVE_MS).await;
            if !self.engine.borrow().heartbeat().keeps_alive() {
                break;
            }
            if let Err(e) = chrome::keepalive().await {
                warn(&format!("keepalive: {e}"));
            }
        }
        self.keeping_alive.set(false);
    }

    async fn persist(&self, token: u64, unit: UnitOfWork) {
        let started = metrics::precise_now();
        let result = match IdbStore::encode(&unit) {
            Ok(puts) => {
                self.metrics
                    .borrow_mut()
                    .encode
                    .add(metrics::precise_now() - started);
                self.store
                    .commit_values(&unit.store_names(), &puts, &unit.deletes)
                    .await
            }
            Err(err) => Err(err),
        };
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

    async fn call_provider(
        &self,
        request_id: u64,
        request: std::rc::Rc<ProviderRequest>,
        idle_timeout_ms: u64,
    ) {
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
        // ever goes into a request header; the tab for the send-time context
        // is asked for at the same time.
        let (settings, tab) = futures::join!(chrome::load_settings(), target_tab());
        let settings = settings.unwrap_or(JsValue::UNDEFINED);
        let (saved, api_key) = parse_settings(&settings, self.engine.borrow().settings_defaults());
        crate::provider::key_may_go_to(&saved.base_url, &request.profile.base_url)?;
        let transport = Transport::from_kind(&request.profile.kind);
        let context = DynamicContext {
            now_ms: now(),
            tab: tab.ok().map(|t| (t.title, t.url)),
        };
        let (url, headers) = http_target(request, &api_key);
        let body = self.request_body(request, &context).map_err(|e| {
            ProviderError::new(
                ErrorKind::Internal,
                format!("Could not build the request body: {e}"),
                false,
            )
        })?;
        stream::stream_response(
            &url,
            &headers,
            &body,
            transport,
            controller,
            idle_timeout_ms,
            |delta| {
                self.input(|e, now| e.handle_provider_delta(now, request_id, delta));
            },
        )
        .await
        // An error's words go into events and IndexedDB: never the key,
        // even one the provider echoed.
        .map_err(|e| crate::provider::without_key(e, &api_key))
    }

    /// The body of `request` for `fetch`. A large one is composed of the
    /// `Blob`s kept from the last request (`BodyCache::plan_with`), so a
    /// step of a long thread copies only its new messages out of wasm
    /// memory; a small one (under `BLOB_BODY_MIN_BYTES`) is bytes.
    fn request_body(
        &self,
        request: &ProviderRequest,
        context: &DynamicContext,
    ) -> Result<JsValue, error::JsError> {
        let started = metrics::precise_now();
        let body = self.request_body_from(request, context);
        self.metrics
            .borrow_mut()
            .body_build
            .add(metrics::precise_now() - started);
        body
    }

    fn request_body_from(
        &self,
        request: &ProviderRequest,
        context: &DynamicContext,
    ) -> Result<JsValue, error::JsError> {
        let mut bodies = self.bodies.borrow_mut();
        let view = request.lineage.map(|l| l.view);
        let at = view.and_then(|v| bodies.iter().position(|b| b.view == v));
        let mut kept = match (view, at) {
            (Some(_), Some(at)) => bodies.remove(at),
            (Some(view), None) => KeptBody {
                view,
                cache: Default::default(),
                slots: Vec::new(),
            },
            // Not a run's step: nothing to keep.
            (None, _) => {
                let body =
                    crate::provider::body::BodyCache::new().body_with(request, Some(context));
                let mut counts = self.metrics.borrow_mut();
                counts.body_bytes += body.len() as u64;
                counts.body_copied += body.len() as u64;
                return fetch::request_body(&body);
            }
        };
        let body = Self::kept_body(&mut kept, request, context, &mut self.metrics.borrow_mut());
        bodies.insert(0, kept);
        bodies.truncate(KEPT_BODIES);
        body
    }

    fn kept_body(
        kept: &mut KeptBody,
        request: &ProviderRequest,
        context: &DynamicContext,
        counts: &mut metrics::Metrics,
    ) -> Result<JsValue, error::JsError> {
        let KeptBody { cache, slots, .. } = kept;
        let plan = cache.plan_with(request, Some(context));
        counts.body_bytes += plan.len as u64;
        if plan.len >= fetch::BLOB_BODY_MIN_BYTES {
            let started = metrics::precise_now();
            let composed = fetch::compose(&plan, slots);
            counts.body_blobs.add(metrics::precise_now() - started);
            match composed {
                Ok((kept, body)) => {
                    *slots = kept;
                    counts.body_copied += plan.text_len() as u64;
                    return Ok(body.into());
                }
                // Sent whole instead; the next plan starts from no slots.
                Err(e) => warn(&format!("request body not composed: {e}")),
            }
        }
        cache.forget_slots();
        slots.clear();
        counts.body_copied += plan.len as u64;
        fetch::request_body(&cache.last_body())
    }

    async fn run_tool(&self, call: ToolDispatch) {
        let ToolDispatch {
            dispatch_id,
            call_id,
            name,
            params,
            target,
            binding,
            retry_safe,
            ..
        } = call;
        // A page tool that does not answer within the limit fails; a host
        // tool may set its own (`timeoutMs`).
        let (waited_for, limit_ms) = match &binding {
            Binding::Host => {
                let limit = self.host_tools.time_limit_ms(&name);
                (
                    "The tool did not finish",
                    limit.unwrap_or(TOOL_TIME_LIMIT_MS),
                )
            }
            #[cfg(feature = "mcp")]
            Binding::Mcp { server, .. } => (
                "The MCP server did not answer",
                self.mcp
                    .get(server)
                    .map_or(TOOL_TIME_LIMIT_MS, |s| s.config.time_limit_ms),
            ),
            _ => ("The page did not answer", TOOL_TIME_LIMIT_MS),
        };
        // A page write that times out was sent: the page may be blocked in
        // a dialog its click opened (confirm, alert) and act once the user
        // answers it. The model must not take the silence for a failure
        // and repeat the action.
        let page_write = matches!(binding, Binding::Page) && !retry_safe;
        // An MCP call that changes something likewise: the server had it.
        let mcp_write = matches!(binding, Binding::Mcp { .. }) && !retry_safe;
        let work = async {
            match (binding, &target) {
                (Binding::Page, _) => {
                    self.page_tool(
                        dispatch_id,
                        &call_id,
                        &name,
                        params,
                        target.as_ref(),
                        retry_safe,
                    )
                    .await
                }
                (Binding::Tab, Some(target)) => {
                    check_origin(target).await?;
                    browser_tools::tab_tool(&name, &params, target).await
                }
                (Binding::Tab, None) => Err("No page was resolved for this tool.".to_string()),
                (Binding::Browser, _) => browser_tools::browser_tool(&name, &params).await,
                (Binding::Host, _) => self.host_tool(dispatch_id, &call_id, &name, &params).await,
                (
                    Binding::Mcp {
                        server, endpoint, ..
                    },
                    _,
                ) => {
                    self.mcp_tool(
                        dispatch_id,
                        (&server, &endpoint),
                        &call_id,
                        &name,
                        &params,
                        !retry_safe,
                    )
                    .await
                }
                (Binding::Engine, _) => {
                    Err(format!("{name} is run by the engine, not the browser."))
                }
            }
        }
        .fuse();
        let clock = ToolClock::start(limit_ms);
        self.clocks.borrow_mut().insert(dispatch_id, clock.clone());
        let timeout = clock.expired().fuse();
        let started = metrics::precise_now();
        futures::pin_mut!(work, timeout);
        let result = futures::select! {
            r = work => r,
            _ = timeout => Err(if page_write {
                format!(
                    "The page did not answer within {} after the action was sent. It may be waiting on a dialog \
        (confirm, alert) or still working, so whether the action happened is unknown. Look at the page \
        (page_snapshot) before doing it again; do not repeat it blindly.",
                    time_limit_text(limit_ms)
                )
            } else if mcp_write {
                format!(
                    "{waited_for} within {}.{}",
                    time_limit_text(limit_ms),
                    crate::mcp::OUTCOME_UNKNOWN
                )
            } else {
                format!("{waited_for} within {}.", time_limit_text(limit_ms))
            }),
        };
        self.clocks.borrow_mut().remove(&dispatch_id);
        // A request for input still waiting ends with its call (the engine
        // withdraws it with the result).
        #[cfg(feature = "mcp")]
        self.elicitations.borrow_mut().remove(&dispatch_id);
        self.metrics
            .borrow_mut()
            .tools
            .add(metrics::precise_now() - started);
        self.close_page_port(dispatch_id);
        // A host tool that timed out is told to stop.
        self.abort_host_tool(dispatch_id);
        let outcome = result.unwrap_or_else(|message| ToolOutcome::text(false, message));
        self.input(|e, now| e.handle_tool_result(now, dispatch_id, outcome));
    }

    async fn page_tool(
        &self,
        dispatch_id: u64,
        call_id: &str,
        name: &str,
        params: Value,
        target: Option<&TargetInfo>,
        retry_safe: bool,
    ) -> Result<ToolOutcome, String> {
        let target = target.ok_or("No page was resolved for this tool.")?;
        // A read describes whatever the tab shows; a write acts only on
        // the document it was resolved and approved on.
        let tab = if retry_safe {
            check_origin(target).await?
        } else {
            check_document(target).await?
        };
        let reach = if retry_safe {
            Reach::Reuse {
                recheck: Some(target),
            }
        } else {
            Reach::Inject {
                document: target.document_id.as_deref(),
                element: target.element.as_ref(),
            }
        };
        if name == "page_snapshot" {
            return self
                .page_snapshot(dispatch_id, call_id, tab, params, reach)
                .await;
        }
        let frame_id = target
            .frame_id
            .and_then(|f| u32::try_from(f).ok())
            .unwrap_or(frames::TOP_FRAME);
        let reply = self
            .frame_call(dispatch_id, call_id, tab, frame_id, name, params, reach)
            .await?;
        Ok(reply.into_outcome())
    }

    /// `page_snapshot`: the top document's outline with the outlines of its
    /// other-origin frames spliced in (at most `frames::MAX_FRAMES` of them,
    /// `frames::MAX_FRAME_DEPTH` deep). A frame that cannot be read is named
    /// with the reason; the snapshot itself still succeeds.
    async fn page_snapshot(
        &self,
        dispatch_id: u64,
        call_id: &str,
        tab: i32,
        params: Value,
        reach: Reach<'_>,
    ) -> Result<ToolOutcome, String> {
        let top = self
            .frame_call(
                dispatch_id,
                call_id,
                tab,
                frames::TOP_FRAME,
                "page_snapshot",
                params,
                reach,
            )
            .await?;
        if !top.ok {
            return Ok(top.into_outcome());
        }
        let placeholders = Placeholder::from_details(top.details.as_ref());
        if placeholders.is_empty() {
            return Ok(top.into_outcome());
        }
        // Which iframe line is which frame: by URL (see frames::match_frames).
        let known = chrome::get_all_frames(tab).await.unwrap_or_default();
        let slots = frames::match_frames(&placeholders, frames::TOP_FRAME, &known);
        let outline = FrameOutline {
            frame_id: frames::TOP_FRAME,
            url: String::new(),
            content: top.content,
            slots,
        };
        let mut queue: VecDeque<(u32, usize)> =
            outline.slots.iter().map(|s| (s.frame_id, 1)).collect();
        let mut children = frames::ChildFrames::new();
        let mut frame_details = Vec::new();
        while let Some((frame_id, depth)) = queue.pop_front() {
            if depth > frames::MAX_FRAME_DEPTH || children.contains_key(&frame_id) {
                continue;
            }
            if frame_details.len() >= frames::MAX_FRAMES {
                let reason = format!("more than {} frames", frames::MAX_FRAMES);
                children.insert(frame_id, ChildFrame::NotRead(reason));
                continue;
            }
            match self
                .child_snapshot(dispatch_id, call_id, tab, frame_id, &known, reach)
                .await
            {
                Ok((child, details)) => {
                    queue.extend(child.slots.iter().map(|s| (s.frame_id, depth + 1)));
                    frame_details.push(details);
                    children.insert(frame_id, ChildFrame::Read(child));
                }
                Err(reason) => {
                    frame_details.push(json!({ "frameId": frame_id, "error": reason }));
                    children.insert(frame_id, ChildFrame::NotRead(reason));
                }
            }
        }
        let mut details = top.details.unwrap_or_else(|| json!({}));
        if let Some(object) = details.as_object_mut() {
            object.insert("frames".into(), Value::Array(frame_details));
        }
        Ok(ToolOutcome {
            ok: true,
            content: frames::assemble(&outline, &children),
            details: Some(details),
            images: Vec::new(),
        })
    }

    /// One child frame's outline, or why it is not shown (short, for the
    /// `iframe` line).
    async fn child_snapshot(
        &self,
        dispatch_id: u64,
        call_id: &str,
        tab: i32,
        frame_id: u32,
        known: &[frames::KnownFrame],
        reach: Reach<'_>,
    ) -> Result<(FrameOutline, Value), String> {
        let frame = known
            .iter()
            .find(|f| f.frame_id == frame_id)
            .ok_or("the frame is gone")?;
        let target = frame_target(tab, frame_id, &frame.url, None, None);
        if gatekeeper::restricted_reason(&target).is_some() {
            return Err(format!("the extension may not read {}", target.origin));
        }
        let call = self.frame_call(
            dispatch_id,
            call_id,
            tab,
            frame_id,
            "page_snapshot",
            json!({}),
            // A child frame of another origin is read as it is now; the
            // top document's target says nothing about it.
            match reach {
                Reach::Reuse { .. } | Reach::Describe { .. } => Reach::Reuse { recheck: None },
                Reach::Inject { .. } => Reach::Inject {
                    document: None,
                    element: None,
                },
            },
        );
        let timeout = TimeoutFuture::new(FRAME_SNAPSHOT_TIMEOUT_MS);
        let reply = match futures::future::select(Box::pin(call), timeout).await {
            // The long tool-error text is for a ref tool; the iframe line gets a short reason.
            futures::future::Either::Left((reply, _)) => reply.map_err(|_| {
                "its content could not be read (it may be loading or have navigated)".to_string()
            })?,
            futures::future::Either::Right(_) => {
                self.close_page_port(dispatch_id);
                return Err(format!(
                    "it did not answer within {} s",
                    FRAME_SNAPSHOT_TIMEOUT_MS / 1000
                ));
            }
        };
        if !reply.ok {
            return Err(reply.content);
        }
        let interactive = reply
            .details
            .as_ref()
            .and_then(|d| d.get("interactiveCount"))
            .cloned()
            .unwrap_or(Value::Null);
        let details = json!({
            "frameId": frame_id,
            "url": frame.url,
            "origin": target.origin,
            "interactiveCount": interactive,
        });
        let placeholders = Placeholder::from_details(reply.details.as_ref());
        Ok((
            FrameOutline {
                frame_id,
                url: frame.url.clone(),
                slots: frames::match_frames(&placeholders, frame_id, known),
                content: reply.content,
            },
            details,
        ))
    }

    /// One of the embedding extension's own tools (`Binding::Host`). Its
    /// progress reports become `item.delta{toolProgress}` like a page tool's.
    async fn host_tool(
        &self,
        dispatch_id: u64,
        call_id: &str,
        name: &str,
        params: &Value,
    ) -> Result<ToolOutcome, String> {
        self.abortable_call(dispatch_id, |controller, progress| async move {
            self.host_tools
                .call(name, call_id, params, &controller.signal(), &progress)
                .await
        })
        .await
    }
}

/// What a start reads of the MCP servers (`Driver::mcp_at_start`).
#[cfg(feature = "mcp")]
struct McpStart {
    servers: mcp::McpServers,
    catalog: serde_json::Map<String, Value>,
    /// The user's entries that cannot be used, listed once the driver runs.
    refused: Vec<crate::mcp::RefusedServer>,
}

/// The MCP servers' side of the driver: discovery, calls, sign-ins and
/// requests for input (`no_mcp` is the build without it).
#[cfg(feature = "mcp")]
impl Driver {
    /// The MCP servers a start sets up: the embedding extension's
    /// (`listed`, `extension/mcp-servers.js`; a wrong entry is left out and
    /// named), then the user's (Settings: `mcpUserServers` in `storage`).
    /// Each offers the tools it listed last at once (`mcpCatalog` in
    /// `storage`, into `config`); they are asked again once the driver runs
    /// (`mcp_after_start`).
    fn mcp_at_start(listed: &Value, storage: &JsValue, config: &mut EngineConfig) -> McpStart {
        let (servers, refused) = crate::mcp::parse_servers(listed);
        for e in refused {
            console_error(&format!("extension/mcp-servers.js: {e}"));
        }
        let extension: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        let (user, user_refused) = crate::mcp::split_user_servers(
            &boundary::from_js_value(chrome::get(storage, "mcpUserServers")),
            &extension,
        );
        for refusal in &user_refused {
            console_error(&format!("your MCP servers: {}", refusal.problem));
        }
        let configs: Vec<_> = servers
            .into_iter()
            .map(|c| (c, McpServerOrigin::Extension))
            .chain(user.into_iter().map(|c| (c, McpServerOrigin::User)))
            .collect();
        let mcp = mcp::McpServers::new(configs);
        let mut mcp_catalog = serde_json::Map::new();
        if let Value::Object(kept) = boundary::from_js_value(chrome::get(storage, "mcpCatalog")) {
            for server in &mcp.all() {
                let name = &server.config.name;
                let Some(entry) = kept.get(name) else {
                    continue;
                };
                // Tools listed by a server at another URL are not this one's.
                if entry.get("url").and_then(Value::as_str) != Some(server.config.url.as_str()) {
                    continue;
                }
                let listed = entry
                    .get("tools")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let (tools, _) = crate::mcp::remote_tools(&server.config, &listed);
                server.set_tools(&tools);
                let _ =
                    config.set_mcp_tools(name, tools.into_iter().map(|t| t.descriptor).collect());
                mcp_catalog.insert(name.clone(), entry.clone());
            }
        }
        McpStart {
            servers: mcp,
            catalog: mcp_catalog,
            refused: user_refused,
        }
    }

    /// The driver runs: every server is listed as being asked, the user's
    /// `refused` entries with their reasons, and the servers are asked for
    /// their tools in the background.
    fn mcp_after_start(self: &Rc<Self>, user_refused: Vec<crate::mcp::RefusedServer>) {
        let servers = self.mcp.all();
        if !servers.is_empty() || !user_refused.is_empty() {
            self.input(|e, now| {
                for server in &servers {
                    e.handle_mcp_status(
                        now,
                        &server.config.name,
                        &server.config.url,
                        server.added_by,
                        McpServerState::Listing,
                        None,
                    );
                }
                if !user_refused.is_empty() {
                    e.handle_mcp_refused(now, user_refused);
                }
            });
            let discovering = self.clone();
            spawn_local(async move { discovering.discover_mcp(servers).await });
        }
        // Sign-ins of servers gone while no worker ran (an update of the
        // extension's list, the user's Remove that woke this worker).
        let driver = self.clone();
        spawn_local(async move { oauth::forget_orphan_grants(&driver.mcp).await });
    }

    /// A tool of an MCP server (`Binding::Mcp`). Its progress
    /// notifications become `item.delta{toolProgress}` like a host tool's.
    async fn mcp_tool(
        &self,
        dispatch_id: u64,
        (server, endpoint): (&str, &str),
        call_id: &str,
        name: &str,
        params: &Value,
        changes_something: bool,
    ) -> Result<ToolOutcome, String> {
        let server = self.mcp.get(server).ok_or_else(|| {
            format!("The MCP server \"{server}\" is not configured in this extension.")
        })?;
        // The call goes where the run's catalog (and an approval card) said:
        // a server of the same name at another address since (removed and
        // added again in Settings) is another server.
        if server.config.url != endpoint {
            return Err(crate::mcp::moved_server_message(
                &server.config.name,
                endpoint,
                &server.config.url,
            ));
        }
        let me = self.me.clone();
        let asking = server.clone();
        let ask = move |id: Value, params: Value, order: Vec<String>| {
            if let Some(driver) = me.upgrade() {
                driver.elicitation_asked(dispatch_id, &asking, id, params, order);
            }
        };
        let calling = server.clone();
        let refusals = server.sign_in_refusals();
        let outcome = self
            .abortable_call(dispatch_id, |controller, progress| async move {
                calling
                    .call(
                        (name, call_id),
                        params,
                        &controller,
                        &progress,
                        &ask,
                        changes_something,
                    )
                    .await
            })
            .await;
        // Refused for want of a sign-in: Settings offers one.
        if let Err(problem) = &outcome {
            if server.sign_in_refusals() > refusals && self.mcp.holds(&server) {
                self.list_sign_in_needed(&server, problem.clone());
            }
        }
        outcome
    }

    /// The server of the MCP call `dispatch_id` asks the user for input:
    /// checked, then handed to the engine, which keeps it before the panel
    /// shows it; the call's time limit waits until the answer is sent. A
    /// request this client cannot show is refused to the server at once.
    fn elicitation_asked(
        &self,
        dispatch_id: u64,
        server: &Rc<mcp::Server>,
        id: Value,
        params: Value,
        order: Vec<String>,
    ) {
        let name = server.config.name.clone();
        let request = match crate::elicitation::parse_request(&params, &order) {
            Ok(request) => request,
            Err(reason) => {
                warn(&format!(
                    "MCP server \"{name}\": a request for the user's input was refused: {reason}"
                ));
                return server.send(crate::elicitation::invalid(&id, &reason));
            }
        };
        if self.elicitations.borrow().contains_key(&dispatch_id) {
            let reason = "the user is already asked for input during this call";
            return server.send(crate::elicitation::invalid(&id, reason));
        }
        // Each request gives the call its whole time limit again once
        // answered: a bounded number of them keeps a server from holding a
        // call (and the worker) for ever.
        let Some(clock) = self.clocks.borrow().get(&dispatch_id).cloned() else {
            return server.send(crate::elicitation::invalid(&id, "the call has ended"));
        };
        let asked = clock.asked.get() + 1;
        if asked > MAX_ELICITATIONS_PER_CALL {
            let reason = format!(
                "the user was already asked for input {MAX_ELICITATIONS_PER_CALL} times during this call"
            );
            return server.send(crate::elicitation::invalid(&id, &reason));
        }
        clock.asked.set(asked);
        clock.pause();
        self.elicitations
            .borrow_mut()
            .insert(dispatch_id, (server.clone(), id, asked));
        // Unanswered for too long: withdrawn, so that a forgotten form
        // neither keeps the worker alive nor the call waiting for ever.
        let me = self.me.clone();
        spawn_local(async move {
            TimeoutFuture::new(ELICITATION_WAIT_MS).await;
            let Some(driver) = me.upgrade() else { return };
            let still = matches!(driver.elicitations.borrow().get(&dispatch_id), Some((_, _, n)) if *n == asked);
            if still {
                driver.input(|e, now| e.handle_elicitation_expired(now, dispatch_id));
            }
        });
        let url = server.config.url.clone();
        self.input(|e, now| e.handle_elicitation(now, dispatch_id, &name, &url, request));
    }
}

impl Driver {
    /// Runs `call` (of a host or MCP tool) with a controller that
    /// `abort_host_tool` aborts (a stop, the time limit) and a progress
    /// function whose reports become `item.delta{toolProgress}`.
    async fn abortable_call<F, Fut>(&self, dispatch_id: u64, call: F) -> Result<ToolOutcome, String>
    where
        F: FnOnce(AbortController, js_sys::Function) -> Fut,
        Fut: std::future::Future<Output = Result<ToolOutcome, String>>,
    {
        let controller = AbortController::new().map_err(|e| error::js_to_error(e).message)?;
        self.host_aborts
            .borrow_mut()
            .insert(dispatch_id, controller.clone());
        let me = self.me.clone();
        let progress = Closure::<dyn FnMut(JsValue)>::new(move |text: JsValue| {
            if let (Some(driver), Some(text)) = (me.upgrade(), text.as_string()) {
                driver.input(|e, now| e.handle_tool_progress(now, dispatch_id, text));
            }
        });
        let result = call(controller, progress.as_ref().clone().unchecked_into()).await;
        // The progress function works until the call ended, not after.
        drop(progress);
        self.host_aborts.borrow_mut().remove(&dispatch_id);
        result
    }
}

#[cfg(feature = "mcp")]
impl Driver {
    /// Ask every MCP server for its tools, offer them, and keep the list
    /// for the next worker (`mcp_catalog`). A server that cannot be reached
    /// keeps the tools it listed last (their calls fail with the reason).
    async fn discover_mcp(&self, servers: Vec<Rc<mcp::Server>>) {
        self.mcp.load_grants().await;
        // Each server's answer is used as it comes: one that is slow (or
        // silent until its time limit) holds no other.
        let mut lists: futures::stream::FuturesUnordered<_> = servers
            .iter()
            .map(|server| async move { (server, server.list_tools().await) })
            .collect();
        while let Some((server, listed)) = lists.next().await {
            if self.take_mcp_listing(server, listed) {
                self.keep_mcp_catalog().await;
            }
        }
    }

    /// What `server` listed (or why it could not): its tools to the engine,
    /// its state to the user. Whether the kept catalog changed.
    fn take_mcp_listing(
        &self,
        server: &Rc<mcp::Server>,
        listed: Result<Vec<Value>, crate::mcp::McpError>,
    ) -> bool {
        // Removed by the user while it was asked: nothing of it stays.
        if !self.mcp.holds(server) {
            return false;
        }
        let name = &server.config.name;
        let url = &server.config.url;
        let added_by = server.added_by;
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                let state = match e {
                    crate::mcp::McpError::SignInNeeded(_)
                    | crate::mcp::McpError::MorePermissionNeeded(_) => McpServerState::SignInNeeded,
                    _ => McpServerState::Unreachable,
                };
                let problem = e.describe(name);
                console_error(&problem);
                let signed_in = self.signed_in_at(server);
                self.input(|e, now| {
                    mirror_signed_in(e, &signed_in);
                    e.handle_mcp_status(now, name, url, added_by, state, Some(problem))
                });
                return false;
            }
        };
        let (tools, mut problems) = crate::mcp::remote_tools(&server.config, &listed);
        server.set_tools(&tools);
        self.follow_mcp(server);
        let descriptors = tools.into_iter().map(|t| t.descriptor).collect();
        let signed_in = self.signed_in_at(server);
        self.input(|e, now| {
            mirror_signed_in(e, &signed_in);
            problems.extend(e.handle_mcp_tools(name, descriptors));
            let problem = (!problems.is_empty()).then(|| problems.join("; "));
            e.handle_mcp_status(now, name, url, added_by, McpServerState::Ready, problem);
        });
        for problem in &problems {
            console_error(problem);
        }
        let entry = json!({ "url": server.config.url, "tools": listed });
        let mut catalog = self.mcp_catalog.borrow_mut();
        if catalog.get(name) == Some(&entry) {
            return false;
        }
        catalog.insert(name.clone(), entry);
        true
    }

    /// `server` is listed as needing a sign-in, saying why; the servers at
    /// its address as signed in or not (a renewal refused for one signed
    /// out them all).
    fn list_sign_in_needed(&self, server: &mcp::Server, problem: String) {
        let signed_in = self.signed_in_at(server);
        let config = &server.config;
        self.input(|e, now| {
            mirror_signed_in(e, &signed_in);
            e.handle_mcp_status(
                now,
                &config.name,
                &config.url,
                server.added_by,
                McpServerState::SignInNeeded,
                Some(problem.clone()),
            )
        });
    }

    /// Whether each server at `server`'s address is signed in (they share
    /// one grant: a renewal refused for one signed out the others too);
    /// handed to the engine with `mirror_signed_in`.
    fn signed_in_at(&self, server: &mcp::Server) -> Vec<(String, McpServerOrigin, bool)> {
        self.mcp
            .sharing_grant(server)
            .iter()
            .map(|s| (s.config.name.clone(), s.added_by, s.signed_in()))
            .collect()
    }

    /// List a server's tools again (it said they changed, or the user
    /// asked): one listing at a time per server, and one more after it
    /// when asked again meanwhile.
    fn relist_mcp(&self, server: Rc<mcp::Server>) {
        if !server.begin_relist() {
            return;
        }
        let driver = self.rc();
        spawn_local(async move {
            loop {
                driver.discover_mcp(vec![server.clone()]).await;
                if !server.finish_relist() {
                    break;
                }
            }
        });
    }

    /// The user asked to sign in to `server`: its sign-in window, then the
    /// tools of every server at its address listed with the new grant; a
    /// failed sign-in is listed with the reason.
    async fn sign_in_mcp(&self, server: Rc<mcp::Server>) {
        if server.signing_in() {
            return;
        }
        let signing = |on: bool| {
            let mut sharing = self.mcp.sharing_grant(&server);
            if !server.takes_grant() {
                sharing.push(server.clone());
            }
            self.input(|e, _| {
                for s in &sharing {
                    e.handle_mcp_signing_in(&s.config.name, s.added_by, on);
                }
            });
        };
        signing(true);
        let result = server.sign_in().await;
        signing(false);
        match result {
            Ok(()) => self.signed_in_or_out(&server),
            // Another window was open (this one changes nothing), or the
            // server was removed meanwhile.
            Err(None) => {}
            Err(Some(_)) if !self.mcp.holds(&server) => {}
            Err(Some(problem)) => {
                console_error(&problem);
                self.list_sign_in_needed(&server, problem);
            }
        }
    }

    /// The user signed in to or out of `server`'s address: every server
    /// there drops the session and event stream opened with the old grant
    /// and lists its tools with the new one (or none).
    fn signed_in_or_out(&self, server: &mcp::Server) {
        for sharer in self.mcp.sharing_grant(server) {
            sharer.drop_session();
            self.relist_mcp(sharer);
        }
    }

    /// Act on what a server announces (`mcp::Server::follow`): a change
    /// of its tools lists them again.
    fn follow_mcp(&self, server: &Rc<mcp::Server>) {
        let driver = self.me.clone();
        let weak = Rc::downgrade(server);
        server.follow(Rc::new(move || {
            let (Some(driver), Some(server)) = (driver.upgrade(), weak.upgrade()) else {
                return;
            };
            if driver.mcp.holds(&server) {
                driver.relist_mcp(server);
            }
        }));
    }

    /// Keep the servers' last lists for the next worker (`mcp_catalog`).
    async fn keep_mcp_catalog(&self) {
        let catalog = Value::Object(self.mcp_catalog.borrow().clone());
        if let Err(e) = chrome::store_local("mcpCatalog", &catalog).await {
            console_error(&format!(
                "the MCP servers' tools were not kept: {}",
                e.message
            ));
        }
    }

    /// The user's list of servers changed (`chrome.storage.local
    /// .mcpUserServers`, its new value): a server removed (or changed) is
    /// disconnected and its tools no longer offered; a new one is set up
    /// and asked for its tools; an entry that cannot be used is listed as
    /// refused with the reason.
    fn apply_user_servers(&self, value: &Value) {
        let current = self.mcp.all();
        let extension: Vec<&str> = current
            .iter()
            .filter(|s| s.added_by == McpServerOrigin::Extension)
            .map(|s| s.config.name.as_str())
            .collect();
        let (wanted, refused) = crate::mcp::split_user_servers(value, &extension);
        // Gone or changed: removed (a changed one is set up anew below).
        let mut removed: Vec<String> = Vec::new();
        let mut retired: Vec<Rc<mcp::Server>> = Vec::new();
        // The addresses whose sign-in is forgotten with them (unless a
        // server still in use has the same one).
        let mut forget: Vec<String> = Vec::new();
        for server in current
            .iter()
            .filter(|s| s.added_by == McpServerOrigin::User)
        {
            if !wanted.iter().any(|w| *w == server.config) {
                removed.push(server.config.name.clone());
                retired.push(server.clone());
                let url = &server.config.url;
                let kept = wanted.iter().any(|w| w.url == *url)
                    || current
                        .iter()
                        .any(|s| s.added_by == McpServerOrigin::Extension && s.config.url == *url);
                if !kept {
                    forget.push(url.clone());
                }
            }
        }
        let added: Vec<crate::mcp::ServerConfig> = wanted
            .into_iter()
            .filter(|config| !current.iter().any(|s| s.config == *config))
            .collect();
        // The new ones first: one changed at the same address keeps its
        // sign-in (the address is never without a server meanwhile, so a
        // renewal or a sign-in under way there is kept).
        let fresh: Vec<Rc<mcp::Server>> = added
            .into_iter()
            .map(|config| self.mcp.add(config, McpServerOrigin::User))
            .collect();
        for server in &retired {
            self.mcp.remove(server);
        }
        {
            let mut catalog = self.mcp_catalog.borrow_mut();
            for name in &removed {
                catalog.remove(name);
            }
        }
        for refusal in &refused {
            console_error(&format!("your MCP servers: {}", refusal.problem));
        }
        self.input(|e, now| {
            for name in &removed {
                e.handle_mcp_removed(name);
            }
            e.handle_mcp_refused(now, refused);
            for server in &fresh {
                e.handle_mcp_status(
                    now,
                    &server.config.name,
                    &server.config.url,
                    McpServerOrigin::User,
                    McpServerState::Listing,
                    None,
                );
            }
        });
        let driver = self.rc();
        spawn_local(async move {
            for url in &forget {
                oauth::keep_grant(url, None).await;
            }
            if !removed.is_empty() {
                driver.keep_mcp_catalog().await;
            }
            if !fresh.is_empty() {
                driver.discover_mcp(fresh).await;
            }
        });
    }
}

impl Driver {
    fn abort_host_tool(&self, dispatch_id: u64) {
        if let Some(controller) = self.host_aborts.borrow_mut().remove(&dispatch_id) {
            controller.abort();
        }
    }

    /// The element a page write names (its `ref`, or its visible `text`),
    /// as the content script of the target's document describes it now.
    /// None when the extension may not look (no host permission, a
    /// restricted page: the gatekeeper says so); an error, the call's
    /// result with nothing done, when the page cannot describe it (an
    /// unknown or stale ref, no element with that text: the words the
    /// write itself would have ended with) or does not answer within
    /// `FRAME_SNAPSHOT_TIMEOUT_MS`.
    async fn describe_element(
        &self,
        resolve_id: u64,
        target: &TargetInfo,
        params: &Value,
    ) -> Result<Option<TargetElement>, String> {
        if !target.host_permission || gatekeeper::restricted_reason(target).is_some() {
            return Ok(None);
        }
        let Ok(tab) = i32::try_from(target.tab_id) else {
            return Ok(None);
        };
        let frame_id = target
            .frame_id
            .and_then(|f| u32::try_from(f).ok())
            .unwrap_or(frames::TOP_FRAME);
        // Its own key among the page Ports: dispatch ids count up from 1.
        let key = u64::MAX - resolve_id;
        let call_id = format!("describe-{resolve_id}");
        let call = self.frame_call(
            key,
            &call_id,
            tab,
            frame_id,
            "describe_target",
            params.clone(),
            Reach::Describe {
                document: target.document_id.as_deref(),
            },
        );
        let timeout = TimeoutFuture::new(FRAME_SNAPSHOT_TIMEOUT_MS);
        let reply = match futures::future::select(Box::pin(call), timeout).await {
            futures::future::Either::Left((reply, _)) => reply?,
            futures::future::Either::Right(_) => {
                self.close_page_port(key);
                return Err(format!(
                    "The page did not answer within {} s when asked which element this action would act \
on, so nothing was done. It may be busy: wait a moment (wait_for) or call page_snapshot, then act again.",
                    FRAME_SNAPSHOT_TIMEOUT_MS / 1000
                ));
            }
        };
        if !reply.ok {
            return Err(reply.content);
        }
        let described = reply
            .details
            .as_ref()
            .ok_or_else(|| "no details".to_string())
            .and_then(TargetElement::from_details);
        described.map(Some).map_err(|problem| {
            warn(&format!("the page described an element badly: {problem}"));
            "The page's description of the element this action would act on could not be read, so \
nothing was done. Call page_snapshot and act again."
                .to_string()
        })
    }

    fn close_page_port(&self, dispatch_id: u64) {
        if let Some(port) = self.page_ports.borrow_mut().remove(&dispatch_id) {
            port.disconnect();
        }
    }

    /// Run one page tool in one frame of a tab and return its result.
    ///
    /// `Reach::Inject`: inject the content script there (idempotent on the
    /// page side), then open a Port to that frame only. `Reach::Reuse`, for
    /// a call that is harmless to run twice: open the Port first; only if it
    /// closes before the frame said anything (no content script listens
    /// there yet, the common case on a fresh document) check the target
    /// again, inject and send the call once more. Injecting into a page that
    /// already has the script cost ~3.5 ms of a ~5 ms read (BENCHMARKS.md
    /// item 32). `Reach::Describe` reuses the same way, bound to a
    /// document. Progress is forwarded; the Port is closed before returning.
    #[allow(clippy::too_many_arguments)]
    async fn frame_call(
        &self,
        dispatch_id: u64,
        call_id: &str,
        tab: i32,
        frame_id: u32,
        name: &str,
        params: Value,
        reach: Reach<'_>,
    ) -> Result<PageReply, String> {
        let (document, expect, reuse) = match reach {
            Reach::Inject { document, element } => (document, element, None),
            Reach::Reuse { recheck } => (None, None, Some(recheck)),
            Reach::Describe { document } => (document, None, Some(None)),
        };
        if let Some(recheck) = reuse {
            match self
                .connect_and_call(
                    dispatch_id,
                    call_id,
                    tab,
                    frame_id,
                    document,
                    None,
                    name,
                    params.clone(),
                )
                .await
            {
                Ok(reply) => return Ok(reply),
                Err(FrameFailure::Failed(message)) => return Err(message),
                Err(FrameFailure::Unanswered(_)) => {
                    // The document may have changed meanwhile: act only on
                    // the one the gatekeeper allowed.
                    if let Some(target) = recheck {
                        check_origin(target).await?;
                    }
                }
            }
        }
        self.metrics.borrow_mut().injections += 1;
        chrome::inject_content_script(tab, frame_id, document)
            .await
            .map_err(|e| {
                if document.is_some() && e.message.contains("document") {
                    // The document checked a moment ago is gone.
                    "The page was replaced by another document before the action ran; nothing was done. \
Call page_snapshot to look at the page as it is now."
                        .to_string()
                } else if frame_id == frames::TOP_FRAME {
                    format!(
                        "Cannot run page tools in this tab ({}). Browser pages (chrome://, the Web Store) cannot be automated; open a normal web page.",
                        e.message
                    )
                } else {
                    format!(
                        "Cannot run page tools in frame f{frame_id} ({}); it may have navigated or been removed. Call page_snapshot to get fresh refs.",
                        e.message
                    )
                }
            })?;
        self.connect_and_call(
            dispatch_id,
            call_id,
            tab,
            frame_id,
            document,
            expect,
            name,
            params,
        )
        .await
        .map_err(FrameFailure::into_message)
    }

    /// Open a Port to one frame's content script, send the call, forward
    /// its progress and return its result.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    async fn connect_and_call(
        &self,
        dispatch_id: u64,
        call_id: &str,
        tab: i32,
        frame_id: u32,
        document: Option<&str>,
        expect: Option<&TargetElement>,
        name: &str,
        params: Value,
    ) -> Result<PageReply, FrameFailure> {
        let port = Port(
            chrome::connect_frame(tab, frame_id, document, "page")
                .map_err(|e| FrameFailure::Failed(format!("Could not reach the page: {e}")))?,
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
        let listen = port
            .on_message(&on_message)
            .and_then(|()| port.on_disconnect(&on_disconnect));
        if let Err(e) = listen {
            port.disconnect();
            return Err(FrameFailure::Failed(e.to_string()));
        }
        if let Some(previous) = self
            .page_ports
            .borrow_mut()
            .insert(dispatch_id, port.clone())
        {
            previous.disconnect();
        }
        let result = self
            .exchange(
                dispatch_id,
                call_id,
                frame_id,
                name,
                params,
                expect,
                &port,
                &mut receiver,
            )
            .await;
        // Closed before the closures it calls are dropped.
        port.disconnect();
        let mut ports = self.page_ports.borrow_mut();
        if ports.get(&dispatch_id).is_some_and(|p| p.0 == port.0) {
            ports.remove(&dispatch_id);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        dispatch_id: u64,
        call_id: &str,
        frame_id: u32,
        name: &str,
        params: Value,
        expect: Option<&TargetElement>,
        port: &Port,
        receiver: &mut mpsc::UnboundedReceiver<Option<JsValue>>,
    ) -> Result<PageReply, FrameFailure> {
        let request = PageRequest::ToolExecute {
            call_id: call_id.to_string(),
            name: name.to_string(),
            params,
            frame_id,
            expect: expect.cloned(),
        };
        let message = boundary::to_js(&request).map_err(FrameFailure::Failed)?;
        port.post(&message)
            .map_err(|e| FrameFailure::Failed(format!("Could not reach the page: {e}")))?;
        let gone = if frame_id == frames::TOP_FRAME {
            "The page closed or navigated away before the tool finished.".to_string()
        } else {
            format!("The frame f{frame_id} was removed or navigated away before the tool finished. Call page_snapshot to see the page now.")
        };
        // Whether the frame said anything: a Port that closes before that
        // reached no content script, and the call did not run.
        let mut heard = false;
        while let Some(item) = receiver.next().await {
            let Some(raw) = item else {
                break;
            };
            heard = true;
            let message = match PageMessage::from_value(boundary::from_js_value(raw)) {
                Ok(message) => message,
                Err(e) => {
                    warn(&format!(
                        "ignored a malformed message from a content script: {e}"
                    ));
                    continue;
                }
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
                    return Ok(PageReply {
                        ok,
                        content,
                        details,
                    });
                }
                _ => {}
            }
        }
        Err(if heard {
            FrameFailure::Failed(gone)
        } else {
            FrameFailure::Unanswered(gone)
        })
    }
}

/// How a page tool reaches a frame's content script (`Driver::frame_call`).
#[derive(Clone, Copy)]
enum Reach<'a> {
    /// Inject the content script first, then connect: into `document`
    /// only when it is known (a write: Chrome then reaches no other
    /// document the frame loaded since it was checked).
    /// `element`: what the write must find (`TargetInfo::element`), the
    /// content script refusing otherwise.
    Inject {
        document: Option<&'a str>,
        element: Option<&'a TargetElement>,
    },
    /// The call is harmless to run twice: connect to the script already in
    /// the frame; if none answers, check `recheck` (the target the
    /// gatekeeper allowed) again, inject and call again.
    Reuse { recheck: Option<&'a TargetInfo> },
    /// The engine's own read (`describe_target`) of `document`: connect
    /// to the script already there; inject into that document only if
    /// none answers.
    Describe { document: Option<&'a str> },
}

/// Why a frame call returned no result.
enum FrameFailure {
    /// The Port closed before the frame sent anything: no content script
    /// listens there (or the document went away first), so nothing ran.
    Unanswered(String),
    /// Anything else, after the call may have started.
    Failed(String),
}

impl FrameFailure {
    fn into_message(self) -> String {
        match self {
            FrameFailure::Unanswered(message) | FrameFailure::Failed(message) => message,
        }
    }
}

/// A content script's `tool.result`.
struct PageReply {
    ok: bool,
    content: String,
    details: Option<Value>,
}

impl PageReply {
    fn into_outcome(self) -> ToolOutcome {
        ToolOutcome {
            ok: self.ok,
            content: self.content,
            details: self.details,
            images: Vec::new(),
        }
    }
}

/// How long one child frame may take to outline itself before
/// `page_snapshot` shows it as not answering (ms).
const FRAME_SNAPSHOT_TIMEOUT_MS: u32 = 5_000;

/// The target of a call acting in a child frame: the frame's URL and origin
/// (what the gatekeeper judges), the tab's page as `page_url`.
fn frame_target(
    tab: i32,
    frame_id: u32,
    url: &str,
    document_id: Option<String>,
    page: Option<TargetInfo>,
) -> TargetInfo {
    TargetInfo {
        tab_id: i64::from(tab),
        document_id,
        url: url.to_string(),
        origin: origin_of(url),
        host_permission: chrome::host_permission(url),
        frame_id: Some(i64::from(frame_id)),
        title: page.as_ref().map(|p| p.title.clone()).unwrap_or_default(),
        page_url: page.map(|p| p.url),
        element: None,
    }
}

/// The page (and frame) a call acts on: the target tab, and the frame of the
/// call's ref if it names one (`f7:e12`). A frame that no longer exists is a
/// tool error the model can act on.
async fn resolve_target(params: Option<&Value>, write: bool) -> Result<TargetInfo, String> {
    let mut page = target_tab().await?.into_target();
    let frame_id = params.map_or(frames::TOP_FRAME, frames::frame_of_params);
    let tab = page.tab_id as i32;
    if frame_id == frames::TOP_FRAME {
        // Only a write is bound to its document: a read's step makes no
        // extra call to Chrome.
        if write {
            page.document_id = document_of(tab, frames::TOP_FRAME).await;
        }
        return Ok(page);
    }
    match chrome::get_frame(tab, frame_id).await {
        Ok(Some(frame)) => Ok(frame_target(
            tab,
            frame_id,
            &frame.url,
            frame.document_id,
            Some(page),
        )),
        // Chrome answers an unknown frame id with null (or, in some versions, an error).
        Ok(None) | Err(_) => Err(frames::frame_gone(frame_id)),
    }
}

/// The id of the document a frame of a tab shows now (None: Chrome did
/// not say, or the frame is gone).
async fn document_of(tab: i32, frame_id: u32) -> Option<String> {
    chrome::get_frame(tab, frame_id)
        .await
        .ok()
        .flatten()
        .and_then(|f| f.document_id)
}

/// A write acts only on the document it was resolved (and approved) on:
/// a reload, or a navigation to another page of the same site, while the
/// user was asked, makes it do nothing (the origin check alone let it act
/// on the new page). Same-document navigations (a `#fragment`, the History
/// API of a single-page app) keep the document. Returns the tab id.
async fn check_document(target: &TargetInfo) -> Result<i32, String> {
    let tab = check_origin(target).await?;
    let Some(expected) = target.document_id.as_deref() else {
        return Ok(tab);
    };
    let frame_id = target
        .frame_id
        .and_then(|f| u32::try_from(f).ok())
        .unwrap_or(frames::TOP_FRAME);
    match document_of(tab, frame_id).await {
        Some(now) if now != expected => Err(if frame_id == frames::TOP_FRAME {
            "The page was reloaded or replaced by another page of the same site before the action \
ran; nothing was done. Call page_snapshot to look at the page as it is now."
                .to_string()
        } else {
            format!(
                "The frame f{frame_id} loaded another document before the action ran; nothing was \
done. Call page_snapshot to look at it again."
            )
        }),
        _ => Ok(tab),
    }
}

/// Act only on the page (and frame) the gatekeeper approved: if the tab or
/// the frame moved to another origin meanwhile, or the frame is gone,
/// nothing is done. Returns the tab id.
async fn check_origin(target: &TargetInfo) -> Result<i32, String> {
    let tab = chrome::get_tab(target.tab_id as i32)
        .await
        .map_err(|e| format!("The tab is gone ({e}); call page_snapshot on the current page."))?;
    let now_origin = origin_of(&tab.url);
    let Some(frame_id) = target.frame_id.and_then(|f| u32::try_from(f).ok()) else {
        if now_origin != target.origin {
            return Err(format!(
                "The tab changed from {} to {} before the action ran; nothing was done. Call page_snapshot to look at the new page.",
                target.origin, now_origin
            ));
        }
        return Ok(tab.id);
    };
    let page_origin = target.page_url.as_deref().map(origin_of);
    if page_origin.as_ref().is_some_and(|o| *o != now_origin) {
        return Err(format!(
            "The tab changed from {} to {} before the action ran; nothing was done. Call page_snapshot to look at the new page.",
            page_origin.unwrap_or_default(),
            now_origin
        ));
    }
    let frame = chrome::get_frame(tab.id, frame_id)
        .await
        .ok()
        .flatten()
        .ok_or_else(|| frames::frame_gone(frame_id))?;
    let frame_origin = origin_of(&frame.url);
    if frame_origin != target.origin {
        return Err(format!(
            "The frame f{frame_id} changed from {} to {} before the action ran; nothing was done. Call page_snapshot to look at it again.",
            target.origin, frame_origin
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

/// A build id or an epoch from sw.js: 1–64 ASCII letters, digits, `-`, `_`.
fn is_token(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A client in the worker itself (`Engine.connectClient`).
#[wasm_bindgen]
pub struct WorkerClient {
    driver: Rc<Driver>,
    id: ConnId,
    open: Cell<bool>,
}

#[wasm_bindgen]
impl WorkerClient {
    /// Send an op (the same object a side panel posts: `type`, `clientId`,
    /// `submissionId`, …). Its answer, and a malformed op's reject, come
    /// to the client's `on_event`. Throws once the client is closed.
    pub fn send(&self, op: JsValue) -> Result<(), JsValue> {
        if !self.open.get() {
            return Err(js_sys::Error::new("This engine client was closed.").into());
        }
        let value = boundary::from_js_value(op);
        let id = self.id;
        self.driver.input(|e, now| e.handle_message(now, id, value));
        Ok(())
    }

    /// Stop the client's events. Ops it sent are still carried out.
    pub fn close(&self) {
        if self.open.replace(false) {
            self.driver.worker_clients.borrow_mut().remove(&self.id);
            let id = self.id;
            self.driver.input(|e, _| e.handle_disconnect(id));
        }
    }
}

/// The engine as `extension/sw.js` sees it.
#[wasm_bindgen(js_name = Engine)]
pub struct EngineHandle {
    driver: Rc<Driver>,
}

#[wasm_bindgen(js_class = Engine)]
impl EngineHandle {
    /// Open the database, recover unfinished runs and start driving them.
    ///
    /// `prefetched` is what sw.js read while the module compiled:
    /// `{ store, storage }`, `store` from `extension/store-prefetch.js`
    /// (the database connection and the start image's records, or null) and
    /// `storage` the result of `chrome.storage.local.get("settings")` (or
    /// null). Whatever is missing or does not check out is read here.
    /// `tools` are the extension's own tools and `builtInTools` the built-in
    /// ones it keeps (`extension/host-tools.js`),
    /// `settingsDefaults` its provider settings defaults
    /// (`extension/settings-defaults.js`) and `instructions` what it adds to
    /// the system prompt (`extension/instructions.js`).
    pub async fn start(prefetched: JsValue) -> Result<EngineHandle, wasm_bindgen::JsError> {
        let started = metrics::precise_now();
        let field = |key: &str| {
            js_sys::Reflect::get(&prefetched, &JsValue::from_str(key))
                .ok()
                .filter(|v| v.is_object())
        };
        // An option of the embedding extension's as JSON data: absent (or
        // null) is `Null`; one that is not JSON data (a function in it) is
        // `false`, which its checker refuses as a whole, by name.
        let json_field = |key: &str| {
            let value = js_sys::Reflect::get(&prefetched, &JsValue::from_str(key))
                .unwrap_or(JsValue::UNDEFINED);
            if value.is_undefined() || value.is_null() {
                Value::Null
            } else {
                serde_wasm_bindgen::from_value(value).unwrap_or(Value::Bool(false))
            }
        };
        let fail = |e: crate::store::StoreError| wasm_bindgen::JsError::new(&e.message);
        let prefetch = field("store").and_then(|p| IdbStore::prefetched(DB_NAME, &p));
        let from_prefetch = prefetch.is_some();
        let (store, image, skipped, opened) = match prefetch {
            Some((store, values, cached)) => {
                let opened = metrics::precise_now();
                let (image, skipped) = store.image_from(values, cached).await.map_err(fail)?;
                (store, image, skipped, opened)
            }
            None => IdbStore::open_with_image(DB_NAME).await.map_err(fail)?,
        };
        for s in skipped {
            warn(&format!("skipped an undecodable record: {s}"));
        }
        let imaged = metrics::precise_now();
        let storage = match field("storage") {
            Some(storage) => storage,
            None => chrome::load_start_storage()
                .await
                .unwrap_or(JsValue::UNDEFINED),
        };
        let settings = chrome::get(&storage, "settings");
        let settled = metrics::precise_now();
        // The embedding extension's settings defaults
        // (`extension/settings-defaults.js`): a wrong field is left out and
        // named in the console, like a wrong tool.
        let (settings_defaults, refused) =
            settings::check_defaults(&json_field("settingsDefaults"));
        for e in refused {
            console_error(&format!(
                "a field of extension/settings-defaults.js was left out: {e}"
            ));
        }
        let (profile, _) = parse_settings(&settings, &settings_defaults);
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| wasm_bindgen::JsError::new(&e.to_string()))?;
        // The side panel answers approval requests. The build and the epoch
        // come from sw.js (the snapshot cache, `engine/snapshot_cache.rs`):
        // without a build nothing is cached.
        let text = |key: &str| {
            js_sys::Reflect::get(&prefetched, &JsValue::from_str(key))
                .ok()
                .and_then(|v| v.as_string())
        };
        let mut config = EngineConfig {
            approver: Approver::Interactive,
            build: text("build").filter(|b| is_token(b)).unwrap_or_default(),
            epoch: text("epoch").filter(|e| is_token(e)),
            settings_defaults,
            ..EngineConfig::default()
        };
        // The embedding extension's instructions extend the system prompt
        // (`extension/instructions.js`); wrong ones are left out, named.
        let instructions = js_sys::Reflect::get(&prefetched, &JsValue::from_str("instructions"))
            .unwrap_or(JsValue::UNDEFINED);
        let added = match instructions.as_string() {
            Some(text) => config.add_instructions(&text),
            None if instructions.is_undefined() || instructions.is_null() => Ok(()),
            None => Err("INSTRUCTIONS must be a string".to_string()),
        };
        if let Err(e) = added {
            console_error(&format!("extension/instructions.js was left out: {e}"));
        }
        // How many parallel-safe reads run together (`MAX_PARALLEL_READS`
        // of `extension/host-tools.js`; undefined or null: the default).
        let parallel = js_sys::Reflect::get(&prefetched, &JsValue::from_str("maxParallelReads"))
            .unwrap_or(JsValue::UNDEFINED);
        if !parallel.is_undefined() && !parallel.is_null() {
            let set = match parallel.as_f64() {
                Some(n) => config.set_parallel_reads(n),
                None => Err(format!(
                    "MAX_PARALLEL_READS must be a number; {} is kept",
                    config.parallel_reads
                )),
            };
            if let Err(e) = set {
                console_error(&format!("extension/host-tools.js: {e}"));
            }
        }
        // The built-in tools the embedding extension keeps (`BUILT_IN_TOOLS`
        // of `extension/host-tools.js`; undefined or null: all of them).
        let built_in = js_sys::Reflect::get(&prefetched, &JsValue::from_str("builtInTools"))
            .unwrap_or(JsValue::UNDEFINED);
        if !built_in.is_undefined() && !built_in.is_null() {
            let names: Option<Vec<String>> = js_sys::Array::is_array(&built_in).then(|| {
                js_sys::Array::from(&built_in)
                    .iter()
                    .map(|n| n.as_string().unwrap_or_default())
                    .collect()
            });
            // (Before any is given up: the registry holds the built-in ones.)
            let known = config
                .registry
                .descriptors()
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let problems = match names {
                Some(names) => config
                    .registry
                    .retain_named(&names)
                    .into_iter()
                    .map(|name| format!("names no built-in tool: {name:?} (known: {known})"))
                    .collect(),
                None => vec![
                    "must be an array of tool names, or null for all of them; all are kept"
                        .to_string(),
                ],
            };
            for problem in problems {
                console_error(&format!(
                    "BUILT_IN_TOOLS of extension/host-tools.js {problem}"
                ));
            }
        }
        // The embedding extension's own tools join the built-in ones (the
        // default registry); a wrong definition is left out and named in
        // the console.
        let (host_tools, refused) = host_tools::HostTools::register(
            &js_sys::Reflect::get(&prefetched, &JsValue::from_str("tools"))
                .unwrap_or(JsValue::UNDEFINED),
            &mut config.registry,
        );
        for e in refused {
            console_error(&format!(
                "a tool of extension/host-tools.js was left out: {e}"
            ));
        }
        // The MCP servers: the embedding extension's and the user's.
        let mcp_start = Driver::mcp_at_start(&json_field("mcpServers"), &storage, &mut config);
        let engine = Engine::new(config, profile, u64::from_le_bytes(seed), image, now());
        let driver = Rc::new_cyclic(|me| Driver {
            engine: RefCell::new(engine),
            store,
            own_origin: chrome::own_origin(),
            ports: RefCell::new(VecMap::new()),
            worker_clients: RefCell::new(VecMap::new()),
            next_worker_client: Cell::new(WORKER_CLIENT_IDS),
            provider_aborts: RefCell::new(VecMap::new()),
            page_ports: RefCell::new(VecMap::new()),
            host_tools,
            host_aborts: RefCell::new(VecMap::new()),
            clocks: RefCell::new(VecMap::new()),
            #[cfg(feature = "mcp")]
            elicitations: RefCell::new(VecMap::new()),
            #[cfg(feature = "mcp")]
            mcp: mcp_start.servers,
            #[cfg(feature = "mcp")]
            mcp_catalog: RefCell::new(mcp_start.catalog),
            timer: RefCell::new(None),
            metrics: RefCell::new(metrics::Metrics::default()),
            bodies: RefCell::new(Vec::new()),
            alarm: Cell::new(None),
            keeping_alive: Cell::new(false),
            me: me.clone(),
        });
        driver.pump();
        driver.mcp_after_start(mcp_start.refused);
        driver.metrics.borrow_mut().start = metrics::StartTimes {
            start_ms: metrics::precise_now() - started,
            start_open_ms: opened - started,
            start_image_ms: imaged - opened,
            start_settings_ms: settled - imaged,
            start_prefetched: from_prefetch,
        };
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
        let value = boundary::from_js_value(message);
        self.driver
            .input(|e, now| e.handle_message(now, id as ConnId, value));
    }

    /// The thread whose cached snapshot, as sw.js read it at start, may be
    /// sent for an `initialize` of `thread_id` (undefined: of the most
    /// recent thread) because it is still current; undefined when none.
    pub fn start_snapshot_for(&self, thread_id: Option<String>) -> Option<String> {
        self.driver
            .engine
            .borrow()
            .start_snapshot_for(thread_id.as_deref())
    }

    /// The port's first message was an `initialize` that sw.js answered
    /// with the cached snapshot of `thread_id` before the engine started
    /// (`engine/snapshot_cache.rs`).
    pub fn on_cached_initialize(&self, id: f64, message: JsValue, thread_id: String) {
        let value = boundary::from_js_value(message);
        self.driver
            .input(|e, now| e.handle_cached_initialize(now, id as ConnId, value, &thread_id));
    }

    /// A client in the worker itself: code of the embedding extension's
    /// worker (a context-menu command, a keyboard shortcut, its own logic)
    /// that drives the engine as a side panel does. `on_event` is called
    /// with every event the client gets (its ops' `command.ack` /
    /// `command.reject`, then, once an `initialize`, `thread.create` or
    /// `turn.submit` subscribed it to a thread, that thread's events). It is
    /// trusted as an extension page, but does not keep the worker awake,
    /// and it ends with the worker: a new worker needs a new client.
    #[wasm_bindgen(js_name = connectClient)]
    pub fn connect_client(&self, on_event: js_sys::Function) -> WorkerClient {
        let id = self.driver.next_worker_client.get();
        self.driver.next_worker_client.set(id + 1);
        self.driver.worker_clients.borrow_mut().insert(id, on_event);
        self.driver
            .input(|e, _| e.handle_connect(id, ClientKind::Worker));
        WorkerClient {
            driver: self.driver.clone(),
            id,
            open: Cell::new(true),
        }
    }

    pub fn on_disconnect(&self, id: f64) {
        self.driver.ports.borrow_mut().remove(&(id as ConnId));
        self.driver.input(|e, _| e.handle_disconnect(id as ConnId));
    }

    /// `mcpUserServers` changed in `chrome.storage.local` (its new value:
    /// the servers the user keeps in Settings). Registered by sw.js like
    /// `on_settings`.
    pub fn on_mcp_user_servers(&self, servers: JsValue) {
        let value = boundary::from_js_value(servers);
        self.driver.apply_user_servers(&value);
    }

    /// `settings` changed in `chrome.storage.local` (its new value). sw.js
    /// registers the listener when the worker's script runs, not once the
    /// engine started, so a change made while the engine starts (after the
    /// settings were read for it) is queued for it instead of lost.
    pub fn on_settings(&self, settings: JsValue) {
        let (profile, _) =
            parse_settings(&settings, self.driver.engine.borrow().settings_defaults());
        self.driver.input(|e, _| e.handle_settings(profile));
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
        boundary::to_js(&*self.driver.metrics.borrow()).map_err(|e| wasm_bindgen::JsError::new(&e))
    }

    /// Start measuring afresh (the start time is kept).
    pub fn reset_metrics(&self) {
        let mut m = self.driver.metrics.borrow_mut();
        *m = metrics::Metrics {
            start: m.start.clone(),
            ..Default::default()
        };
    }
}

/// Tell the engine which servers are signed in (`Driver::signed_in_at`).
#[cfg(feature = "mcp")]
fn mirror_signed_in(engine: &mut Engine, signed_in: &[(String, McpServerOrigin, bool)]) {
    for (name, added_by, on) in signed_in {
        engine.handle_mcp_signed_in(name, *added_by, *on);
    }
}
