//! The snapshot cache: what a restarted worker can show a reconnecting
//! panel before the engine runs.
//!
//! Chrome kills the worker often; the panel's Port reconnect starts it
//! again and asks `initialize`. Fetching, compiling and starting the wasm
//! engine is most of that cold start (BENCHMARKS.md), although a thread at
//! rest looks exactly as it did before the kill. So, once nothing has been
//! in flight for `CACHE_WRITE_DELAY_MS`, the engine writes the snapshot of
//! each thread a client is subscribed to or opened since the last write,
//! and of the most recent one (`recentOf`: what a fresh panel's `initialize`
//! without a thread id opens), as it would send it now, to the `snapshots`
//! store (`CachedSnapshot`, stamped with the build). The worker script reads
//! the cache's keys and the most recent thread's record with the start
//! image (`extension/store-prefetch.js`), any other record when a panel
//! asks for its thread, and answers an extension page's first `initialize`
//! for such a thread itself (`extension/sw.js`: `seq` 0 under the epoch it
//! hands the engine), before
//! the engine runs or, once it runs, when [`Engine::start_snapshot_for`]
//! says the copy it read is still current. The engine adopts the
//! subscription without sending a second snapshot
//! ([`Engine::handle_cached_initialize`]) — or sends the current one, which
//! replaces the cached one on the panel, when it no longer holds.
//!
//! Why a cached snapshot is never stale: every unit of work the engine
//! issues while a cached snapshot may exist deletes it in the same
//! transaction (one more store in the first checkpoint after a rest, none
//! in the following ones), and one is written only when no unit is in
//! flight and no run is going, so no commit can land between the state it
//! shows and the worker reading it. A run waiting for the user (approval,
//! answer, uncertain write) is at rest too: a restarted engine re-presents
//! it from the store without a unit, so the cached card is the one it would
//! send. The crash-anywhere simulation checks
//! that no unit commits and leaves a cached snapshot (`Sim::apply`), that a
//! snapshot sent while the cache is held current is the cached one
//! (`Sim::check_snapshot_matches_cache`), and that none is adopted with a
//! unit in flight (`Sim::initialize_from_cache`).

use super::*;
use crate::store::{CachedKey, CachedSnapshot, SnapshotRecord};

/// The largest snapshot cached, as JSON (1 MiB). A snapshot carries the
/// last `snapshot_nodes` nodes; page outlines among them can make it large,
/// and the worker script reads the most recent thread's whenever it starts.
const MAX_CACHED_BYTES: usize = 1 << 20;

/// How long the engine stays at rest before it writes the cache (ms). A
/// turn that follows at once (a queued one, a quick reply) neither waits
/// behind the write nor carries it in its steps; the worker lives ~30 s
/// after its last event, so a rest it is killed in is rarely this short.
pub const CACHE_WRITE_DELAY_MS: u64 = 1000;

/// How many threads opened within one rest are remembered for the cache.
const MAX_WANTED: usize = 8;

/// What the engine knows of the `snapshots` store.
#[derive(Debug, Default)]
pub(super) struct SnapshotCache {
    /// Threads whose cached snapshot may be in the store: every unit deletes
    /// them until one of those units commits (a superset: deleting a missing
    /// key is harmless). Only the first unit deleting them once let a unit
    /// issued beside it commit while that first one failed, leaving a stale
    /// snapshot a restarted worker would have shown as current.
    present: Vec<String>,
    /// Threads whose cached snapshot is in the store, written by this build,
    /// with no unit issued since (not written again while so).
    valid: Vec<String>,
    /// Of those, the ones whose record is the one read at start: what the
    /// worker script holds and may send (it never reads the store again).
    at_start: Vec<String>,
    /// Something a snapshot shows may have changed, or a client subscribed,
    /// since the cache was last written.
    dirty: bool,
    /// Units issued so far (a cache write is valid only if none followed it).
    issued: u64,
    /// When the cache is to be written, if the engine is still at rest.
    due: Option<u64>,
    /// Threads a client opened since the cache was last written (it may
    /// have gone since: a panel closed within the second still counts).
    wanted: Vec<String>,
}

impl SnapshotCache {
    /// What a starting engine found in the store.
    pub(super) fn from_start(found: Vec<CachedKey>, build: &str) -> Self {
        let valid: Vec<String> = found
            .iter()
            .filter(|k| !build.is_empty() && k.build.as_deref() == Some(build))
            .map(|k| k.thread_id.clone())
            .collect();
        SnapshotCache {
            present: found.into_iter().map(|k| k.thread_id).collect(),
            at_start: valid.clone(),
            valid,
            dirty: true,
            issued: 0,
            due: None,
            wanted: Vec::new(),
        }
    }
}

