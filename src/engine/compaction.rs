//! Context window management: compaction checkpoints and overflow repair.
//!
//! Before a request, its size is estimated (`estimate_tokens`, a tokenizer-free
//! heuristic measured against real tokenizers, scaled by what the provider
//! reported for the previous request of the run). Above
//! [`compaction_threshold`] (80% of the model's window, less when the room
//! for the answer needs more), or when the provider reports a context
//! overflow, the model first writes a summary of what it has already
//! answered: everything before its latest message. That message, its tool
//! calls, their results and the user's messages after it (steers, a new
//! turn's message) are not summarized: the model has not seen them answered
//! yet. A compaction node is appended to the path with the summary, what the
//! engine copies verbatim (the user's messages of the task in progress that
//! the summary stands for) and how many nodes before it it keeps; the
//! outbound view starts there: the summary (with the task's files sent
//! again), then the kept nodes as they are. The stored history is never
//! deleted.
//!
//! Progress: a compaction needs a model response after the previous
//! checkpoint and at least [`MIN_SUMMARIZED_TOKENS`] (estimated) to
//! summarize that the previous checkpoint did not already stand for;
//! otherwise the request is sent as it is, and a provider that reports an
//! overflow then ends the run with `ContextOverflow`: a tail too large
//! alone stops the run, it never loops.

use super::context::{estimate_messages, estimate_text_tokens, kept_tail_start};
use super::*;
use crate::model::Attachment;
use crate::provider::ChatMessage;

/// Tool results are cut to this many characters inside a compaction request.
const SUMMARY_RESULT_CHARS: usize = 2_000;

/// The verbatim section of a checkpoint holds at most this many estimated
/// tokens of message text, and at most an eighth of the model's window.
pub const VERBATIM_MAX_TOKENS: u64 = 2_000;

/// The first line of a checkpoint's verbatim section.
pub const VERBATIM_HEADER: &str =
    "[Copied verbatim by the engine when this summary was written, not summarized]";

/// A compaction summarizes at least this many estimated tokens that the
/// previous checkpoint did not already stand for (the files of the user's
/// messages not counted: they are sent again). A summary and the verbatim
/// section take a few hundred tokens themselves: less would free no room.
pub const MIN_SUMMARIZED_TOKENS: u64 = 1_000;

/// The first line of a compaction request's transcript.
const TRANSCRIPT_HEADER: &str = "The conversation to summarize, oldest first (tool calls and \
their results written as text, long results cut):";

/// The last line of a compaction request.
const WRITE_NOW: &str = "Write the summary now, following the instructions.";

/// The estimate above which a request is compacted before it is sent: 80%
/// of the window, or less so that the answer keeps its room (the profile's
/// `max_output_tokens`, Anthropic's default of 4,096 when unset, at most
/// half the window: a window too small for the whole reserve still gets
/// compacted at its half, not before every request).
pub fn compaction_threshold(window: u64, max_output_tokens: Option<u32>) -> u64 {
    let reserve =
        u64::from(max_output_tokens.unwrap_or(crate::provider::anthropic::DEFAULT_MAX_TOKENS))
            .min(window / 2);
    (window.saturating_mul(COMPACT_AT_PERCENT) / 100).min(window - reserve)
}

/// Where a compaction cuts a request built from the thread's view.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// Index in the request's messages of the model's latest message: the
    /// messages before it are summarized, it and the rest are kept.
    message: usize,
    /// Index in the path of that message's node: the checkpoint keeps the
    /// nodes from here to its own place.
    node: usize,
}

/// A compaction whose summary is being written (or waits for a retry).
#[derive(Debug)]
pub(super) struct PendingCompaction {
    /// The summary request, sent again after a transient failure.
    request: Rc<ProviderRequest>,
    /// Index in the path of the first node the checkpoint keeps.
    kept_from: usize,
}

impl Engine {
    /// Where a compaction of `request` would cut it, if one can make
    /// progress: the model answered since the latest checkpoint (its
    /// latest message is after it), this step has not compacted twice, and
    /// what would be summarized that the latest checkpoint does not already
    /// stand for is at least [`MIN_SUMMARIZED_TOKENS`].
    fn compaction_cut(&self, tid: &str, request: &ProviderRequest) -> Option<Cut> {
        let t = &self.threads[tid];
        if t.exec.as_ref().map_or(0, |e| e.compactions) >= 2 {
            return None;
        }
        let cut = cut_point(&t.path, request)?;
        let checkpoint = t.path[..cut.node]
            .iter()
            .rposition(|n| matches!(n.body, NodeBody::Compaction { .. }));
        // The view leads with the latest checkpoint's message: summarized
        // again, but nothing new.
        let new = request
            .messages
            .get(usize::from(checkpoint.is_some())..cut.message)
            .unwrap_or_default();
        (estimate_messages(new) >= MIN_SUMMARIZED_TOKENS).then_some(cut)
    }

