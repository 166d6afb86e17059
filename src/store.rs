//! Persistence vocabulary: records, units of work, the loaded image, and an
//! in-memory store used by native drivers and tests.
//!
//! Owns: what one checkpoint writes (`UnitOfWork`, applied atomically: one
//! IndexedDB readwrite transaction in the browser), the object-store names,
//! and what the engine reads back at start (`StoreImage`).
//!
//! Must not: know the loop or decide what to write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{
    ApprovalRecord, EnvironmentRecord, InteractionRecord, Node, PendingSteer, QueueItem, Receipt,
    Run, SiteRule, Thread,
};
use crate::protocol::Snapshot;

/// Object store names. One logical checkpoint touches any subset in one transaction.
pub mod stores {
    pub const THREADS: &str = "threads";
    pub const NODES: &str = "nodes";
    pub const RUNS: &str = "runs";
    pub const STEERS: &str = "steers";
    pub const QUEUE: &str = "queue";
    pub const RECEIPTS: &str = "receipts";
    pub const APPROVALS: &str = "approvals";
    pub const SITE_RULES: &str = "site_rules";
    pub const INTERACTIONS: &str = "interactions";
    /// Keyed by run id; read only for unfinished runs.
    pub const ENVIRONMENTS: &str = "environments";
    /// Keyed by thread id: the snapshot cache (`CachedSnapshot`), never
    /// decoded by the engine. At start the worker script reads its keys,
    /// which of them this build wrote (`SNAPSHOTS_BY_BUILD`) and one record
    /// whole, this build's most recent thread's (`SNAPSHOTS_RECENT`); any
    /// other cached thread's record only when a panel asks for it.
    pub const SNAPSHOTS: &str = "snapshots";
    /// Index of `SNAPSHOTS` on `build`.
    pub const SNAPSHOTS_BY_BUILD: &str = "build";
    /// Index of `SNAPSHOTS` on `recentOf` (only the most recent thread's
    /// record has it: the build that wrote it).
    pub const SNAPSHOTS_RECENT: &str = "recentOf";
    pub const ALL: [&str; 11] = [
        THREADS,
        NODES,
        RUNS,
        STEERS,
        QUEUE,
        RECEIPTS,
        APPROVALS,
        SITE_RULES,
        INTERACTIONS,
        ENVIRONMENTS,
        SNAPSHOTS,
    ];
    /// Index of `RUNS` on `state`: a start reads the unfinished runs only
    /// (`RunState::TERMINAL_NAMES`), not every run kept for the retention.
    pub const RUNS_BY_STATE: &str = "state";
    /// What a starting engine reads before it runs: every store but the
    /// nodes (read per thread), the environments (read per unfinished run)
    /// and the receipts (read right after, `Effect::LoadReceipts`: only a
    /// command needs them, and a long-used profile holds thousands); of the
    /// runs, the unfinished ones (`RUNS_BY_STATE`). In this order in
    /// `extension/store-prefetch.js`, which reads them while the wasm module
    /// compiles (a test compares the two lists).
    pub const START_IMAGE: [&str; 7] = [
        THREADS,
        RUNS,
        STEERS,
        QUEUE,
        APPROVALS,
        SITE_RULES,
        INTERACTIONS,
    ];
}

/// The IndexedDB database: its name and version (bump together with
/// `model::SCHEMA_VERSION` migrations). `extension/store-prefetch.js` opens
/// exactly this version and leaves creating or upgrading to the engine.
/// 4: run environments moved to their own store (`environments`). A run
/// record of version 3 still carries its environment and is read with it;
/// the engine writes an unfinished one's into its own record at start.
/// 5: nodes gain the `threadTime` index ([threadId, createdAt]) so a cold
/// start reads only the tail of a long thread (records unchanged).
/// 6: the `snapshots` store (the snapshot cache; records unchanged).
/// 7: `snapshots` gains the `build` and `recentOf` indexes, so a start reads
/// one cached snapshot instead of all of them (the `recent` flag became
/// `recentOf`; a version-6 record, another build's, is never sent).
/// 8: `runs` gains the `state` index, so a start reads the unfinished runs
/// instead of every run kept for the retention (records unchanged; the
/// upgrade indexes the existing ones).
pub const DB_NAME: &str = "sw-agent";
pub const DB_VERSION: u32 = 8;

/// The key ranges of the runs' `state` index (`stores::RUNS_BY_STATE`) that
/// hold every run a start needs: each state that is not terminal, and any
/// other key a damaged record may have (it is decoded and reported), i.e.
/// everything between and around `RunState::TERMINAL_NAMES`. As
/// `(lower, upper)` bounds, both open; `None` is unbounded.
pub fn unfinished_run_states() -> Vec<(Option<&'static str>, Option<&'static str>)> {
    let names = crate::model::RunState::TERMINAL_NAMES;
    let mut ranges = vec![(None, Some(names[0]))];
    ranges.extend(names.windows(2).map(|w| (Some(w[0]), Some(w[1]))));
    ranges.push((Some(names[names.len() - 1]), None));
    ranges
}

