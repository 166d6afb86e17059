//! Gatekeeping and durable approvals.
//!
//! Before a page tool runs, the driver resolves its target page; the
//! gatekeeper decides allow / ask / deny. `ask` writes an approval record and
//! the run's pending approval in one checkpoint, then waits. The answer, the
//! record, the run revision and the command receipt are one checkpoint; only
//! then is it ACKed. Right before dispatching an approved call the target is
//! resolved again: a different origin (or lost permission) asks again.

use crate::model::SiteRuleSummary;
use crate::tools::{Binding, ToolDescriptor};
use serde_json::{json, Value};

use super::*;

impl Engine {
    /// Decide whether the call at `index` may run on `target` (None for
    /// browser-wide tools).
    pub(super) fn gate(&mut self, now: u64, tid: &str, index: usize, target: Option<TargetInfo>) {
        let t = &self.threads[tid];
        let exec = t.exec.as_ref().expect("active run");
        let call = exec.calls[index].clone();
        let Some(descriptor) = self.config.registry.get(&call.name).cloned() else {
            return self.persist_tool_result(
                now,
                tid,
                index,
                ToolStatus::Error,
                format!("Unknown tool {:?}.", call.name),
                None,
            );
        };
        let origin = target
            .as_ref()
            .map(|t| t.origin.clone())
            .unwrap_or_default();
        // An approval the user already gave for this very call, on this origin
        // (after a restart, or at the re-check right before dispatch).
        let given = t.approvals.iter().find(|a| {
            a.call_id == call.call_id
                && matches!(
                    a.status,
                    ApprovalStatus::AcceptedOnce | ApprovalStatus::AcceptedForSite
                )
                && a.origin == origin
        });
        // ...given for another document than the one the tab shows now: the
        // page was reloaded or left for another page of the same site while
        // the user was asked. What was approved is gone; the model looks
        // again (a ref of the old document means nothing in the new one).
        let document_now = target.as_ref().and_then(|t| t.document_id.as_deref());
        let moved = given
            .and_then(|a| a.document_id.as_deref())
            .zip(document_now)
            .is_some_and(|(asked, now_id)| asked != now_id);
        // What acting again means: asked again after "once"; after "for
        // this site", the site's writes run without asking.
        let again = match given.map(|a| a.status) {
            Some(ApprovalStatus::AcceptedForSite) => {
                "(the user allowed this site's actions, so it will not be asked again: be sure)"
            }
            _ => "(the user will be asked again)",
        };
        // ...given for an element the page no longer shows under that ref
        // (relabeled, replaced, gone): the user approved what the card
        // described, and that is not there any more.
        let shown = given.and_then(|a| a.element.as_ref());
        let now_there = target.as_ref().and_then(|t| t.element.as_ref());
        // ...given for an MCP server that, under the same name, is now at
        // another address (removed and added again in Settings): the user
        // approved sending it to the address the card named.
        let server_now = match &descriptor.binding {
            Binding::Mcp {
                server, endpoint, ..
            } => Some((server.as_str(), endpoint.as_str())),
            _ => None,
        };
        let server_moved = given
            .and_then(|a| a.server_url.as_deref())
            .zip(server_now)
            .filter(|(asked, (_, now_url))| asked != now_url);
        let changed = if moved {
            Some(
                "The page was reloaded or replaced by another page of the same site after the user \
approved this action"
                    .to_string(),
            )
        } else if let Some((asked, (name, now_url))) = server_moved {
            Some(format!(
                "The MCP server \"{name}\" is now at {now_url}, not at {asked} where the user approved \
sending this call"
            ))
        } else {
            shown
                .filter(|shown| !now_there.is_some_and(|e| shown.same_as(e)))
                .map(|shown| {
                    let now_words = match now_there {
                        Some(e) => format!("it is now {}", e.summary()),
                        None => "the page no longer shows it".to_string(),
                    };
                    format!(
                        "The element the user approved this action on, {}, changed after the \
approval ({now_words})",
                        shown.summary()
                    )
                })
        };
        if let Some(what) = changed {
            let text = if server_moved.is_some() {
                format!(
                    "{what}; nothing was sent. Call it again only if it still makes sense {again}."
                )
            } else {
                format!(
                    "{what}; nothing was done. Call page_snapshot to look at the page as it is now, \
and act again only if it still makes sense {again}."
                )
            };
            return self.persist_tool_result(now, tid, index, ToolStatus::Error, text, None);
        }
        let approved = given.is_some();
        // A rule for what is no site (kept from before `is_site`) is not used.
        let rule = self
            .site_rules
            .get(&origin)
            .filter(|_| gatekeeper::is_site(&origin));
        let verdict = match gatekeeper::verdict(&descriptor, target.as_ref(), rule) {
            Verdict::Ask if approved => Verdict::Allow,
            other => other,
        };
        if let Some(target) = &target {
            self.threads
                .get_mut(tid)
                .and_then(|t| t.exec.as_mut())
                .expect("active run")
                .targets
                .insert(index, target.clone());
        }
        match verdict {
            // Calls that must not silently run twice are recorded as in flight first.
            Verdict::Allow if call.recovery != Recovery::RetrySafe => self.mark_and_dispatch(now, tid, index, None),
            Verdict::Allow => self.dispatch(tid, index),
            Verdict::Deny(reason) => self.persist_tool_result(now, tid, index, ToolStatus::Denied, reason, None),
            Verdict::Ask if self.config.approver == Approver::DenyAll => self.persist_tool_result(
                now,
                tid,
                index,
                ToolStatus::Denied,
                "This action needs the user's approval and no approver is attached, so it was denied.".into(),
                None,
            ),
            Verdict::Ask => self.ask_approval(now, tid, index, &descriptor, target),
        }
    }