    /// Whether the step's request (the one just sent) can be compacted
    /// (`compaction_cut`): the overflow repair asks this.
    pub(super) fn can_compact(&self, tid: &str) -> bool {
        let request = self.threads[tid]
            .exec
            .as_ref()
            .and_then(|e| e.request.clone());
        request.is_some_and(|r| self.compaction_cut(tid, &r).is_some())
    }

    /// Whether `request` (of `estimate` tokens before calibration) should be
    /// compacted before it is sent: above [`compaction_threshold`], and a
    /// compaction can make progress. Otherwise it is sent as it is.
    pub(super) fn needs_compaction(
        &self,
        tid: &str,
        request: &ProviderRequest,
        estimate: u64,
    ) -> bool {
        let Some(window) = request.profile.context_window else {
            return false;
        };
        let calibration = self.threads[tid]
            .exec
            .as_ref()
            .map_or(1.0, |e| e.calibration);
        let estimate = (estimate as f64 * calibration) as u64;
        estimate > compaction_threshold(window, request.profile.max_output_tokens)
            && self.compaction_cut(tid, request).is_some()
    }

    /// Ask the model for a summary of what `base` (the request that is too
    /// large) holds before the model's latest message. The callers checked
    /// that a compaction can make progress (`needs_compaction`,
    /// `can_compact`).
    pub(super) fn start_compaction(&mut self, tid: &str, base: ProviderRequest) {
        let t = &self.threads[tid];
        // Unreachable after the callers' check; should it happen, the whole
        // request is summarized (what checkpoints did before they kept a tail).
        let cut = cut_point(&t.path, &base).unwrap_or(Cut {
            message: base.messages.len(),
            node: t.path.len(),
        });
        // An estimate the provider showed to be low shrinks the budget.
        let calibration = t.exec.as_ref().map_or(1.0, |e| e.calibration);
        let request = summary_request(&base, cut.message, calibration);
        let exec = self
            .threads
            .get_mut(tid)
            .and_then(|t| t.exec.as_mut())
            .expect("active run");
        exec.compaction = Some(PendingCompaction {
            request: Rc::new(request),
            kept_from: cut.node,
        });
        // Its own attempts (`schedule_retry`); no delta of it reaches a client.
        exec.attempt = 0;
        exec.delta_seen = false;
        self.send_compaction(tid);
    }

