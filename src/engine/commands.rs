//! Client ops: validation, downgrades, and the checkpoint each op decides.

use serde_json::{json, Value};

use super::*;
use crate::provider::ChatMessage;

/// Output tokens a connection test may use.
const PROVIDER_TEST_MAX_TOKENS: u32 = 16;

impl Engine {
    // --------------------------------------------------------------- commands

    #[inline(never)]
    pub(super) fn op_initialize(&mut self, now: u64, conn: ConnId, thread_id: Option<String>) {
        let target = self.initialize_target(thread_id);
        self.cache_subscribed(target.as_deref());
        self.show_thread(conn, target);
        self.cache_arm(now);
    }

    /// Subscribe `conn` to `target` (None: no thread) and send it the
    /// snapshot: an `initialize`'s answer, and a new thread's or fork's to
    /// the client that made it (`Follow::ThreadCreated`).
    pub(super) fn show_thread(&mut self, conn: ConnId, target: Option<String>) {
        let snapshot = self.snapshot(target.as_deref());
        if let Some(c) = self.conns.get_mut(&conn) {
            c.subscribed = target;
        }
        self.send(
            conn,
            Event::Initialized {
                snapshot: Box::new(snapshot),
            },
        );
    }

    #[inline(never)]
    pub(super) fn op_thread_create(&mut self, now: u64, reply: Reply) {
        let thread = Thread {
            id: self.ids.next_id("t"),
            title: String::new(),
            leaf_id: None,
            created_at: now,
            updated_at: now,
            revision: 1,
            parent_thread_id: None,
            usage: Usage::default(),
            path_len: None,
        };
        let result = json!({ "threadId": thread.id });
        let mut unit = UnitOfWork::new();
        unit.put(Record::Thread(thread.clone()));
        self.command(now, &thread.id, unit, reply, result, Follow::ThreadCreated);
    }

