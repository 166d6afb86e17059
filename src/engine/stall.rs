//! A thread paused after a failed checkpoint (`ThreadState::stalled`): the
//! store is probed until it takes writes again, then the thread is read back
//! from it and its run resumed in this worker, exactly as a new worker would
//! resume it.
//!
//! Why read it back rather than go on from memory: the stopped run's
//! memory may hold steps that were never saved (a tool's result, a step
//! counter), and a new worker would not know them either. Going on from
//! what the store holds keeps one recovery rule for both cases (a
//! never-retry write whose result was not saved becomes `paused_uncertain`,
//! a read runs again), and that rule is the one the crash tests exercise.

use super::*;

/// Why an op on a paused thread is refused.
pub(super) const PAUSED: &str = "Saving this conversation failed, so it is paused. It continues from its last saved step once saving works again.";

/// The key a probe writes and deletes again in the snapshot store (no
/// thread id has a colon, so it never names a cached snapshot).
fn probe_key(tid: &str) -> String {
    format!("probe:{tid}")
}

impl Engine {
    /// A run checkpoint of `tid` failed for good: this worker stops driving
    /// the run, remembers what the panel is told, and schedules the first
    /// probe of the store.
    pub(super) fn stall(&mut self, now: u64, tid: &str, error: ErrorInfo) {
        let policy = self.config.stall_probe.clone();
        self.cache_shown_changed();
        if let Some(t) = self.threads.get_mut(tid) {
            t.stalled = Some(error);
            t.probe = (policy.max_attempts > 0).then_some(Probe {
                at: now.saturating_add(policy.base_delay_ms),
                failed: 0,
                issued: false,
            });
        }
    }

