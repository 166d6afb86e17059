//! Context window management: compaction checkpoints and overflow repair.
//!
//! Before a request, its size is estimated (`estimate_tokens`, a tokenizer-free
//! heuristic measured against real tokenizers, scaled by what the provider
//! reported for the previous request of the run). Above
//! `COMPACT_AT_PERCENT` of the model's window, or when the provider reports a
//! context overflow, the model first writes a summary; a compaction node with
//! it, followed by what the engine copies verbatim (the user's messages of the
//! task in progress and the queue), is appended to the path and the outbound
//! view starts there. The stored
//! history is never deleted. Each compaction must have something new to
//! summarize, so a model that keeps overflowing ends in a clear error.

use super::context::estimate_text_tokens;
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

impl Engine {
    /// Whether the path has grown since the last checkpoint (progress guard)
    /// and this step has not compacted twice already.
    pub(super) fn can_compact(&self, tid: &str) -> bool {
        let t = &self.threads[tid];
        let since = t
            .path
            .iter()
            .rev()
            .take_while(|n| !matches!(n.body, NodeBody::Compaction { .. }))
            .filter(|n| {
                !matches!(
                    n.body,
                    NodeBody::Notice { .. } | NodeBody::TurnContext { .. }
                )
            })
            .count();
        let compactions = t.exec.as_ref().map_or(0, |e| e.compactions);
        since > 2 && compactions < 2
    }