/// A thread's `initialized` snapshot, exactly as the engine that wrote it
/// would send it, cached while nothing it shows can change
/// (`engine/snapshot_cache.rs`). The worker script sends it to an extension
/// page's `initialize` for this thread before the engine has started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedSnapshot {
    pub thread_id: String,
    /// The build that wrote it (`EngineConfig::build`): another build's
    /// snapshot is never sent, its shape may differ.
    pub build: String,
    /// Set on the record of the thread an `initialize` without a thread id
    /// opens (the most recently updated) when this was written, to the
    /// build: the key of the `recentOf` index, which lets the worker script
    /// read this one record at start and no other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_of: Option<String>,
    pub snapshot: Snapshot,
}

impl CachedSnapshot {
    /// Whether this is the most recent thread's snapshot.
    pub fn is_recent(&self) -> bool {
        self.recent_of.is_some()
    }
}

/// A cached snapshot ready to store: its `CachedSnapshot` as JSON text,
/// encoded once, by the engine (which needs the size to decide).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub thread_id: String,
    pub json: String,
}

/// A cached snapshot found at start: whose, and by which build (None when
/// only its key was read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedKey {
    pub thread_id: String,
    pub build: Option<String>,
}

/// A record to put.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Records are built once and moved into a unit; boxing the large ones would
// only add an allocation per checkpoint.
#[allow(clippy::large_enum_variant)]
pub enum Record {
    Thread(Thread),
    Node(Node),
    Run(Run),
    Steer(PendingSteer),
    QueueItem(QueueItem),
    Receipt(Receipt),
    Approval(ApprovalRecord),
    SiteRule(SiteRule),
    Interaction(InteractionRecord),
    Environment(EnvironmentRecord),
    Snapshot(SnapshotRecord),
}

impl Record {
    pub fn store_name(&self) -> &'static str {
        match self {
            Record::Thread(_) => stores::THREADS,
            Record::Node(_) => stores::NODES,
            Record::Run(_) => stores::RUNS,
            Record::Steer(_) => stores::STEERS,
            Record::QueueItem(_) => stores::QUEUE,
            Record::Receipt(_) => stores::RECEIPTS,
            Record::Approval(_) => stores::APPROVALS,
            Record::SiteRule(_) => stores::SITE_RULES,
            Record::Interaction(_) => stores::INTERACTIONS,
            Record::Environment(_) => stores::ENVIRONMENTS,
            Record::Snapshot(_) => stores::SNAPSHOTS,
        }
    }
}

/// A record to delete, by store and primary key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordKey {
    pub store: &'static str,
    pub key: String,
}

/// Everything one checkpoint writes, applied all-or-nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitOfWork {
    pub puts: Vec<Record>,
    pub deletes: Vec<RecordKey>,
}

impl UnitOfWork {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, record: Record) -> &mut Self {
        self.puts.push(record);
        self
    }

    pub fn delete(&mut self, store: &'static str, key: impl Into<String>) -> &mut Self {
        self.deletes.push(RecordKey {
            store,
            key: key.into(),
        });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.deletes.is_empty()
    }

    /// The run record this unit puts, if any (to amend it before commit).
    pub fn run_mut(&mut self) -> Option<&mut Run> {
        self.puts.iter_mut().find_map(|r| match r {
            Record::Run(run) => Some(run),
            _ => None,
        })
    }

    /// Whether this unit puts or deletes a record of `store` (no allocation:
    /// asked after every commit).
    pub fn touches(&self, store: &str) -> bool {
        self.puts.iter().any(|r| r.store_name() == store)
            || self.deletes.iter().any(|d| d.store == store)
    }

    /// The distinct object stores this unit touches (the transaction's scope).
    pub fn store_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .puts
            .iter()
            .map(Record::store_name)
            .chain(self.deletes.iter().map(|d| d.store))
            .collect();
        crate::sorting::sort(&mut names);
        names.dedup();
        names
    }
}