    /// Persist the question (approval record + the run's pending approval), then ask.
    fn ask_approval(
        &mut self,
        now: u64,
        tid: &str,
        index: usize,
        descriptor: &ToolDescriptor,
        target: Option<TargetInfo>,
    ) {
        let target = target.unwrap_or(TargetInfo {
            tab_id: -1,
            host_permission: true,
            ..TargetInfo::default()
        });
        let t = &self.threads[tid];
        let exec = t.exec.as_ref().expect("active run");
        let call = &exec.calls[index];
        let mut run = t.latest_run.clone().expect("active run");
        let server = match &descriptor.binding {
            Binding::Mcp {
                server, endpoint, ..
            } => Some((server.as_str(), endpoint.as_str())),
            _ => None,
        };
        let approval = ApprovalRecord {
            id: self.ids.next_id("a"),
            thread_id: tid.to_string(),
            run_id: run.id.clone(),
            call_id: call.call_id.clone(),
            tool_name: call.name.clone(),
            label: descriptor.label.clone(),
            params: call.params.clone().unwrap_or(Value::Null),
            origin: target.origin.clone(),
            url: target.url.clone(),
            tab_id: target.tab_id,
            frame_id: target.frame_id,
            page_url: target.page_url.clone(),
            document_id: target.document_id.clone(),
            element: target.element.clone(),
            server: server.map(|(name, _)| name.to_string()),
            server_url: server.map(|(_, url)| url.to_string()),
            status: ApprovalStatus::Pending,
            created_at: now,
            decided_at: None,
        };
        run.state = RunState::WaitingApproval;
        run.pending_approval = Some(approval.id.clone());
        run.revision += 1;
        run.updated_at = now;
        let approval_id = approval.id.clone();
        let mut unit = UnitOfWork::new();
        unit.put(Record::Approval(approval)).put(Record::Run(run));
        let token = self.persist(tid, unit, Then::ApprovalAsked { index, approval_id });
        self.set_phase(tid, Phase::Persisting(token));
    }

