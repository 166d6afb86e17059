// Wire protocol of the side panel, the service worker and content scripts
// (docs/protocol.md), as TypeScript declarations.
//
// GENERATED from src/protocol.rs and src/model.rs by tests/suite/protocol_ts.rs:
// do not edit. Regenerate with `make protocol-types`; `cargo test protocol_ts`
// fails when this file is stale.

/** Any JSON value (`serde_json::Value`). */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** A client operation. Each variant documents the events it causes. */
export type Op =
  /** Subscribe to a thread (null: the most recent one) → `initialized`. */
  | {
    type: "initialize";
    threadId?: string | null;
  } & Submission
  /** Create an empty thread → `command.ack{threadId}`, `threads.updated`, `initialized`. */
  | {
    type: "thread.create";
  } & Submission
  /**
   * Copy a thread's conversation up to a message into a new thread →
   * `command.ack{threadId}`, `threads.updated`, `initialized` (the client
   * is subscribed to the fork). `nodeId` null: up to the current end.
   */
  | {
    type: "thread.fork";
    threadId: string;
    nodeId?: string | null;
  } & Submission
  /**
   * Make another branch of a thread the active one → `command.ack{leafId}`,
   * `initialized` to every client subscribed to the thread. `nodeId` is any
   * message of the thread; the branch's newest tip under it becomes the leaf.
   * Refused while a turn runs or waits for an answer on the thread.
   */
  | {
    type: "thread.selectBranch";
    threadId: string;
    nodeId: string;
  } & Submission
  /**
   * Give a thread the title the user chose → `command.ack{threadId,
   * title}` once saved, then `threads.updated`. The title is trimmed, its
   * runs of white space made one space; empty or longer than
   * `engine::MAX_TITLE_CHARS` (80) is `invalid_command`. Taken while
   * the thread's turn runs too; sent while a change of the thread is
   * being saved, it waits for that save. From then on no model title
   * replaces it.
   */
  | {
    type: "thread.rename";
    threadId: string;
    title: string;
  } & Submission
  /**
   * Delete a thread and everything in it → `command.ack`, `threads.updated`.
   * While the thread's turn runs it is refused (`invalid_command`), unless
   * `stopTurn` is true: then the turn is stopped as by `turn.interrupt`
   * (its end is saved and announced with `turn.complete`) and the thread
   * is deleted after that. Sent while a change of the thread is being
   * saved, it waits for that save.
   */
  | {
    type: "thread.delete";
    threadId: string;
    stopTurn?: boolean;
  } & Submission
  /**
   * Start a turn (or queue it when one is running) → `command.ack`, `turn.start`, items…, `turn.complete`.
   * With `replaces` (the id of a message that started a turn on the active
   * path) the new turn starts a sibling branch in its place ("edit and
   * resend"): the old branch stays in the thread, subscribers get a fresh
   * `initialized`; refused (not queued) while a turn runs.
   */
  | {
    type: "turn.submit";
    threadId?: string | null;
    input: UserInput;
    replaces?: string | null;
  } & Submission
  /** Add input to the running turn → `command.ack{steerId}` after the steer is durable. */
  | {
    type: "turn.steer";
    threadId: string;
    expectedTurnId: string;
    input: UserInput;
  } & Submission
  /** Queue a next turn → `command.ack{queueItemId}`, `queue.updated`. */
  | {
    type: "turn.enqueue";
    threadId: string;
    input: UserInput;
  } & Submission
  /** Remove a queued turn → `command.ack`, `queue.updated`. */
  | {
    type: "queue.remove";
    threadId: string;
    itemId: string;
  } & Submission
  /**
   * Change the text of a queued turn that has not started →
   * `command.ack{itemId}`, `queue.updated`.
   */
  | {
    type: "queue.update";
    threadId: string;
    itemId: string;
    input: UserInput;
  } & Submission
  /** Stop the running turn now → `command.ack`, `turn.complete{interrupted}`. */
  | {
    type: "turn.interrupt";
    threadId: string;
  } & Submission
  /**
   * Continue a thread whose last run was interrupted or failed → `command.ack`, `turn.start`, …
   * `input` defaults to "Continue." (the model sees it as the user's message).
   */
  | {
    type: "run.resume";
    threadId: string;
    input?: UserInput | null;
  } & Submission
  /**
   * Answer an approval request → `command.ack` once the decision is
   * durable, `approval.resolved`, then the run continues.
   */
  | {
    type: "approval.response";
    threadId: string;
    approvalId: string;
    decision: ApprovalDecision;
  } & Submission
  /**
   * Answer the model's question (`ask_user`) → `command.ack` once the
   * answer is durable, `interaction.resolved`, then the run continues.
   */
  | {
    type: "interaction.response";
    threadId: string;
    interactionId: string;
    answer: string;
  } & Submission
  /**
   * Answer an MCP server's request for input (an `interaction.request`
   * whose record names a `server`) → `command.ack{interactionId, status,
   * action}` once the answer is durable, `interaction.resolved`, then the
   * answer goes to the server, whose call goes on. `content` (the values,
   * by field name) only with `accept`; checked against the record's
   * `form` (`invalid_command` names the field that does not fit).
   */
  | {
    type: "elicitation.response";
    threadId: string;
    interactionId: string;
    action: ElicitationAction;
    content?: JsonValue | null;
  } & Submission
  /**
   * The part of the active path before `beforeNodeId` (at most `limit`
   * nodes, default and maximum as for snapshots) → `command.ack{nodes,
   * olderNodes}`: a page of earlier history for a client that got the
   * tail in `initialized`. Reads only; no receipt.
   */
  | {
    type: "thread.history";
    threadId: string;
    beforeNodeId: string;
    limit?: number | null;
  } & Submission
  /**
   * One file a view showed without its content (`kind: "omitted"`):
   * the `index`th attachment of `ownerId`, a message on the active path,
   * a queued turn or a pending steer → `command.ack{ownerId, index,
   * attachment}`. Reads only; no receipt.
   */
  | {
    type: "attachment.get";
    threadId: string;
    ownerId: string;
    index: number;
  } & Submission
  /**
   * A tiny real request with these settings (the API key is the stored
   * one) → `command.ack{ok: true, model, reply, latencyMs}` or
   * `command.reject` with the provider's typed error. Changes nothing.
   */
  | {
    type: "provider.test";
    profile: ProviderProfile;
  } & Submission
  /**
   * The embedding extension's provider settings defaults, as the engine
   * checked them (`extension/settings-defaults.js`; never an `apiKey`)
   * → `command.ack{defaults}`: what a settings form shows for the fields
   * the user has not set. Reads only; no receipt.
   */
  | {
    type: "settings.defaults";
  } & Submission
  /**
   * The sites where write tools run without asking (rules made by
   * `acceptForSite`) → `command.ack{rules: [{origin, allowWrites,
   * createdAt}]}`, by origin. Reads only; no receipt.
   */
  | {
    type: "siteRules.list";
  } & Submission
  /**
   * The embedding extension's MCP servers, each with its state and the
   * tools of it the agent is offered → `command.ack{servers:
   * McpServerSummary[]}`, in the order of `extension/mcp-servers.js`.
   * Reads only; no receipt.
   */
  | {
    type: "mcpServers.list";
  } & Submission
  /**
   * Ask MCP servers for their tools again (Settings' "Check again": one
   * was unreachable, or its tools changed) → `command.ack{servers}` with
   * those asked in state `listing`; `mcpServers.updated` follows with
   * each outcome. `name`: that server; none: every server that can be
   * used. Reads only; no receipt.
   */
  | {
    type: "mcpServers.refresh";
    name?: string | null;
  } & Submission
  /**
   * Sign in to the MCP server `name`, which asks for it (Settings'
   * "Sign in"): the worker opens the server's sign-in window →
   * `command.ack{servers}` at once; `mcpServers.updated` follows with
   * the outcome (`ready` with its tools, or `sign_in_needed` with why).
   * No receipt: sent again, it opens the window again.
   */
  | {
    type: "mcpServers.signIn";
    name: string;
  } & Submission
  /**
   * Forget the user's sign-in to the MCP server `name` →
   * `command.ack{servers}`; it is asked for its tools again (a server
   * that needs a sign-in then says so). No receipt.
   */
  | {
    type: "mcpServers.signOut";
    name: string;
  } & Submission
  /**
   * Remove a site's rule → `command.ack{origin}` once the removal is
   * saved: from then on every write tool on that origin asks again.
   * `not_found` when the site has no rule.
   */
  | {
    type: "siteRule.revoke";
    origin: string;
  } & Submission
  /** Decide a `paused_uncertain` write → `command.ack`, then the run continues. */
  | {
    type: "run.resolveUncertain";
    threadId: string;
    choice: UncertainChoice;
  } & Submission;

