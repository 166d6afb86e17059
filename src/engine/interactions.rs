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
        let turn_id = self.threads[tid]
            .latest_run
            .as_ref()
            .map(|r| r.id.clone())
            .unwrap_or_default();
        self.broadcast(
            tid,
            Event::InteractionResolved {
                thread_id: tid.to_string(),
                turn_id,
                interaction_id,
                status: InteractionStatus::Answered,
            },
        );
        self.announce(tid, unit);
        if self.take_pending_finish(now, tid) {
            return;
        }
        self.run_next_tool(now, tid);
    }
}