    /// The question is durable: show it.
    pub(super) fn after_approval_asked(
        &mut self,
        now: u64,
        tid: &str,
        index: usize,
        approval_id: String,
        unit: &UnitOfWork,
    ) {
        self.announce(tid, unit);
        if self.take_pending_finish(now, tid) {
            return;
        }
        self.set_phase(
            tid,
            Phase::WaitingApproval {
                index,
                approval_id: approval_id.clone(),
            },
        );
        self.present_approval(tid, &approval_id);
    }

    /// Send `approval.request` for a pending approval to the thread's clients.
    pub(super) fn present_approval(&mut self, tid: &str, approval_id: &str) {
        let t = &self.threads[tid];
        let Some(approval) = t.approvals.iter().find(|a| a.id == approval_id).cloned() else {
            return;
        };
        self.broadcast(
            tid,
            Event::ApprovalRequest {
                thread_id: tid.to_string(),
                turn_id: approval.run_id.clone(),
                approval,
            },
        );
    }

    #[inline(never)]
    pub(super) fn op_approval_response(
        &mut self,
        now: u64,
        reply: Reply,
        thread_id: &str,
        approval_id: &str,
        decision: ApprovalDecision,
    ) {
        let Some(t) = self.threads.get(thread_id) else {
            return self.reject(&reply, ErrorKind::NotFound, "No such thread.");
        };
        let Some(approval) = t.approvals.iter().find(|a| a.id == approval_id).cloned() else {
            return self.reject(&reply, ErrorKind::NotFound, "No such approval request.");
        };
        if approval.status != ApprovalStatus::Pending {
            // Already decided: the same answer is acknowledged again, a
            // different one is refused; neither changes the first outcome.
            return if approval.status == decision.status() {
                // With a receipt of its own, like every other ACK.
                let result = json!({ "approvalId": approval.id, "status": approval.status });
                self.ack_with_receipt(now, thread_id, reply, result)
            } else {
                let message = match approval.status {
                    ApprovalStatus::AcceptedOnce => {
                        "This approval was already answered: allowed once."
                    }
                    ApprovalStatus::AcceptedForSite => {
                        "This approval was already answered: allowed for the site."
                    }
                    ApprovalStatus::Declined => "This approval was already answered: declined.",
                    // (Pending does not reach here: it was checked above.)
                    ApprovalStatus::Cancelled | ApprovalStatus::Pending => {
                        "This approval was already withdrawn: its run ended."
                    }
                };
                self.reject(&reply, ErrorKind::InvalidCommand, message)
            };
        }
        let waiting = match t.exec.as_ref().map(|e| &e.phase) {
            Some(Phase::WaitingApproval {
                index,
                approval_id: a,
            }) if a == approval_id => Some(*index),
            _ => None,
        };
        let Some(index) = waiting else {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "The run is not waiting for this approval.",
            );
        };
        // A tool without a page (the embedding extension's own tools) has no
        // site to remember: it asks before every write.
        // A local file (`file://`) has no site either: allowing "the site"
        // would allow every file on the disk.
        if decision == ApprovalDecision::AcceptForSite && !gatekeeper::is_site(&approval.origin) {
            return self.reject(
                &reply,
                ErrorKind::InvalidCommand,
                "This action is not on a site, so it cannot be allowed for a site: allow it once or decline.",
            );
        }
        let mut decided = approval.clone();
        decided.status = decision.status();
        decided.decided_at = Some(now);
        let result = json!({ "approvalId": approval.id, "status": decided.status });
        let mut unit = match decision {
            // A decline is a tool result the model sees (not a breaker failure).
            ApprovalDecision::Decline => {
                let on = if approval.origin.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", approval.origin)
                };
                let content = format!(
                    "The user declined this action ({}{on}). Do not retry it; ask the user or choose another way.",
                    approval.label
                );
                let mut unit =
                    self.tool_result_unit(now, thread_id, index, ToolStatus::Denied, content, None);
                // The result is written with the answer, which memory does
                // not hold until this unit commits.
                for record in &mut unit.puts {
                    if let Record::Node(Node {
                        body: NodeBody::ToolResult { approval, .. },
                        ..
                    }) = record
                    {
                        *approval = Some(ApprovalNote::of(&decided));
                    }
                }
                unit
            }
            _ => {
                let mut run = self.threads[thread_id]
                    .latest_run
                    .clone()
                    .expect("active run");
                run.state = RunState::ExecutingTools;
                run.revision += 1;
                run.updated_at = now;
                let mut unit = UnitOfWork::new();
                unit.put(Record::Run(run));
                unit
            }
        };
        if let Some(run) = unit.run_mut() {
            run.pending_approval = None;
        }
        unit.put(Record::Approval(decided));
        if decision == ApprovalDecision::AcceptForSite {
            let version = self
                .site_rules
                .get(&approval.origin)
                .map_or(1, |r| r.version + 1);
            unit.put(Record::SiteRule(SiteRule {
                origin: approval.origin.clone(),
                allow_writes: true,
                version,
                created_at: now,
            }));
        }
        if decision == ApprovalDecision::Decline {
            self.mark_call_done(thread_id, index);
        }
        let token = self.persist_command(
            now,
            thread_id,
            unit,
            Then::ApprovalDecided {
                index,
                approval_id: approval.id.clone(),
                decision,
            },
            reply,
            result,
        );
        self.set_phase(thread_id, Phase::Persisting(token));
    }

    /// The decision is durable (and ACKed): move the run on.
    pub(super) fn after_approval_decided(
        &mut self,
        now: u64,
        tid: &str,
        index: usize,
        approval_id: String,
        decision: ApprovalDecision,
        unit: &UnitOfWork,
    ) {
        let turn_id = self.latest_run_id(tid);
        self.broadcast(
            tid,
            Event::ApprovalResolved {
                thread_id: tid.to_string(),
                turn_id,
                approval_id,
                status: decision.status(),
            },
        );
        self.announce(tid, unit);
        if self.take_pending_finish(now, tid) {
            return;
        }
        match decision {
            ApprovalDecision::Decline => self.run_next_tool(now, tid),
            _ => self.check_target_then_gate(now, tid, index),
        }
    }

    /// Right before dispatch (approved, or a Retry the user chose): the
    /// page the call at `index` acts on is checked again; a tool without a
    /// page (an MCP server's, the embedder's own) goes to its gate as it
    /// is.
    pub(super) fn check_target_then_gate(&mut self, now: u64, tid: &str, index: usize) {
        let targets_tab = self.threads[tid]
            .exec
            .as_ref()
            .and_then(|e| self.config.registry.get(&e.calls[index].name))
            .is_none_or(|d| d.binding.targets_tab());
        if targets_tab {
            self.resolve_target(tid, index)
        } else {
            self.gate(now, tid, index, None)
        }
    }

    /// Ask the driver which page (and frame) the call at `index` would act on.
    pub(super) fn resolve_target(&mut self, tid: &str, index: usize) {
        let resolve_id = self.next_handle();
        let call = &self.threads[tid].exec.as_ref().expect("active run").calls[index];
        let params = call.params.clone().ok();
        let write = call.recovery != Recovery::RetrySafe;
        let in_page = self
            .config
            .registry
            .get(&call.name)
            .is_some_and(|d| d.binding == Binding::Page);
        let names_element = params.as_ref().is_some_and(|p| {
            ["ref", "text"].iter().any(|key| {
                p.get(key)
                    .and_then(Value::as_str)
                    .is_some_and(|v| !v.trim().is_empty())
            })
        });
        self.set_phase(tid, Phase::Resolving { index, resolve_id });
        self.effects.push_back(Effect::ResolveTarget {
            resolve_id,
            thread_id: tid.to_string(),
            params,
            write,
            describe: write && in_page && names_element,
        });
    }

    /// The sites whose writes run without asking, by origin (reads only).
    #[inline(never)]
    pub(super) fn op_site_rules_list(&mut self, reply: Reply) {
        let rules = self.site_rule_summaries();
        self.ack(&reply, json!({ "rules": rules }));
    }

    /// The site rules by origin, as clients list them.
    pub(super) fn site_rule_summaries(&self) -> Vec<SiteRuleSummary> {
        let mut rules: Vec<SiteRuleSummary> = self
            .site_rules
            .values()
            .map(SiteRuleSummary::from)
            .collect();
        crate::sorting::sort_by(&mut rules, |a, b| a.origin.cmp(&b.origin));
        rules
    }

    /// Every extension page is shown the site rules as saved: a panel with
    /// Settings open redraws the list another panel (or an approval in
    /// another thread) changed.
    pub(super) fn broadcast_site_rules(&mut self) {
        let rules = self.site_rule_summaries();
        self.send_to_pages(Event::SiteRulesUpdated { rules });
    }

    /// Remove a site's rule. The ACK follows the saved removal; the rule
    /// leaves memory with it (`apply_to_memory`), so from the ACK on every write
    /// on that origin asks again. A call the rule already let through (its
    /// gate passed before this op arrived) still runs.
    #[inline(never)]
    pub(super) fn op_site_rule_revoke(&mut self, now: u64, reply: Reply, origin: &str) {
        if !self.site_rules.contains_key(origin) {
            return self.reject(
                &reply,
                ErrorKind::NotFound,
                "This site has no rule: its actions already ask first.",
            );
        }
        let mut unit = UnitOfWork::new();
        unit.delete(stores::SITE_RULES, origin);
        let result = json!({ "origin": origin });
        // Of no thread: the rule is the profile's.
        self.command(now, "", unit, reply, result, Follow::AckOnly);
    }
}