/** Identity of a command: who sent it and which user action it is. */
export interface Submission {
  /** Stable per client instance (one side panel load). */
  clientId: string;
  /** Unique per user action; a repeated id is a retry of the same action. */
  submissionId: string;
}

/**
 * User input of a turn, a steer or a queued turn: what the user typed and
 * the files attached to it.
 */
export interface UserInput {
  /** The text the user typed. */
  text: string;
  attachments?: Attachment[];
}

/**
 * A file attached to a user message (spec 000 §3, 004 §2.1). It lives in
 * the message's node (and in the steer or queued turn before that), so it
 * is written in the same transaction as the message it belongs to.
 *
 * Images and PDFs reach vision models as image and document blocks (both
 * providers read PDFs through their vision models); other models get a
 * placeholder, decided per request (a later switch to a vision model sees
 * them again). Text files reach the model as a delimited block after the
 * message's text.
 */
export type Attachment =
  | {
    kind: "image";
    name: string;
    /** One of [`ATTACHMENT_IMAGE_TYPES`]. */
    mediaType: string;
    /** Base64 without the `data:` prefix. */
    data: string;
  }
  | {
    kind: "text";
    name: string;
    /** As the file said (`text/plain`, `text/csv`, `application/json`…). */
    mediaType: string;
    text: string;
  }
  | {
    kind: "pdf";
    name: string;
    /** `application/pdf`. */
    mediaType: string;
    /** Base64 without the `data:` prefix. */
    data: string;
  }
  /**
   * A file as a client is shown it without its content
   * ([`Attachment::omitted`]): what it is and how large. `attachment.get`
   * fetches the file itself. Only views carry one: the engine takes
   * none in an input (the file itself must be sent) and stores none.
   */
  | {
    kind: "omitted";
    name: string;
    mediaType: string;
    /** The kind of the file left out. */
    of: FileKind;
    /** Its size as [`Attachment::size`] counts it. */
    size: number;
  };

