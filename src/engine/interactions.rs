//! Questions from the model to the user (the built-in `ask_user` tool).
//!
//! The question is a durable record and the run's pending interaction,
//! written in one checkpoint before it is shown. The answer is claimed
//! exactly once: the tool result, the claimed record, the run revision and
//! the command receipt are one checkpoint, ACKed after it commits. After a
//! restart the question is re-presented from the snapshot.

use serde_json::{json, Value};

use super::*;

impl Engine {
    /// Run a tool the engine executes itself.
    pub(super) fn run_engine_tool(&mut self, now: u64, tid: &str, index: usize) {
        let exec = self.threads[tid].exec.as_ref().expect("active run");
        let call = exec.calls[index].clone();
        match call.name.as_str() {
            "ask_user" => self.ask_user(now, tid, index, call.params.unwrap_or(Value::Null)),
            other => self.persist_tool_result(
                now,
                tid,
                index,
                ToolStatus::Error,
                format!("Unknown built-in tool {other:?}."),
                None,
            ),
        }
    }

    fn ask_user(&mut self, now: u64, tid: &str, index: usize, params: Value) {
        let question = params
            .get("question")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        if question.is_empty() {
            return self.persist_tool_result(
                now,
                tid,
                index,
                ToolStatus::Error,
                "ask_user needs a non-empty question.".into(),
                None,
            );
        }
        let options: Vec<String> = params
            .get("options")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .take(8)
                    .collect()
            })
            .unwrap_or_default();
        let t = &self.threads[tid];
        let call = &t.exec.as_ref().expect("active run").calls[index];
        let mut run = t.latest_run.clone().expect("active run");
        let interaction = InteractionRecord {
            id: self.ids.next_id("i"),
            thread_id: tid.to_string(),
            run_id: run.id.clone(),
            call_id: call.call_id.clone(),
            question,
            options,
            status: InteractionStatus::Pending,
            answer: None,
            created_at: now,
            answered_at: None,
            server: None,
            server_url: None,
            form: None,
            action: None,
            content: None,
        };
        run.state = RunState::WaitingInteraction;
        run.pending_interaction = Some(interaction.id.clone());
        run.revision += 1;
        run.updated_at = now;
        let interaction_id = interaction.id.clone();
        let mut unit = UnitOfWork::new();
        unit.put(Record::Interaction(interaction))
            .put(Record::Run(run));
        let token = self.persist(
            tid,
            unit,
            Then::InteractionAsked {
                index,
                interaction_id,
            },
        );
        self.set_phase(tid, Phase::Persisting(token));
    }

    pub(super) fn after_interaction_asked(
        &mut self,
        now: u64,
        tid: &str,
        index: usize,
        interaction_id: String,
        unit: &UnitOfWork,
    ) {
        self.announce(tid, unit);
        if self.take_pending_finish(now, tid) {
            return;
        }
        self.set_phase(
            tid,
            Phase::WaitingInteraction {
                index,
                interaction_id: interaction_id.clone(),
            },
        );
        let t = &self.threads[tid];
        if let Some(interaction) = t
            .interactions
            .iter()
            .find(|i| i.id == interaction_id)
            .cloned()
        {
            self.broadcast(
                tid,
                Event::InteractionRequest {
                    thread_id: tid.to_string(),
                    turn_id: interaction.run_id.clone(),
                    interaction,
                },
            );
        }
    }

    /// `interaction.resolved{answered}` (with how a server's request was
    /// answered) for the thread's current turn.
    fn broadcast_answered(
        &mut self,
        tid: &str,
        interaction_id: String,
        action: Option<ElicitationAction>,
    ) {
        let turn_id = self.latest_run_id(tid);
        self.broadcast(
            tid,
            Event::InteractionResolved {
                thread_id: tid.to_string(),
                turn_id,
                interaction_id,
                status: InteractionStatus::Answered,
                action,
            },
        );
    }

    #[inline(never)]
    pub(super) fn op_interaction_response(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        interaction_id: &str,
        answer: String,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(interaction) = t
            .interactions
            .iter()
            .find(|i| i.id == interaction_id)
            .cloned()
        else {
            return self.reject(&reply, ErrorKind::NotFound, "No such question.");
        };
        if interaction.status != InteractionStatus::Pending {
            // Claimed once: the same answer is acknowledged again, another is refused.
            return if interaction.answer.as_deref() == Some(answer.as_str()) {
                // With a receipt of its own, like every other ACK.
                let result =
                    json!({ "interactionId": interaction.id, "status": interaction.status });
                self.ack_with_receipt(now, thread_id, reply, result)
            } else {
                let message = match interaction.status {
                    InteractionStatus::Cancelled => {
                        "This question was already withdrawn: its run ended."
                    }
                    _ => "This question was already answered.",
                };
                self.reject(&reply, ErrorKind::InvalidCommand, message)
            };
        }
        if answer.trim().is_empty() {
            return self.reject(&reply, ErrorKind::InvalidCommand, "The answer is empty.");
        }
        let waiting = match t.exec.as_ref().map(|e| &e.phase) {
            Some(Phase::WaitingInteraction {
                index,
                interaction_id: i,
            }) if i == interaction_id => Some(*index),
            _ => None,
        };
        let Some(index) = waiting else {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "The run is not waiting for this answer.",
            );
        };
        let mut answered = interaction.clone();
        answered.status = InteractionStatus::Answered;
        answered.answer = Some(answer.clone());
        answered.answered_at = Some(now);
        // The user's own words: a trusted result, not page data.
        let content = format!("The user answered: {answer}");
        let mut unit = self.tool_result_unit(now, thread_id, index, ToolStatus::Ok, content, None);
        if let Some(run) = unit.run_mut() {
            run.pending_interaction = None;
        }
        unit.put(Record::Interaction(answered));
        self.mark_call_done(thread_id, index);
        let result =
            json!({ "interactionId": interaction.id, "status": InteractionStatus::Answered });
        let token = self.persist_command(
            now,
            thread_id,
            unit,
            Then::InteractionAnswered {
                interaction_id: interaction.id.clone(),
            },
            reply,
            result,
        );
        self.set_phase(thread_id, Phase::Persisting(token));
    }

    pub(super) fn after_interaction_answered(
        &mut self,
        now: u64,
        tid: &str,
        interaction_id: String,
        unit: &UnitOfWork,
    ) {
        self.broadcast_answered(tid, interaction_id, None);
        self.announce(tid, unit);
        if self.take_pending_finish(now, tid) {
            return;
        }
        self.run_next_tool(now, tid);
    }
}