impl Engine {
    /// The calls from `index` on that may run together: valid, parallel-safe
    /// reads that act on the tab or are the extension's own (no page), at
    /// most `parallel_reads` of them.
    pub(super) fn parallel_batch(&self, tid: &str, index: usize) -> Vec<usize> {
        let exec = self.threads[tid].exec.as_ref().expect("active run");
        exec.calls
            .iter()
            .enumerate()
            .skip(index)
            .take_while(|(_, c)| {
                !c.done
                    && c.params.is_ok()
                    && self.config.registry.get(&c.name).is_some_and(|d| {
                        d.parallel_safe
                            && (d.binding.targets_tab() || d.binding == crate::tools::Binding::Host)
                    })
            })
            .map(|(i, _)| i)
            .take(self.config.parallel_reads.max(1))
            .collect()
    }

    pub(super) fn start_batch(&mut self, now: u64, tid: &str, indices: Vec<usize>) {
        let resolve_id = self.next_handle();
        let exec = self.threads[tid].exec.as_ref().expect("active run");
        let on_page = indices.iter().any(|&i| {
            self.config
                .registry
                .get(&exec.calls[i].name)
                .is_some_and(|d| d.binding.targets_tab())
        });
        self.set_phase(
            tid,
            Phase::Batch {
                resolve_id,
                running: Vec::new(),
                results: Vec::new(),
                indices,
            },
        );
        if !on_page {
            // Only the extension's own reads: no page to find (and none of
            // them needs one).
            let none = Err("No page was resolved for this tool.".to_string());
            self.dispatch_batch(now, tid, resolve_id, none);
            return;
        }
        // Parallel page reads (page_snapshot, read_page) take no ref: the top document.
        self.effects.push_back(Effect::ResolveTarget {
            resolve_id,
            thread_id: tid.to_string(),
            params: None,
            write: false,
            describe: false,
        });
    }