/** The kinds of file a message can carry. */
export type FileKind =
  | "image"
  | "text"
  | "pdf";

/** The user's answer to an approval request. */
export type ApprovalDecision =
  | "acceptOnce"
  /** Accept, and allow this tool's kind of action on this site from now on. */
  | "acceptForSite"
  | "decline";

/** How the user answered an MCP server's request for input. */
export type ElicitationAction =
  /** Sent the values filled in. */
  | "accept"
  /** Refused to give them. */
  | "decline"
  /** Dismissed the request without deciding. */
  | "cancel";

/** The frozen provider settings of a run (never the API key). */
export interface ProviderProfile {
  /** `openai` or `anthropic`. */
  kind: string;
  baseUrl: string;
  model: string;
  maxOutputTokens?: number | null;
  /** Temperature ×100, kept integral so the profile stays `Eq` and digestible. */
  temperatureCenti?: number | null;
  /** The model accepts images (screenshots are offered and sent). */
  vision?: boolean;
  /** The model can call tools; without it no tool schema is sent. */
  toolUse?: boolean;
  /**
   * Tokens (input + output) a run may spend before it pauses with
   * `budget_pause` at the next safe boundary; None: no budget.
   */
  tokenBudget?: number | null;
  /**
   * The model's context window in tokens; when the outbound request is
   * estimated above 80% of it, or above what leaves room for the answer
   * (`engine::compaction::compaction_threshold`), the conversation is
   * compacted first.
   * None: compaction happens only when the provider reports an overflow.
   */
  contextWindow?: number | null;
}

/** What to do with a write whose outcome is unknown after a crash. */
export type UncertainChoice =
  /** Dispatch it again (the user accepts a possible repeat). */
  | "retry"
  /** The user saw that it happened: record success. */
  | "mark_done"
  /** Record failure; the model decides what next. */
  | "fail";

/** An event as sent on the wire: the event plus ordering metadata. */
export type EventEnvelope = {
  /**
   * Increases by one per event of this engine instance, from 1; 0 is
   * the `initialized` that sw.js sent from the snapshot cache before the
   * engine started (`engine/snapshot_cache.rs`).
   */
  seq: number;
  /** Random per engine instance; a new epoch means the SW restarted. */
  epoch: string;
} & Event;

