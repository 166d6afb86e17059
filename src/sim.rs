//! A native driver for the engine: in-memory store, scripted provider,
//! scripted tools, virtual clock, in-process ("direct") transport, and crash
//! injection at any effect boundary.
//!
//! Owns: executing engine effects deterministically so the whole loop,
//! including crash and recovery, runs natively in microseconds. Used by the
//! crate's tests and usable by embedders to test their own tools.
//!
//! Must not: contain engine decisions (it only executes effects and records).

use std::collections::VecDeque;

use serde_json::Value;

use crate::engine::{Approver, ConnId, Effect, Engine, EngineConfig, Heartbeat, ToolOutcome};
use crate::frames;
use crate::gatekeeper::{origin_of, TargetInfo};
use crate::model::{ProviderProfile, StopReason, Usage};
use crate::protocol::{ApprovalDecision, Submission};
use crate::protocol::{ClientKind, Event, EventEnvelope, Op};
use crate::provider::{ProviderError, ProviderRequest, ProviderResponse, RawToolCall, StreamEvent};
use crate::store::{MemoryStore, StoreError};

/// What the scripted provider answers to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Stream this text in chunks, then stop with `stop`.
    Text { text: String, stop: StopReason },
    /// Optional text, then these tool calls (stop reason `tool_use` unless given).
    ToolCalls {
        text: String,
        calls: Vec<RawToolCall>,
        stop: StopReason,
    },
    /// Stream `partial` text, then fail.
    Error {
        partial: String,
        error: ProviderError,
    },
}

impl Reply {
    pub fn text(text: &str) -> Self {
        Reply::Text {
            text: text.to_string(),
            stop: StopReason::End,
        }
    }

    pub fn call(id: &str, name: &str, arguments: &str) -> Self {
        Reply::ToolCalls {
            text: String::new(),
            calls: vec![RawToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments: arguments.to_string(),
            }],
            stop: StopReason::ToolUse,
        }
    }
}

/// Decides the reply to each request (a function of the request survives crashes).
pub type Policy = Box<dyn FnMut(&ProviderRequest) -> Reply>;
/// Executes a tool call: (name, params) → outcome.
pub type ToolFn = Box<dyn FnMut(&str, &Value) -> ToolOutcome>;

/// Something the outside world will feed to the engine later.
#[derive(Debug, Clone)]
enum Input {
    Delta {
        request_id: u64,
        event: StreamEvent,
    },
    Done {
        request_id: u64,
        result: Result<ProviderResponse, ProviderError>,
    },
    ToolResult {
        dispatch_id: u64,
        outcome: ToolOutcome,
    },
    Target {
        resolve_id: u64,
        target: Result<TargetInfo, String>,
    },
    Op {
        conn: ConnId,
        op: Op,
    },
}

/// A tool dispatch as the world saw it (the side effect happened).
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub dispatch_id: u64,
    pub call_id: String,
    pub name: String,
    pub params: Value,
    /// The page (and frame) the engine told the driver to act on.
    pub target: Option<TargetInfo>,
}

/// Where a crash may be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The next persist is lost (crash before commit).
    BeforeCommit,
    /// The next persist commits but the engine dies before the ack.
    AfterCommit,
}