    /// The batch's page is known: gate each read and dispatch the allowed ones together.
    pub(super) fn batch_target_resolved(
        &mut self,
        now: u64,
        resolve_id: u64,
        target: Result<TargetInfo, String>,
    ) {
        let found =
            self.threads
                .iter()
                .find_map(|(id, t)| match t.exec.as_ref().map(|e| &e.phase) {
                    Some(Phase::Batch { resolve_id: r, .. }) if *r == resolve_id => {
                        Some(id.clone())
                    }
                    _ => None,
                });
        if let Some(tid) = found {
            self.dispatch_batch(now, &tid, resolve_id, target);
        }
    }

    /// Gate each read of the batch and dispatch the allowed ones together.
    /// `target` is the page the batch's page reads act on, or why there is
    /// none; the extension's own reads act on no page, whatever it is.
    fn dispatch_batch(
        &mut self,
        now: u64,
        tid: &str,
        resolve_id: u64,
        target: Result<TargetInfo, String>,
    ) {
        let indices = match self.threads[tid].exec.as_ref().map(|e| &e.phase) {
            Some(Phase::Batch { indices, .. }) => indices.clone(),
            _ => return,
        };
        let tid = tid.to_string();
        let mut running = Vec::new();
        let mut results = Vec::new();
        for index in indices.iter().copied() {
            let exec = self.threads[&tid].exec.as_ref().expect("active run");
            let call = exec.calls[index].clone();
            let descriptor = self.config.registry.get(&call.name).cloned();
            let on_page = descriptor.as_ref().is_some_and(|d| d.binding.targets_tab());
            let target = match (&target, on_page) {
                (_, false) => None,
                (Ok(t), true) => Some(t.clone()),
                (Err(message), true) => {
                    results.push(ResultParts::new(
                        index,
                        ToolStatus::Error,
                        message.clone(),
                        None,
                    ));
                    continue;
                }
            };
            let verdict = descriptor
                .as_ref()
                .map(|d| {
                    let rule = target.as_ref().and_then(|t| self.site_rules.get(&t.origin));
                    gatekeeper::verdict(d, target.as_ref(), rule)
                })
                .unwrap_or(Verdict::Deny("Unknown tool.".into()));
            let exec = self
                .threads
                .get_mut(&tid)
                .and_then(|t| t.exec.as_mut())
                .expect("active run");
            if let Some(target) = &target {
                exec.targets.insert(index, target.clone());
            }
            match verdict {
                Verdict::Allow => {
                    let dispatch_id = self.next_handle();
                    running.push((dispatch_id, index));
                    self.effects.push_back(Effect::DispatchTool(ToolDispatch {
                        retry_safe: call.recovery == Recovery::RetrySafe,
                        dispatch_id,
                        thread_id: tid.clone(),
                        call_id: call.call_id,
                        name: call.name,
                        params: call.params.unwrap_or(Value::Null),
                        target,
                        binding: descriptor
                            .map(|d| d.binding)
                            .unwrap_or(crate::tools::Binding::Page),
                    }));
                }
                Verdict::Deny(reason) => {
                    results.push(ResultParts::new(index, ToolStatus::Denied, reason, None))
                }
                Verdict::Ask => results.push(ResultParts::new(
                    index,
                    ToolStatus::Denied,
                    "This read needs approval; it is only run on its own.".into(),
                    None,
                )),
            }
        }
        let done = running.is_empty();
        self.set_phase(
            &tid,
            Phase::Batch {
                resolve_id,
                running,
                results,
                indices,
            },
        );
        if done {
            self.persist_batch(now, &tid);
        }
    }

    /// One read of a batch finished; when the last one has, persist them all.
    pub(super) fn batch_result(
        &mut self,
        now: u64,
        tid: &str,
        dispatch_id: u64,
        result: ResultParts,
    ) {
        let Some(Phase::Batch {
            running, results, ..
        }) = self
            .threads
            .get_mut(tid)
            .and_then(|t| t.exec.as_mut())
            .map(|e| &mut e.phase)
        else {
            return;
        };
        running.retain(|(d, _)| *d != dispatch_id);
        results.push(result);
        if running.is_empty() {
            self.persist_batch(now, tid);
        }
    }

    fn persist_batch(&mut self, now: u64, tid: &str) {
        let results = match self.threads[tid].exec.as_ref().map(|e| &e.phase) {
            Some(Phase::Batch { results, .. }) => results.clone(),
            _ => return,
        };
        self.persist_results(now, tid, results, None);
    }
}