/** An engine event. `seq` and `epoch` are added by [`EventEnvelope`]. */
export type Event =
  | {
    type: "initialized";
    snapshot: Snapshot;
  }
  | {
    type: "command.ack";
    submissionId: string;
    opType: string;
    result: JsonValue;
  }
  | {
    type: "command.reject";
    submissionId: string;
    opType: string;
    error: ErrorInfo;
  }
  | {
    type: "threads.updated";
    threads: ThreadSummary[];
  }
  /**
   * The sites where write tools run without asking, by origin, sent to
   * every extension page once a change of them is saved (a rule made by
   * `acceptForSite`, one removed by `siteRule.revoke`).
   */
  | {
    type: "siteRules.updated";
    rules: SiteRuleSummary[];
  }
  /**
   * The MCP servers as `mcpServers.list` answers, sent to every
   * extension page when one's state changes (its tools listed, asking
   * failed).
   */
  | {
    type: "mcpServers.updated";
    servers: McpServerSummary[];
  }
  | {
    type: "turn.start";
    threadId: string;
    turnId: string;
  }
  | {
    type: "item.start";
    threadId: string;
    turnId: string;
    itemId: string;
    kind: ItemKind;
    label?: string | null;
  }
  | {
    type: "item.delta";
    threadId: string;
    turnId: string;
    itemId: string;
    delta: Delta;
  }
  | {
    type: "item.complete";
    threadId: string;
    turnId: string;
    node: Node;
  }
  | {
    type: "token.usage";
    threadId: string;
    turnId: string;
    usage: Usage;
    turnTotal: UsageTotals;
    threadTotal: UsageTotals;
  }
  | {
    type: "queue.updated";
    threadId: string;
    queue: QueueItem[];
  }
  /**
   * A provider request failed with a retryable error before any text was
   * shown; it is sent again after `delayMs`, at `retryAt` (ms since the
   * epoch by the worker's clock, which is the browser's: a panel that
   * gets the event late still counts down to the right moment).
   */
  | {
    type: "run.retry";
    threadId: string;
    turnId: string;
    attempt: number;
    maxAttempts: number;
    delayMs: number;
    retryAt: number;
    error: ErrorInfo;
  }
  /** The run waits for the user to approve a tool call. */
  | {
    type: "approval.request";
    threadId: string;
    turnId: string;
    approval: ApprovalRecord;
  }
  /** An approval was decided (or cancelled) durably. */
  | {
    type: "approval.resolved";
    threadId: string;
    turnId: string;
    approvalId: string;
    status: ApprovalStatus;
  }
  /** The model asks the user a question; the run waits. */
  | {
    type: "interaction.request";
    threadId: string;
    turnId: string;
    interaction: InteractionRecord;
  }
  /** A question was answered (or withdrawn) durably. */
  | {
    type: "interaction.resolved";
    threadId: string;
    turnId: string;
    interactionId: string;
    status: InteractionStatus;
    /** How the user answered an MCP server's request for input. */
    action?: ElicitationAction | null;
  }
  | {
    type: "run.status";
    threadId: string;
    turnId: string;
    state: RunState;
  }
  | {
    type: "turn.complete";
    threadId: string;
    turnId: string;
    stopReason: StopReason;
    error?: ErrorInfo | null;
  };

/** Everything a (re)connecting client needs to render. */
export interface Snapshot {
  protocolVersion: number;
  threads: ThreadSummary[];
  thread?: ThreadView | null;
}

/** The thread list entry. */
export interface ThreadSummary {
  id: string;
  title: string;
  updatedAt: number;
}

/** The thread a client sees after `initialize`. */
export interface ThreadView {
  id: string;
  title: string;
  /**
   * The tail of the active path, root side first: its last
   * `EngineConfig::snapshot_nodes` nodes, cut where no tool call is
   * separated from its result.
   */
  nodes: Node[];
  /**
   * How many nodes of the active path come before `nodes[0]`
   * (`thread.history` pages them in).
   */
  olderNodes?: number;
  /** The latest run of the thread, if any. */
  run?: Run | null;
  queue: QueueItem[];
  pendingSteers: PendingSteerView[];
  /** The approval the run waits for, re-presented after a restart. */
  pendingApproval?: ApprovalRecord | null;
  /** The question the run waits for, re-presented after a restart. */
  pendingInteraction?: InteractionRecord | null;
  /** Where the active path meets other branches of this thread, root first. */
  branches?: BranchPoint[];
}