/// What the engine reads at start: every thread, steer and queue item
/// (receipts too, unless `receipts_deferred`), the unfinished runs, and the nodes and every run of the threads
/// that have an unfinished run or a queued turn (`loaded_threads`). Other
/// threads' finished runs come with the thread when it loads
/// (`Engine::handle_thread_loaded`): a start decodes no finished run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreImage {
    pub threads: Vec<Thread>,
    /// Unfinished runs, and every run of `loaded_threads`.
    pub runs: Vec<Run>,
    pub steers: Vec<PendingSteer>,
    pub queue: Vec<QueueItem>,
    pub receipts: Vec<Receipt>,
    pub approvals: Vec<ApprovalRecord>,
    pub site_rules: Vec<SiteRule>,
    pub interactions: Vec<InteractionRecord>,
    /// The environments of the unfinished runs.
    pub environments: Vec<EnvironmentRecord>,
    /// Nodes of the threads listed in `loaded_threads`.
    pub nodes: Vec<Node>,
    pub loaded_threads: Vec<String>,
    /// The snapshot cache's records (keys, and builds when known).
    pub snapshots: Vec<CachedKey>,
    /// `receipts` is empty because they were not read: the engine reads
    /// them right after it starts (`Effect::LoadReceipts`).
    pub receipts_deferred: bool,
}

/// A store failure, typed. `retryable` tells whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub message: String,
    pub retryable: bool,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

/// An in-memory store with the same atomicity as the IndexedDB one.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    pub threads: BTreeMap<String, Thread>,
    pub nodes: BTreeMap<String, Node>,
    pub runs: BTreeMap<String, Run>,
    pub steers: BTreeMap<String, PendingSteer>,
    pub queue: BTreeMap<String, QueueItem>,
    pub receipts: BTreeMap<String, Receipt>,
    pub approvals: BTreeMap<String, ApprovalRecord>,
    pub site_rules: BTreeMap<String, SiteRule>,
    pub interactions: BTreeMap<String, InteractionRecord>,
    pub environments: BTreeMap<String, EnvironmentRecord>,
    pub snapshots: BTreeMap<String, CachedSnapshot>,
    /// Number of units applied (one per transaction).
    pub commits: u64,
}

