//! Engine plumbing: checkpoints and receipts, ACKs and events, delta
//! coalescing, snapshots, and mirroring committed units into memory.

use serde_json::Value;

use super::*;

impl Engine {
    // --------------------------------------------------------------- helpers

    pub(super) fn next_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    pub(super) fn set_phase(&mut self, tid: &str, phase: Phase) {
        if let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) {
            exec.phase = phase;
        }
    }

    /// The call at `index` of the thread's active run has its result.
    pub(super) fn mark_call_done(&mut self, tid: &str, index: usize) {
        if let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) {
            exec.calls[index].done = true;
        }
    }

    pub(super) fn persist(&mut self, tid: &str, unit: UnitOfWork, then: Then) -> u64 {
        self.persist_with(0, tid, unit, then, None)
    }

    /// Issue a unit that is never retried and changes nothing in memory
    /// (a snapshot cache write, a paused thread's probe): no receipt, no
    /// path lengths, no cache invalidation, and the pending entry keeps an
    /// empty unit instead of a copy.
    pub(super) fn issue_unkept(&mut self, tid: &str, unit: UnitOfWork, then: Then) {
        let token = self.next_handle();
        self.pending.insert(
            token,
            Pending {
                thread_id: tid.to_string(),
                unit: UnitOfWork::new(),
                then,
                reply: None,
                attempts: 0,
            },
        );
        self.effects.push_back(Effect::Persist { token, unit });
    }

    /// Queue a checkpoint; when it decides a command, its receipt joins the
    /// same unit and the ACK waits for the commit (ack_after_commit).
    pub(super) fn persist_with(
        &mut self,
        now: u64,
        tid: &str,
        mut unit: UnitOfWork,
        then: Then,
        decided: Option<(Reply, Value)>,
    ) -> u64 {
        if let Some((reply, result)) = &decided {
            self.add_receipt(now, &mut unit, reply, result);
        }
        self.stamp_path_lengths(&mut unit);
        self.cache_invalidate(&mut unit);
        let token = self.next_handle();
        self.pending.insert(
            token,
            Pending {
                thread_id: tid.to_string(),
                unit: unit.clone(),
                then,
                reply: decided,
                attempts: 0,
            },
        );
        self.effects.push_back(Effect::Persist { token, unit });
        token
    }

    /// Every thread record of a unit carries the length of its active path
    /// (`Thread::path_len`), computed from the unit's own nodes and the
    /// committed path in memory; None when that cannot be known here (an
    /// ancestor still in flight in another unit, a thread not in memory), which
    /// only means the next cold start reads that thread whole.
    fn stamp_path_lengths(&self, unit: &mut UnitOfWork) {
        if !unit.puts.iter().any(|r| matches!(r, Record::Thread(_))) {
            return;
        }
        let parents: HashMap<String, Option<String>> = unit
            .puts
            .iter()
            .filter_map(|r| match r {
                Record::Node(n) => Some((n.id.clone(), n.parent_id.clone())),
                _ => None,
            })
            .collect();
        for record in &mut unit.puts {
            if let Record::Thread(thread) = record {
                thread.path_len = self.path_len_of(thread, &parents);
            }
        }
    }

    /// Whether a cold start's tail read, which takes the newest nodes, would
    /// reach back to `oldest_other` (the oldest node off the path to be
    /// stamped) once the unit's `unit_nodes` new nodes are in.
    fn within_tail_read(
        &self,
        t: &ThreadState,
        oldest_other: Option<u64>,
        unit_nodes: usize,
    ) -> bool {
        oldest_other.is_none_or(|since| {
            let newer = t.all_nodes().filter(|n| n.created_at >= since).count();
            newer + unit_nodes <= tail_window(self.config.snapshot_nodes)
        })
    }

    fn path_len_of(
        &self,
        thread: &Thread,
        parents: &HashMap<String, Option<String>>,
    ) -> Option<u64> {
        let Some(leaf) = thread.leaf_id.as_deref() else {
            return Some(0);
        };
        let state = self.threads.get(&thread.id);
        let loaded = state.filter(|t| t.loaded);
        // Up through this unit's new nodes.
        let mut cursor = leaf.to_string();
        let mut above: u64 = 0;
        while let Some(parent) = parents.get(&cursor) {
            above += 1;
            match parent {
                None => return Some(above),
                Some(p) => cursor = p.clone(),
            }
            if above as usize > parents.len() {
                return None; // a cycle among the unit's nodes
            }
        }
        if let Some(t) = loaded {
            // Ancestors never change: a node at index i of the committed
            // active path has i + 1 nodes from the root, whatever the leaf.
            if let Some(i) = t.path.iter().rposition(|n| n.id == cursor) {
                // A cold start reads only the newest nodes when the length
                // is known. Other versions of a message (an edit) older
                // than that read would go unseen, and with them the version
                // switcher: then the thread is read whole instead.
                let leaving = t.path[i + 1..].iter().map(|n| n.created_at);
                let oldest_other = t.off_path.iter().map(|n| n.created_at).chain(leaving).min();
                return self
                    .within_tail_read(t, oldest_other, parents.len())
                    .then_some(above + i as u64 + 1);
            }
            // On another branch (a branch switch): walk the whole tree.
            let by_id: HashMap<&str, &Node> = t.all_nodes().map(|n| (n.id.as_str(), n)).collect();
            let mut node = by_id.get(cursor.as_str())?;
            let mut on_path: HashSet<&str> = HashSet::from([node.id.as_str()]);
            while let Some(parent) = node.parent_id.as_deref() {
                node = by_id.get(parent)?;
                if !on_path.insert(node.id.as_str()) {
                    return None; // a cycle
                }
            }
            // As above: the versions left behind must be within a tail read.
            let oldest_other = t
                .all_nodes()
                .filter(|n| !on_path.contains(n.id.as_str()))
                .map(|n| n.created_at)
                .min();
            return self
                .within_tail_read(t, oldest_other, parents.len())
                .then_some(above + on_path.len() as u64);
        }
        // Not in memory: the leaf did not move, so the stored length holds.
        state
            .filter(|t| above == 0 && t.thread.leaf_id.as_deref() == Some(leaf))
            .and_then(|t| t.thread.path_len)
    }

    pub(super) fn persist_command(
        &mut self,
        now: u64,
        tid: &str,
        unit: UnitOfWork,
        then: Then,
        reply: Reply,
        result: Value,
    ) -> u64 {
        self.persist_with(now, tid, unit, then, Some((reply, result)))
    }

    /// Whether a save of the thread is in flight (not committed yet).
    pub(super) fn thread_saving(&self, tid: &str) -> bool {
        self.thread_saving_where(tid, |_| true)
    }

    /// Whether a save of the thread in flight (not committed yet) is one
    /// `f` picks out by what its unit writes.
    pub(super) fn thread_saving_where(&self, tid: &str, f: impl Fn(&UnitOfWork) -> bool) -> bool {
        self.pending
            .values()
            .any(|p| p.thread_id == tid && f(&p.unit))
    }

    pub(super) fn command(
        &mut self,
        now: u64,
        tid: &str,
        unit: UnitOfWork,
        reply: Reply,
        result: Value,
        follow: Follow,
    ) {
        self.persist_command(now, tid, unit, Then::Command { follow }, reply, result);
    }

    /// ACK a command that changes nothing, after its receipt commits: sent
    /// again, it replays this answer instead of acting on what is then.
    pub(super) fn ack_with_receipt(&mut self, now: u64, tid: &str, reply: Reply, result: Value) {
        self.command(now, tid, UnitOfWork::new(), reply, result, Follow::AckOnly);
    }

    pub(super) fn add_receipt(
        &mut self,
        now: u64,
        unit: &mut UnitOfWork,
        reply: &Reply,
        result: &Value,
    ) {
        let key = receipt_key(&reply.submission);
        // Registered already (an interrupt, from its arrival): its waiters
        // stay.
        if !self.inflight_receipts.contains_key(&key) {
            self.inflight_receipts
                .insert(key.clone(), (reply.fingerprint.clone(), Vec::new()));
        }
        unit.put(Record::Receipt(Receipt {
            key,
            op_type: reply.op_type.to_string(),
            fingerprint: reply.fingerprint.clone(),
            result: result.clone(),
            created_at: now,
        }));
    }

    /// The id of the thread's latest run ("" when it has none): what a
    /// turn's events name as `turnId`.
    pub(super) fn latest_run_id(&self, tid: &str) -> String {
        self.threads[tid]
            .latest_run
            .as_ref()
            .map(|r| r.id.clone())
            .unwrap_or_default()
    }

    /// receipt_replay_or_reject: a known submission id replays or is rejected.
    pub(super) fn replay_receipt(&mut self, now: u64, reply: &Reply) -> bool {
        let key = receipt_key(&reply.submission);
        if let Some(receipt) = self.receipts.get(&key) {
            if receipt.fingerprint == reply.fingerprint && receipt.op_type == reply.op_type {
                let result = receipt.result.clone();
                let created = match reply.op_type {
                    "thread.create" | "thread.fork" => result
                        .get("threadId")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    _ => None,
                };
                self.ack(reply, result);
                // The first answer (the ACK and the new thread's snapshot)
                // may never have reached the client: a retry opens the
                // thread again, as the first answer did, so the client is
                // not left waiting for a snapshot no one sends.
                if let Some(thread_id) = created {
                    self.reopen_created(now, reply, thread_id);
                }
            } else {
                self.reject(
                    reply,
                    ErrorKind::InvalidCommand,
                    "This submission id was already used for a different command.",
                );
            }
            return true;
        }
        if let Some((fp, waiters)) = self.inflight_receipts.get_mut(&key) {
            if *fp == reply.fingerprint {
                waiters.push(reply.clone());
            } else {
                let reply = reply.clone();
                self.reject(
                    &reply,
                    ErrorKind::InvalidCommand,
                    "This submission id was already used for a different command.",
                );
            }
            return true;
        }
        false
    }

    /// The same submission sent again while its commit was in flight: it is
    /// answered with it.
    pub(super) fn take_waiters(&mut self, reply: &Reply) -> Vec<Reply> {
        self.inflight_receipts
            .remove(&receipt_key(&reply.submission))
            .map(|(_, w)| w)
            .unwrap_or_default()
    }

    /// ACKs `reply` and every retry of it that arrived while its commit was
    /// in flight; returns the connections answered.
    pub(super) fn ack(&mut self, reply: &Reply, result: Value) -> Vec<ConnId> {
        let waiters = self.take_waiters(reply);
        let mut answered = Vec::with_capacity(1 + waiters.len());
        for r in std::iter::once(reply).chain(waiters.iter()) {
            answered.push(r.conn);
            self.send(
                r.conn,
                Event::CommandAck {
                    submission_id: r.submission.submission_id.clone(),
                    op_type: r.op_type.to_string(),
                    result: result.clone(),
                },
            );
        }
        answered
    }

    /// A retried `thread.create` or `thread.fork`: the client is shown the
    /// thread it made, as by `initialize` (which loads it if a restart left
    /// it on disk), or, if that thread was deleted since, the most recent
    /// one, so the client always gets the snapshot it waits for.
    fn reopen_created(&mut self, now: u64, reply: &Reply, thread_id: String) {
        let op = Op::Initialize {
            submission: reply.submission.clone(),
            thread_id: Some(thread_id),
        };
        self.handle_op(now, reply.conn, op);
    }

    pub(super) fn reject(&mut self, reply: &Reply, kind: ErrorKind, message: &str) {
        self.reject_with(reply, ErrorInfo::new(kind, message));
    }

    /// Reject with a full error (e.g. a provider's, with its retry hint).
    pub(super) fn reject_with(&mut self, reply: &Reply, error: ErrorInfo) {
        self.send(
            reply.conn,
            Event::CommandReject {
                submission_id: reply.submission.submission_id.clone(),
                op_type: reply.op_type.to_string(),
                error,
            },
        );
    }

    pub(super) fn send(&mut self, conn: ConnId, event: Event) {
        self.seq += 1;
        self.effects.push_back(Effect::Send {
            conn,
            event: EventEnvelope {
                seq: self.seq,
                epoch: self.epoch.clone(),
                event,
            },
        });
    }

    pub(super) fn subscribers(&self, tid: &str) -> Vec<ConnId> {
        let mut conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.kind.trusted() && c.subscribed.as_deref() == Some(tid))
            .map(|(id, _)| *id)
            .collect();
        crate::sorting::sort(&mut conns);
        conns
    }

    pub(super) fn broadcast(&mut self, tid: &str, event: Event) {
        if !matches!(event, Event::ItemDelta { .. }) {
            self.flush_pending_deltas(tid);
        }
        // Usually one subscriber: the event moves to the last, is cloned
        // only for the others.
        let subscribers = self.subscribers(tid);
        if let Some((last, others)) = subscribers.split_last() {
            for conn in others {
                self.send(*conn, event.clone());
            }
            self.send(*last, event);
        }
    }

    /// Send an event to every connected extension page, in connection
    /// order (not to a web page's content script).
    pub(super) fn send_to_pages(&mut self, event: Event) {
        let mut conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.kind.trusted())
            .map(|(id, _)| *id)
            .collect();
        crate::sorting::sort(&mut conns);
        for conn in conns {
            self.send(conn, event.clone());
        }
    }

    pub(super) fn broadcast_threads(&mut self) {
        let threads = self.thread_summaries();
        self.send_to_pages(Event::ThreadsUpdated { threads });
    }

    pub(super) fn flush_deltas(&mut self, now: u64, tid: &str) {
        if let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) {
            if exec.deltas.pending.is_empty() {
                exec.deltas.flush_at = None;
                return;
            }
            exec.deltas.last_sent_at = Some(now);
        }
        self.flush_pending_deltas(tid);
    }

    pub(super) fn flush_pending_deltas(&mut self, tid: &str) {
        let Some(t) = self.threads.get_mut(tid) else {
            return;
        };
        let turn_id = t
            .latest_run
            .as_ref()
            .map(|r| r.id.clone())
            .unwrap_or_default();
        let Some(exec) = t.exec.as_mut() else { return };
        exec.deltas.flush_at = None;
        if exec.deltas.pending.is_empty() {
            return;
        }
        let deltas = std::mem::take(&mut exec.deltas.pending);
        let item_id = exec.item_id.clone();
        for delta in deltas {
            let event = Event::ItemDelta {
                thread_id: tid.to_string(),
                turn_id: turn_id.clone(),
                item_id: item_id.clone(),
                delta,
            };
            for conn in self.subscribers(tid) {
                self.send(conn, event.clone());
            }
        }
    }

    /// Announce every node a committed unit wrote, and the run's state.
    pub(super) fn announce(&mut self, tid: &str, unit: &UnitOfWork) {
        let turn_id = self
            .threads
            .get(tid)
            .and_then(|t| t.latest_run.as_ref())
            .map(|r| r.id.clone())
            .unwrap_or_default();
        for record in &unit.puts {
            match record {
                Record::Node(node) => self.broadcast(
                    tid,
                    Event::ItemComplete {
                        thread_id: tid.to_string(),
                        turn_id: turn_id.clone(),
                        node: node.clone(),
                    },
                ),
                Record::Run(run) => {
                    // Only changes are news: a checkpoint that keeps the state says nothing.
                    let key = (run.id.clone(), run.state);
                    let Some(t) = self.threads.get_mut(tid) else {
                        continue;
                    };
                    if t.announced_state.as_ref() == Some(&key) {
                        continue;
                    }
                    t.announced_state = Some(key);
                    self.broadcast(
                        tid,
                        Event::RunStatus {
                            thread_id: tid.to_string(),
                            turn_id: run.id.clone(),
                            state: run.state,
                        },
                    )
                }
                _ => {}
            }
        }
    }

    /// Report the usage of the reply `unit` keeps (else `unkept`, a reply
    /// no node keeps) with the turn's and the thread's new totals.
    pub(super) fn emit_usage(
        &mut self,
        tid: &str,
        unit: &UnitOfWork,
        unkept: Option<crate::model::Usage>,
    ) {
        let usage = unit
            .puts
            .iter()
            .find_map(|r| match r {
                Record::Node(Node {
                    body: NodeBody::AssistantMessage { usage: Some(u), .. },
                    ..
                }) => Some(*u),
                _ => None,
            })
            .or(unkept);
        let Some(usage) = usage else { return };
        let t = &self.threads[tid];
        let Some(run) = t.latest_run.as_ref() else {
            return;
        };
        let event = Event::TokenUsage {
            thread_id: tid.to_string(),
            turn_id: run.id.clone(),
            usage,
            turn_total: UsageTotals {
                input: run.usage.input,
                output: run.usage.output,
            },
            thread_total: UsageTotals {
                input: t.thread.usage.input,
                output: t.thread.usage.output,
            },
        };
        self.broadcast(tid, event);
    }

    pub(super) fn emit_queue(&mut self, tid: &str) {
        let Some(t) = self.threads.get(tid) else {
            return;
        };
        let queue = queue_view(&t.queue);
        self.broadcast(
            tid,
            Event::QueueUpdated {
                thread_id: tid.to_string(),
                queue,
            },
        );
    }

    /// Emits `SetHeartbeat` when `wants_heartbeat` changed. Called by
    /// `poll_effect` once an input's effects are drained, the one place
    /// the heartbeat follows the engine's state (and at start).
    pub(super) fn update_heartbeat(&mut self) {
        let level = self.wants_heartbeat();
        if level != self.heartbeat {
            self.heartbeat = level;
            self.effects.push_back(Effect::SetHeartbeat { level });
        }
    }

    pub(super) fn thread_streaming(&self, request_id: u64) -> Option<String> {
        self.threads
            .iter()
            .find(|(_, t)| {
                t.exec
                    .as_ref()
                    .is_some_and(|e| e.phase == Phase::Streaming { request_id })
            })
            .map(|(id, _)| id.clone())
    }

    pub(super) fn thread_running_tool(&self, dispatch_id: u64) -> Option<(String, usize)> {
        self.threads
            .iter()
            .find_map(|(id, t)| match t.exec.as_ref().map(|e| &e.phase) {
                Some(Phase::Tool {
                    dispatch_id: d,
                    index,
                }) if *d == dispatch_id => Some((id.clone(), *index)),
                Some(Phase::Batch { running, .. }) => running
                    .iter()
                    .find(|(d, _)| *d == dispatch_id)
                    .map(|(_, index)| (id.clone(), *index)),
                _ => None,
            })
    }

    /// The thread a rename or delete must wait for: one with a save in
    /// flight (a run's checkpoint, a queued turn, a title, a branch switch).
    /// Both write or delete its records as memory holds them, which lags
    /// the store until that save commits; written before it commits, they
    /// would commit after it and undo it (or leave its records behind a
    /// delete). A delete of a thread whose turn runs is refused instead
    /// (`op_thread_delete`), not kept waiting, unless it stopped the turn
    /// (`stopTurn`): then it waits for the turn's end to be saved.
    pub(super) fn thread_to_settle(&self, op: &Op) -> Option<String> {
        let (Op::ThreadRename { thread_id, .. } | Op::ThreadDelete { thread_id, .. }) = op else {
            return None;
        };
        let t = self.threads.get(thread_id)?;
        if let (Op::ThreadDelete { stop_turn, .. }, Some(exec)) = (op, &t.exec) {
            // A stopped run always has its end (or a checkpoint before it)
            // in flight; were it not, the delete is refused, not stranded.
            let stopped = *stop_turn && exec.stopping() && self.thread_saving(thread_id);
            return stopped.then(|| thread_id.clone());
        }
        (t.queue_inflight > 0 || self.thread_saving(thread_id)).then(|| thread_id.clone())
    }

    /// A save of the thread committed or failed: the renames and deletes
    /// that waited for it run now, in order, once none is left in flight
    /// (one of them may start another save; the rest wait for that one).
    pub(super) fn release_settled(&mut self, now: u64, tid: &str) {
        let Some(t) = self.threads.get(tid) else {
            return;
        };
        if t.settle_waiting.is_empty() || t.queue_inflight > 0 || self.thread_saving(tid) {
            return;
        }
        let t = self.threads.get_mut(tid).expect("exists");
        for (conn, op) in std::mem::take(&mut t.settle_waiting) {
            self.handle_op(now, conn, op);
        }
    }

    pub(super) fn thread_needing_load(&self, op: &Op) -> Option<String> {
        let tid = match op {
            // The thread it opens, which must be read first like any other.
            Op::Initialize { thread_id, .. } => self.initialize_target(thread_id.clone()),
            _ => op_thread(op).map(str::to_string),
        }?;
        let t = self.threads.get(&tid)?;
        // A snapshot can be drawn from a tail read earlier.
        let from_tail = matches!(op, Op::Initialize { .. }) && t.partial.is_some();
        (!t.loaded && !from_tail).then_some(tid)
    }

    /// The thread an `initialize` of `thread_id` opens: that one, or, when
    /// none is named or it no longer exists (deleted meanwhile), the most
    /// recent thread.
    pub(super) fn initialize_target(&self, thread_id: Option<String>) -> Option<String> {
        thread_id
            .filter(|id| self.threads.contains_key(id))
            .or_else(|| self.most_recent_thread())
    }

    /// The thread `initialize` without a thread id opens.
    pub(super) fn most_recent_thread(&self) -> Option<String> {
        self.threads
            .values()
            .max_by_key(|t| (t.thread.updated_at, t.thread.id.clone()))
            .map(|t| t.thread.id.clone())
    }

    pub(super) fn thread_summaries(&self) -> Vec<crate::model::ThreadSummary> {
        let mut list: Vec<_> = self
            .threads
            .values()
            .filter(|t| t.thread.revision > 0)
            .map(|t| t.thread.summary())
            .collect();
        crate::sorting::sort_by(&mut list, |a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        list
    }

    pub(super) fn snapshot(&self, tid: Option<&str>) -> Snapshot {
        let limit = self.config.snapshot_nodes.max(1);
        let thread = tid.and_then(|id| self.threads.get(id)).map(|t| {
            let page = match (&t.partial, t.loaded) {
                (Some(p), false) => (nodes_view(&p.nodes), p.older, p.branches.clone()),
                _ => {
                    let start = page_start(&t.path, t.path.len(), limit);
                    (
                        nodes_view(&t.path[start..]),
                        start as u64,
                        t.branch_points(start..t.path.len()),
                    )
                }
            };
            (t, page)
        });
        let thread = thread.map(|(t, (nodes, older_nodes, branches))| ThreadView {
            id: t.thread.id.clone(),
            title: t.thread.title.clone(),
            older_nodes,
            nodes,
            run: t.latest_run.clone().map(|run| match &t.stalled {
                // What the panel was told when the run stopped (not what is
                // stored: the next worker resumes the saved run).
                Some(error) => Run {
                    state: RunState::Failed,
                    stop_reason: Some(StopReason::Error),
                    error: Some(error.clone()),
                    ..run
                },
                None => run,
            }),
            queue: queue_view(&t.queue),
            pending_steers: t
                .steers
                .iter()
                .map(|s| PendingSteerView {
                    id: s.id.clone(),
                    text: s.text.clone(),
                    attachments: s.attachments.iter().map(Attachment::omitted).collect(),
                })
                .collect(),
            pending_approval: t
                .latest_run
                .as_ref()
                .and_then(|r| r.pending_approval.as_ref())
                .and_then(|id| {
                    t.approvals
                        .iter()
                        .find(|a| &a.id == id && a.status == ApprovalStatus::Pending)
                })
                .cloned(),
            pending_interaction: t
                .latest_run
                .as_ref()
                .and_then(|r| {
                    let question = r.pending_interaction.as_ref().and_then(|id| {
                        t.interactions
                            .iter()
                            .find(|q| &q.id == id && q.status == InteractionStatus::Pending)
                    });
                    // Or an MCP server's request for input during the call
                    // running now (not one a restart left behind: recovery
                    // withdraws it).
                    let running = t.exec.as_ref().and_then(|e| match &e.phase {
                        Phase::Tool { index, .. } => Some(e.calls[*index].call_id.as_str()),
                        _ => None,
                    });
                    question.or_else(|| {
                        t.interactions.iter().rev().find(|q| {
                            q.server.is_some()
                                && q.run_id == r.id
                                && q.status == InteractionStatus::Pending
                                && running == Some(q.call_id.as_str())
                        })
                    })
                })
                .cloned(),
            branches,
        });
        Snapshot {
            protocol_version: PROTOCOL_VERSION,
            threads: self.thread_summaries(),
            thread,
        }
    }

    /// Mirror a committed unit into memory (the store is the source of truth).
    pub(super) fn apply_to_memory(&mut self, unit: &UnitOfWork) {
        for record in &unit.puts {
            match record {
                Record::Thread(thread) => {
                    let t = self
                        .threads
                        .entry(thread.id.clone())
                        .or_insert_with(|| ThreadState::new(thread.clone(), true));
                    if t.thread.leaf_id != thread.leaf_id {
                        t.partial = None;
                    }
                    t.thread = thread.clone();
                    // A model title that arrived while this record was in
                    // flight wins; once a record carries it, it is durable.
                    match &t.pending_title {
                        Some(title) if *title == thread.title => t.pending_title = None,
                        Some(title) => t.thread.title = title.clone(),
                        None => {}
                    }
                }
                Record::Node(node) => {
                    if let Some(t) = self.threads.get_mut(&node.thread_id) {
                        if let NodeBody::ToolCall { call_id, .. } = &node.body {
                            t.call_ids.insert(call_id.clone());
                        }
                        t.add_node(node.clone());
                    }
                }
                Record::Run(run) => {
                    if let Some(t) = self.threads.get_mut(&run.thread_id) {
                        if !t.run_ids.contains(&run.id) {
                            t.run_ids.push(run.id.clone());
                        }
                        t.latest_run = Some(run.clone());
                    }
                }
                Record::Steer(steer) => {
                    if let Some(t) = self.threads.get_mut(&steer.thread_id) {
                        t.steers.push(steer.clone());
                        crate::sorting::sort_by_key(&mut t.steers, |s| s.admission_seq);
                    }
                }
                Record::QueueItem(item) => {
                    if let Some(t) = self.threads.get_mut(&item.thread_id) {
                        t.queue.retain(|q| q.id != item.id);
                        t.queue.push(item.clone());
                        crate::sorting::sort_by_key(&mut t.queue, |q| q.position);
                    }
                }
                Record::Receipt(receipt) => {
                    self.receipts.insert(receipt.key.clone(), receipt.clone());
                }
                Record::Approval(approval) => {
                    if let Some(t) = self.threads.get_mut(&approval.thread_id) {
                        t.approvals.retain(|a| a.id != approval.id);
                        t.approvals.push(approval.clone());
                    }
                }
                Record::SiteRule(rule) => {
                    self.site_rules.insert(rule.origin.clone(), rule.clone());
                }
                Record::Interaction(interaction) => {
                    if let Some(t) = self.threads.get_mut(&interaction.thread_id) {
                        t.interactions.retain(|i| i.id != interaction.id);
                        t.interactions.push(interaction.clone());
                    }
                }
                // The run in memory already holds it.
                Record::Environment(_) | Record::Snapshot(_) => {}
            }
        }
        for key in &unit.deletes {
            match key.store {
                stores::THREADS => {
                    // Ops that waited for a paused thread's probe are answered.
                    let waiting = self
                        .threads
                        .remove(&key.key)
                        .map(|t| t.awaiting_probe)
                        .unwrap_or_default();
                    self.refuse_ops(waiting, ErrorKind::NotFound, "This thread was deleted.");
                }
                stores::STEERS => {
                    for t in self.threads.values_mut() {
                        t.steers.retain(|s| s.id != key.key);
                    }
                }
                stores::QUEUE => {
                    for t in self.threads.values_mut() {
                        t.queue.retain(|q| q.id != key.key);
                    }
                }
                stores::SITE_RULES => {
                    self.site_rules.remove(&key.key);
                }
                _ => {}
            }
        }
    }
}