/// The native driver.
pub struct Sim {
    pub config: EngineConfig,
    pub profile: ProviderProfile,
    pub store: MemoryStore,
    pub engine: Engine,
    pub now: u64,
    /// Every event delivered to every client, in order.
    pub events: Vec<(ConnId, EventEnvelope)>,
    /// Every provider request made.
    pub requests: Vec<std::rc::Rc<ProviderRequest>>,
    /// Whether `requests` keep their conversation (tests read it; on by
    /// default). A kept request shares the engine's outbound messages, so
    /// the next step's fold must copy them all: `benches/native.rs` turns it
    /// off to hold only what a browser driver holds once a request is done.
    pub keep_request_messages: bool,
    /// Every tool dispatch the world performed.
    pub dispatches: Vec<Dispatch>,
    /// Commits observed (for checking invariants against event order).
    pub commit_log: Vec<u64>,
    /// The last `Effect::SetHeartbeat` level.
    pub heartbeat: Heartbeat,
    pub crashes: u32,
    policy: Policy,
    tool: ToolFn,
    inputs: VecDeque<(u64, Input)>,
    seed: u64,
    next_conn: ConnId,
    /// Clients connected to the current engine.
    connected: Vec<ConnId>,
    chunk: usize,
    /// Failures to inject into the next persists.
    pub fail_next_persists: u32,
    /// A full disk: while set, every persist fails (a retryable
    /// `QuotaExceededError`) and nothing of it is written.
    pub refuse_writes: bool,
    /// The page tools act on (or why there is none). Its `element` is what
    /// the page describes for a write naming one (a read is told nothing).
    pub target: Result<TargetInfo, String>,
    /// Child frames of that page by Chrome frame id (`url`, `origin` and
    /// `host_permission` are the frame's); a ref like `f7:e1` acts in frame 7,
    /// a missing frame is gone.
    pub frames: std::collections::BTreeMap<u32, TargetInfo>,
    /// How the simulated user answers approval requests (None: never).
    pub auto_approve: Option<ApprovalDecision>,
    /// What the simulated user answers to `ask_user` (None: never).
    pub auto_answer: Option<String>,
    /// Report usage like a real provider (input = estimated request size)
    /// instead of the fixed 10 in / 5 out.
    pub realistic_usage: bool,
    /// When set, persists are parked in `held` instead of committed (a slow disk).
    pub hold_persists: bool,
    /// Requests this says yes to are answered only at `release_replies`
    /// (a slow model): their replies wait in `held_replies`.
    pub hold_replies_to: Option<fn(&ProviderRequest) -> bool>,
    held_replies: Vec<(u64, Reply)>,
    /// Tools this says yes to (by name) are run, but their results are
    /// delivered only at `release_tools` (a call that takes a while: a
    /// server asking the user for input meanwhile).
    pub hold_tools: Option<fn(&str) -> bool>,
    held_tools: Vec<(u64, ToolOutcome)>,
    /// Every answer the engine sent to a server's request for input
    /// (`Effect::AnswerElicitation`): the call, the action, the content.
    pub elicitation_answers: Vec<(u64, crate::model::ElicitationAction, Option<Value>)>,
    /// The tool call each of `elicitation_answers` was for (dispatch ids
    /// start again with every worker).
    pub elicitation_answer_calls: Vec<String>,
    /// Each `Effect::ListMcpTools`: the servers asked for their tools.
    pub mcp_listings: Vec<Vec<String>>,
    /// Each `Effect::SignInMcp` (true) and `SignOutMcp` (false).
    pub mcp_sign_ins: Vec<(String, bool)>,
    /// Start the engine without receipts and deliver them as an input after
    /// whatever was already queued, as the browser's start does (true).
    pub defer_receipts: bool,
    /// Receipts read for the engine and not delivered yet: each step
    /// delivers them unless the next input is a command and a coin says
    /// the command goes first (then it waits for them in the engine).
    parked_receipts: Option<Vec<crate::model::Receipt>>,
    coin: u64,
    /// Keep read receipts parked (not delivered) while set.
    pub receipts_on_hold: bool,
    /// Fail this many receipt reads (retryable store errors).
    pub fail_receipt_reads: u32,
    pub held: Vec<(u64, crate::store::UnitOfWork)>,
    /// Threads read whole (`Effect::LoadThread`), in order.
    pub loads: Vec<String>,
    /// Tail reads (`Effect::LoadThreadTail`): thread, nodes read, complete.
    pub tail_loads: Vec<(String, usize, bool)>,
    /// Driver-observed invariant violations (ack before commit, announce
    /// before commit, turn.complete before the terminal write).
    pub violations: Vec<String>,
    /// Reconnects answered from the snapshot cache and adopted by the engine.
    pub cache_adoptions: u64,
    /// The cached snapshots as the worker script read them when this engine
    /// started (it never reads the store again).
    pub start_snapshots: Vec<crate::store::CachedSnapshot>,
}