/** One node of the append-only conversation tree. */
export type Node = {
  id: string;
  threadId: string;
  parentId?: string | null;
  createdAt: number;
} & NodeBody;

/** What a node holds. */
export type NodeBody =
  /** Start of a turn. */
  | {
    kind: "turn_context";
    turnId: string;
    model: string;
  }
  | {
    kind: "user_message";
    text: string;
    steered?: boolean;
    /**
     * Files the user attached (images, text files), kept with the
     * message and sent with it on every request.
     */
    attachments?: Attachment[];
  }
  | {
    kind: "assistant_message";
    text: string;
    reasoning?: string | null;
    stopReason: StopReason;
    usage?: Usage | null;
    /** A prefix kept after an interrupt or an error. */
    interrupted?: boolean;
    model: string;
    /**
     * Provider-private data (e.g. thinking signatures), replayed only to
     * the provider that produced it; never shown to the model otherwise.
     */
    providerPrivate?: JsonValue | null;
  }
  | {
    kind: "tool_call";
    callId: string;
    /** The assistant message that requested this call. */
    assistantId: string;
    name: string;
    label: string;
    arguments: JsonValue;
  }
  | {
    kind: "tool_result";
    callId: string;
    name: string;
    status: ToolStatus;
    /** What the model sees. */
    content: string;
    /** UI-only details (highlight box, thumbnail); never sent to the model. */
    details?: JsonValue | null;
    /**
     * Images for the model (a screenshot); replaced by a placeholder
     * for models without vision.
     */
    images?: ImageData[];
    /**
     * The user's answer when the call asked for approval (UI only,
     * never sent to the model): the conversation keeps what the user
     * authorized after the approval record's retention ends.
     */
    approval?: ApprovalNote | null;
  }
  | {
    kind: "notice";
    level: NoticeLevel;
    text: string;
  }
  /**
   * A compaction checkpoint: the model-written summary that replaces
   * everything before it in the outbound view but the tail it keeps
   * (`kept_nodes`, sent after the summary); the history itself stays.
   */
  | {
    kind: "compaction";
    /** Written by the model. */
    summary: string;
    /** How many path nodes the summary stands for. */
    compactedNodes: number;
    /**
     * Copied by the engine, not the model: the user's messages of the
     * task in progress that the summary stands for, delimited and
     * size-bounded (empty in checkpoints written before it existed;
     * older checkpoints also copied the queued messages here).
     */
    verbatim?: string;
    /**
     * How many path nodes right before this checkpoint it does not
     * summarize: the model's latest message with its tool calls, their
     * results and the messages after it, sent as they are after the
     * summary. 0 in checkpoints written before it existed (they
     * summarize everything before them).
     */
    keptNodes?: number;
  };

/** Why the provider stopped one response, or why a turn ended. */
export type StopReason =
  /** The model finished its answer. */
  | "end"
  /** The model wants tools to run (only for an assistant message). */
  | "tool_use"
  | "max_tokens"
  | "content_filter"
  | "interrupted"
  | "budget_pause"
  | "error"
  /** The failure breaker disabled tools and the model gave its final reply. */
  | "tools_disabled";

/** Token usage as reported by a provider. */
export interface Usage {
  /**
   * Every prompt token, cached ones included (`cache_read` and
   * `cache_write` are parts of it): OpenAI's `prompt_tokens`, Anthropic's
   * `input_tokens` plus its two cache counts (replies recorded before
   * 2026-12-06 kept Anthropic's uncached count alone).
   */
  input: number;
  output: number;
  cacheRead?: number;
  cacheWrite?: number;
  reasoning?: number;
}

/** Outcome of a tool call as the model and the UI see it. */
export type ToolStatus =
  | "ok"
  | "error"
  /** Dispatched, then cut off by an interrupt. */
  | "interrupted"
  /** Never dispatched (interrupt or failure before it started). */
  | "aborted"
  /** The user or a policy declined it. */
  | "denied";

/** An image as the model receives it. */
export interface ImageData {
  /**
   * `image/png` or `image/jpeg` (a screenshot), or one of
   * [`ATTACHMENT_IMAGE_TYPES`] (an attached image).
   */
  mediaType: string;
  /** Base64 without the `data:` prefix. */
  data: string;
}