/// `record` as the worker reads it back from its stored JSON data.
fn read_back<T: Serialize + crate::model::FromRecord>(record: &T) -> T {
    let value = serde_json::to_value(record).expect("a record encodes");
    T::from_record(value).unwrap_or_else(|e| panic!("a stored record reads back: {e}"))
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply a unit of work atomically (nothing here can fail half-way).
    /// Every record is kept as the worker reads it back: encoded to its
    /// JSON data and decoded by the worker's own decoders, so what the
    /// encoding does not carry (a `null` that reads back as absent, …) is
    /// not carried here either.
    pub fn apply(&mut self, unit: &UnitOfWork) {
        for record in &unit.puts {
            match record {
                Record::Thread(t) => {
                    self.threads.insert(t.id.clone(), read_back(t));
                }
                Record::Node(n) => {
                    let value = serde_json::to_value(n).expect("a node encodes");
                    let n: Node = serde_json::from_value(value).expect("a node reads back");
                    self.nodes.insert(n.id.clone(), n);
                }
                Record::Run(r) => {
                    // As IndexedDB stores it: the environment lives in its own record.
                    let mut r = r.clone();
                    r.environment = None;
                    self.runs.insert(r.id.clone(), read_back(&r));
                }
                Record::Steer(s) => {
                    self.steers.insert(s.id.clone(), read_back(s));
                }
                Record::QueueItem(q) => {
                    self.queue.insert(q.id.clone(), read_back(q));
                }
                Record::Receipt(r) => {
                    self.receipts.insert(r.key.clone(), read_back(r));
                }
                Record::Approval(a) => {
                    self.approvals.insert(a.id.clone(), read_back(a));
                }
                Record::SiteRule(r) => {
                    self.site_rules.insert(r.origin.clone(), read_back(r));
                }
                Record::Interaction(i) => {
                    self.interactions.insert(i.id.clone(), read_back(i));
                }
                Record::Environment(e) => {
                    self.environments.insert(e.run_id.clone(), read_back(e));
                }
                Record::Snapshot(r) => {
                    // IndexedDB takes the parsed JSON text, keyed by its
                    // `threadId`: anything else fails the whole commit in
                    // the browser (`IdbStore::encode`), so it is a bug here.
                    let key = serde_json::from_str::<serde_json::Value>(&r.json)
                        .ok()
                        .and_then(|v| v.get("threadId")?.as_str().map(str::to_string));
                    assert_eq!(
                        key.as_deref(),
                        Some(r.thread_id.as_str()),
                        "a snapshot record IndexedDB would refuse: {}",
                        r.json
                    );
                    // As IndexedDB stores it: the parsed JSON text.
                    if let Ok(c) = serde_json::from_str::<CachedSnapshot>(&r.json) {
                        self.snapshots.insert(r.thread_id.clone(), c);
                    }
                }
            }
        }
        for key in &unit.deletes {
            match key.store {
                stores::THREADS => {
                    self.threads.remove(&key.key);
                }
                stores::NODES => {
                    self.nodes.remove(&key.key);
                }
                stores::RUNS => {
                    self.runs.remove(&key.key);
                }
                stores::STEERS => {
                    self.steers.remove(&key.key);
                }
                stores::QUEUE => {
                    self.queue.remove(&key.key);
                }
                stores::RECEIPTS => {
                    self.receipts.remove(&key.key);
                }
                stores::APPROVALS => {
                    self.approvals.remove(&key.key);
                }
                stores::SITE_RULES => {
                    self.site_rules.remove(&key.key);
                }
                stores::INTERACTIONS => {
                    self.interactions.remove(&key.key);
                }
                stores::ENVIRONMENTS => {
                    self.environments.remove(&key.key);
                }
                stores::SNAPSHOTS => {
                    self.snapshots.remove(&key.key);
                }
                _ => {}
            }
        }
        self.commits += 1;
    }

    /// The image a fresh engine starts from.
    pub fn image(&self) -> StoreImage {
        let unfinished: Vec<Run> = self
            .runs
            .values()
            .filter(|r| !r.state.is_terminal())
            .cloned()
            .collect();
        let queue: Vec<QueueItem> = self.queue.values().cloned().collect();
        let loaded_threads: Vec<String> = threads_to_load(&unfinished, &queue);
        // As the IndexedDB store reads them: unfinished runs, and every run
        // of the threads loaded at start; the rest come with their thread.
        let runs = self
            .runs
            .values()
            .filter(|r| !r.state.is_terminal() || loaded_threads.contains(&r.thread_id))
            .cloned()
            .collect();
        let nodes = self
            .nodes
            .values()
            .filter(|n| loaded_threads.contains(&n.thread_id))
            .cloned()
            .collect();
        StoreImage {
            receipts_deferred: false,
            threads: self.threads.values().cloned().collect(),
            runs,
            steers: self.steers.values().cloned().collect(),
            queue,
            receipts: self.receipts.values().cloned().collect(),
            approvals: self.approvals.values().cloned().collect(),
            site_rules: self.site_rules.values().cloned().collect(),
            interactions: self.interactions.values().cloned().collect(),
            environments: self
                .environments
                .values()
                .filter(|e| {
                    self.runs
                        .get(&e.run_id)
                        .is_some_and(|r| !r.state.is_terminal())
                })
                .cloned()
                .collect(),
            nodes,
            loaded_threads,
            snapshots: self
                .snapshots
                .values()
                .map(|c| CachedKey {
                    thread_id: c.thread_id.clone(),
                    build: Some(c.build.clone()),
                })
                .collect(),
        }
    }

    /// Every run of one thread, as stored (what a thread load hands the
    /// engine with the nodes).
    pub fn thread_runs(&self, thread_id: &str) -> Vec<Run> {
        self.runs
            .values()
            .filter(|r| r.thread_id == thread_id)
            .cloned()
            .collect()
    }

    /// All nodes of one thread (what `Effect::LoadThread` asks for).
    pub fn thread_nodes(&self, thread_id: &str) -> Vec<Node> {
        self.nodes
            .values()
            .filter(|n| n.thread_id == thread_id)
            .cloned()
            .collect()
    }

    /// The newest `count` nodes of a thread by creation time, plus every node
    /// created in the same millisecond as the oldest of them, and whether
    /// that is all of the thread (what `Effect::LoadThreadTail` asks for;
    /// the IndexedDB store answers the same from its `threadTime` index).
    pub fn thread_tail(&self, thread_id: &str, count: usize) -> (Vec<Node>, bool) {
        select_tail(self.thread_nodes(thread_id), count)
    }
}

/// Keep the newest `count` nodes (by `createdAt`) and any tied with the
/// oldest kept; true when nothing was dropped.
fn select_tail(nodes: Vec<Node>, count: usize) -> (Vec<Node>, bool) {
    let count = count.max(1);
    if nodes.len() <= count {
        return (nodes, true);
    }
    let mut times: Vec<u64> = nodes.iter().map(|n| n.created_at).collect();
    crate::sorting::sort_by(&mut times, |a, b| b.cmp(a));
    let boundary = times[count - 1];
    let tail = nodes
        .into_iter()
        .filter(|n| n.created_at >= boundary)
        .collect();
    (tail, false)
}

/// Threads whose nodes must be loaded at start: those with an unfinished run
/// or a queued turn waiting to start.
pub fn threads_to_load(runs: &[Run], queue: &[QueueItem]) -> Vec<String> {
    let mut ids: Vec<String> = runs
        .iter()
        .filter(|r| !r.state.is_terminal())
        .map(|r| r.thread_id.clone())
        .chain(queue.iter().map(|q| q.thread_id.clone()))
        .collect();
    crate::sorting::sort(&mut ids);
    ids.dedup();
    ids
}