impl Sim {
    pub fn new(seed: u64, policy: Policy, tool: ToolFn) -> Self {
        let config = EngineConfig {
            approver: Approver::Interactive,
            // Tests that count provider requests opt in to title requests.
            model_titles: false,
            ..EngineConfig::default()
        };
        let profile = ProviderProfile {
            kind: "openai".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "sim-model".into(),
            max_output_tokens: None,
            temperature_centi: None,
            vision: false,
            tool_use: true,
            token_budget: None,
            context_window: None,
        };
        let store = MemoryStore::new();
        let engine = Engine::new(config.clone(), profile.clone(), seed, store.image(), 0);
        Sim {
            config,
            profile,
            store,
            engine,
            now: 0,
            events: Vec::new(),
            requests: Vec::new(),
            keep_request_messages: true,
            dispatches: Vec::new(),
            commit_log: Vec::new(),
            heartbeat: Heartbeat::Off,
            crashes: 0,
            policy,
            tool,
            inputs: VecDeque::new(),
            hold_replies_to: None,
            held_replies: Vec::new(),
            hold_tools: None,
            held_tools: Vec::new(),
            elicitation_answers: Vec::new(),
            elicitation_answer_calls: Vec::new(),
            mcp_listings: Vec::new(),
            mcp_sign_ins: Vec::new(),
            seed,
            next_conn: 1,
            connected: Vec::new(),
            chunk: 3,
            fail_next_persists: 0,
            refuse_writes: false,
            target: Ok(Sim::page("https://shop.example/")),
            frames: std::collections::BTreeMap::new(),
            auto_approve: Some(ApprovalDecision::AcceptOnce),
            auto_answer: Some("yes".into()),
            realistic_usage: false,
            hold_persists: false,
            defer_receipts: true,
            parked_receipts: None,
            coin: seed,
            receipts_on_hold: false,
            fail_receipt_reads: 0,
            held: Vec::new(),
            loads: Vec::new(),
            tail_loads: Vec::new(),
            violations: Vec::new(),
            cache_adoptions: 0,
            start_snapshots: Vec::new(),
        }
    }

    /// Rebuild the engine with `self.config` (changed after `new`), from
    /// the store as it is, with the simulation's seed.
    pub fn reconfigure(&mut self) {
        let mut image = self.store.image();
        if self.defer_receipts {
            image.receipts.clear();
            image.receipts_deferred = true;
        }
        self.engine = Engine::new(
            self.config.clone(),
            self.profile.clone(),
            self.seed,
            image,
            self.now,
        );
    }

    /// A target page at `url` the extension may access.
    pub fn page(url: &str) -> TargetInfo {
        TargetInfo {
            tab_id: 1,
            url: url.to_string(),
            origin: origin_of(url),
            title: "Test page".into(),
            host_permission: true,
            ..TargetInfo::default()
        }
    }

    /// Connect a trusted client (the side panel) and return its id.
    pub fn connect(&mut self) -> ConnId {
        self.connect_as(ClientKind::ExtensionPage)
    }

    pub fn connect_as(&mut self, kind: ClientKind) -> ConnId {
        let conn = self.next_conn;
        self.next_conn += 1;
        self.engine.handle_connect(conn, kind);
        self.connected.push(conn);
        conn
    }

    /// A client's Port closed (the panel was closed).
    pub fn disconnect(&mut self, conn: ConnId) {
        self.connected.retain(|c| *c != conn);
        self.engine.handle_disconnect(conn);
        self.drain_effects();
    }

    /// Every client of the current engine disconnects.
    pub fn disconnect_all(&mut self) {
        for conn in std::mem::take(&mut self.connected) {
            self.engine.handle_disconnect(conn);
        }
        self.drain_effects();
    }

    /// Send an op from a client (the direct transport).
    pub fn send(&mut self, conn: ConnId, op: Op) {
        self.engine.handle_op(self.now, conn, op);
    }

    /// Send a raw JSON message, as a Port would deliver it.
    pub fn send_raw(&mut self, conn: ConnId, message: Value) {
        self.engine.handle_message(self.now, conn, message);
    }

    /// Kill the engine and rebuild it from the store: in-flight provider
    /// streams and tool results are lost, committed units survive.
    pub fn crash(&mut self) {
        self.crashes += 1;
        self.inputs.clear();
        self.held_replies.clear();
        self.held_tools.clear();
        self.parked_receipts = None;
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Transactions held in flight die with the worker: the browser
        // commits them in order, so some first ones may have committed
        // (unacknowledged), the rest never will. None lands after the next
        // worker read the store.
        let held = std::mem::take(&mut self.held);
        let committed = (self.seed >> 33) as usize % (held.len() + 1);
        for (token, unit) in held.into_iter().take(committed) {
            self.apply(&unit);
            self.commit_log.push(token);
        }
        self.start_snapshots = self.store.snapshots.values().cloned().collect();
        self.reconfigure();
        self.next_conn += 1000; // old connections are gone
        self.connected.clear();
    }