/// An MCP server's request for input during one of its tool calls
/// (`crate::elicitation`, spec 000 §5 "MCP Elicitation").
///
/// The request is written as an `InteractionRecord` naming the server
/// before it is shown; the call stays the run's running tool (its time
/// limit waits meanwhile, in the driver). The answer is checked against the
/// form, made durable with its receipt, ACKed, and only then sent to the
/// server. If the call ends first (its result, a stop, the run's end), the
/// request is withdrawn (`Cancelled`). If the worker dies while the request
/// waits or before the call's result, the server's call cannot be
/// continued: a read (which recovery would otherwise run again) gets an
/// interrupted result that tells the model to call again only if that is
/// safe (`elicitation_recovery`); a write in flight is `paused_uncertain`
/// like any other (the user decides; never_retry_at_most_once), its request
/// withdrawn.
impl Engine {
    /// The server of the call `dispatch_id` asks the user for input.
    pub fn handle_elicitation(
        &mut self,
        now: u64,
        dispatch_id: u64,
        server: &str,
        server_url: &str,
        request: crate::elicitation::Request,
    ) {
        let Some((tid, index)) = self.thread_running_tool(dispatch_id) else {
            // The call already ended: nobody is left to ask.
            return self.effects.push_back(Effect::AnswerElicitation {
                dispatch_id,
                action: ElicitationAction::Cancel,
                content: None,
            });
        };
        let t = &self.threads[&tid];
        let exec = t.exec.as_ref().expect("running tool implies exec");
        let interaction = InteractionRecord {
            id: self.ids.next_id("i"),
            thread_id: tid.clone(),
            run_id: t
                .latest_run
                .as_ref()
                .map(|r| r.id.clone())
                .unwrap_or_default(),
            call_id: exec.calls[index].call_id.clone(),
            question: request.message,
            options: Vec::new(),
            status: InteractionStatus::Pending,
            answer: None,
            created_at: now,
            answered_at: None,
            server: Some(server.to_string()),
            server_url: Some(server_url.to_string()),
            form: Some(request.form),
            action: None,
            content: None,
        };
        let interaction_id = interaction.id.clone();
        let mut unit = UnitOfWork::new();
        unit.put(Record::Interaction(interaction));
        // Not a run checkpoint: the run stays on its running call.
        self.persist(
            &tid,
            unit,
            Then::ElicitationAsked {
                dispatch_id,
                interaction_id,
            },
        );
    }