/**
 * How the user answered a call's approval request, kept on its
 * `tool_result` node: `accepted_once`, `accepted_for_site`, `declined`,
 * or `cancelled` (the turn ended before an answer); or, for a call that
 * needed approval and ran without being asked, the site rule that let it.
 */
export interface ApprovalNote {
  status: ApprovalStatus;
  /** The origin the user was asked about. */
  origin: string;
  decidedAt?: number | null;
  /**
   * The call was not asked about: the user's rule for the site
   * ("Allow on this site", made at `decided_at`) let it run
   * (`status` is then `accepted_for_site`).
   */
  byRule?: boolean;
}

/** Where an approval stands. */
export type ApprovalStatus =
  | "pending"
  | "accepted_once"
  | "accepted_for_site"
  | "declined"
  /** The run ended (interrupt) before anyone answered. */
  | "cancelled";

/** Severity of a display-only notice. */
export type NoticeLevel =
  | "info"
  | "warning"
  | "error";

/** One turn's execution, persisted with its cursor. */
export interface Run {
  /** Also the turn id. */
  id: string;
  threadId: string;
  state: RunState;
  createdAt: number;
  updatedAt: number;
  revision: number;
  /** Number of provider requests made so far. */
  step: number;
  profile: ProviderProfile;
  /** Consecutive tool failures (the failure breaker). */
  consecutiveFailures?: number;
  /** Set when the breaker disabled tools for the final reply. */
  toolsDisabled?: boolean;
  /** A never-retry tool that was dispatched and has no result yet. */
  inFlightTool?: InFlightTool | null;
  /** The approval the run waits for (state `waiting_approval`). */
  pendingApproval?: string | null;
  /** The question the run waits for (state `waiting_interaction`). */
  pendingInteraction?: string | null;
  stopReason?: StopReason | null;
  error?: ErrorInfo | null;
  /** Usage of this run so far. */
  usage?: Usage;
}

/** Run states (DESIGN.md §4). */
export type RunState =
  | "queued"
  | "streaming_model"
  | "executing_tools"
  | "waiting_approval"
  | "waiting_interaction"
  | "completed"
  | "interrupted"
  | "failed"
  | "budget_paused"
  | "paused_uncertain";

/** A tool call that was dispatched and may have had an effect. */
export interface InFlightTool {
  callId: string;
  name: string;
}

/** A serializable error: what happened, in words a user can act on. */
export interface ErrorInfo {
  kind: ErrorKind;
  message: string;
}

/** Kinds of errors that cross the wire. The UI maps each to plain words. */
export type ErrorKind =
  /** The message could not be decoded as an op. */
  | "invalid_op"
  /** The op is well-formed but not allowed now (bad ids, wrong state). */
  | "invalid_command"
  /** The sender may not issue ops (a content script, a web page). */
  | "forbidden"
  /** No such thread / item. */
  | "not_found"
  /** The queue already holds its maximum number of turns. */
  | "queue_full"
  /** No provider is configured. */
  | "not_configured"
  /**
   * A started run cannot resume: its environment (tools, prompt,
   * transport) changed since it started.
   */
  | "environment_drift"
  /** The run environment exceeds a size limit. */
  | "environment_too_large"
  /** The provider rejected the API key. */
  | "auth"
  /** The provider does not know the model. */
  | "model_not_found"
  /** The request was larger than the model's context window. */
  | "context_overflow"
  /** The provider is rate limiting. */
  | "rate_limited"
  /** The provider account has no credit or quota left (not retried). */
  | "quota_exceeded"
  /** The provider is overloaded or failing (5xx, 529). */
  | "provider_unavailable"
  /** The provider sent something we cannot parse. */
  | "provider_protocol"
  /** The network failed. */
  | "network"
  /** The local store failed. */
  | "storage"
  /** A tool failed in a way that ends the run. */
  | "tool"
  /** An internal invariant failed. */
  | "internal";

/** A queued next turn. */
export interface QueueItem {
  id: string;
  threadId: string;
  /** Position key: lower runs first. */
  position: number;
  text: string;
  attachments?: Attachment[];
  createdAt: number;
}

/** A steer that is durable but not yet part of the conversation. */
export interface PendingSteerView {
  id: string;
  text: string;
  attachments?: Attachment[];
}