    /// A new thread holding copies of the path up to `node_id`.
    #[inline(never)]
    pub(super) fn op_thread_fork(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        node_id: Option<String>,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        if let Some(why) = held_reason(t, "forking") {
            return self.reject(&reply, ErrorKind::InvalidCommand, &why);
        }
        let end = match &node_id {
            None => t.path.len(),
            Some(id) => match t.path.iter().position(|n| &n.id == id) {
                Some(i) => i + 1,
                None => {
                    return self.reject(
                        &reply,
                        ErrorKind::NotFound,
                        "That message is not in this conversation.",
                    )
                }
            },
        };
        let prefix: Vec<Node> = t.path[..end].to_vec();
        // The fork must not start with a tool call waiting for its result.
        let mut open: Vec<&str> = Vec::new();
        for node in &prefix {
            match &node.body {
                NodeBody::ToolCall { call_id, .. } => open.push(call_id),
                NodeBody::ToolResult { call_id, .. } => open.retain(|c| c != call_id),
                _ => {}
            }
        }
        if !open.is_empty() {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "Fork at a message where every tool call already has its result.",
            );
        }
        let fork_id = self.ids.next_id("t");
        let mut unit = UnitOfWork::new();
        let mut parent: Option<String> = None;
        // A copied tool call belongs to the copy of its assistant message:
        // the provider view groups calls under it, and a call left pointing
        // into the source thread would leave its result without a call.
        let mut copied: HashMap<String, String> = HashMap::new();
        for node in prefix {
            let mut copy = node;
            let id = self.ids.next_id("n");
            copied.insert(std::mem::replace(&mut copy.id, id), copy.id.clone());
            if let NodeBody::ToolCall { assistant_id, .. } = &mut copy.body {
                if let Some(id) = copied.get(assistant_id.as_str()) {
                    *assistant_id = id.clone();
                }
            }
            copy.thread_id = fork_id.clone();
            copy.parent_id = parent.clone();
            parent = Some(copy.id.clone());
            unit.put(Record::Node(copy));
        }
        let source = &self.threads[thread_id].thread;
        let title = if source.title.is_empty() {
            String::new()
        } else {
            format!("{} (fork)", source.title)
        };
        let thread = Thread {
            id: fork_id.clone(),
            title,
            leaf_id: parent,
            created_at: now,
            updated_at: now,
            revision: 1,
            parent_thread_id: Some(thread_id.to_string()),
            usage: Usage::default(),
            path_len: None,
        };
        unit.puts.insert(0, Record::Thread(thread));
        let result = json!({ "threadId": fork_id });
        self.command(now, &fork_id, unit, reply, result, Follow::ThreadCreated);
    }

    /// Make the branch holding `node_id` the active path.
    #[inline(never)]
    pub(super) fn op_select_branch(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        node_id: &str,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        if let Some(why) = busy_reason(t, "switching branches") {
            return self.reject(&reply, ErrorKind::InvalidCommand, &why);
        }
        if !t.all_nodes().any(|n| n.id == node_id) {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "That message is not in this thread.",
            );
        }
        let leaf = t.branch_tip(node_id);
        let mut thread = t.thread.clone();
        let result = json!({ "threadId": thread_id, "leafId": leaf });
        let mut unit = UnitOfWork::new();
        if thread.leaf_id.as_deref() != Some(leaf.as_str()) {
            thread.leaf_id = Some(leaf);
            thread.revision += 1;
            thread.updated_at = now;
            unit.put(Record::Thread(thread));
        }
        // Without a change the unit still carries the receipt: a duplicate replays it.
        self.command(now, thread_id, unit, reply, result, Follow::AckOnly);
    }

    /// "Edit and resend": a new turn in place of the one `replaces` started,
    /// as a sibling branch; the old branch stays in the thread.
    #[inline(never)]
    pub(super) fn op_submit_branch(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: Option<String>,
        replaces: &str,
        input: UserInput,
    ) {
        let Some(tid) = thread_id else {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "Editing a message needs the thread it is in.",
            );
        };
        let Some(t) = self.threads.get(&tid) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        if let Some(why) = busy_reason(t, "editing a message") {
            return self.reject(&reply, ErrorKind::InvalidCommand, &why);
        }
        let Some(index) = t.path.iter().position(|n| n.id == replaces) else {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "That message is not in the active conversation.",
            );
        };
        // Only a turn's opening message can be replaced; its turn_context
        // goes with it (anything before, like a model-switch notice, stays shared).
        let opens_turn = matches!(
            t.path[index].body,
            NodeBody::UserMessage { steered: false, .. }
        ) && index > 0
            && matches!(t.path[index - 1].body, NodeBody::TurnContext { .. });
        if !opens_turn {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "Only a message that started a turn can be edited.",
            );
        }
        let start = index - 1;
        let parent = t.path[start].parent_id.clone();
        self.start_turn_at(now, &tid, input, Some(reply), None, Some(parent));
    }

    #[inline(never)]
    pub(super) fn op_thread_delete(&mut self, now: u64, reply: Reply, thread_id: &str) {
        if !self.threads.contains_key(thread_id) {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        }
        // Saves of the thread in flight were waited for (`thread_to_settle`).
        let t = &self.threads[thread_id];
        if t.exec.is_some() {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "This thread has a running turn; stop it before deleting the thread \
                 (or send the delete with stopTurn).",
            );
        }
        let mut unit = UnitOfWork::new();
        unit.delete(stores::THREADS, thread_id);
        for node in t.all_nodes() {
            unit.delete(stores::NODES, node.id.clone());
        }
        for run_id in &t.run_ids {
            unit.delete(stores::RUNS, run_id.clone());
            unit.delete(stores::ENVIRONMENTS, run_id.clone());
        }
        for steer in &t.steers {
            unit.delete(stores::STEERS, steer.id.clone());
        }
        for item in &t.queue {
            unit.delete(stores::QUEUE, item.id.clone());
        }
        for approval in &t.approvals {
            unit.delete(stores::APPROVALS, approval.id.clone());
        }
        for interaction in &t.interactions {
            unit.delete(stores::INTERACTIONS, interaction.id.clone());
        }
        for (store, key) in &t.pruned {
            unit.delete(store, key.clone());
        }
        let result = json!({ "threadId": thread_id });
        self.command(now, thread_id, unit, reply, result, Follow::ThreadDeleted);
        if let Some(t) = self.threads.get_mut(thread_id) {
            t.deleting = true;
        }
    }

    /// The user's title for a thread, written with the thread's record as
    /// memory holds it. So only while nothing else of the thread is being
    /// saved (the op waits for that, `thread_to_settle`): a checkpoint in
    /// flight writes the record with the conversation's new end, and this
    /// one, committed after it, would move the end back. A running turn
    /// does not stop it: its later checkpoints are built from memory and
    /// carry the title. Set in memory at once, as a model title is
    /// (`pending_title`), so a model title that was asked for before cannot
    /// replace it (`on_title`).
    #[inline(never)]
    pub(super) fn op_thread_rename(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        title: &str,
    ) {
        let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
        if title.is_empty() {
            return self.reject(&reply, ErrorKind::InvalidCommand, "The title is empty.");
        }
        if title.chars().count() > MAX_TITLE_CHARS {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "A title has at most 80 characters.",
            );
        }
        if !self.threads.contains_key(thread_id) {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        }
        // Saves of the thread in flight were waited for
        // (`thread_to_settle`); a running turn's next checkpoints carry the
        // title too, as they are built from memory.
        let t = self.threads.get_mut(thread_id).expect("checked");
        let previous = std::mem::replace(&mut t.thread.title, title.clone());
        t.pending_title = Some(title.clone());
        let mut thread = t.thread.clone();
        thread.revision += 1;
        let mut unit = UnitOfWork::new();
        unit.put(Record::Thread(thread));
        let result = json!({ "threadId": thread_id, "title": title });
        self.command(
            now,
            thread_id,
            unit,
            reply,
            result,
            Follow::ThreadRenamed { previous },
        );
    }

    /// A rename whose save failed (refused to the client): the title goes
    /// back unless something replaced it since. A checkpoint of a running
    /// turn issued while the rename was in flight was built from memory and
    /// carries the refused title; the old one is then kept pending, so that
    /// checkpoint's commit cannot bring the refused title back into memory
    /// and the next record of the thread writes the old one again.
    pub(super) fn rename_unsaved(&mut self, thread_id: &str, previous: String) {
        let Some(t) = self.threads.get(thread_id) else {
            return;
        };
        if t.pending_title.as_deref() != Some(t.thread.title.as_str()) {
            return;
        }
        let refused = t.thread.title.clone();
        let carried = self.thread_saving_where(thread_id, |unit| {
            unit.puts
                .iter()
                .any(|r| matches!(r, Record::Thread(thread) if thread.title == refused))
        });
        let t = self.threads.get_mut(thread_id).expect("exists");
        t.thread.title = previous.clone();
        t.pending_title = carried.then_some(previous);
    }

    #[inline(never)]
    pub(super) fn op_submit(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: Option<String>,
        input: UserInput,
    ) {
        match thread_id {
            Some(tid) => {
                let Some(t) = self.threads.get(&tid) else {
                    return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
                };
                if t.exec.is_some() {
                    self.op_enqueue(now, reply, &tid, input, false);
                } else {
                    self.start_turn(now, &tid, input, Some(reply), None);
                }
            }
            None => {
                let thread = Thread {
                    id: self.ids.next_id("t"),
                    title: String::new(),
                    leaf_id: None,
                    created_at: now,
                    updated_at: now,
                    revision: 0,
                    parent_thread_id: None,
                    usage: Usage::default(),
                    path_len: None,
                };
                let tid = thread.id.clone();
                // The thread exists in memory only until the first checkpoint commits
                // (the checkpoint writes it); a failure removes it again.
                self.threads
                    .insert(tid.clone(), ThreadState::new(thread, true));
                if let Some(c) = self.conns.get_mut(&reply.conn) {
                    c.subscribed = Some(tid.clone());
                }
                self.start_turn(now, &tid, input, Some(reply), None);
            }
        }
    }

    #[inline(never)]
    pub(super) fn op_steer(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        expected_turn_id: &str,
        input: UserInput,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let running = t.latest_run.as_ref().filter(|_| t.exec.is_some());
        let steerable = t
            .exec
            .as_ref()
            .is_some_and(|e| e.admission_open && !e.stopping() && e.finish.is_none());
        match running {
            Some(run) if run.id != expected_turn_id => {
                let message = format!(
                    "Turn {expected_turn_id} is not the running turn (running: {}).",
                    run.id
                );
                self.reject(&reply, ErrorKind::InvalidCommand, &message)
            }
            Some(run) if steerable => {
                let steer = PendingSteer {
                    id: self.ids.next_id("s"),
                    thread_id: thread_id.to_string(),
                    run_id: run.id.clone(),
                    admission_seq: self.next_steer_seq,
                    text: input.text,
                    attachments: input.attachments,
                    created_at: now,
                };
                self.next_steer_seq += 1;
                let seq = steer.admission_seq;
                let steer_id = steer.id.clone();
                let mut unit = UnitOfWork::new();
                unit.put(Record::Steer(steer));
                let result = json!({ "steerId": steer_id });
                self.threads
                    .get_mut(thread_id)
                    .expect("exists")
                    .admitting
                    .push(seq);
                self.persist_command(
                    now,
                    thread_id,
                    unit,
                    Then::SteerAdmitted { seq },
                    reply,
                    result,
                );
            }
            // No steerable turn (none running, or it is ending): queue it instead.
            _ => self.op_enqueue(now, reply, thread_id, input, true),
        }
    }

    #[inline(never)]
    pub(super) fn op_enqueue(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        input: UserInput,
        downgraded: bool,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        if t.queue.len() + t.queue_inflight >= MAX_QUEUE {
            return self.reject(
                &reply,
                ErrorKind::QueueFull,
                &format!("The queue already holds {MAX_QUEUE} turns; remove one first."),
            );
        }
        let item = QueueItem {
            id: self.ids.next_id("q"),
            thread_id: thread_id.to_string(),
            position: self.next_queue_position,
            text: input.text,
            attachments: input.attachments,
            created_at: now,
        };
        self.next_queue_position += 1;
        let mut result = json!({ "queueItemId": item.id, "queued": true, "threadId": thread_id });
        if downgraded {
            result["downgraded"] = json!(true);
        }
        let mut unit = UnitOfWork::new();
        unit.put(Record::QueueItem(item));
        self.threads
            .get_mut(thread_id)
            .expect("exists")
            .queue_inflight += 1;
        self.command(now, thread_id, unit, reply, result, Follow::StartQueued);
    }

    #[inline(never)]
    pub(super) fn op_queue_remove(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        item_id: &str,
    ) {
        if let Err((kind, why)) = self.queue_item_editable(thread_id, item_id) {
            return self.reject(&reply, kind, why);
        }
        let mut unit = UnitOfWork::new();
        unit.delete(stores::QUEUE, item_id);
        let result = json!({ "itemId": item_id });
        self.command(now, thread_id, unit, reply, result, Follow::QueueUpdated);
    }

    #[inline(never)]
    pub(super) fn op_queue_update(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        item_id: &str,
        input: UserInput,
    ) {
        if let Err((kind, why)) = self.queue_item_editable(thread_id, item_id) {
            return self.reject(&reply, kind, why);
        }
        let mut item = self.threads[thread_id]
            .queue
            .iter()
            .find(|q| q.id == item_id)
            .cloned()
            .expect("checked");
        item.text = input.text;
        item.attachments = input.attachments;
        let mut unit = UnitOfWork::new();
        unit.put(Record::QueueItem(item));
        let result = json!({ "itemId": item_id });
        self.command(now, thread_id, unit, reply, result, Follow::QueueUpdated);
    }

    /// A page of the active path before a node (reads only, no receipt).
    #[inline(never)]
    pub(super) fn op_thread_history(
        &mut self,
        reply: Reply,
        thread_id: &str,
        before: &str,
        limit: Option<u32>,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(end) = t.path.iter().position(|n| n.id == before) else {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "That message is no longer in the active conversation; reload the thread.",
            );
        };
        let max = self.config.snapshot_nodes.max(1);
        let limit = limit.map_or(max, |l| (l as usize).clamp(1, max));
        let start = super::support::page_start(&t.path, end, limit);
        // The page's version switchers travel with it (a snapshot carries
        // only those of the nodes it shows).
        let result = json!({
            "threadId": thread_id,
            "nodes": super::support::nodes_view(&t.path[start..end]),
            "olderNodes": start,
            "branches": t.branch_points(start..end),
        });
        self.ack(&reply, result);
    }

    /// One file a view left out (reads only): from a message on the active
    /// path, a queued turn or a pending steer.
    #[inline(never)]
    pub(super) fn op_attachment_get(
        &mut self,
        reply: Reply,
        thread_id: &str,
        owner_id: &str,
        index: u32,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let files = t
            .path
            .iter()
            .find_map(|n| match &n.body {
                NodeBody::UserMessage { attachments, .. } if n.id == owner_id => Some(attachments),
                _ => None,
            })
            .or_else(|| {
                t.queue
                    .iter()
                    .find(|q| q.id == owner_id)
                    .map(|q| &q.attachments)
            })
            .or_else(|| {
                t.steers
                    .iter()
                    .find(|s| s.id == owner_id)
                    .map(|s| &s.attachments)
            });
        let Some(files) = files else {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "That message is no longer in the conversation or the queue; reload the thread.",
            );
        };
        let Some(file) = files.get(index as usize) else {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                &format!(
                    "That message has {} attached files; there is no file {index}.",
                    files.len()
                ),
            );
        };
        let result = json!({ "ownerId": owner_id, "index": index, "attachment": file });
        self.ack(&reply, result);
    }

    /// The embedding extension's checked settings defaults (reads only).
    #[inline(never)]
    pub(super) fn op_settings_defaults(&mut self, reply: Reply) {
        let defaults = Value::Object(self.config.settings_defaults.clone());
        self.ack(&reply, json!({ "defaults": defaults }));
    }

    /// "Test connection": one tiny request with the given settings.
    #[inline(never)]
    pub(super) fn op_provider_test(&mut self, now: u64, reply: Reply, profile: ProviderProfile) {
        if !profile.is_configured() {
            return self.reject(
                &reply,
                ErrorKind::NotConfigured,
                "Set the base URL and the model first.",
            );
        }
        if !matches!(profile.kind.as_str(), "openai" | "anthropic") {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "The provider must be \"openai\" (OpenAI-compatible) or \"anthropic\".",
            );
        }
        let model = profile.model.clone();
        let mut profile = profile;
        profile.max_output_tokens = Some(PROVIDER_TEST_MAX_TOKENS);
        profile.token_budget = None;
        let request = ProviderRequest {
            lineage: None,
            profile,
            system: PROVIDER_TEST_PROMPT.into(),
            messages: vec![ChatMessage::user("ping")].into(),
            tools: Default::default(),
        };
        let request_id = self.next_handle();
        self.test_requests.insert(request_id, (reply, model, now));
        self.effects.push_back(Effect::CallProvider {
            request_id,
            request: request.into(),
            idle_timeout_ms: self.config.stream_idle_timeout_ms,
        });
    }

    pub(super) fn on_provider_test(
        &mut self,
        now: u64,
        reply: Reply,
        model: String,
        started: u64,
        result: Result<ProviderResponse, ProviderError>,
    ) {
        match result {
            Ok(response) => {
                let text: String = response.text.trim().chars().take(200).collect();
                let result = json!({
                    "ok": true,
                    "model": model,
                    "reply": text,
                    "latencyMs": now.saturating_sub(started),
                });
                self.ack(&reply, result);
            }
            Err(error) => self.reject_with(&reply, error.info()),
        }
    }

    /// A queued turn that exists and is not being started right now.
    fn queue_item_editable(
        &self,
        thread_id: &str,
        item_id: &str,
    ) -> Result<(), (ErrorKind, &'static str)> {
        let Some(t) = self.threads.get(thread_id) else {
            return Err((ErrorKind::NotFound, "No such thread."));
        };
        if !t.queue.iter().any(|q| q.id == item_id) {
            return Err((ErrorKind::NotFound, "That queued turn no longer exists."));
        }
        let starting = self.thread_saving_where(thread_id, |unit| {
            unit.deletes
                .iter()
                .any(|d| d.store == stores::QUEUE && d.key == item_id)
        });
        if starting {
            return Err((
                ErrorKind::InvalidCommand,
                "That queued turn is starting now; it can no longer be changed.",
            ));
        }
        Ok(())
    }

    #[inline(never)]
    pub(super) fn op_interrupt(&mut self, now: u64, reply: Reply, thread_id: &str) {
        let Some(t) = self.threads.get_mut(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(exec) = t.exec.as_mut() else {
            // Always allowed: nothing runs, so there is nothing to stop. Its
            // receipt is kept all the same: sent again later, while a turn
            // runs, it must replay this answer, not stop that turn.
            let result = json!({ "turnId": Value::Null });
            return self.ack_with_receipt(now, thread_id, reply, result);
        };
        // receipt_replay_or_reject: its id is taken from now on (the same
        // interrupt again waits for this one's answer; another command
        // under that id is refused), though its receipt is written with
        // the run's last checkpoint.
        self.inflight_receipts.insert(
            receipt_key(&reply.submission),
            (reply.fingerprint.clone(), Vec::new()),
        );
        exec.interrupts.push(reply);
        self.stop_run(now, thread_id);
    }

    /// A `thread.delete` with `stopTurn` found the thread's turn running:
    /// the turn is stopped as by an interrupt that nobody waits for, and
    /// the delete waits for its end to be saved (`thread_to_settle`).
    pub(super) fn stop_run_for_delete(&mut self, now: u64, thread_id: &str) {
        if let Some(exec) = self
            .threads
            .get_mut(thread_id)
            .and_then(|t| t.exec.as_mut())
        {
            exec.stop_requested = true;
            self.stop_run(now, thread_id);
        }
    }

    /// End the thread's running turn as `interrupted`, now or, while a
    /// checkpoint is in flight, once it commits (`take_pending_finish`).
    fn stop_run(&mut self, now: u64, thread_id: &str) {
        let Some(exec) = self
            .threads
            .get_mut(thread_id)
            .and_then(|t| t.exec.as_mut())
        else {
            return;
        };
        let phase = exec.phase.clone();
        let finish = Finish {
            state: RunState::Interrupted,
            stop: StopReason::Interrupted,
            error: None,
        };
        match phase {
            Phase::Persisting(_) => {
                // Decided now, written after the in-flight checkpoint commits.
                if exec.finish.is_none() {
                    exec.finish = Some(finish);
                }
            }
            Phase::Finishing { .. } => {}
            Phase::Streaming { request_id } | Phase::Compacting { request_id } => {
                self.effects.push_back(Effect::AbortProvider { request_id });
                self.finish_run(now, thread_id, finish);
            }
            Phase::Batch { running, .. } => {
                for (dispatch_id, _) in running {
                    self.effects.push_back(Effect::AbortTool { dispatch_id });
                }
                self.finish_run(now, thread_id, finish);
            }
            Phase::Tool { dispatch_id, .. } => {
                self.effects.push_back(Effect::AbortTool { dispatch_id });
                self.finish_run(now, thread_id, finish);
            }
            Phase::AwaitingSteers { .. }
            | Phase::Closing
            | Phase::Uncertain { .. }
            | Phase::Resolving { .. }
            | Phase::WaitingApproval { .. }
            | Phase::WaitingInteraction { .. }
            | Phase::Backoff { .. } => self.finish_run(now, thread_id, finish),
        }
    }

    #[inline(never)]
    pub(super) fn op_resume(&mut self, now: u64, reply: Reply, thread_id: &str, input: UserInput) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        if t.exec.is_some() {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "A turn is already running in this thread.",
            );
        }
        self.start_turn(now, thread_id, input, Some(reply), None);
    }

    #[inline(never)]
    pub(super) fn op_resolve(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        choice: UncertainChoice,
    ) {
        let Some(t) = self.threads.get_mut(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(Phase::Uncertain { index }) = t.exec.as_ref().map(|e| e.phase.clone()) else {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "No action is waiting for a decision.",
            );
        };
        let turn_id = t.latest_run.as_ref().map(|r| r.id.clone());
        let decided = Some((reply, json!({ "turnId": turn_id, "choice": choice })));
        match choice {
            // The decision is recorded first; the call then goes through the
            // gatekeeper again (its page is resolved anew) before it runs.
            UncertainChoice::Retry => {
                let mut run = self.threads[thread_id].latest_run.clone().expect("active run");
                run.state = RunState::ExecutingTools;
                run.revision += 1;
                run.updated_at = now;
                let mut unit = UnitOfWork::new();
                unit.put(Record::Run(run));
                let token = self.persist_with(now, thread_id, unit, Then::RetryDecided { index }, decided);
                self.set_phase(thread_id, Phase::Persisting(token));
            }
            UncertainChoice::MarkDone => self.persist_tool_result_for(
                now,
                thread_id,
                index,
                ToolStatus::Ok,
                "The worker restarted while this action ran; the user confirmed that it completed.".into(),
                None,
                decided,
            ),
            UncertainChoice::Fail => self.persist_tool_result_for(
                now,
                thread_id,
                index,
                ToolStatus::Error,
                "The worker restarted while this action ran and its outcome is unknown; the user marked it as failed. Check the page before trying again.".into(),
                None,
                decided,
            ),
        }
    }
}

/// Why a thread cannot change shape now: it waits for the user's answer.
fn held_reason(t: &ThreadState, doing: &str) -> Option<String> {
    let held = t.exec.as_ref().is_some_and(|e| {
        matches!(
            e.phase,
            Phase::WaitingApproval { .. } | Phase::WaitingInteraction { .. }
        )
    });
    held.then(|| {
        format!(
            "This thread waits for your answer to a question; answer it (or stop the turn) before {doing}."
        )
    })
}

/// Why the active path cannot move now: a turn holds it.
fn busy_reason(t: &ThreadState, doing: &str) -> Option<String> {
    if let Some(why) = held_reason(t, doing) {
        return Some(why);
    }
    let uncertain = t
        .exec
        .as_ref()
        .is_some_and(|e| matches!(e.phase, Phase::Uncertain { .. }));
    if uncertain {
        return Some(format!(
            "An action on this thread has an unknown outcome; choose Retry, Mark done or Fail before {doing}."
        ));
    }
    t.exec
        .is_some()
        .then(|| format!("A turn is running on this thread; stop it (Esc) before {doing}."))
}