    /// Send (or send again, after a backoff) the pending compaction's
    /// summary request. Whether there was one.
    pub(super) fn send_compaction(&mut self, tid: &str) -> bool {
        let request_id = self.next_handle();
        let idle_timeout_ms = self.config.stream_idle_timeout_ms;
        let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) else {
            return false;
        };
        let Some(pending) = exec.compaction.as_ref() else {
            return false;
        };
        let request = pending.request.clone();
        exec.phase = Phase::Compacting { request_id };
        self.effects.push_back(Effect::CallProvider {
            request_id,
            request,
            idle_timeout_ms,
        });
        true
    }

    pub(super) fn thread_compacting(&self, request_id: u64) -> Option<String> {
        self.threads
            .iter()
            .find(|(_, t)| {
                t.exec
                    .as_ref()
                    .is_some_and(|e| e.phase == Phase::Compacting { request_id })
            })
            .map(|(id, _)| id.clone())
    }

    /// The summary arrived: write the checkpoint (its usage counts like any
    /// other). A transient failure is retried like a step's request (same
    /// policy, `run.retry` events); a final one ends the run with its own
    /// kind and message.
    pub(super) fn on_compaction_done(
        &mut self,
        now: u64,
        tid: &str,
        result: Result<ProviderResponse, ProviderError>,
    ) {
        let response = match result {
            Ok(r) if !r.text.trim().is_empty() => r,
            Ok(_) => {
                return self.fail_compaction(
                    now,
                    tid,
                    ErrorInfo::new(
                        ErrorKind::ContextOverflow,
                        "The conversation is too long and could not be compacted: \
the model returned an empty summary.",
                    ),
                );
            }
            Err(e) if self.schedule_retry(now, tid, &e) => return,
            Err(e) => {
                let error = ErrorInfo::new(
                    e.kind,
                    format!(
                        "{} (while summarizing the conversation to fit the context window)",
                        e.message
                    ),
                );
                return self.fail_compaction(now, tid, error);
            }
        };
        let t = &self.threads[tid];
        let kept_from = t
            .exec
            .as_ref()
            .and_then(|e| e.compaction.as_ref())
            .map_or(t.path.len(), |p| p.kept_from.min(t.path.len()));
        let kept_nodes = (t.path.len() - kept_from) as u64;
        let compacted = summarized_nodes(&t.path, kept_from) as u64;
        let usage = response.usage.unwrap_or_default();
        let budget = t
            .latest_run
            .as_ref()
            .and_then(|r| r.profile.context_window)
            .map_or(VERBATIM_MAX_TOKENS, |w| (w / 8).min(VERBATIM_MAX_TOKENS));
        let verbatim = verbatim_section(&t.path, kept_nodes, budget);
        let node = Node {
            id: self.ids.next_id("n"),
            thread_id: tid.to_string(),
            parent_id: t.leaf_id(),
            created_at: now,
            body: NodeBody::Compaction {
                summary: response.text,
                compacted_nodes: compacted,
                verbatim,
                kept_nodes,
            },
        };
        let mut thread = t.thread.clone();
        thread.leaf_id = Some(node.id.clone());
        thread.updated_at = now;
        thread.revision += 1;
        thread.usage.add(&usage);
        let mut run = t.latest_run.clone().expect("active run");
        run.usage.add(&usage);
        run.revision += 1;
        run.updated_at = now;
        let mut unit = UnitOfWork::new();
        unit.put(Record::Node(node))
            .put(Record::Thread(thread))
            .put(Record::Run(run));
        let token = self.persist(tid, unit, Then::Compacted);
        let exec = self
            .threads
            .get_mut(tid)
            .and_then(|t| t.exec.as_mut())
            .expect("active run");
        exec.compaction = None;
        exec.compactions += 1;
        exec.phase = Phase::Persisting(token);
    }

    fn fail_compaction(&mut self, now: u64, tid: &str, error: ErrorInfo) {
        if let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) {
            exec.compaction = None;
        }
        self.finish_run(
            now,
            tid,
            Finish {
                state: RunState::Failed,
                stop: StopReason::Error,
                error: Some(error),
            },
        );
    }

    /// Record how far the estimate was from what the provider reported.
    pub(super) fn calibrate(&mut self, tid: &str, reported_input: u64) {
        let Some(exec) = self.threads.get_mut(tid).and_then(|t| t.exec.as_mut()) else {
            return;
        };
        if exec.estimate > 0 && reported_input > 0 {
            exec.calibration = (reported_input as f64 / exec.estimate as f64).clamp(0.25, 4.0);
        }
    }
}

/// Where a compaction would cut `request` (built from `path`'s view): at the
/// model's latest message, if it comes after the latest checkpoint (else
/// the model has not answered since, and there is nothing new to summarize).
fn cut_point(path: &[Node], request: &ProviderRequest) -> Option<Cut> {
    let node = path
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::AssistantMessage { .. }))?;
    if path[node..]
        .iter()
        .any(|n| matches!(n.body, NodeBody::Compaction { .. }))
    {
        return None;
    }
    // The view folds the nodes in path order after the checkpoint's message
    // and kept tail, so the node's message is the view's last assistant one.
    let message = request
        .messages
        .iter()
        .rposition(|m| matches!(m, ChatMessage::Assistant { .. }))?;
    Some(Cut { message, node })
}

/// How many path nodes a checkpoint keeping the nodes from `kept_from` on
/// stands for: those of the latest checkpoint's view before `kept_from`
/// (its kept tail, then the nodes after it), or all before `kept_from`.
fn summarized_nodes(path: &[Node], kept_from: usize) -> usize {
    let previous = path[..kept_from]
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::Compaction { .. }));
    match previous.map(|at| (at, &path[at].body)) {
        Some((at, NodeBody::Compaction { kept_nodes, .. })) => {
            (at - kept_tail_start(path, at, *kept_nodes)) + (kept_from - at - 1)
        }
        _ => kept_from,
    }
}