/** A durable question to the user: may this tool call run on this site? */
export interface ApprovalRecord {
  id: string;
  threadId: string;
  runId: string;
  callId: string;
  toolName: string;
  label: string;
  /** The full parameters the tool would run with. */
  params: JsonValue;
  /**
   * The page the call would act on (the frame's, when it acts in a
   * child frame: that is the origin the user approves).
   */
  origin: string;
  url: string;
  tabId: number;
  /** Chrome's frame id when the call acts in a child frame of the tab. */
  frameId?: number | null;
  /** The tab's own URL when the call acts in a child frame. */
  pageUrl?: string | null;
  /**
   * Chrome's id of the document the user was asked about: an approved
   * write runs on that document only (a reload or another page of the
   * same site meanwhile ends the call with an error, nothing done).
   */
  documentId?: string | null;
  /**
   * The element the call acts on as the page described it when the user
   * was asked (`TargetElement`): the card shows it, and the approved
   * write acts only on that element (the same ref, role and name), or
   * ends with an error, nothing done.
   */
  element?: TargetElement | null;
  /**
   * The MCP server the call would be sent to (its name in
   * `extension/mcp-servers.js`), for a tool of such a server.
   */
  server?: string | null;
  /** That server's endpoint. */
  serverUrl?: string | null;
  status: ApprovalStatus;
  createdAt: number;
  decidedAt?: number | null;
}

/**
 * One element of a page as the content script describes it: its ref, its
 * role, its accessible name (whitespace collapsed, at most
 * [`TargetElement::MAX_NAME`] characters) and its state words
 * (`value="…" checked (disabled)`, for the user's eyes only).
 *
 * An approved write carries the element the user was shown; the content
 * script acts only when the element it finds is that one (the same ref,
 * role and name, letter case aside), so what the card said is what is
 * clicked, or nothing is.
 */
export interface TargetElement {
  ref: string;
  role: string;
  name: string;
  state?: string;
}

/**
 * A durable question to the user: the model's (the `ask_user` tool), or
 * an MCP server's request for input during one of its tool calls
 * (`elicitation/create`; `server` is set, and `form` says what it asks).
 */
export interface InteractionRecord {
  id: string;
  threadId: string;
  runId: string;
  callId: string;
  /** The model's question, or the server's message. */
  question: string;
  /** Suggested answers (the user may also type another). */
  options?: string[];
  status: InteractionStatus;
  /** The user's answer to a question of the model's. */
  answer?: string | null;
  createdAt: number;
  answeredAt?: number | null;
  /** The MCP server asking (its name in `extension/mcp-servers.js`). */
  server?: string | null;
  /** That server's endpoint. */
  serverUrl?: string | null;
  /** The fields the server asks for. */
  form?: ElicitationForm | null;
  /** How the user answered the server. */
  action?: ElicitationAction | null;
  /** The values the user gave the server (with `accept`), by field name. */
  content?: JsonValue | null;
}

/** Where a question to the user stands. */
export type InteractionStatus =
  | "pending"
  /** Answered (a server's request: accepted, declined or cancelled, `action`). */
  | "answered"
  /**
   * The run ended before the user answered (or, for a server's request,
   * its call ended or the worker restarted: the call cannot go on).
   */
  | "cancelled";

/**
 * What an MCP server asks the user for (its `requestedSchema`, checked
 * and flattened into fields in the server's order: `crate::elicitation`).
 */
export interface ElicitationForm {
  fields: FormField[];
}

/** One value an MCP server asks for. */
export interface FormField {
  /** The key of the value in the answer. */
  name: string;
  type: FieldKind;
  title?: string | null;
  description?: string | null;
  required?: boolean;
  /** The only values allowed (a string field's `enum`). */
  options?: string[];
  /** What to show for each option (`enumNames`), same length. */
  optionLabels?: string[];
  format?: StringFormat | null;
  /** In characters. */
  minLength?: number | null;
  maxLength?: number | null;
  minimum?: number | null;
  maximum?: number | null;
  /** Filled in to begin with. */
  default?: JsonValue | null;
}

/** The kind of value a form field takes. */
export type FieldKind =
  | "string"
  | "number"
  | "integer"
  | "boolean";

/** The shape a string field's value must have. */
export type StringFormat =
  | "email"
  | "uri"
  | "date"
  | "date-time";

/**
 * A place where the conversation has alternatives: `nodeIds` are siblings
 * (same parent, oldest first) and `active` indexes the one on the active path.
 */