    /// Issue the probes that are due: one transaction each, writing a
    /// record of the snapshot store and deleting it again.
    pub(super) fn probe_stalled(&mut self, now: u64) {
        let due: Vec<String> = self
            .threads
            .iter()
            .filter(|(_, t)| t.probe.is_some_and(|p| !p.issued && p.at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for tid in due {
            let t = self.threads.get_mut(&tid).expect("listed above");
            if t.deleting {
                // Nothing of a thread being deleted is written; if the
                // delete fails, the next op on the thread probes again
                // (`await_probe`), or the next worker resumes the run. What
                // waited is answered now: the delete refuses it.
                t.probe = None;
                let waiting = std::mem::take(&mut t.awaiting_probe);
                self.answer_now(now, waiting);
                continue;
            }
            if let Some(p) = t.probe.as_mut() {
                p.issued = true;
            }
            let key = probe_key(&tid);
            let mut unit = UnitOfWork::new();
            unit.put(Record::Snapshot(crate::store::SnapshotRecord {
                // The store keys it by the value's `threadId`.
                json: serde_json::json!({ "threadId": key }).to_string(),
                thread_id: key.clone(),
            }));
            unit.delete(stores::SNAPSHOTS, key);
            self.issue_unkept(&tid, unit, Then::Probed);
        }
    }

    /// Ops that waited for a probe, handled now after all (the thread is
    /// no longer paused, or is being deleted, which refuses them).
    fn answer_now(&mut self, now: u64, waiting: Vec<(ConnId, Op)>) {
        for (conn, op) in waiting {
            self.handle_op(now, conn, op);
        }
    }

    /// An op the pause refuses arrived: the user is acting on the thread,
    /// so the store is probed now, and the op is answered by the outcome (it
    /// runs on the resumed thread, or is refused if the disk is still full).
    /// A thread past its last probe starts probing again.
    pub(super) fn await_probe(&mut self, now: u64, tid: &str, conn: ConnId, op: Op) {
        let Some(t) = self.threads.get_mut(tid) else {
            return;
        };
        t.awaiting_probe.push((conn, op));
        match t.probe.as_mut() {
            Some(p) if p.issued => {}
            Some(p) => p.at = p.at.min(now),
            None => {
                t.probe = Some(Probe {
                    at: now,
                    failed: 0,
                    issued: false,
                })
            }
        }
    }

    /// A probe failed: the next one waits twice as long (up to the policy's
    /// bound); after the last one the thread waits for the next worker. Ops
    /// that waited for it are refused.
    pub(super) fn probe_failed(&mut self, now: u64, tid: &str) {
        let policy = self.config.stall_probe.clone();
        let Some(t) = self.threads.get_mut(tid) else {
            return;
        };
        let waiting = std::mem::take(&mut t.awaiting_probe);
        let failed = t.probe.map_or(0, |p| p.failed) + 1;
        t.probe = (failed < policy.max_attempts && t.stalled.is_some()).then(|| {
            let delay = policy
                .base_delay_ms
                .saturating_mul(1u64 << failed.min(20))
                .min(policy.max_delay_ms);
            Probe {
                at: now.saturating_add(delay),
                failed,
                issued: false,
            }
        });
        self.reject_waiting(waiting, PAUSED);
    }

    /// A probe committed: forget this worker's view of the thread's
    /// conversation and runs (`ThreadState::forget_conversation`) and read
    /// them back from the store; the run resumes once the read arrives
    /// (`resume_revived`). The run's frozen environment is kept aside (the
    /// runs read back do not carry it).
    pub(super) fn revive(&mut self, now: u64, tid: &str) {
        let Some(t) = self.threads.get_mut(tid) else {
            return;
        };
        t.probe = None;
        let waiting = std::mem::take(&mut t.awaiting_probe);
        if t.stalled.is_none() || t.deleting {
            return self.answer_now(now, waiting);
        }
        t.stalled = None;
        // They run once the thread is read back and its run resumed.
        t.deferred.extend(waiting);
        let revival = match t.reviving.take() {
            // A read back that failed before: memory no longer has the run.
            Some(revival) => revival,
            None => Revival {
                environment: t
                    .latest_run
                    .as_ref()
                    .and_then(|r| Some((r.id.clone(), r.environment.clone()?))),
            },
        };
        t.reviving = Some(revival);
        t.forget_conversation();
        // Ops that arrive meanwhile wait for the read (`handle_op`).
        t.loading = true;
        self.effects.push_back(Effect::LoadThread {
            thread_id: tid.to_string(),
        });
        self.cache_shown_changed();
    }

    /// The thread read back after a probe (`handle_thread_loaded`): panels
    /// redraw from it, then its run goes on from the last saved step.
    pub(super) fn resume_revived(&mut self, now: u64, tid: &str) {
        let Some(t) = self.threads.get_mut(tid) else {
            return;
        };
        if t.stalled.is_some() {
            return; // paused again meanwhile: the next probe reads it back
        }
        let Some(revival) = t.reviving.take() else {
            return;
        };
        if let Some((run_id, environment)) = revival.environment {
            if let Some(run) = t
                .latest_run
                .as_mut()
                .filter(|r| r.id == run_id && r.environment.is_none())
            {
                run.environment = Some(environment);
            }
        }
        let snapshot = self.snapshot(Some(tid));
        self.broadcast(
            tid,
            Event::Initialized {
                snapshot: Box::new(snapshot),
            },
        );
        self.recover_thread(now, tid);
    }

    /// Reading the thread back failed: it stays paused, and the next probe
    /// tries again.
    pub(super) fn revive_read_failed(&mut self, now: u64, tid: &str, error: &StoreError) {
        let reviving = self
            .threads
            .get(tid)
            .is_some_and(|t| t.reviving.is_some() && t.stalled.is_none());
        if reviving {
            let error = ErrorInfo::new(
                ErrorKind::Storage,
                format!(
                    "Saving works again, but reading the conversation back failed: {error}. It continues from its last saved step once that works."
                ),
            );
            self.stall(now, tid, error);
        }
    }
}