    /// Whether the call `dispatch_id` is still the running call `call_id`
    /// of thread `tid`.
    fn call_still_running(&self, tid: &str, dispatch_id: u64, call_id: &str) -> bool {
        self.thread_running_tool(dispatch_id)
            .is_some_and(|(t, index)| {
                t == tid
                    && self.threads[tid]
                        .exec
                        .as_ref()
                        .is_some_and(|e| e.calls[index].call_id == call_id)
            })
    }

    pub(super) fn after_elicitation_asked(
        &mut self,
        now: u64,
        tid: &str,
        dispatch_id: u64,
        interaction_id: &str,
    ) {
        let Some(interaction) = self.threads.get(tid).and_then(|t| {
            t.interactions
                .iter()
                .find(|i| i.id == interaction_id && i.status == InteractionStatus::Pending)
                .cloned()
        }) else {
            return;
        };
        if self.call_still_running(tid, dispatch_id, &interaction.call_id) {
            let turn_id = interaction.run_id.clone();
            return self.broadcast(
                tid,
                Event::InteractionRequest {
                    thread_id: tid.to_string(),
                    turn_id,
                    interaction,
                },
            );
        }
        // The call ended while the request was being saved.
        let mut withdrawn = interaction;
        withdrawn.status = InteractionStatus::Cancelled;
        withdrawn.answered_at = Some(now);
        let mut unit = UnitOfWork::new();
        unit.put(Record::Interaction(withdrawn));
        self.persist(
            tid,
            unit,
            Then::Command {
                follow: Follow::AckOnly,
            },
        );
        self.effects.push_back(Effect::AnswerElicitation {
            dispatch_id,
            action: ElicitationAction::Cancel,
            content: None,
        });
    }

    /// The user left the request of the call `dispatch_id` unanswered for
    /// as long as a request may wait (the driver's
    /// `ELICITATION_WAIT_MS`): it is withdrawn and the server told
    /// `cancel`; its call goes on.
    pub fn handle_elicitation_expired(&mut self, now: u64, dispatch_id: u64) {
        let Some((tid, index)) = self.thread_running_tool(dispatch_id) else {
            // The engine let the call go (a stalled save): the server is
            // told, so that the call's time limit runs again.
            return self.effects.push_back(Effect::AnswerElicitation {
                dispatch_id,
                action: ElicitationAction::Cancel,
                content: None,
            });
        };
        let call_id = self.threads[&tid]
            .exec
            .as_ref()
            .map(|e| e.calls[index].call_id.clone())
            .unwrap_or_default();
        let mut unit = UnitOfWork::new();
        let ids = self.withdraw_elicitations(now, &tid, Some(&call_id), &mut unit);
        self.persist_withdrawal(&tid, unit, ids, Some(dispatch_id));
    }

    /// At a restart: withdraw every request for input still pending (its
    /// call died with the worker before). Claimed until durable, so the
    /// running call's recovery (its result, or its pause) leaves them to
    /// this unit; `elicitation_recovery` still reads them as they were.
    pub(super) fn withdraw_stale_elicitations(&mut self, now: u64, tid: &str) {
        let mut unit = UnitOfWork::new();
        let ids = self.withdraw_into(now, tid, &mut unit, |_| true);
        self.persist_withdrawal(tid, unit, ids, None);
    }