/// The thread an op names, if any (an `initialize` or `turn.submit` without
/// one names none).
pub(super) fn op_thread(op: &Op) -> Option<&str> {
    match op {
        Op::Initialize { thread_id, .. } | Op::TurnSubmit { thread_id, .. } => thread_id.as_deref(),
        Op::ThreadDelete { thread_id, .. }
        | Op::ThreadRename { thread_id, .. }
        | Op::ThreadFork { thread_id, .. }
        | Op::ApprovalResponse { thread_id, .. }
        | Op::InteractionResponse { thread_id, .. }
        | Op::ElicitationResponse { thread_id, .. }
        | Op::RunResolveUncertain { thread_id, .. }
        | Op::TurnInterrupt { thread_id, .. }
        | Op::QueueRemove { thread_id, .. }
        | Op::QueueUpdate { thread_id, .. }
        | Op::ThreadSelectBranch { thread_id, .. }
        | Op::ThreadHistory { thread_id, .. }
        | Op::AttachmentGet { thread_id, .. }
        | Op::TurnSteer { thread_id, .. }
        | Op::TurnEnqueue { thread_id, .. }
        | Op::RunResume { thread_id, .. } => Some(thread_id),
        Op::ThreadCreate { .. }
        | Op::ProviderTest { .. }
        | Op::SiteRulesList { .. }
        | Op::McpServersList { .. }
        | Op::McpServersRefresh { .. }
        | Op::McpServersSignIn { .. }
        | Op::McpServersSignOut { .. }
        | Op::SettingsDefaults { .. }
        | Op::SiteRuleRevoke { .. } => None,
    }
}