    /// Whether `request` (of `estimate` tokens before calibration) should be
    /// compacted before it is sent.
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
        estimate * 100 > window * COMPACT_AT_PERCENT && self.can_compact(tid)
    }

    /// Ask the model for a summary of `base` (the request that is too large).
    pub(super) fn start_compaction(&mut self, tid: &str, base: ProviderRequest) {
        let request_id = self.next_handle();
        let idle_timeout_ms = self.config.stream_idle_timeout_ms;
        let mut messages: Vec<ChatMessage> = std::rc::Rc::unwrap_or_clone(base.messages)
            .into_iter()
            .map(|m| match m {
                ChatMessage::ToolResult {
                    call_id,
                    content,
                    is_error,
                    images,
                } => ChatMessage::ToolResult {
                    call_id,
                    content: content
                        .chars()
                        .take(SUMMARY_RESULT_CHARS)
                        .collect::<String>()
                        .into(),
                    is_error,
                    images: if images.is_empty() {
                        images
                    } else {
                        Vec::new()
                    },
                },
                // Files are not summarized from (the checkpoint names them).
                ChatMessage::User {
                    mut text,
                    images,
                    documents,
                } if !images.is_empty() || !documents.is_empty() => {
                    let names: Vec<&str> = documents.iter().map(|d| d.name.as_str()).collect();
                    text.push_str(&format!(
                        "\n[Attached here, not shown for the summary: {} image(s){}{}]",
                        images.len(),
                        if names.is_empty() { "" } else { ", PDF(s) " },
                        names.join(", ")
                    ));
                    ChatMessage::user(text)
                }
                other => other,
            })
            .collect();
        messages.push(ChatMessage::user(
            "Write the summary now, following the instructions.",
        ));
        let request = ProviderRequest {
            lineage: None,
            profile: base.profile,
            system: COMPACTION_PROMPT.into(),
            messages: messages.into(),
            tools: Default::default(),
        };
        self.set_phase(tid, Phase::Compacting { request_id });
        self.effects.push_back(Effect::CallProvider {
            request_id,
            request: request.into(),
            idle_timeout_ms,
        });
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

    /// The summary arrived: write the checkpoint (its usage counts like any other).
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
                    "The model returned an empty summary.".into(),
                );
            }
            Err(e) => return self.fail_compaction(now, tid, e.message),
        };
        let t = &self.threads[tid];
        let compacted = t
            .path
            .iter()
            .rev()
            .take_while(|n| !matches!(n.body, NodeBody::Compaction { .. }))
            .count() as u64;
        let usage = response.usage.unwrap_or_default();
        let budget = t
            .latest_run
            .as_ref()
            .and_then(|r| r.profile.context_window)
            .map_or(VERBATIM_MAX_TOKENS, |w| (w / 8).min(VERBATIM_MAX_TOKENS));
        let verbatim = verbatim_section(&t.path, &t.queue, budget);
        let node = Node {
            id: self.ids.next_id("n"),
            thread_id: tid.to_string(),
            parent_id: t.leaf_id(),
            created_at: now,
            body: NodeBody::Compaction {
                summary: response.text,
                compacted_nodes: compacted,
                verbatim,
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
        exec.compactions += 1;
        exec.phase = Phase::Persisting(token);
    }

    fn fail_compaction(&mut self, now: u64, tid: &str, why: String) {
        self.finish_run(
            now,
            tid,
            Finish {
                state: RunState::Failed,
                stop: StopReason::Error,
                error: Some(ErrorInfo::new(
                    ErrorKind::ContextOverflow,
                    format!("The conversation is too long and could not be compacted: {why}"),
                )),
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

/// The user's messages of the task in progress, oldest first, with whether
/// each was a steer: those of the current turn, and of the turns before it
/// as long as a turn was opened by a plain resume (`CONTINUE_TEXT`), so a
/// task continued after a budget pause keeps its goal.
fn task_messages(path: &[Node]) -> Vec<(&str, bool, &[Attachment])> {
    let mut turns = Vec::new();
    let mut end = path.len();
    while let Some(start) = path[..end]
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::TurnContext { .. }))
    {
        let messages: Vec<(&str, bool, &[Attachment])> = path[start..end]
            .iter()
            .filter_map(|n| match &n.body {
                NodeBody::UserMessage {
                    text,
                    steered,
                    attachments,
                } => Some((text.as_str(), *steered, attachments.as_slice())),
                _ => None,
            })
            .collect();
        let resumed = messages
            .first()
            .is_some_and(|(text, _, _)| *text == CONTINUE_TEXT);
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
/// progress (`task_messages`) and the messages queued for later turns.
/// Each message is delimited by tags and copied byte for byte; past
/// `budget_tokens` (estimated) the message in hand is cut with a note and the
/// rest are only counted. Pending steers are not copied: they reach the model
/// as their own messages right after the checkpoint (exactly once).
/// Empty when there is nothing to copy.
pub fn verbatim_section(path: &[Node], queue: &[QueueItem], budget_tokens: u64) -> String {
    const TASK: &str = "The user's messages of the task in progress, oldest first:";
    const QUEUED: &str =
        "Messages the user queued for after this task (not part of it; do not start them now):";
    // (heading, tag, attributes, text) in the order they are copied. The
    // files of a message are named, not copied (the summary covers them).
    let entries: Vec<(&str, &str, String, &str)> = task_messages(path)
        .into_iter()
        .map(|(text, steered, files)| {
            let mut attributes = files_attribute(files);
            if steered {
                attributes.push_str(" steered=\"true\"");
            }
            (TASK, "user_message", attributes, text)
        })
        .chain(queue.iter().map(|item| {
            let attributes = files_attribute(&item.attachments);
            (QUEUED, "queued_message", attributes, item.text.as_str())
        }))
        .collect();
    if entries.is_empty() {
        return String::new();
    }
    let mut out = String::from(VERBATIM_HEADER);
    let mut heading = "";
    // The bound covers the framing too; room for the two notes is kept.
    let mut left = budget_tokens.saturating_sub(estimate_text_tokens(VERBATIM_HEADER) + 50);
    for (index, (section, tag, attributes, text)) in entries.iter().enumerate() {
        if *section != heading {
            heading = section;
            out.push('\n');
            out.push_str(section);
            left = left.saturating_sub(estimate_text_tokens(section));
        }
        let open = format!("\n<{tag}{attributes}>\n");
        let close = format!("\n</{tag}>");
        left = left.saturating_sub(estimate_text_tokens(&open) + estimate_text_tokens(&close));
        let (kept, cut) = within(text, left);
        out.push_str(&open);
        out.push_str(kept);
        out.push_str(&close);
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