/// The request that asks for a summary of `base.messages[..cut]`: the
/// compaction prompt and one user message holding them as a plain-text
/// transcript, so it carries no tool blocks (Anthropic and gateways refuse
/// tool_use or tool_result blocks in a request that defines no tools).
/// Tool results are cut to `SUMMARY_RESULT_CHARS`; files are named, not
/// sent. With a known window the transcript is bounded so the request stays
/// under [`compaction_threshold`] (in estimated tokens, scaled by the run's
/// `calibration` when the provider reported more than estimated): the
/// oldest messages are left out first, and the text says how many.
fn summary_request(base: &ProviderRequest, cut: usize, calibration: f64) -> ProviderRequest {
    let entries: Vec<String> = base.messages[..cut].iter().map(transcript_entry).collect();
    let budget = base.profile.context_window.map(|window| {
        let threshold = compaction_threshold(window, base.profile.max_output_tokens);
        ((threshold as f64 / calibration.max(1.0)) as u64).saturating_sub(
            estimate_text_tokens(COMPACTION_PROMPT)
                + estimate_text_tokens(TRANSCRIPT_HEADER)
                + estimate_text_tokens(WRITE_NOW)
                // Message framing, the note on what was left out, joins.
                + 40,
        )
    });
    // Newest first, while they fit; the newest alone keeps what fits of it.
    let mut kept: Vec<&str> = Vec::new();
    let mut left = budget.unwrap_or(u64::MAX);
    for entry in entries.iter().rev() {
        let cost = estimate_text_tokens(entry) + 1;
        if cost <= left {
            left -= cost;
            kept.push(entry);
        } else {
            if kept.is_empty() {
                kept.push(within(entry, left).0);
            }
            break;
        }
    }
    let left_out = entries.len() - kept.len();
    let mut text = String::from(TRANSCRIPT_HEADER);
    if left_out > 0 {
        text.push_str(&format!(
            "\n[The oldest {left_out} message(s) are left out here to fit the context window.]"
        ));
    }
    for entry in kept.iter().rev() {
        text.push_str("\n\n");
        text.push_str(entry);
    }
    text.push_str("\n\n");
    text.push_str(WRITE_NOW);
    ProviderRequest {
        lineage: None,
        profile: base.profile.clone(),
        system: COMPACTION_PROMPT.into(),
        messages: vec![ChatMessage::user(text)].into(),
        tools: Default::default(),
    }
}

/// One message of a compaction request's transcript, as plain text.
fn transcript_entry(message: &ChatMessage) -> String {
    match message {
        ChatMessage::User {
            text,
            images,
            documents,
        } => {
            let mut out = format!("[user]\n{text}");
            // Files are not summarized from (the checkpoint sends them again).
            if !images.is_empty() || !documents.is_empty() {
                let names: Vec<&str> = documents.iter().map(|d| d.name.as_str()).collect();
                out.push_str(&format!(
                    "\n[Attached here, not shown for the summary: {} image(s){}{}]",
                    images.len(),
                    if names.is_empty() { "" } else { ", PDF(s) " },
                    names.join(", ")
                ));
            }
            out
        }
        ChatMessage::Assistant {
            text, tool_calls, ..
        } => {
            let mut out = String::from("[assistant]");
            if !text.is_empty() {
                out.push('\n');
                out.push_str(text);
            }
            for call in tool_calls {
                out.push_str(&format!(
                    "\n[tool call {} (id {})] {}",
                    call.name, call.id, call.arguments
                ));
            }
            out
        }
        ChatMessage::ToolResult {
            call_id,
            content,
            is_error,
            images,
        } => {
            let total = content.chars().count();
            let mut out = format!(
                "[tool result (id {call_id}){}]\n",
                if *is_error { ", failed" } else { "" }
            );
            out.extend(content.chars().take(SUMMARY_RESULT_CHARS));
            if total > SUMMARY_RESULT_CHARS {
                out.push_str(&format!(
                    "\n[… {} more characters not shown]",
                    total - SUMMARY_RESULT_CHARS
                ));
            }
            if !images.is_empty() {
                out.push_str(&format!("\n[{} image(s) not shown]", images.len()));
            }
            out
        }
    }
}

/// One of the user's messages of the task in progress (`task_messages`).
pub(super) struct TaskMessage<'a> {
    /// Its index in the path.
    pub index: usize,
    pub text: &'a str,
    pub steered: bool,
    pub files: &'a [Attachment],
}