/// The most characters of file content one view of a conversation (a
/// snapshot's nodes, a `thread.history` page) carries (4 MiB). A message
/// holds up to 6 MiB of files and a snapshot up to 60 messages: sent whole,
/// a snapshot could outgrow what a Port carries (64 MiB) and what a worker
/// should hold twice (as values and as JSON). The panel shows a file left
/// out by its name and fetches it with `attachment.get` when it is opened
/// or sent again.
pub const VIEW_FILES_BUDGET: usize = 4 * 1024 * 1024;

/// `nodes` as a client is shown them: the files of the newest messages keep
/// their content while it fits in [`VIEW_FILES_BUDGET`]; the others are
/// [`Attachment::omitted`] (never copied whole first). `item.complete`
/// sends a new node whole (one message's files are bounded by
/// `MAX_ATTACHMENTS_CHARS`).
pub(super) fn nodes_view(nodes: &[Node]) -> Vec<Node> {
    let mut left = VIEW_FILES_BUDGET;
    let mut view: Vec<Node> = nodes
        .iter()
        .rev()
        .map(|node| match &node.body {
            NodeBody::UserMessage {
                text,
                steered,
                attachments,
            } if !attachments.is_empty() => Node {
                id: node.id.clone(),
                thread_id: node.thread_id.clone(),
                parent_id: node.parent_id.clone(),
                created_at: node.created_at,
                body: NodeBody::UserMessage {
                    text: text.clone(),
                    steered: *steered,
                    attachments: attachments
                        .iter()
                        .map(|file| match file.size() {
                            size if size <= left => {
                                left -= size;
                                file.clone()
                            }
                            _ => file.omitted(),
                        })
                        .collect(),
                },
            },
            _ => node.clone(),
        })
        .collect();
    view.reverse();
    view
}