    /// Whether nothing is left to do.
    pub fn is_idle(&self) -> bool {
        self.inputs.is_empty()
            && (self.parked_receipts.is_none() || self.receipts_on_hold)
            && self.engine.poll_timeout().is_none()
    }

    /// Execute one pending effect (or deliver one input). Returns false when idle.
    pub fn step(&mut self) -> bool {
        self.step_with(None)
    }

    /// Like `step`, but crash at `crash` if the effect is a persist.
    pub fn step_with(&mut self, crash: Option<CrashPoint>) -> bool {
        self.now += 1;
        if let Some(at) = self.engine.poll_timeout() {
            if at <= self.now {
                self.engine.handle_timeout(self.now);
            }
        }
        if let Some(effect) = self.engine.poll_effect() {
            self.execute(effect, crash);
            return true;
        }
        if self.parked_receipts.is_some() && !self.receipts_on_hold {
            self.coin = self
                .coin
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let command_next = matches!(self.inputs.front(), Some((_, Input::Op { .. })));
            if !command_next || self.coin >> 63 == 0 {
                let receipts = self.parked_receipts.take().unwrap_or_default();
                self.engine.handle_receipts_loaded(self.now, Ok(receipts));
                return true;
            }
        }
        if let Some((_, input)) = self.inputs.pop_front() {
            self.deliver(input);
            return true;
        }
        if let Some(at) = self.engine.poll_timeout() {
            self.now = self.now.max(at);
            self.engine.handle_timeout(self.now);
            return true;
        }
        false
    }

    /// Answer the requests `hold_replies_to` held, in the order they were made.
    /// Deliver the results of the held tool calls (`hold_tools`).
    pub fn release_tools(&mut self) {
        for (dispatch_id, outcome) in std::mem::take(&mut self.held_tools) {
            self.inputs.push_back((
                dispatch_id,
                Input::ToolResult {
                    dispatch_id,
                    outcome,
                },
            ));
        }
    }

    pub fn release_replies(&mut self) {
        for (request_id, reply) in std::mem::take(&mut self.held_replies) {
            self.queue_reply(request_id, reply);
        }
    }

    /// Commit and acknowledge every parked persist, in order.
    pub fn release_persists(&mut self) {
        self.hold_persists = false;
        for (token, unit) in std::mem::take(&mut self.held) {
            self.apply(&unit);
            self.commit_log.push(token);
            self.engine.handle_store_ack(self.now, token);
        }
    }

    /// Commit and acknowledge every parked persist in an order the browser
    /// may use: IndexedDB completes a readwrite transaction after every
    /// earlier one whose stores overlap its own, and in any order relative
    /// to the others (here coin-chosen).
    pub fn release_persists_in_any_order(&mut self) {
        self.hold_persists = false;
        let mut held = std::mem::take(&mut self.held);
        while !held.is_empty() {
            let scopes: Vec<Vec<&'static str>> =
                held.iter().map(|(_, unit)| unit.store_names()).collect();
            let ready: Vec<usize> = (0..held.len())
                .filter(|&i| (0..i).all(|j| !scopes[j].iter().any(|s| scopes[i].contains(s))))
                .collect();
            self.coin = self
                .coin
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pick = ready[(self.coin >> 33) as usize % ready.len()];
            let (token, unit) = held.remove(pick);
            self.apply(&unit);
            self.commit_log.push(token);
            self.engine.handle_store_ack(self.now, token);
        }
    }

    /// Fail every parked persist (a full disk): nothing of them is written.
    pub fn fail_held_persists(&mut self, retryable: bool) {
        self.hold_persists = false;
        while self.fail_nth(0, retryable) {}
    }

    /// Commit and acknowledge the oldest parked persist only; later ones stay parked.
    pub fn release_one(&mut self) -> bool {
        self.release_nth(0)
    }