/// The user's messages of the task in progress, oldest first: those of the
/// current turn, and of the turns before it as long as a turn was opened by
/// a plain resume (`CONTINUE_TEXT`), so a task continued after a budget
/// pause keeps its goal.
pub(super) fn task_messages(path: &[Node]) -> Vec<TaskMessage<'_>> {
    let mut turns = Vec::new();
    let mut end = path.len();
    while let Some(start) = path[..end]
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::TurnContext { .. }))
    {
        let messages: Vec<TaskMessage<'_>> = path[start..end]
            .iter()
            .enumerate()
            .filter_map(|(offset, n)| match &n.body {
                NodeBody::UserMessage {
                    text,
                    steered,
                    attachments,
                } => Some(TaskMessage {
                    index: start + offset,
                    text,
                    steered: *steered,
                    files: attachments,
                }),
                _ => None,
            })
            .collect();
        let resumed = messages.first().is_some_and(|m| m.text == CONTINUE_TEXT);
        turns.push(messages);
        if !resumed {
            break;
        }
        end = start;
    }
    turns.into_iter().rev().flatten().collect()
}

/// ` files="a.png, b.csv"` for a message with attached files, else empty.
fn files_attribute(files: &[Attachment]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let names: Vec<String> = files
        .iter()
        .map(|f| f.name().replace(['"', '<', '>'], "'"))
        .collect();
    format!(" files=\"{}\"", names.join(", "))
}

/// What a checkpoint copies verbatim after the model's summary, so the exact
/// words do not depend on the summary: the user's messages of the task in
/// progress (`task_messages`) that the summary stands for, i.e. not among
/// the last `kept_nodes` nodes of `path` (the checkpoint sends those as they
/// are). The queue is not copied: a queued message is not part of the
/// task, and one edited, removed or started later would be shown to the
/// model as it was when the summary was written.
/// Each message is delimited by tags and copied byte for byte; its files
/// are named (the view sends them again with the summary). Past
/// `budget_tokens` (estimated) the message in hand is cut with a note and
/// the rest are only counted. Pending steers are not copied: they reach
/// the model as their own messages right after the checkpoint (exactly
/// once). Empty when there is nothing to copy.
pub fn verbatim_section(path: &[Node], kept_nodes: u64, budget_tokens: u64) -> String {
    const TASK: &str = "The user's messages of the task in progress, oldest first:";
    let tail = path
        .len()
        .saturating_sub(usize::try_from(kept_nodes).unwrap_or(usize::MAX));
    let entries: Vec<(String, &str)> = task_messages(path)
        .into_iter()
        .filter(|m| m.index < tail)
        .map(|m| {
            let mut attributes = files_attribute(m.files);
            if m.steered {
                attributes.push_str(" steered=\"true\"");
            }
            (attributes, m.text)
        })
        .collect();
    if entries.is_empty() {
        return String::new();
    }
    let mut out = String::from(VERBATIM_HEADER);
    out.push('\n');
    out.push_str(TASK);
    // The bound covers the framing too; room for the two notes is kept.
    let mut left = budget_tokens
        .saturating_sub(estimate_text_tokens(VERBATIM_HEADER) + estimate_text_tokens(TASK) + 50);
    for (index, (attributes, text)) in entries.iter().enumerate() {
        let open = format!("\n<user_message{attributes}>\n");
        let close = "\n</user_message>";
        left = left.saturating_sub(estimate_text_tokens(&open) + estimate_text_tokens(close));
        let (kept, cut) = within(text, left);
        out.push_str(&open);
        out.push_str(kept);
        out.push_str(close);
        left = left.saturating_sub(estimate_text_tokens(kept));
        if cut > 0 {
            out.push_str(&format!(
                "\n[… the size limit cut this message here: {cut} more characters are not copied; the summary covers them.]"
            ));
            let rest = entries.len() - index - 1;
            if rest > 0 {
                out.push_str(&format!(
                    "\n[{rest} more message(s) not copied (size limit); the summary covers them.]"
                ));
            }
            break;
        }
    }
    out
}