impl Engine {
    /// A unit is about to be issued: it deletes every cached snapshot, and
    /// none is current any more.
    pub(super) fn cache_invalidate(&mut self, unit: &mut UnitOfWork) {
        let cache = &mut self.cache;
        cache.issued += 1;
        cache.valid.clear();
        cache.at_start.clear();
        cache.due = None;
        cache.dirty = true;
        for thread_id in &cache.present {
            unit.delete(stores::SNAPSHOTS, thread_id.clone());
        }
    }

    /// A unit committed: the cached snapshots it deleted are gone.
    pub(super) fn cache_deleted(&mut self, unit: &UnitOfWork) {
        let gone = |t: &String| {
            unit.deletes
                .iter()
                .any(|k| k.store == stores::SNAPSHOTS && k.key == *t)
        };
        self.cache.present.retain(|t| !gone(t));
    }

    /// A client opened a thread: cache its snapshot at the next rest.
    pub(super) fn cache_subscribed(&mut self, thread_id: Option<&str>) {
        self.cache.dirty = true;
        let wanted = &mut self.cache.wanted;
        if let Some(tid) = thread_id.filter(|t| !wanted.iter().any(|w| w == t)) {
            // A few at most: the threads opened within one rest.
            if wanted.len() == MAX_WANTED {
                wanted.remove(0);
            }
            wanted.push(tid.to_string());
        }
    }

    /// Nothing in flight that could change what a snapshot shows: no unit,
    /// no running step, no admission, no queued turn, no read, no title to
    /// write. A run that waits for the user (an approval, an answer, a
    /// decision on an uncertain write) is at rest: only the user's answer,
    /// a unit, moves it, and a restarted engine re-presents it as it was.
    fn at_rest(&self) -> bool {
        self.pending.is_empty()
            && self.held.is_empty()
            && self.title_requests.is_empty()
            && self.test_requests.is_empty()
            && self.threads.values().all(|t| {
                let waiting = t.exec.as_ref().is_none_or(|e| e.waits_for_user());
                let run_settled = t.latest_run.as_ref().is_none_or(|r| {
                    r.state.is_terminal()
                        || matches!(
                            r.state,
                            RunState::WaitingApproval
                                | RunState::WaitingInteraction
                                | RunState::PausedUncertain
                        )
                });
                waiting
                    && run_settled
                    && !t.loading
                    && t.admitting.is_empty()
                    && t.queue_inflight == 0
                    && t.queue.is_empty()
                    && t.steers.is_empty()
                    && t.deferred.is_empty()
                    && t.settle_waiting.is_empty()
                    && t.awaiting_probe.is_empty()
                    && t.pending_title.is_none()
            })
    }

    /// At rest with something new to cache: write it `CACHE_WRITE_DELAY_MS`
    /// from now, unless a unit is issued before (`handle_timeout`).
    pub(super) fn cache_arm(&mut self, now: u64) {
        if self.cache_writable() {
            self.cache.due.get_or_insert(now + CACHE_WRITE_DELAY_MS);
        }
    }

    /// Something new to cache, a build to stamp it with, and at rest.
    fn cache_writable(&self) -> bool {
        self.cache.dirty && !self.config.build.is_empty() && self.at_rest()
    }

    /// When the cache write is due (`Engine::poll_timeout`).
    pub(super) fn cache_due(&self) -> Option<u64> {
        self.cache.due
    }

    /// The cache write's time came: write it if still at rest.
    pub(super) fn cache_timeout(&mut self, now: u64) {
        if self.cache.due.is_some_and(|at| at <= now) {
            self.cache.due = None;
            self.cache_maybe_write();
        }
    }