    /// Commit and acknowledge the `n`th parked persist (from 0, oldest
    /// first) only, as IndexedDB may when their stores do not overlap; the
    /// others stay parked.
    pub fn release_nth(&mut self, n: usize) -> bool {
        if n >= self.held.len() {
            return false;
        }
        let (token, unit) = self.held.remove(n);
        self.apply(&unit);
        self.commit_log.push(token);
        self.engine.handle_store_ack(self.now, token);
        true
    }

    /// Fail the `n`th parked persist only (nothing of it is written); the
    /// others stay parked.
    pub fn fail_nth(&mut self, n: usize, retryable: bool) -> bool {
        if n >= self.held.len() {
            return false;
        }
        let (token, _) = self.held.remove(n);
        self.engine.handle_store_error(
            self.now,
            token,
            StoreError {
                message: "QuotaExceededError".into(),
                retryable,
            },
        );
        true
    }

    /// The simulated user answers a question or an approval shown live or
    /// re-presented in a snapshot (sent by the engine or from the cache).
    fn auto_respond(&mut self, conn: ConnId, event: &Event) {
        let shown = match event {
            Event::Initialized { snapshot } => snapshot.thread.as_ref(),
            _ => None,
        };
        let question = match event {
            Event::InteractionRequest { interaction, .. } => Some(interaction),
            _ => shown.and_then(|t| t.pending_interaction.as_ref()),
        };
        if let (Some(question), Some(answer)) = (question, self.auto_answer.clone()) {
            let op = Op::InteractionResponse {
                submission: Submission {
                    client_id: "sim-user".into(),
                    submission_id: format!("answer-{}", question.id),
                },
                thread_id: question.thread_id.clone(),
                interaction_id: question.id.clone(),
                answer,
            };
            self.inputs.push_back((0, Input::Op { conn, op }));
        }
        let asked = match event {
            Event::ApprovalRequest { approval, .. } => Some(approval),
            _ => shown.and_then(|t| t.pending_approval.as_ref()),
        };
        if let (Some(approval), Some(decision)) = (asked, self.auto_approve) {
            let op = Op::ApprovalResponse {
                submission: Submission {
                    client_id: "sim-user".into(),
                    submission_id: format!("approve-{}", approval.id),
                },
                thread_id: approval.thread_id.clone(),
                approval_id: approval.id.clone(),
                decision,
            };
            self.inputs.push_back((0, Input::Op { conn, op }));
        }
    }

    /// Commit a unit to the store. snapshot_cache: a unit that is not the
    /// cache's own write leaves no cached snapshot behind (every unit
    /// deletes them), so one in the store always shows the durable state.
    fn apply(&mut self, unit: &crate::store::UnitOfWork) {
        self.store.apply(unit);
        let cache_write = unit
            .puts
            .iter()
            .all(|r| matches!(r, crate::store::Record::Snapshot(_)));
        if !cache_write && !self.store.snapshots.is_empty() {
            let left: Vec<&String> = self.store.snapshots.keys().collect();
            self.violations.push(format!(
                "snapshot_cache: a unit committed and left the cached snapshots of {left:?}"
            ));
        }
    }

    /// Reconnect the way `extension/sw.js` does when, at this engine's
    /// start, the store held this build's cached snapshot of `asked` (None:
    /// of the thread a fresh panel opens): the client gets that snapshot
    /// (`seq` 0) before the engine sees its `initialize`, then the engine
    /// adopts the subscription or sends the current snapshot. False (nothing
    /// done) when no such snapshot was cached.
    pub fn initialize_from_cache(&mut self, conn: ConnId, asked: Option<&str>) -> bool {
        let Some(cached) = self
            .start_snapshots
            .iter()
            .find(|c| match asked {
                Some(t) => c.thread_id == t,
                None => c.is_recent(),
            })
            .filter(|c| c.build == self.config.build)
            .cloned()
        else {
            return false;
        };
        let thread_id = cached.thread_id.clone();
        let thread_id = thread_id.as_str();
        // What the engine would send instead, had it no cache: checked
        // against the cached one when it is sent (`check_snapshot_matches_cache`).
        let probe = self.connect();
        self.send(
            probe,
            Op::Initialize {
                submission: Submission {
                    client_id: "sim-probe".into(),
                    submission_id: format!("probe-{conn}"),
                },
                thread_id: Some(thread_id.to_string()),
            },
        );
        let event = Event::Initialized {
            snapshot: Box::new(cached.snapshot),
        };
        self.auto_respond(conn, &event);
        self.events.push((
            conn,
            crate::protocol::EventEnvelope {
                seq: 0,
                epoch: self.engine.epoch().to_string(),
                event,
            },
        ));
        let message = serde_json::json!({
            "type": "initialize",
            "clientId": "sim-user",
            "submissionId": format!("init-cached-{conn}"),
            "threadId": asked,
        });
        if self.engine.start_snapshot_for(asked).as_deref() == Some(thread_id) {
            self.cache_adoptions += 1;
            // What the client was shown is the store's state only if no unit
            // was issued since the snapshot was cached.
            if self.engine.units_in_flight() > 0 {
                self.violations.push(format!(
                    "snapshot_cache: the cached snapshot of {thread_id} is held current with a unit in flight"
                ));
            }
        }
        self.engine
            .handle_cached_initialize(self.now, conn, message, thread_id);
        true
    }