/// The longest prefix of `text` (at a character boundary) whose estimate fits
/// `budget` tokens, and how many characters were left out.
fn within(text: &str, budget: u64) -> (&str, usize) {
    if estimate_text_tokens(text) <= budget {
        return (text, 0);
    }
    let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    // The estimate grows (almost) monotonically with the prefix: binary
    // search the last one that fits; `low` always fits (0 characters).
    let (mut low, mut high) = (0, boundaries.len());
    while low < high {
        let mid = (low + high).div_ceil(2);
        let end = boundaries.get(mid).copied().unwrap_or(text.len());
        if estimate_text_tokens(&text[..end]) <= budget {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    let end = boundaries.get(low).copied().unwrap_or(text.len());
    (&text[..end], boundaries.len() - low)
}

impl Engine {
    /// On a thread's first turn, ask for a short title in the background;
    /// the first-line title stays until (and unless) this succeeds.
    pub(super) fn request_title(&mut self, tid: &str) {
        let t = &self.threads[tid];
        let Some(run) = t.latest_run.as_ref() else {
            return;
        };
        if !self.config.model_titles || t.run_ids.len() != 1 || !run.profile.is_configured() {
            return;
        }
        let Some((text, files)) = t.path.iter().find_map(|n| match &n.body {
            NodeBody::UserMessage {
                text, attachments, ..
            } => Some((text, attachments)),
            _ => None,
        }) else {
            return;
        };
        // A title the user gave (`thread.rename`) is not replaced.
        if t.thread.title != super::first_title(text, files) {
            return;
        }
        // The message's text and the names of its files (a message of files
        // only is titled after what they are).
        let mut first: String = text.chars().take(2_000).collect();
        if !files.is_empty() {
            let names: Vec<&str> = files.iter().map(Attachment::name).collect();
            first = format!("{}\n\n(Attached: {})", first.trim_end(), names.join(", "))
                .trim_start()
                .to_string();
        }
        let asked_over = t.thread.title.clone();
        let mut profile = run.profile.clone();
        profile.max_output_tokens = Some(32);
        let request = ProviderRequest {
            lineage: None,
            profile,
            system: TITLE_PROMPT.into(),
            messages: vec![ChatMessage::user(first)].into(),
            tools: Default::default(),
        };
        let request_id = self.next_handle();
        self.title_requests
            .insert(request_id, (tid.to_string(), asked_over));
        self.effects.push_back(Effect::CallProvider {
            request_id,
            request: request.into(),
            idle_timeout_ms: self.config.stream_idle_timeout_ms,
        });
    }

    /// The model's title replaces `asked_over`, the title the thread had
    /// when it was asked for, unless the user renamed the thread meanwhile.
    pub(super) fn on_title(
        &mut self,
        now: u64,
        tid: &str,
        asked_over: &str,
        result: Result<ProviderResponse, ProviderError>,
    ) {
        let Ok(response) = result else { return };
        let title: String = response
            .text
            .lines()
            .map(|l| {
                l.trim()
                    .trim_matches(|c| c == '"' || c == '\'' || c == '*' || c == '#')
                    .trim()
            })
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .chars()
            .take(MAX_TITLE_CHARS)
            .collect();
        // Nothing of a thread being deleted is written again.
        let Some(t) = self.threads.get(tid).filter(|t| !t.deleting) else {
            return;
        };
        if title.is_empty() || title == t.thread.title || t.thread.title != asked_over {
            return;
        }
        let t = self.threads.get_mut(tid).expect("exists");
        // In memory at once, so every thread record written from now on
        // carries it; a record already in flight cannot undo it.
        t.thread.title = title.clone();
        t.pending_title = Some(title);
        if !self.persist_pending_title(now, tid) {
            // The run's next checkpoint writes it, or this once the
            // thread's last save committed; shown meanwhile.
            self.broadcast_threads();
        }
    }

    /// Write a title kept in memory (`pending_title`) with the thread's
    /// record, unless a running turn or a save of the thread in flight
    /// would commit around it: that record, written from memory, carries
    /// the committed state and would undo one in flight (a checkpoint, a
    /// branch switch). Whether it was written.
    pub(super) fn persist_pending_title(&mut self, now: u64, tid: &str) -> bool {
        let Some(t) = self.threads.get(tid) else {
            return false;
        };
        if t.pending_title.is_none() || t.exec.is_some() || self.thread_saving(tid) {
            return false;
        }
        let mut thread = t.thread.clone();
        thread.revision += 1;
        thread.updated_at = thread.updated_at.max(now);
        let mut unit = UnitOfWork::new();
        unit.put(Record::Thread(thread));
        self.persist(tid, unit, Then::TitleUpdated);
        true
    }
}