    pub(super) fn after_elicitation_withdrawn(
        &mut self,
        dispatch_id: Option<u64>,
        interaction_ids: Vec<String>,
    ) {
        self.elicitations_in_flight
            .retain(|i| !interaction_ids.contains(i));
        if let Some(dispatch_id) = dispatch_id {
            self.effects.push_back(Effect::AnswerElicitation {
                dispatch_id,
                action: ElicitationAction::Cancel,
                content: None,
            });
        }
    }

    /// Saving the request failed: the server is told the user did not
    /// answer (`cancel`), and its call goes on.
    pub(super) fn elicitation_unsaved(&mut self, dispatch_id: u64) {
        self.effects.push_back(Effect::AnswerElicitation {
            dispatch_id,
            action: ElicitationAction::Cancel,
            content: None,
        });
    }

    #[inline(never)]
    pub(super) fn op_elicitation_response(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        interaction_id: &str,
        action: ElicitationAction,
        content: Option<Value>,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(interaction) = t
            .interactions
            .iter()
            .find(|i| i.id == interaction_id && i.server.is_some())
            .cloned()
        else {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "No such request of an MCP server.",
            );
        };
        let form = interaction
            .form
            .clone()
            .unwrap_or(crate::model::ElicitationForm { fields: Vec::new() });
        let checked = match crate::elicitation::check_answer(&form, action, content.as_ref()) {
            Ok(checked) => checked,
            Err(message) => return self.reject(&reply, ErrorKind::InvalidCommand, &message),
        };
        let result = json!({
            "interactionId": interaction.id,
            "status": InteractionStatus::Answered,
            "action": action,
        });
        if interaction.status == InteractionStatus::Pending
            && self.elicitations_in_flight.contains(&interaction.id)
        {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "An answer to this request, or its withdrawal, is being saved.",
            );
        }
        if interaction.status != InteractionStatus::Pending {
            // Claimed once: the same answer is acknowledged again, another is refused.
            return if interaction.status == InteractionStatus::Answered
                && interaction.action == Some(action)
                && interaction.content == checked
            {
                self.ack_with_receipt(now, thread_id, reply, result)
            } else {
                let message = match interaction.status {
                    InteractionStatus::Cancelled => {
                        "This request was already withdrawn: the server's call ended."
                    }
                    _ => "This request was already answered.",
                };
                self.reject(&reply, ErrorKind::InvalidCommand, message)
            };
        }
        let dispatch = t.exec.as_ref().and_then(|e| match &e.phase {
            Phase::Tool { dispatch_id, index }
                if e.calls[*index].call_id == interaction.call_id =>
            {
                Some(*dispatch_id)
            }
            _ => None,
        });
        let Some(dispatch_id) = dispatch else {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "The server's call this request belongs to is no longer running.",
            );
        };
        let mut answered = interaction;
        answered.status = InteractionStatus::Answered;
        answered.action = Some(action);
        answered.content = checked.clone();
        answered.answered_at = Some(now);
        let mut unit = UnitOfWork::new();
        unit.put(Record::Interaction(answered));
        self.elicitations_in_flight.push(interaction_id.to_string());
        self.persist_command(
            now,
            thread_id,
            unit,
            Then::ElicitationAnswered {
                dispatch_id,
                interaction_id: interaction_id.to_string(),
                action,
                content: checked,
            },
            reply,
            result,
        );
    }

    pub(super) fn after_elicitation_answered(
        &mut self,
        tid: &str,
        dispatch_id: u64,
        interaction_id: String,
        action: ElicitationAction,
        content: Option<Value>,
    ) {
        self.elicitations_in_flight.retain(|i| *i != interaction_id);
        self.broadcast_answered(tid, interaction_id, Some(action));
        // The driver sends it if the call still waits for it.
        self.effects.push_back(Effect::AnswerElicitation {
            dispatch_id,
            action,
            content,
        });
    }

    /// The requests for input of the call `call_id` (None: of the run)
    /// still waiting, withdrawn in `unit` (the call ended: its result, a
    /// stop, the run's end, a restart); `announce_withdrawn` tells the
    /// clients once the unit commits.
    pub(super) fn withdraw_elicitations(
        &self,
        now: u64,
        tid: &str,
        call_id: Option<&str>,
        unit: &mut UnitOfWork,
    ) -> Vec<String> {
        let run_id = self
            .threads
            .get(tid)
            .and_then(|t| t.latest_run.as_ref())
            .map(|r| r.id.clone());
        self.withdraw_into(now, tid, unit, |i| {
            Some(&i.run_id) == run_id.as_ref() && call_id.is_none_or(|c| c == i.call_id)
        })
    }

    /// The pending requests for input of thread `tid` that `which` picks,
    /// withdrawn in `unit` (their ids); one whose answer or withdrawal is
    /// being saved is left to that save.
    fn withdraw_into(
        &self,
        now: u64,
        tid: &str,
        unit: &mut UnitOfWork,
        which: impl Fn(&InteractionRecord) -> bool,
    ) -> Vec<String> {
        let Some(t) = self.threads.get(tid) else {
            return Vec::new();
        };
        let mut ids = Vec::new();
        for interaction in &t.interactions {
            let open = interaction.server.is_some()
                && interaction.status == InteractionStatus::Pending
                && !self.elicitations_in_flight.contains(&interaction.id)
                && which(interaction);
            if open {
                let mut cancelled = interaction.clone();
                cancelled.status = InteractionStatus::Cancelled;
                cancelled.answered_at = Some(now);
                ids.push(cancelled.id.clone());
                unit.put(Record::Interaction(cancelled));
            }
        }
        ids
    }

    /// Save a withdrawal of `interaction_ids`, claimed until durable: an
    /// answer arriving meanwhile is refused, and the server of the call
    /// `dispatch_id` (if it still runs) hears `cancel` only once it is kept.
    fn persist_withdrawal(
        &mut self,
        tid: &str,
        unit: UnitOfWork,
        interaction_ids: Vec<String>,
        dispatch_id: Option<u64>,
    ) {
        if interaction_ids.is_empty() {
            return;
        }
        self.elicitations_in_flight
            .extend(interaction_ids.iter().cloned());
        self.persist(
            tid,
            unit,
            Then::ElicitationWithdrawn {
                dispatch_id,
                interaction_ids,
            },
        );
    }

    /// `interaction.resolved{cancelled}` for each request for input a
    /// committed unit withdrew.
    pub(super) fn announce_withdrawn(&mut self, tid: &str, unit: &UnitOfWork) {
        for record in &unit.puts {
            if let Record::Interaction(i) = record {
                if i.server.is_some() && i.status == InteractionStatus::Cancelled {
                    self.broadcast(
                        tid,
                        Event::InteractionResolved {
                            thread_id: tid.to_string(),
                            turn_id: i.run_id.clone(),
                            interaction_id: i.id.clone(),
                            status: InteractionStatus::Cancelled,
                            action: None,
                        },
                    );
                }
            }
        }
    }

    /// A request for input of the running call at a restart: the server's
    /// call cannot be continued (its stream ended with the worker). The
    /// call's index and its result's text, if there was such a request.
    pub(super) fn elicitation_recovery(&self, tid: &str) -> Option<(usize, String)> {
        let t = self.threads.get(tid)?;
        let exec = t.exec.as_ref()?;
        let run_id = t.latest_run.as_ref()?.id.as_str();
        t.interactions.iter().rev().find_map(|i| {
            let server = i.server.as_deref()?;
            if i.run_id != run_id || i.status == InteractionStatus::Cancelled {
                return None;
            }
            let index = exec
                .calls
                .iter()
                .position(|c| c.call_id == i.call_id && !c.done)?;
            let answered = match (i.status, i.action) {
                (InteractionStatus::Answered, Some(action)) => {
                    format!(" (the user had answered it: {})", action.as_str())
                }
                _ => String::new(),
            };
            Some((
                index,
                format!(
                    "The MCP server \"{server}\" asked the user for input during this call{answered}, and the worker restarted before the call finished, so the server's call cannot be continued and whether it took effect is unknown. Call the tool again only if that is safe: a read, or an action you have checked did not happen."
                ),
            ))
        })
    }
}