    /// At rest with something new to cache: write the snapshot of every
    /// thread a trusted client is subscribed to or opened since the last
    /// write, and of the thread a fresh panel's `initialize` (no thread id)
    /// opens, in one unit of its own.
    /// Each must be in memory (loaded, or its tail read); a snapshot whose
    /// JSON exceeds `MAX_CACHED_BYTES` is not cached (the worker script
    /// reads the most recent thread's record at each start).
    pub(super) fn cache_maybe_write(&mut self) {
        if !self.cache_writable() {
            return;
        }
        let recent = self.most_recent_thread();
        let mut targets: Vec<String> = self
            .conns
            .values()
            .filter(|c| c.kind == ClientKind::ExtensionPage)
            .filter_map(|c| c.subscribed.clone())
            .chain(self.cache.wanted.drain(..))
            .chain(recent.clone())
            .filter(|tid| !self.cache.valid.contains(tid))
            .filter(|tid| {
                // A paused thread is shown ended with its error by this
                // worker only; the next one (or this one, once the store
                // takes writes again) shows the saved run going on.
                self.threads.get(tid).is_some_and(|t| {
                    t.thread.revision > 0
                        && (t.loaded || t.partial.is_some())
                        && t.stalled.is_none()
                })
            })
            .collect();
        crate::sorting::sort(&mut targets);
        targets.dedup();
        self.cache.dirty = false;
        if targets.is_empty() {
            return;
        }
        let mut unit = UnitOfWork::new();
        let mut written = Vec::new();
        for tid in targets {
            let cached = CachedSnapshot {
                thread_id: tid.clone(),
                build: self.config.build.clone(),
                recent_of: (recent.as_ref() == Some(&tid)).then(|| self.config.build.clone()),
                snapshot: self.snapshot(Some(&tid)),
            };
            let Ok(json) = serde_json::to_string(&cached) else {
                continue;
            };
            if json.len() > MAX_CACHED_BYTES {
                continue;
            }
            unit.put(Record::Snapshot(SnapshotRecord {
                thread_id: tid.clone(),
                json,
            }));
            if !self.cache.present.contains(&tid) {
                self.cache.present.push(tid.clone());
            }
            written.push(tid);
        }
        if written.is_empty() {
            return;
        }
        // Its snapshots can be megabytes: not kept (`issue_unkept`).
        let then = Then::SnapshotsCached {
            issued: self.cache.issued,
            threads: written,
        };
        self.issue_unkept("", unit, then);
    }

    /// The cache write committed: its snapshots are current unless a unit
    /// was issued after it (that unit deletes them).
    pub(super) fn cache_written(&mut self, issued: u64, threads: Vec<String>) {
        if self.cache.issued != issued {
            return;
        }
        for tid in threads {
            if !self.cache.valid.contains(&tid) {
                self.cache.valid.push(tid);
            }
        }
    }

    /// What a snapshot shows changed without a unit (a thread paused after
    /// a failed checkpoint, or resumed): write the cache at the next rest.
    pub(super) fn cache_shown_changed(&mut self) {
        self.cache.dirty = true;
    }

    /// The cache write failed: try again at the next rest.
    pub(super) fn cache_write_failed(&mut self) {
        self.cache.dirty = true;
    }

    /// The thread whose snapshot, as read at start, the worker script may
    /// send for an `initialize` of `asked` (None: a fresh panel's, which
    /// opens the most recent thread): the one that `initialize` opens, if
    /// its cached snapshot is the one read at start and still current.
    pub fn start_snapshot_for(&self, asked: Option<&str>) -> Option<String> {
        let opens = match asked {
            Some(t) => Some(t.to_string()),
            None => self.most_recent_thread(),
        }?;
        (self.cache.at_start.contains(&opens) && self.threads.contains_key(&opens)).then_some(opens)
    }

    /// An `initialize` the worker script already answered with the cached
    /// snapshot of `thread_id` it read at start. When that snapshot is
    /// still current the port is subscribed and nothing is sent; otherwise
    /// the op is handled as usual and the client gets the current snapshot,
    /// which replaces the cached one.
    pub fn handle_cached_initialize(
        &mut self,
        now: u64,
        conn: ConnId,
        message: Value,
        thread_id: &str,
    ) {
        let trusted = self.conns.get(&conn).is_some_and(|c| c.kind.trusted());
        let current = trusted
            && match Op::from_value(message.clone()) {
                Ok(Op::Initialize {
                    thread_id: asked, ..
                }) => self.start_snapshot_for(asked.as_deref()).as_deref() == Some(thread_id),
                _ => false,
            };
        if !current {
            return self.handle_message(now, conn, message);
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.subscribed = Some(thread_id.to_string());
        }
    }

    /// Whether the store's cached snapshot of `thread_id` is current (tests
    /// and the simulation's check).
    pub fn cached_snapshot_is_current(&self, thread_id: &str) -> bool {
        self.cache.valid.iter().any(|t| t == thread_id)
    }

    /// Units of work issued and not yet committed, the cache's own writes
    /// aside (the simulation's check: none while a cached snapshot is current).
    pub fn units_in_flight(&self) -> usize {
        self.pending
            .values()
            .filter(|p| !matches!(p.then, Then::SnapshotsCached { .. }))
            .count()
    }
}