/// The queue as a client is shown it: each turn's files by name and size
/// only (the panel lists them by name; `attachment.get` fetches one).
pub(super) fn queue_view(queue: &[QueueItem]) -> Vec<QueueItem> {
    queue
        .iter()
        .map(|item| QueueItem {
            id: item.id.clone(),
            thread_id: item.thread_id.clone(),
            position: item.position,
            text: item.text.clone(),
            attachments: item.attachments.iter().map(Attachment::omitted).collect(),
            created_at: item.created_at,
        })
        .collect()
}

/// Where a page of about `limit` path nodes ending before `end` starts:
/// never between a tool call and its result (a page starts at a node that
/// is neither), so every page renders on its own. When the last `limit`
/// nodes are all calls and results, the page reaches further back instead.
pub(super) fn page_start(path: &[Node], end: usize, limit: usize) -> usize {
    let end = end.min(path.len());
    let earliest = end.saturating_sub(limit);
    if earliest == 0 {
        return 0;
    }
    let safe = |i: &usize| {
        !matches!(
            path[*i].body,
            NodeBody::ToolCall { .. } | NodeBody::ToolResult { .. }
        )
    };
    (earliest..end)
        .find(safe)
        .or_else(|| (0..earliest).rev().find(safe))
        .unwrap_or(0)
}