    /// snapshot_cache: while the engine holds a cached snapshot current, the
    /// snapshot it sends for that thread is the cached one, byte for byte.
    fn check_snapshot_matches_cache(&mut self, event: &Event) {
        let Event::Initialized { snapshot } = event else {
            return;
        };
        let Some(thread) = &snapshot.thread else {
            return;
        };
        let Some(cached) = self.store.snapshots.get(&thread.id) else {
            return;
        };
        // Compared as what a client receives: the JSON text.
        let cached = serde_json::to_string(&cached.snapshot).unwrap_or_default();
        let sent = serde_json::to_string(&**snapshot).unwrap_or_default();
        if self.engine.cached_snapshot_is_current(&thread.id) && cached != sent {
            self.violations.push(format!(
                "snapshot_cache: the cached snapshot of {} differs from the one sent:\n{cached}\n{sent}",
                thread.id
            ));
        }
    }

    /// Drive until idle; panics on livelock (more than `max_steps`).
    pub fn run(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            if !self.step() {
                return;
            }
        }
        panic!("simulation did not settle within {max_steps} steps (livelock?)");
    }

    /// Drain only the engine's queued effects (no new provider/tool input).
    pub fn drain_effects(&mut self) {
        while let Some(effect) = self.engine.poll_effect() {
            self.execute(effect, None);
        }
    }

    fn execute(&mut self, effect: Effect, crash: Option<CrashPoint>) {
        match effect {
            Effect::Persist { token, unit } => {
                if crash == Some(CrashPoint::BeforeCommit) {
                    self.crash();
                    return;
                }
                if self.hold_persists {
                    self.held.push((token, unit));
                    return;
                }
                let failure = if self.refuse_writes {
                    Some("QuotaExceededError: the disk is full")
                } else if self.fail_next_persists > 0 {
                    self.fail_next_persists -= 1;
                    Some("injected failure")
                } else {
                    None
                };
                if let Some(message) = failure {
                    let error = StoreError {
                        message: message.into(),
                        retryable: true,
                    };
                    return self.engine.handle_store_error(self.now, token, error);
                }
                self.apply(&unit);
                self.commit_log.push(token);
                if crash == Some(CrashPoint::AfterCommit) {
                    self.crash();
                    return;
                }
                self.engine.handle_store_ack(self.now, token);
            }
            Effect::LoadThread { thread_id } => {
                let nodes = self.store.thread_nodes(&thread_id);
                self.loads.push(thread_id.clone());
                let runs = self.store.thread_runs(&thread_id);
                self.engine
                    .handle_thread_loaded(self.now, &thread_id, nodes, runs);
            }
            // Read now, delivered after what is already queued: commands
            // that arrive meanwhile wait for it.
            Effect::LoadReceipts => {
                if self.fail_receipt_reads > 0 {
                    self.fail_receipt_reads -= 1;
                    let error = StoreError {
                        message: "injected read failure".into(),
                        retryable: true,
                    };
                    self.engine.handle_receipts_loaded(self.now, Err(error));
                    return;
                }
                self.parked_receipts = Some(self.store.receipts.values().cloned().collect());
            }
            Effect::LoadThreadTail { thread_id, nodes } => {
                let (tail, complete) = self.store.thread_tail(&thread_id, nodes);
                self.tail_loads
                    .push((thread_id.clone(), tail.len(), complete));
                let runs = self.store.thread_runs(&thread_id);
                self.engine
                    .handle_thread_tail_loaded(self.now, &thread_id, tail, runs, complete);
            }
            Effect::CallProvider {
                request_id,
                request,
                ..
            } => {
                let reply = (self.policy)(&request);
                let held = self.hold_replies_to.is_some_and(|hold| hold(&request));
                let input = self
                    .realistic_usage
                    .then(|| crate::engine::estimate_tokens(&request));
                self.requests.push(if self.keep_request_messages {
                    request
                } else {
                    std::rc::Rc::new(ProviderRequest {
                        lineage: None,
                        messages: Default::default(),
                        ..(*request).clone()
                    })
                });
                if held {
                    self.held_replies.push((request_id, reply));
                    return;
                }
                self.queue_reply(request_id, reply);
                if let Some(input) = input {
                    self.set_reported_input(request_id, input);
                }
            }
            Effect::AbortProvider { request_id } => {
                self.inputs.retain(|(_, i)| match i {
                    Input::Delta { request_id: r, .. } | Input::Done { request_id: r, .. } => {
                        *r != request_id
                    }
                    _ => true,
                });
            }
            Effect::DispatchTool(crate::engine::ToolDispatch {
                dispatch_id,
                call_id,
                name,
                params,
                target,
                ..
            }) => {
                let outcome = (self.tool)(&name, &params);
                let held = self.hold_tools.is_some_and(|hold| hold(&name));
                self.dispatches.push(Dispatch {
                    dispatch_id,
                    call_id,
                    name,
                    params,
                    target,
                });
                if held {
                    self.held_tools.push((dispatch_id, outcome));
                    return;
                }
                self.inputs.push_back((
                    dispatch_id,
                    Input::ToolResult {
                        dispatch_id,
                        outcome,
                    },
                ));
            }
            Effect::AbortTool { dispatch_id } => {
                self.inputs.retain(|(_, i)| !matches!(i, Input::ToolResult { dispatch_id: d, .. } if *d == dispatch_id));
                self.held_tools.retain(|(d, _)| *d != dispatch_id);
            }
            Effect::AnswerElicitation {
                dispatch_id,
                action,
                content,
            } => {
                // This worker's dispatch of that id: the latest one.
                let call = self
                    .dispatches
                    .iter()
                    .rev()
                    .find(|d| d.dispatch_id == dispatch_id)
                    .map(|d| d.call_id.clone())
                    .unwrap_or_default();
                self.elicitation_answer_calls.push(call);
                self.elicitation_answers
                    .push((dispatch_id, action, content));
            }
            // The test answers for the servers (`handle_mcp_status`).
            Effect::ListMcpTools { names } => self.mcp_listings.push(names),
            Effect::SignInMcp { name } => self.mcp_sign_ins.push((name, true)),
            Effect::SignOutMcp { name } => self.mcp_sign_ins.push((name, false)),
            Effect::ResolveTarget {
                resolve_id,
                params,
                describe,
                ..
            } => {
                let frame_id = params
                    .as_ref()
                    .map_or(frames::TOP_FRAME, frames::frame_of_params);
                let target = match self.target.clone() {
                    Ok(page) if frame_id != frames::TOP_FRAME => match self.frames.get(&frame_id) {
                        Some(frame) => Ok(TargetInfo {
                            tab_id: page.tab_id,
                            frame_id: Some(i64::from(frame_id)),
                            page_url: Some(page.url),
                            ..frame.clone()
                        }),
                        None => Err(frames::frame_gone(frame_id)),
                    },
                    other => other,
                };
                // The page describes the named element only when asked
                // (a write naming one), as the driver does.
                let target = target.map(|mut t| {
                    if !describe {
                        t.element = None;
                    }
                    t
                });
                self.inputs
                    .push_back((resolve_id, Input::Target { resolve_id, target }));
            }
            Effect::Send { conn, event } => {
                self.check_event_is_durable(&event.event);
                self.check_snapshot_matches_cache(&event.event);
                self.auto_respond(conn, &event.event);
                self.events.push((conn, event));
            }
            Effect::SetHeartbeat { level } => self.heartbeat = level,
        }
    }

    fn queue_reply(&mut self, request_id: u64, reply: Reply) {
        let (text, result) = match reply {
            Reply::Text { text, stop } => {
                let response = ProviderResponse {
                    text: text.clone(),
                    reasoning: String::new(),
                    tool_calls: Vec::new(),
                    stop_reason: stop,
                    usage: Some(Usage {
                        input: 10,
                        output: 5,
                        ..Usage::default()
                    }),
                    model: String::new(),
                    private: None,
                };
                (text, Ok(response))
            }
            Reply::ToolCalls { text, calls, stop } => {
                let response = ProviderResponse {
                    text: text.clone(),
                    reasoning: String::new(),
                    tool_calls: calls,
                    stop_reason: stop,
                    usage: Some(Usage {
                        input: 10,
                        output: 5,
                        ..Usage::default()
                    }),
                    model: String::new(),
                    private: None,
                };
                (text, Ok(response))
            }
            Reply::Error { partial, error } => (partial, Err(error)),
        };
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(self.chunk.max(1)) {
            self.inputs.push_back((
                request_id,
                Input::Delta {
                    request_id,
                    event: StreamEvent::TextDelta(chunk.iter().collect()),
                },
            ));
        }
        self.inputs
            .push_back((request_id, Input::Done { request_id, result }));
    }

    /// Replace the usage of a queued response with a realistic input count.
    fn set_reported_input(&mut self, request_id: u64, input: u64) {
        for (_, queued) in self.inputs.iter_mut() {
            if let Input::Done {
                request_id: r,
                result: Ok(response),
            } = queued
            {
                if *r == request_id {
                    if let Some(usage) = response.usage.as_mut() {
                        usage.input = input;
                    }
                }
            }
        }
    }

    fn deliver(&mut self, input: Input) {
        match input {
            Input::Delta { request_id, event } => self
                .engine
                .handle_provider_delta(self.now, request_id, event),
            Input::Done { request_id, result } => self
                .engine
                .handle_provider_done(self.now, request_id, result),
            Input::ToolResult {
                dispatch_id,
                outcome,
            } => self
                .engine
                .handle_tool_result(self.now, dispatch_id, outcome),
            Input::Target { resolve_id, target } => self
                .engine
                .handle_target_resolved(self.now, resolve_id, target),
            Input::Op { conn, op } => self.engine.handle_op(self.now, conn, op),
        }
    }

    /// ack_after_commit, complete_after_writes and "announce after commit",
    /// checked at the moment an event leaves the engine.
    fn check_event_is_durable(&mut self, event: &Event) {
        match event {
            Event::CommandAck {
                submission_id,
                op_type,
                ..
            } => {
                // Reads: no receipt, nothing written. Every other ACK,
                // even one that changed nothing, has its receipt.
                let nothing_written = crate::protocol::READ_OP_TYPES.contains(&op_type.as_str());
                let suffix = format!("\u{1f}{submission_id}");
                if !nothing_written && !self.store.receipts.keys().any(|k| k.ends_with(&suffix)) {
                    self.violations
                        .push(format!("ack_after_commit: {op_type} {submission_id} acked before its receipt committed"));
                }
            }
            Event::ItemComplete { node, .. } if self.store.nodes.get(&node.id) != Some(node) => {
                self.violations.push(format!(
                    "item.complete for node {} before it committed",
                    node.id
                ));
            }
            Event::TurnComplete { turn_id, error, .. } => {
                let terminal = self
                    .store
                    .runs
                    .get(turn_id)
                    .is_some_and(|r| r.state.is_terminal());
                // A storage failure is reported as such: the run resumes from its last checkpoint.
                let storage_failure = error
                    .as_ref()
                    .is_some_and(|e| e.kind == crate::protocol::ErrorKind::Storage);
                if !terminal && !storage_failure {
                    self.violations
                        .push(format!("complete_after_writes: turn.complete for {turn_id} before its terminal write"));
                }
            }
            _ => {}
        }
    }

    /// Events delivered to one client.
    pub fn events_for(&self, conn: ConnId) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|(c, _)| *c == conn)
            .map(|(_, e)| &e.event)
            .collect()
    }

    /// Number of pending inputs (provider chunks, tool results) not yet delivered.
    pub fn pending_inputs(&self) -> usize {
        self.inputs.len()
    }
}