export interface BranchPoint {
  nodeIds: string[];
  active: number;
}

/** A site rule as a client lists it (`siteRules.list`, `siteRules.updated`). */
export interface SiteRuleSummary {
  origin: string;
  allowWrites: boolean;
  createdAt: number;
}

/**
 * An MCP server as a client lists it (`mcpServers.list`,
 * `mcpServers.updated`).
 */
export interface McpServerSummary {
  /** Its name in `extension/mcp-servers.js` (or as the user wrote it). */
  name: string;
  url: string;
  addedBy: McpServerOrigin;
  state: McpServerState;
  /** The tools of it the agent is offered now. */
  tools: McpToolSummary[];
  /** Why it is unreachable, or which of its tools were left out and why. */
  problem?: string | null;
  /** When its state last changed (ms since the epoch). */
  since: number;
  /** The user is signed in to it (a sign-in this extension keeps). */
  signedIn?: boolean;
  /** Its sign-in window is open (`mcpServers.signIn`). */
  signingIn?: boolean;
}

/** Who named an MCP server. */
export type McpServerOrigin =
  /** The embedding extension (`extension/mcp-servers.js`). */
  | "extension"
  /**
   * The user, in the side panel's Settings
   * (`chrome.storage.local.mcpUserServers`).
   */
  | "user";

/** Where the engine stands with an MCP server of the embedding extension's. */
export type McpServerState =
  /**
   * Its tools are being asked for (those it listed for an earlier
   * worker, if any, are offered meanwhile).
   */
  | "listing"
  /** It listed its tools to this worker. */
  | "ready"
  /**
   * Asking failed (`problem` says why); the tools it listed for an
   * earlier worker, if any, are offered, and their calls fail with the
   * reason while it stays so.
   */
  | "unreachable"
  /**
   * An entry of the user's that cannot be used (`problem` says why: a
   * wrong field, a name another server has, one server too many); not
   * connected, no tools.
   */
  | "refused"
  /**
   * It asks for a sign-in (HTTP 401) and no kept one works: the user
   * signs in from Settings (`mcpServers.signIn`; `problem` says why
   * when a sign-in failed). The tools it listed before, if any, are
   * offered, and their calls fail saying so.
   */
  | "sign_in_needed";

/** A tool of an MCP server as a client lists it. */
export interface McpToolSummary {
  /** The model's name of it (`server__tool`). */
  name: string;
  label: string;
  /**
   * The server marks it read-only (it is run again after a crash; it
   * asks like every other tool of a server).
   */
  readOnly: boolean;
}

/** Kind of a streaming item. */
export type ItemKind =
  | "assistant_message"
  | "tool_call";

/** One increment of a streaming item. */
export interface Delta {
  kind: DeltaKind;
  text: string;
}

/** What a delta adds to. */
export type DeltaKind =
  | "text"
  | "reasoning"
  | "toolProgress";

/** Token usage totals reported with `token.usage`. */
export interface UsageTotals {
  input: number;
  output: number;
}

/** Engine → content script (page channel). Never carries a client op. */
export type PageRequest =
  | {
    type: "tool.execute";
    callId: string;
    name: string;
    params: JsonValue;
    /**
     * Chrome's id of the frame the script runs in (0: the tab's top
     * document). In a child frame refs carry it (`f7:e12`).
     */
    frameId?: number;
    /**
     * A write through a ref (or by text) acts only on this element
     * (the same ref, role and name, letter case aside): the one the
     * user approved, or the page described when the call was
     * resolved. The content script refuses otherwise, nothing done.
     */
    expect?: TargetElement | null;
  };

/** Content script → engine (page channel). */
export type PageMessage =
  | {
    type: "tool.progress";
    callId: string;
    text: string;
  }
  | {
    type: "tool.result";
    callId: string;
    ok: boolean;
    content: string;
    details?: JsonValue | null;
  };

/** The wire name of every op. */
export type OpType = Op["type"];
/** The op of one `type`. */
export type OpOf<T extends OpType> = Extract<Op, { type: T }>;
/** The wire name of every event. */
export type EventType = Event["type"];
/** The event (with `seq` and `epoch`) of one `type`. */
export type EventOf<T extends EventType> = Extract<EventEnvelope, { type: T }>;
/** One `kind` of node. */
export type NodeOf<K extends Node["kind"]> = Extract<Node, { kind: K }>;
