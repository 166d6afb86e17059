// Side panel app: renders one thread and turns user actions into ops.
//
// It is a view over the engine in the service worker, reached through a Port
// named "panel" (docs/protocol.md §1). The engine owns all state; the panel
// keeps only what it needs to draw and re-draws everything from each
// `initialized` snapshot, so reconnecting after the worker was killed is just
// "connect, initialize, replace". Model text is only ever put in the DOM with
// textContent / text nodes, never parsed as HTML.

// Protocol types, generated from the Rust sources (www/protocol.d.ts; see
// tests/suite/protocol_ts.rs). `make lint` type-checks this file against them.
/** @typedef {import("./protocol").Op} Op */
/** @typedef {import("./protocol").OpType} OpType */
/** @template {OpType} T @typedef {import("./protocol").OpOf<T>} OpOf */
/** @typedef {import("./protocol").EventEnvelope} EventEnvelope */
/** @template {import("./protocol").EventType} T @typedef {import("./protocol").EventOf<T>} EventOf */
/** @typedef {import("./protocol").Node} ProtocolNode */
/** @template {ProtocolNode["kind"]} K @typedef {import("./protocol").NodeOf<K>} NodeOf */
/** @typedef {import("./protocol").Snapshot} Snapshot */
/** @typedef {import("./protocol").ThreadView} ThreadView */
/** @typedef {import("./protocol").ThreadSummary} ThreadSummary */
/** @typedef {import("./protocol").BranchPoint} BranchPoint */
/** @typedef {import("./protocol").QueueItem} QueueItem */
/** @typedef {import("./protocol").ErrorInfo} ErrorInfo */
/** @typedef {import("./protocol").ErrorKind} ErrorKind */
/** @typedef {import("./protocol").ProviderProfile} ProviderProfile */
/** @typedef {import("./protocol").ApprovalRecord} ApprovalRecord */
/** @typedef {import("./protocol").InteractionRecord} InteractionRecord */
/** @typedef {import("./protocol").JsonValue} JsonValue */
/** @typedef {import("./protocol").Attachment} Attachment */
/** @typedef {import("./protocol").ElicitationAction} ElicitationAction */
/**
 * An MCP server's request for input (`elicitation/create`), as the panel
 * reads it from an InteractionRecord with `server` (see `elicitationOf`).
 * @typedef {{ server: string, serverUrl: string, fields: ElicitationField[] }} Elicitation
 * @typedef {{ name: string, type: "string" | "number" | "integer" | "boolean", title: string,
 *   description: string, required: boolean, options: string[] | null, optionLabels: string[] | null,
 *   format: string, minLength: number | null, maxLength: number | null, minimum: number | null,
 *   maximum: number | null, default: string | number | boolean | null }} ElicitationField
 */
/**
 * The fields of an op the panel fills in; `sendOp` adds the type and the ids.
 * @template {OpType} T @typedef {Omit<OpOf<T>, "type" | "clientId" | "submissionId">} OpFields
 */

/** @type {(id: string) => HTMLElement} */
const $ = (id) => document.getElementById(id);
/** @type {(id: string) => HTMLInputElement} */
const $input = (id) => /** @type {HTMLInputElement} */ (document.getElementById(id));
/** @type {(id: string) => HTMLButtonElement} */
const $button = (id) => /** @type {HTMLButtonElement} */ (document.getElementById(id));
/** @type {(id: string) => HTMLSelectElement} */
const $select = (id) => /** @type {HTMLSelectElement} */ (document.getElementById(id));

const dom = {
  connection: $("connection"),
  connectionText: $("connection-text"),
  newThread: $button("new-thread-button"),
  threadList: $select("thread-list"),
  deleteThread: $button("delete-thread-button"),
  renameThread: $button("rename-thread-button"),
  threadTitleInput: $input("thread-title-input"),
  deleteNote: $("delete-thread-note"),
  settingsToggle: $("settings-toggle"),
  settingsSection: $("settings-section"),
  settingsForm: /** @type {HTMLFormElement} */ ($("settings-form")),
  settingsProvider: $select("settings-provider"),
  settingsBaseUrl: $input("settings-base-url"),
  settingsModel: $input("settings-model"),
  settingsApiKey: $input("settings-api-key"),
  settingsMaxTokens: $input("settings-max-tokens"),
  settingsTemperature: $input("settings-temperature"),
  settingsToolUse: $input("settings-tool-use"),
  settingsVision: $input("settings-vision"),
  settingsContextWindow: $input("settings-context-window"),
  settingsTokenBudget: $input("settings-token-budget"),
  settingsStatus: $("settings-status"),
  settingsSave: $button("settings-save"),
  settingsTest: $button("settings-test"),
  settingsTestResult: $("settings-test-result"),
  siteRulesHeading: $("site-rules-heading"),
  siteRulesEmpty: $("site-rules-empty"),
  siteRulesList: $("site-rules-list"),
  siteRulesStatus: $("site-rules-status"),
  mcpServers: $("mcp-servers"),
  mcpServersHeading: $("mcp-servers-heading"),
  mcpServersEmpty: $("mcp-servers-empty"),
  mcpServersList: $("mcp-servers-list"),
  mcpServersStatus: $("mcp-servers-status"),
  mcpAddForm: /** @type {HTMLFormElement} */ ($("mcp-add-form")),
  mcpAddName: $input("mcp-add-name"),
  mcpAddUrl: $input("mcp-add-url"),
  mcpAddHeaderName: $input("mcp-add-header-name"),
  mcpAddHeaderValue: $input("mcp-add-header-value"),
  mcpAddClientId: $input("mcp-add-client-id"),
  mcpAddSubmit: $button("mcp-add-submit"),
  mcpAddStatus: $("mcp-add-status"),
  status: $("status"),
  statusText: $("status-text"),
  usageText: $("usage-text"),
  errorBanner: $("error-banner"),
  errorText: $("error-text"),
  errorDetail: $("error-detail"),
  errorSettings: $button("error-settings"),
  errorDismiss: $("error-dismiss"),
  interruptedBanner: $("interrupted-banner"),
  messages: $("messages"),
  /** @type {HTMLUListElement | null} */
  steerList: null,
  queueSection: $("queue-section"),
  queueList: $("queue-list"),
  composer: /** @type {HTMLFormElement} */ ($("composer")),
  input: /** @type {HTMLTextAreaElement} */ ($("task-input")),
  note: $("composer-note"),
  attachList: $("attachment-list"),
  attachInput: $input("attach-input"),
  attach: $button("attach-button"),
  send: $button("send-button"),
  enqueue: $button("enqueue-button"),
  stop: $button("stop-button"),
  continue: $button("continue-button"),
  retryLine: $("retry-line"),
  approvalCard: $("approval-card"),
  approvalHeadingAction: $("approval-heading-action"),
  approvalHeadingSite: $("approval-heading-site"),
  approvalHeadingOn: $("approval-heading-on"),
  approvalHelp: $("approval-help"),
  approvalOriginTerm: $("approval-origin-term"),
  approvalServerTerm: $("approval-server-term"),
  approvalServer: $("approval-server"),
  approvalUrlTerm: $("approval-url-term"),
  approvalSiteHint: $("approval-site-hint"),
  approvalLabel: $("approval-tool-label"),
  approvalName: $("approval-tool-name"),
  approvalOrigin: $("approval-origin"),
  approvalUrl: $("approval-url"),
  approvalElementTerm: $("approval-element-term"),
  approvalFrameTerm: $("approval-frame-term"),
  approvalFrame: $("approval-frame"),
  approvalElement: $("approval-element"),
  approvalParams: $("approval-params"),
  approvalHintSite: $("approval-hint-site"),
  approvalStatus: $("approval-status"),
  approvalButtons: {
    acceptOnce: $button("approval-accept-once"),
    acceptForSite: $button("approval-accept-site"),
    decline: $button("approval-decline"),
  },
  interactionCard: $("interaction-card"),
  interactionHeading: $("interaction-heading"),
  interactionServerUrl: $("interaction-server-url"),
  interactionQuestion: $("interaction-question"),
  interactionOptions: $("interaction-options"),
  interactionForm: /** @type {HTMLFormElement} */ ($("interaction-form")),
  interactionAnswer: $input("interaction-answer"),
  interactionSubmit: $button("interaction-submit"),
  interactionStatus: $("interaction-status"),
  elicitationForm: /** @type {HTMLFormElement} */ ($("elicitation-form")),
  elicitationFields: $("elicitation-fields"),
  elicitationRequiredNote: $("elicitation-required-note"),
  elicitationNoteServer: $("elicitation-note-server"),
  elicitationButtons: {
    accept: $button("elicitation-submit"),
    decline: $button("elicitation-decline"),
    cancel: $button("elicitation-cancel"),
  },
  uncertainCard: $("uncertain-card"),
  uncertainLabel: $("uncertain-tool-label"),
  uncertainName: $("uncertain-tool-name"),
  uncertainArgs: $("uncertain-tool-args"),
  uncertainStatus: $("uncertain-status"),
  uncertainButtons: {
    retry: $button("uncertain-retry"),
    mark_done: $button("uncertain-done"),
    fail: $button("uncertain-fail"),
  },
};

const RUNNING_STATES = new Set([
  "queued", "streaming_model", "executing_tools", "waiting_approval", "waiting_interaction",
]);
const STATE_TEXT = {
  idle: "Idle",
  queued: "Starting…",
  streaming_model: "Thinking…",
  executing_tools: "Working on the page…",
  waiting_approval: "Waiting for your approval",
  waiting_interaction: "Waiting for your answer",
  completed: "Done",
  interrupted: "Stopped",
  failed: "Failed",
  budget_paused: "Paused: budget reached",
  paused_uncertain: "Paused: not sure whether the last page action happened",
};
// Run state to show when `turn.complete` arrives before a terminal `run.status`.
const STATE_FOR_STOP_REASON = {
  end: "completed",
  max_tokens: "completed",
  content_filter: "completed",
  tools_disabled: "completed",
  interrupted: "interrupted",
  budget_pause: "budget_paused",
  error: "failed",
};
const STOP_REASON_TEXT = {
  max_tokens: "Stopped: output token limit reached",
  content_filter: "Stopped by the provider's content filter",
  tools_disabled: "Stopped: tools are disabled",
  budget_pause: "Paused: budget reached",
};
const OP_VERBS = {
  "initialize": "load the thread",
  "thread.create": "create a thread",
  "thread.delete": "delete the thread",
  "thread.rename": "rename the thread",
  "turn.submit": "send the message",
  "turn.steer": "steer the running turn",
  "turn.enqueue": "queue the message",
  "queue.remove": "remove the queued message",
  "queue.update": "change the queued message",
  "thread.fork": "fork the thread",
  "thread.selectBranch": "switch to another version of the conversation",
  "provider.test": "test the connection",
  "thread.history": "load earlier messages",
  "turn.interrupt": "stop the turn",
  "run.resume": "continue the run",
  "run.resolveUncertain": "record your answer about the interrupted action",
  "approval.response": "record your answer to the approval request",
  "interaction.response": "send your answer to the agent's question",
  "elicitation.response": "send your answer to the MCP server's request",
  "siteRules.list": "list the sites where the agent acts without asking",
  "mcpServers.list": "list the MCP servers",
  "mcpServers.refresh": "ask the MCP server for its tools again",
  "mcpServers.signIn": "sign in to the MCP server",
  "mcpServers.signOut": "sign out of the MCP server",
  "siteRule.revoke": "remove the site",
  "settings.defaults": "read the extension's settings defaults",
  "attachment.get": "load the attached file",
};
const APPROVAL_DECISION_TEXT = {
  acceptOnce: "Allowing once…",
  acceptForSite: "Allowing on this site…",
  decline: "Declining…",
};
const APPROVAL_STATUS_TEXT = {
  accepted_once: "allowed once",
  accepted_for_site: "allowed on this site",
  declined: "declined",
  cancelled: "cancelled",
};
const INTERACTION_STATUS_TEXT = {
  answered: "answered",
  cancelled: "question withdrawn",
};
/** How an MCP server's request for input ended, on its tool card (`markElicitationOnCard`). */
const ELICITATION_END_TEXT = {
  accept: "accepted",
  decline: "declined",
  cancel: "cancelled",
  answered: "answered",
  withdrawn: "request withdrawn",
};
/** The interaction card's status line while an answer to a server is on its way. */
const ELICITATION_SENDING_TEXT = {
  accept: "Sending your answer…",
  decline: "Declining…",
  cancel: "Cancelling…",
};
/** The same once the engine has recorded it. */
const ELICITATION_RECORDED_TEXT = {
  accept: "Answer recorded. The server gets it now.",
  decline: "Recorded: the server is told you declined.",
  cancel: "Recorded: the server is told you cancelled.",
};
/** The input type of a string field per JSON Schema `format` (MCP 2025-06-18 allows these four). */
const FORMAT_INPUT_TYPES = {
  email: "email",
  uri: "url",
  date: "date",
  "date-time": "datetime-local",
};
/** Prefix of the tool result the engine writes for an answered `ask_user`. */
const ANSWER_PREFIX = "The user answered: ";
/**
 * The engine's built-in tools (src/tools.rs `ToolRegistry::page_tools`;
 * tests/suite/details.rs keeps the two lists equal). Their results' details
 * show as thumbnails and snapshot diffs; any other tool is an extension's
 * own, whose details show as data under the result.
 */
const BUILT_IN_TOOL_NAMES = new Set([
  "page_snapshot", "read_page", "click", "type", "select", "scroll", "wait_for",
  "navigate", "go_back", "screenshot", "ask_user", "list_tabs", "switch_tab",
]);
/** The most characters of an extension tool's details a card shows. */
const MAX_SHOWN_DETAILS_CHARS = 8000;
/**
 * Every error kind of docs/protocol.md §1.3 in words a user can act on:
 * what happened, then what to do. `settings` names the field the fix is in
 * (the banner then offers "Open Settings").
 */
const ERROR_WORDS = {
  auth: { text: "The provider rejected the API key. Open Settings and check the key.", settings: "settings-api-key" },
  model_not_found: { text: "The provider does not know this model. Open Settings and check the model name.", settings: "settings-model" },
  rate_limited: { text: "The provider is rate limiting your requests. Wait a minute, then press Continue." },
  quota_exceeded: { text: "The provider account has no credit or quota left. Add credit or raise the limit with your provider, then press Continue." },
  provider_unavailable: { text: "The provider is overloaded or having problems. Wait a moment, then press Continue." },
  network: { text: "Could not reach the provider. Check your internet connection and the base URL in Settings, then press Continue.", settings: "settings-base-url" },
  not_configured: { text: "No provider is set up yet. Open Settings and enter the base URL, the model and (if your provider needs one) the API key.", settings: "settings-base-url" },
  context_overflow: { text: "The conversation is too long for this model's context window. Start a new thread, or choose a model with a larger context window in Settings.", settings: "settings-model" },
  environment_drift: { text: "The agent's setup (tools, system prompt or provider) changed since this run started, so the run cannot pick up where it left off. Press Continue to start a new turn with the current setup." },
  environment_too_large: { text: "The agent's setup (system prompt and tool list) is over a size limit, so nothing was sent to the provider. This is a problem with the extension: please report it." },
  storage: { text: "The browser's storage failed, so the agent could not save its progress. Make sure the disk is not full: a paused run goes on by itself from its last saved step once saving works again, and anything refused meanwhile can be sent again." },
  provider_protocol: { text: "The provider sent a reply the agent could not understand. Check that the base URL in Settings points to an OpenAI-compatible API, then press Continue.", settings: "settings-base-url" },
  queue_full: { text: "The queue is full. Wait until a queued message has started, or remove one." },
  tool: { text: "A page tool failed in a way that stopped the run. Check the page, then press Continue." },
  internal: { text: "Something went wrong inside the agent. Press Continue to try again; if it keeps happening, reload the extension." },
  invalid_op: { text: "The side panel sent a message the agent did not understand. Reload the side panel." },
  forbidden: { text: "Only the side panel may control the agent." },
};
/** Kinds whose own message is the best explanation (the engine says why it refused). */
const MESSAGE_FIRST_KINDS = new Set(["invalid_command", "not_found"]);
/** The retry line's short cause per retryable kind (the engine retries by itself). */
const RETRY_WORDS = {
  rate_limited: "the provider is rate limiting requests",
  provider_unavailable: "the provider is overloaded or failing",
  network: "the provider could not be reached",
};
/** Start of a page tool's result: page text the model must treat as data (docs/protocol.md). */
const UNTRUSTED_OPEN = "<untrusted_page_content";
const UNTRUSTED_CLOSE = "</untrusted_page_content>";
const UNCERTAIN_CHOICE_TEXT = {
  retry: "Retrying the action…",
  mark_done: "Marking the action as done…",
  fail: "Marking the action as failed…",
};
const DEFAULT_BASE_URLS = {
  openai: "https://api.openai.com/v1",
  anthropic: "https://api.anthropic.com/v1",
};
const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 2000;
/**
 * A panel hidden this long (its window minimized, another tab's panel
 * shown) lets go of its Port, so Chrome may stop an idle worker and free
 * its memory; shown again, it reconnects (README, "Worker lifetime").
 */
const RELEASE_HIDDEN_MS = 30000;
/**
 * Earlier messages load by themselves once the reader scrolls within this
 * many pixels of the top of the list (or when what is drawn does not fill
 * it), so a snapshot can carry a short tail (EngineConfig::snapshot_nodes).
 */
const EARLIER_AUTOLOAD_PX = 400;

const clientId = crypto.randomUUID();

/**
 * What the panel remembers about an op it sent.
 * `quiet`: a read the user did not ask for, sent without "Not connected yet".
 * @typedef {{ text?: string, attachments?: Attachment[], editNodeId?: string, queueItemId?: string, quiet?: boolean }} PendingMeta
 */

const state = {
  port: null,
  connected: false,
  reconnectDelay: RECONNECT_MIN_MS,
  reconnectTimer: null,
  /** Whether the panel let go of its Port while hidden (`releaseIfHidden`). */
  released: false,
  releaseTimer: null,
  epoch: null,
  seq: null,
  threadId: null,
  threads: [],
  runState: "idle",
  turnId: null,
  lastStopReason: null,
  queue: [],
  pendingSteers: [],
  /** @type {Attachment[]} files ready to go with the next message (`attachFiles`). */
  attachments: [],
  /** How many picked files are still being read or scaled. */
  attaching: 0,
  /** The run's `inFlightTool` ({ callId, name }) from the last snapshot, until its result arrives. */
  inFlightTool: null,
  /** submissionId of a sent, not yet answered run.resolveUncertain. */
  resolveSubmission: null,
  /** The pending ApprovalRecord of this thread's run (from approval.request or the snapshot). */
  approval: null,
  /** { submissionId, approvalId, decision } of a sent approval.response, until the question closes (or it is rejected). */
  approvalAnswer: null,
  /**
   * The pending InteractionRecord of this thread's run (from interaction.request
   * or the snapshot): the agent's question (ask_user) or an MCP server's request for input.
   */
  interaction: null,
  /**
   * { submissionId, interactionId, answer } of a sent interaction.response, or
   * { submissionId, interactionId, answer: null, action, content } of a sent
   * elicitation.response, until the question closes (or it is rejected).
   */
  interactionAnswer: null,
  /** The last run.retry of the current turn, until the retried request shows progress. */
  retry: null,
  retryTimer: null,
  /** @type {Map<string, { message: Op } & PendingMeta>} ops not yet acked, re-sent after a reconnect. */
  pendingOps: new Map(),
  /**
   * The composer's submit mode ("auto" or "enqueue") held while the chosen
   * thread is not shown yet (`threadPending`), sent once its snapshot is.
   * @type {"auto" | "enqueue" | null}
   */
  heldSubmit: null,
};

/** What is on screen, keyed the way events address it. Reset by each snapshot. */
const view = {
  elementsById: new Map(),
  cardsByCallId: new Map(),
  resultsByCallId: new Map(),
  /** callId → { name, label, args } of every tool_call node drawn. */
  toolCalls: new Map(),
  /** itemId → { kind, element, text, reasoning, progress } for items still streaming. */
  streaming: new Map(),
  stickToBottom: true,
  scrollScheduled: false,
  /** id → kind of every node drawn (turn_context too): tells which user messages opened a turn. */
  kindById: new Map(),
  /**
   * The open inline editor of a user message:
   * { nodeId, element, body, form, textarea, error, submissionId }.
   * @type {MessageEditor | null}
   */
  editor: null,
  /** The open editor of a queued message. @type {QueueEditor | null} */
  queueEditor: null,
  /** A CSS selector of what gets the focus after the next snapshot redraw (a branch switcher's button). */
  focusAfterSnapshot: null,
  /** Nodes of the active path before the first one drawn (paged in with `thread.history`). */
  olderNodes: 0,
  /** The first node drawn (the next page ends before it). @type {string | null} */
  firstNodeId: null,
  /** The snapshot's branch points (applied again to each page of earlier nodes). @type {BranchPoint[]} */
  branches: [],
};

/**
 * @typedef {{ nodeId: string, element: HTMLElement, body: HTMLElement, form: HTMLFormElement,
 *   textarea: HTMLTextAreaElement, error: HTMLElement, submissionId: string | null }} MessageEditor
 * @typedef {{ itemId: string, li: HTMLLIElement, input: HTMLInputElement, error: HTMLElement,
 *   submissionId: string | null, sentText: string }} QueueEditor
 */

// ------------------------------------------------------------ connection ---

function connect() {
  state.reconnectTimer = null;
  let port;
  try {
    port = chrome.runtime.connect({ name: "panel" });
  } catch (err) {
    console.warn("[sw-agent] connect failed", err);
    scheduleReconnect();
    return;
  }
  state.port = port;
  port.onMessage.addListener((message) => {
    if (state.port !== port) return;
    try {
      handleEvent(message);
    } catch (err) {
      console.error("[sw-agent] failed to handle event", message && message.type, err);
    }
  });
  port.onDisconnect.addListener(() => {
    void chrome.runtime.lastError; // read it so Chrome does not log it as unchecked
    if (state.port !== port) return;
    state.port = null;
    setConnected(false);
    scheduleReconnect();
  });
  sendInitialize();
  // Ops the engine may not have received: the same submissionId makes a
  // repeat safe (the engine replays the stored outcome of a committed op).
  for (const { message } of state.pendingOps.values()) post(message);
}

/**
 * Hidden, the panel arms `releaseIfHidden`; shown again, it reconnects if
 * it let go of its Port meanwhile. The engine keeps a worker alive while a
 * panel is connected (a stopped worker would drop the Port, and its
 * reconnect start a new worker every 30 s); a panel nobody sees need not
 * hold one, and the reconnect is answered from the snapshot cache when the
 * thread is at rest.
 */
function onVisibilityChange() {
  if (document.visibilityState === "hidden") {
    if (state.releaseTimer === null) state.releaseTimer = setTimeout(releaseIfHidden, RELEASE_HIDDEN_MS);
    return;
  }
  clearTimeout(state.releaseTimer);
  state.releaseTimer = null;
  if (state.released) {
    state.released = false;
    connect();
  }
}

/**
 * Lets go of the Port if the panel is still hidden and nothing it sent waits
 * for an answer (an unanswered op, a new thread's among them, or input held
 * for a thread): those keep it connected, and it looks again later.
 */
function releaseIfHidden() {
  state.releaseTimer = null;
  if (document.visibilityState !== "hidden" || state.released) return;
  if (state.port === null || state.pendingOps.size > 0 || state.heldSubmit !== null) {
    state.releaseTimer = setTimeout(releaseIfHidden, RELEASE_HIDDEN_MS);
    return;
  }
  const port = state.port;
  state.port = null;
  state.released = true;
  try {
    port.disconnect();
  } catch {
    // Already closed: nothing to let go of.
  }
  setConnected(false);
  setConnectionText("Paused while hidden");
}

function scheduleReconnect() {
  if (state.reconnectTimer !== null) return;
  setConnectionText("Reconnecting…");
  const delay = state.reconnectDelay;
  state.reconnectDelay = Math.min(delay * 2, RECONNECT_MAX_MS);
  state.reconnectTimer = setTimeout(connect, delay);
}

function setConnected(connected) {
  state.connected = connected;
  dom.connection.dataset.connected = String(connected);
  if (connected) {
    state.reconnectDelay = RECONNECT_MIN_MS;
    setConnectionText("Connected");
  } else {
    setConnectionText("Reconnecting…");
  }
}

function setConnectionText(text) {
  if (dom.connectionText.textContent !== text) dom.connectionText.textContent = text;
}

/** @param {Op} message */
function post(message) {
  if (state.port === null) return false;
  try {
    state.port.postMessage(message);
    return true;
  } catch (err) {
    console.warn("[sw-agent] postMessage failed", err);
    return false;
  }
}

function sendInitialize() {
  post({ type: "initialize", clientId, submissionId: crypto.randomUUID(), threadId: state.threadId });
}

/**
 * Shows `threadId` next (null: the most recent one): its snapshot, asked for
 * or on its way, redraws the messages. Until it arrives they are still the
 * previous thread's, so they are marked busy (dimmed, no clicks: an action
 * there would name the new thread with the old thread's message), and
 * `#messages[data-thread-id]` tells which thread they show.
 * @param {string | null} threadId
 */
function expectThread(threadId) {
  state.threadId = threadId;
  if (threadId === null || dom.messages.dataset.threadId !== threadId) dom.messages.setAttribute("aria-busy", "true");
}

/**
 * A new thread (created or forked) will be shown once the engine answers:
 * until its snapshot arrives, the messages shown are the previous thread's
 * (see `expectThread`; its id comes with the ACK).
 */
function expectNewThread() {
  dom.messages.setAttribute("aria-busy", "true");
}

/**
 * Whether the thread the panel shows is not the one it is opening yet (a
 * switch, a new thread or the first snapshot is on its way). Whether the
 * composer steers or starts a turn, and which turn a steer names, are the
 * shown thread's, so input waits for the snapshot (`heldSubmit`) instead of
 * naming the new thread with the old thread's run; every other action on
 * what is shown (a message's buttons, the edit and queue editors, the
 * queue's ×, the approval, question and uncertain cards, Continue, Stop,
 * Delete) does nothing until then.
 */
function threadPending() {
  return dom.messages.getAttribute("aria-busy") === "true" || document.body.dataset.ready !== "true" || creatingThread();
}

/** Said in the composer's note when an action waits for no thread (`refusedWhileOpening`). */
const OPENING_NOTE = "The thread is still opening: try again once it is shown.";

/**
 * Whether an action on what is shown must not be taken because another
 * thread is opening (`threadPending`); if so, the composer's note (a polite
 * live region) says why nothing happened, unless input held for the thread
 * already says it.
 */
function refusedWhileOpening() {
  if (!threadPending()) return false;
  if (state.heldSubmit === null) setNote(OPENING_NOTE);
  return true;
}

/** Clears `OPENING_NOTE` once the thread is shown (or stays shown). */
function clearOpeningNote() {
  if (dom.note.textContent === OPENING_NOTE && !threadPending()) setNote("");
}

/**
 * Whether a new thread (New thread, Fork) is asked for and not answered yet.
 * After a reconnect the panel's `initialize` names the thread still shown,
 * and its snapshot can come before the answer to the re-sent create or
 * fork: the messages stay busy and held input waits for the new thread
 * (the engine shows it again when it answers a retry).
 */
function creatingThread() {
  for (const { message } of state.pendingOps.values()) {
    if (message.type === "thread.create" || message.type === "thread.fork") return true;
  }
  return false;
}

/**
 * Ops whose answer a caller awaits (`requestOp`), by submission id.
 * @type {Map<string, { resolve: (result: { [key: string]: JsonValue }) => void, reject: (error: ErrorInfo) => void }>}
 */
const opWaiters = new Map();

/**
 * Sends an op (quietly: its caller says what failed) and resolves with its
 * ACK's result, or rejects with the `ErrorInfo` of its reject.
 * @template {OpType} T
 * @param {T} type
 * @param {OpFields<T>} fields
 * @returns {Promise<{ [key: string]: JsonValue }>}
 */
function requestOp(type, fields) {
  return new Promise((resolve, reject) => {
    opWaiters.set(sendOp(type, fields, { quiet: true }), { resolve, reject });
  });
}

/**
 * Sends an op; it stays pending (and is re-sent on reconnect) until acked or rejected.
 * `meta` stays with the pending op: `text` is given back to the composer when
 * the op is rejected.
 * @template {OpType} T
 * @param {T} type
 * @param {OpFields<T>} fields
 * @param {PendingMeta} [meta]
 * @returns {string} the submissionId
 */
function sendOp(type, fields, meta = {}) {
  const message = /** @type {Op} */ (/** @type {unknown} */ ({ type, clientId, submissionId: crypto.randomUUID(), ...fields }));
  state.pendingOps.set(message.submissionId, { message, ...meta });
  if (!post(message) && !meta.quiet) setNote("Not connected yet; it will be sent when the connection is back.");
  return message.submissionId;
}

// ---------------------------------------------------------------- events ---

/** @param {EventEnvelope} event */
function handleEvent(event) {
  if (event === null || typeof event !== "object" || typeof event.type !== "string") return;
  if (!state.connected) setConnected(true);
  if (typeof event.epoch === "string" && event.epoch !== state.epoch) {
    const restarted = typeof state.epoch === "string" && state.epoch !== "";
    state.epoch = event.epoch;
    dom.connection.dataset.epoch = event.epoch;
    // A new worker asks the MCP servers again: an open list follows it
    // (its first `mcpServers.updated` may have gone out before this Port).
    if (restarted && !dom.settingsSection.hidden) requestMcpServers();
  }
  if (typeof event.seq === "number") state.seq = event.seq;

  switch (event.type) {
    case "initialized": return applySnapshot(event.snapshot);
    case "command.ack": return onAck(event);
    case "command.reject": return onReject(event);
    case "threads.updated": return renderThreads(event.threads);
    case "siteRules.updated": return syncSiteRules(event.rules);
    case "mcpServers.updated": return renderMcpServers(event.servers);
    default: break;
  }
  if (state.threadId === null || event.threadId !== state.threadId) return;

  switch (event.type) {
    case "turn.start": return onTurnStart(event);
    case "item.start": return onItemStart(event);
    case "item.delta": return onItemDelta(event);
    case "item.complete": return onItemComplete(event);
    case "token.usage": return renderUsage(event);
    case "queue.updated":
      state.queue = Array.isArray(event.queue) ? event.queue : [];
      return renderQueue();
    case "run.status":
      if (event.turnId) state.turnId = event.turnId;
      if (typeof event.state === "string") state.runState = event.state;
      if (state.runState !== "streaming_model") clearRetry();
      return renderRunState();
    case "run.retry": return onRunRetry(event);
    case "approval.request": return onApprovalRequest(event);
    case "approval.resolved": return onApprovalResolved(event);
    case "interaction.request": return onInteractionRequest(event);
    case "interaction.resolved": return onInteractionResolved(event);
    case "turn.complete": return onTurnComplete(event);
    default: return undefined;
  }
}

/** @param {Snapshot} snapshot */
function applySnapshot(snapshot) {
  const threads = snapshot && Array.isArray(snapshot.threads) ? snapshot.threads : [];
  const thread = snapshot && snapshot.thread ? snapshot.thread : null;
  const threadChanged = (thread ? thread.id : null) !== state.threadId;
  // Input held for a named thread (chosen, created, forked) is not given to
  // another one the engine shows instead (that thread was deleted meanwhile).
  const heldForAnother = state.heldSubmit !== null && state.threadId !== null && threadChanged;
  state.threadId = thread ? thread.id : null;
  // The messages are this thread's from here on (see `expectThread`).
  dom.messages.dataset.threadId = state.threadId ?? "";
  if (creatingThread()) dom.messages.setAttribute("aria-busy", "true");
  else dom.messages.removeAttribute("aria-busy");
  renderThreads(threads);

  view.elementsById.clear();
  view.cardsByCallId.clear();
  view.resultsByCallId.clear();
  view.toolCalls.clear();
  view.streaming.clear();
  view.kindById.clear();
  // An editor survives a redraw only while its text was not sent (e.g. a reconnect).
  const draft = view.editor && view.editor.submissionId === null && !threadChanged
    ? { nodeId: view.editor.nodeId, text: view.editor.textarea.value, focused: view.editor.form.contains(document.activeElement) }
    : null;
  view.editor = null;
  dom.messages.replaceChildren();
  view.branches = thread && Array.isArray(thread.branches) ? thread.branches : [];
  view.olderNodes = thread && typeof thread.olderNodes === "number" ? thread.olderNodes : 0;
  view.firstNodeId = thread && Array.isArray(thread.nodes) && thread.nodes.length > 0 ? thread.nodes[0].id : null;
  // A long thread arrives as its tail; earlier messages come a page at a time.
  if (view.olderNodes > 0) dom.messages.append(buildEarlierButton());
  if (thread && Array.isArray(thread.nodes)) {
    for (const node of thread.nodes) placeNode(node);
    renderBranches(thread.nodes, view.branches);
  }
  if (draft) {
    const element = view.elementsById.get(draft.nodeId);
    if (element && element.querySelector(':scope > .node-actions > [data-action="edit"]')) {
      openEditor(element, draft.nodeId, draft.text, draft.focused);
    }
  }
  if (!thread || dom.messages.childElementCount === 0) {
    const empty = document.createElement("p");
    empty.className = "empty-hint";
    empty.textContent = "Describe a task and the agent will work on the current page.";
    dom.messages.append(empty);
  }

  const run = thread && thread.run ? thread.run : null;
  state.runState = run && typeof run.state === "string" ? run.state : "idle";
  state.turnId = run && run.id ? run.id : null;
  state.lastStopReason = run && run.stopReason ? run.stopReason : null;
  state.inFlightTool = run && isInFlightTool(run.inFlightTool) && !view.resultsByCallId.has(run.inFlightTool.callId)
    ? { callId: run.inFlightTool.callId, name: run.inFlightTool.name }
    : null;
  state.queue = thread && Array.isArray(thread.queue) ? thread.queue : [];
  state.pendingSteers = thread && Array.isArray(thread.pendingSteers) ? thread.pendingSteers.slice() : [];
  // The snapshot is the truth about the question: shown again after a restart, gone once answered.
  const pendingApproval = thread && isPendingApproval(thread.pendingApproval) ? thread.pendingApproval : null;
  const answer = state.approvalAnswer;
  // Only an answer still on its way (re-sent after a reconnect) keeps the buttons disabled.
  const answerInFlight = answer !== null && pendingApproval !== null
    && answer.approvalId === pendingApproval.id && state.pendingOps.has(answer.submissionId);
  if (!answerInFlight) {
    state.approvalAnswer = null;
    dom.approvalStatus.textContent = "";
  }
  state.approval = pendingApproval;
  const pendingInteraction = thread && isPendingInteraction(thread.pendingInteraction) ? thread.pendingInteraction : null;
  const reply = state.interactionAnswer;
  const replyInFlight = reply !== null && pendingInteraction !== null
    && reply.interactionId === pendingInteraction.id && state.pendingOps.has(reply.submissionId);
  if (!replyInFlight) {
    state.interactionAnswer = null;
    dom.interactionStatus.textContent = "";
  }
  state.interaction = pendingInteraction;
  clearRetry();

  hideError();
  if (run && run.error && (run.state === "failed" || run.state === "paused_uncertain")) {
    showError(run.error);
  }
  if (threadChanged) dom.usageText.textContent = "";
  renderQueue();
  renderPendingSteers();
  renderRunState();
  view.stickToBottom = true;
  scheduleScroll();
  if (view.focusAfterSnapshot !== null) {
    const target = /** @type {HTMLElement | null} */ (dom.messages.querySelector(view.focusAfterSnapshot));
    view.focusAfterSnapshot = null;
    if (target) {
      target.focus({ preventScroll: true });
      target.scrollIntoView({ block: "nearest" });
      view.stickToBottom = false;
    }
  }
  document.body.dataset.ready = "true";
  clearOpeningNote();
  if (heldForAnother) {
    // The text stays in the composer, unsent.
    state.heldSubmit = null;
    setNote("");
  } else if (state.heldSubmit !== null && !threadPending()) {
    const mode = state.heldSubmit;
    state.heldSubmit = null;
    setNote("");
    submitInput(mode);
  }
}

/** @param {EventOf<"command.ack">} event */
function onAck(event) {
  const pending = state.pendingOps.get(event.submissionId);
  if (!pending) return;
  state.pendingOps.delete(event.submissionId);
  /** @type {{ [key: string]: JsonValue }} */
  const result = event.result && typeof event.result === "object" && !Array.isArray(event.result) ? event.result : {};
  const waiter = opWaiters.get(event.submissionId);
  if (waiter) {
    opWaiters.delete(event.submissionId);
    waiter.resolve(result);
    return;
  }
  if (isElicitationReply(event.submissionId)) {
    // Durable now; the card goes away with interaction.resolved (or the next snapshot).
    dom.interactionStatus.textContent = ELICITATION_RECORDED_TEXT[state.interactionAnswer.action] || "Answer recorded.";
    return;
  }
  switch (event.opType || pending.message.type) {
    case "thread.create":
      if (typeof result.threadId === "string") expectThread(result.threadId);
      break;
    case "thread.delete":
      if (result.threadId === state.threadId) {
        // Show the most recent remaining thread (or an empty panel).
        expectThread(null);
        sendInitialize();
      }
      setNote("Thread deleted.");
      break;
    case "thread.fork":
      // The engine subscribed this panel to the new thread; its snapshot draws it.
      if (typeof result.threadId === "string") expectThread(result.threadId);
      setNote("This is the new thread, forked from the conversation up to that message. The original is still in the thread list.");
      dom.input.focus();
      break;
    case "queue.update":
      if (view.queueEditor && view.queueEditor.submissionId === event.submissionId) {
        // Durable now; show the new text at once (queue.updated follows with the same).
        const { itemId, sentText } = view.queueEditor;
        state.queue = state.queue.map((item) => (item.id === itemId ? { ...item, text: sentText } : item));
        closeQueueEditor(true);
      }
      break;
    case "provider.test":
      onProviderTestResult(result, null);
      break;
    case "thread.history":
      prependHistory(result);
      break;
    case "thread.rename":
      if (renaming && renaming.submissionId === event.submissionId) {
        // Shown at once; threads.updated follows with the same title.
        const threadId = renaming.threadId;
        state.threads = state.threads.map((t) => (t.id === threadId && typeof result.title === "string" ? { ...t, title: result.title } : t));
        const hadFocus = document.activeElement === dom.threadTitleInput;
        closeRename(hadFocus);
        renderThreads(null);
      }
      break;
    case "siteRules.list":
      if (event.submissionId === siteRulesSubmission) syncSiteRules(result.rules);
      break;
    case "mcpServers.list":
      if (event.submissionId === mcpServersSubmission) renderMcpServers(result.servers);
      break;
    case "mcpServers.refresh":
    case "mcpServers.signOut":
      renderMcpServers(result.servers);
      break;
    case "mcpServers.signIn":
      setMcpServersStatus("The server's sign-in window is open: sign in there.", false, "sign-in");
      break;
    case "settings.defaults":
      onSettingsDefaults(result.defaults ?? {});
      break;
    case "siteRule.revoke":
      if (typeof result.origin === "string") {
        forgetSiteRule(result.origin);
        setSiteRulesStatus(`Removed ${result.origin}: the agent asks before acting there again.`, false);
      }
      break;
    case "turn.submit":
      if (pending.editNodeId) {
        // The edited message is a new version now: the snapshot that comes with it redraws the thread.
        if (view.editor && view.editor.submissionId === event.submissionId) closeEditor(false);
        if (!document.activeElement || document.activeElement === document.body) dom.input.focus();
        break;
      }
      if (typeof result.threadId === "string" && result.threadId !== state.threadId) {
        // The submit created a thread: show it (the snapshot brings what we missed).
        expectThread(result.threadId);
        sendInitialize();
      }
      if (result.queued === true) setNote("A turn is running; your message is queued as the next turn.");
      break;
    case "turn.steer":
      if (result.downgraded === true) {
        setNote("Could not steer; queued as next turn");
      } else if (typeof result.steerId === "string" && typeof pending.text === "string"
        && !state.pendingSteers.some((steer) => steer.id === result.steerId)
        && !view.elementsById.has(result.steerId)) {
        // Durable, not yet read by the agent: listed until its user message
        // (whose node id is the steer's) arrives. An ACK replayed after a
        // reconnect can come after that message: then there is nothing to list.
        state.pendingSteers.push({ id: result.steerId, text: pending.text, attachments: pending.attachments || [] });
        renderPendingSteers();
      }
      break;
    case "run.resume":
      // The ACK can arrive before the new turn's turn.start: from here on the
      // panel shows the continued turn as queued, never the old turn's
      // "interrupted" under the new turn's id.
      if (typeof result.turnId === "string" && result.turnId !== state.turnId) adoptTurn(result.turnId);
      break;
    case "approval.response":
      if (state.approvalAnswer && state.approvalAnswer.submissionId === event.submissionId) {
        // Durable now; the card goes away with approval.resolved (or the next snapshot).
        dom.approvalStatus.textContent = "Answer recorded. Waiting for the agent…";
      }
      break;
    case "interaction.response":
      if (state.interactionAnswer && state.interactionAnswer.submissionId === event.submissionId) {
        // Durable now; the card goes away with interaction.resolved (or the next snapshot).
        dom.interactionStatus.textContent = "Answer recorded. Waiting for the agent…";
      }
      break;
    case "run.resolveUncertain":
      if (state.resolveSubmission === event.submissionId) {
        state.resolveSubmission = null;
        // The card goes away with the run.status that follows the decision.
        dom.uncertainStatus.textContent = "Sent. The agent continues.";
        renderUncertain();
      }
      break;
    default:
      break;
  }
}

/** @param {EventOf<"command.reject">} event */
function onReject(event) {
  const pending = state.pendingOps.get(event.submissionId);
  state.pendingOps.delete(event.submissionId);
  const opType = event.opType || (pending && pending.message.type) || "";
  const waiter = opWaiters.get(event.submissionId);
  if (waiter) {
    opWaiters.delete(event.submissionId);
    waiter.reject(event.error);
    return;
  }
  if (opType === "provider.test") {
    onProviderTestResult(null, event.error);
    return;
  }
  if (opType === "thread.history") resetEarlierButton();
  if (opType === "thread.rename" && renaming && renaming.submissionId === event.submissionId) {
    onRenameRefused(event.error);
    return;
  }
  if (opType === "settings.defaults") {
    onSettingsDefaults(null);
    return;
  }
  if (opType === "mcpServers.list") {
    if (pending && pending.message && pending.message.submissionId === mcpServersSubmission) {
      setMcpServersStatus(`Could not list the MCP servers: ${explainError(event.error).text}`, true, "list");
    }
    return;
  }
  if (opType === "mcpServers.signIn" || opType === "mcpServers.signOut") {
    const message = pending ? pending.message : null;
    const name = message && (message.type === "mcpServers.signIn" || message.type === "mcpServers.signOut") ? message.name : "";
    const what = opType === "mcpServers.signIn" ? "sign in to" : "sign out of";
    setMcpServersStatus(`Could not ${what} ${name ? `the server ${name}` : "the server"}: ${explainError(event.error).text}`, true, "sign-in");
    requestMcpServers();
    return;
  }
  if (opType === "mcpServers.refresh") {
    const message = pending ? pending.message : null;
    const name = message && message.type === "mcpServers.refresh" && typeof message.name === "string" ? message.name : "";
    setMcpServersStatus(`Could not ask ${name ? `the server ${name}` : "the servers"} again: ${explainError(event.error).text}`, true, "refresh");
    requestMcpServers();
    return;
  }
  if (opType === "siteRules.list" || opType === "siteRule.revoke") {
    onSiteRuleReject(opType, pending ? pending.message : null, event.error);
    return;
  }
  if (isElicitationReply(event.submissionId) && onElicitationRejected(event.error)) return;
  const editor = view.editor;
  if (editor && editor.submissionId === event.submissionId) {
    // Said where the user is looking; the text stays in the editor.
    editor.submissionId = null;
    setEditorBusy(editor, false);
    editor.error.textContent = `Not sent: ${explainError(event.error).text}`;
    editor.textarea.focus();
    return;
  }
  const queueEditor = view.queueEditor;
  if (queueEditor && queueEditor.submissionId === event.submissionId) {
    queueEditor.submissionId = null;
    queueEditor.input.readOnly = false;
    queueEditor.error.textContent = `Not changed: ${explainError(event.error).text}`;
    queueEditor.input.focus();
    return;
  }
  const opening = opType === "initialize" || opType === "thread.create" || opType === "thread.fork";
  if (opening && dom.messages.getAttribute("aria-busy") === "true") {
    // The chosen (or new) thread could not be opened: stay on the one
    // shown. Input held for it stays in the composer, unsent.
    state.threadId = dom.messages.dataset.threadId || null;
    dom.messages.removeAttribute("aria-busy");
    renderThreads(null);
    if (state.heldSubmit !== null) {
      state.heldSubmit = null;
      setNote("");
    }
    clearOpeningNote();
  }
  // A refused switch or fork changes nothing: no focus to move, no "Forking…".
  if (opType === "thread.selectBranch") view.focusAfterSnapshot = null;
  if (opType === "thread.fork") setNote("");
  const verb = OP_VERBS[opType] || "do that";
  showError(event.error, `Could not ${verb}: `);
  if (state.resolveSubmission === event.submissionId) {
    state.resolveSubmission = null;
    dom.uncertainStatus.textContent = "";
    renderUncertain();
  }
  if (state.approvalAnswer && state.approvalAnswer.submissionId === event.submissionId) {
    // Not recorded: the question is still open, so the buttons work again.
    state.approvalAnswer = null;
    dom.approvalStatus.textContent = "";
    renderApproval();
  }
  if (state.interactionAnswer && state.interactionAnswer.submissionId === event.submissionId) {
    // Not recorded: the question is still open; the typed answer is still in the field.
    state.interactionAnswer = null;
    dom.interactionStatus.textContent = "";
    renderInteraction();
  }
  // Give the user their words back so nothing typed is lost.
  if (pending && pending.text && dom.input.value.trim() === "") dom.input.value = pending.text;
  if (pending && pending.attachments && pending.attachments.length > 0 && state.attachments.length === 0) {
    state.attachments = pending.attachments.slice();
    renderComposerAttachments();
  }
}

/** @param {EventOf<"turn.start">} event */
function onTurnStart(event) {
  if (event.turnId) adoptTurn(event.turnId);
}

/**
 * A turn starts (turn.start) or is known to be starting (run.resume's ACK):
 * whichever comes first switches the panel to it.
 * @param {string} turnId
 */
function adoptTurn(turnId) {
  if (turnId !== state.turnId) {
    state.inFlightTool = null;
    clearRetry();
  }
  state.turnId = turnId;
  state.lastStopReason = null;
  if (!RUNNING_STATES.has(state.runState)) state.runState = "queued";
  hideError();
  renderRunState();
}

/** @param {EventOf<"turn.complete">} event */
function onTurnComplete(event) {
  if (event.turnId) state.turnId = event.turnId;
  state.lastStopReason = event.stopReason || null;
  clearRetry();
  // A question the run no longer waits for (interrupted, failed) is withdrawn with it.
  if (state.approval && (!event.turnId || state.approval.runId === event.turnId)) {
    markApprovalOnCard(state.approval.callId, "cancelled");
    state.approval = null;
    state.approvalAnswer = null;
  }
  if (state.interaction && (!event.turnId || state.interaction.runId === event.turnId)) {
    markInteractionEnd(state.interaction, "cancelled", null);
    state.interaction = null;
    state.interactionAnswer = null;
    dom.interactionStatus.textContent = "";
  }
  if (RUNNING_STATES.has(state.runState) || state.runState === "idle") {
    state.runState = STATE_FOR_STOP_REASON[event.stopReason] || "completed";
  }
  // A finished run has written every steer it admitted into the conversation.
  if (state.pendingSteers.length > 0) {
    state.pendingSteers = [];
    renderPendingSteers();
  }
  if (event.error) {
    showError(event.error);
  } else if (STOP_REASON_TEXT[event.stopReason]) {
    setNote(STOP_REASON_TEXT[event.stopReason]);
  }
  // Whatever still streams belonged to this turn and will not grow any more.
  for (const [itemId, entry] of view.streaming) {
    if (entry.kind === "assistant_message" && entry.element.hidden) {
      // Stopped before its first word: nothing of it was stored, so nothing
      // of it stays (a new panel's snapshot has no such message either).
      entry.element.remove();
      view.streaming.delete(itemId);
    } else if (entry.kind === "assistant_message") {
      entry.element.classList.remove("streaming");
      entry.element.removeAttribute("aria-busy");
      view.streaming.delete(itemId);
      view.elementsById.set(itemId, entry.element);
    }
  }
  renderRunState();
}

// --------------------------------------------------------------- streaming ---

/** @param {EventOf<"item.start">} event */
function onItemStart(event) {
  clearRetry();
  const itemId = event.itemId;
  if (typeof itemId !== "string" || view.streaming.has(itemId) || view.elementsById.has(itemId)) return;
  removeEmptyHint();
  if (event.kind === "tool_call") {
    const card = buildToolCard({ id: itemId, label: event.label, status: "running" });
    dom.messages.append(card);
    view.streaming.set(itemId, { kind: "tool_call", element: card });
  } else {
    startAssistantStream(itemId);
  }
  scheduleScroll();
}

function startAssistantStream(itemId) {
  const element = document.createElement("article");
  element.className = "node assistant streaming";
  element.dataset.kind = "assistant_message";
  element.dataset.nodeId = itemId;
  element.setAttribute("aria-busy", "true");
  // Shown with its first text or reasoning: a step that only calls tools has nothing to read.
  element.hidden = true;
  const body = document.createElement("div");
  body.className = "message-text plain";
  const text = document.createTextNode("");
  body.append(text);
  element.append(body);
  dom.messages.append(element);
  const entry = { kind: "assistant_message", element, text, reasoning: null };
  view.streaming.set(itemId, entry);
  return entry;
}

/** @param {EventOf<"item.delta">} event */
function onItemDelta(event) {
  const delta = event.delta;
  if (!delta || typeof delta.text !== "string" || typeof event.itemId !== "string") return;
  if (delta.kind !== "toolProgress") clearRetry();
  const itemId = event.itemId;
  if (delta.kind === "toolProgress") {
    const card = (view.streaming.get(itemId) || {}).element
      || view.elementsById.get(itemId)
      || view.cardsByCallId.get(itemId);
    if (card) appendProgress(card, delta.text);
    scheduleScroll();
    return;
  }
  let entry = view.streaming.get(itemId);
  if (!entry) {
    // Final node already drawn (e.g. a snapshot raced the stream): nothing to grow.
    if (view.elementsById.has(itemId)) return;
    // Joined mid-stream (reconnect): start from here; item.complete fills the rest.
    removeEmptyHint();
    entry = startAssistantStream(itemId);
  }
  if (entry.kind !== "assistant_message") return;
  if (delta.kind === "reasoning") {
    if (entry.reasoning === null) entry.reasoning = addReasoning(entry.element, "", true);
    entry.reasoning.appendData(delta.text);
  } else {
    entry.text.appendData(delta.text);
  }
  if (entry.element.hidden && delta.text.trim() !== "") entry.element.hidden = false;
  scheduleScroll();
}

/** @param {EventOf<"item.complete">} event */
function onItemComplete(event) {
  if (!event.node || typeof event.node !== "object") return;
  removeEmptyHint();
  placeNode(event.node);
  scheduleScroll();
}

// ----------------------------------------------------------------- nodes ---

/**
 * Draws a durable node: replaces its streaming (or older) element, or appends.
 * @param {ProtocolNode} node
 */
function placeNode(node) {
  if (typeof node.id !== "string") return;
  view.kindById.set(node.id, node.kind);
  if (node.kind === "tool_result") {
    placeToolResult(node);
    return;
  }
  const streamingEntry = view.streaming.get(node.id);
  const existing = streamingEntry ? streamingEntry.element : view.elementsById.get(node.id);
  view.streaming.delete(node.id);
  const element = renderNode(node);
  if (element === null) {
    if (existing) existing.remove();
    view.elementsById.delete(node.id);
    return;
  }
  if (existing && existing.isConnected) {
    // A node drawn from a snapshot arrives again as item.complete: keep its version switcher.
    const switcher = existing.querySelector(":scope > .node-actions > .branch-switcher");
    const bar = element.querySelector(":scope > .node-actions");
    if (switcher && bar) {
      bar.prepend(switcher);
      element.dataset.branchIndex = existing.dataset.branchIndex;
    }
    if (view.editor && view.editor.element === existing) closeEditor(false);
    existing.replaceWith(element);
  } else {
    dom.messages.append(element);
  }
  view.elementsById.set(node.id, element);

  if (node.kind === "tool_call" && typeof node.callId === "string") {
    if (existing && existing !== element) carryProgress(existing, element);
    view.toolCalls.set(node.callId, { name: node.name, label: node.label, args: node.arguments });
    view.cardsByCallId.set(node.callId, element);
    const result = view.resultsByCallId.get(node.callId);
    if (result) setCardResult(element, result);
    else if (state.approval && state.approval.callId === node.callId) renderApproval();
    else if (state.interaction && state.interaction.callId === node.callId) renderInteraction();
  }
  if (node.kind === "user_message" && node.steered) dropPendingSteer(node);
}

/** @param {ProtocolNode} node */
function renderNode(node) {
  switch (node.kind) {
    case "user_message": return renderUserMessage(node);
    case "assistant_message": return renderAssistantMessage(node);
    case "tool_call": return buildToolCard({
      id: node.id,
      callId: node.callId,
      name: node.name,
      label: node.label,
      args: node.arguments,
      status: "running",
    });
    case "notice": return renderNotice(node);
    case "compaction": return renderCompaction(node);
    case "turn_context": return null; // bookkeeping for the engine, nothing to read
    default: return renderUnknown(node);
  }
}

function nodeElement(node, tag, className) {
  const element = document.createElement(tag);
  element.className = `node ${className}`;
  element.dataset.kind = node.kind;
  element.dataset.nodeId = node.id;
  return element;
}

function renderUserMessage(node) {
  const element = nodeElement(node, "article", "user");
  element.setAttribute("aria-label", node.steered ? "You (steering)" : "You");
  if (node.steered) element.append(badge("steer", "Sent while the agent was working"));
  const body = document.createElement("div");
  body.className = "message-text plain";
  body.textContent = typeof node.text === "string" ? node.text : "";
  body.hidden = body.textContent === "";
  element.append(body);
  const files = attachmentsOf(node);
  if (files.length > 0) element.append(attachmentList(files, node.id));
  messageFiles.set(element, files);
  // Only the message that opened a turn can be edited: the new version replaces that turn.
  const opensTurn = !node.steered && view.kindById.get(node.parentId) === "turn_context";
  element.append(messageActions(opensTurn));
  messageSource.set(element, body.textContent);
  return element;
}

function renderAssistantMessage(node) {
  const element = nodeElement(node, "article", "assistant");
  element.setAttribute("aria-label", "Agent");
  const text = typeof node.text === "string" && node.text.trim() !== "" ? node.text : "";
  const reasoning = typeof node.reasoning === "string" && node.reasoning.trim() !== "" ? node.reasoning : "";
  if (reasoning) addReasoning(element, reasoning, false);
  if (text) {
    const body = document.createElement("div");
    body.className = "message-text";
    body.append(renderMarkdown(text));
    element.append(body);
  }
  if (node.interrupted) element.append(badge("interrupted", "The reply was cut off"));
  else if (STOP_REASON_TEXT[node.stopReason]) element.append(badge("stopped", STOP_REASON_TEXT[node.stopReason]));
  // A reply that only called tools (or was cut off before its first word) has
  // nothing to read: no empty bubble. The status line tells about an interrupt.
  if (!text && !reasoning) element.hidden = true;
  else element.append(messageActions(false));
  // Copy gives the answer as written (Markdown), not its rendering.
  messageSource.set(element, text);
  return element;
}

function addReasoning(element, text, open) {
  const details = document.createElement("details");
  details.className = "reasoning";
  details.open = open;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const body = document.createElement("div");
  body.className = "reasoning-text";
  const textNode = document.createTextNode(text);
  body.append(textNode);
  details.append(summary, body);
  element.prepend(details);
  return textNode;
}

function renderNotice(node) {
  const element = nodeElement(node, "div", "notice");
  const level = ["info", "warning", "error"].includes(node.level) ? node.level : "info";
  element.dataset.level = level;
  if (level === "error") element.setAttribute("role", "note");
  element.textContent = typeof node.text === "string" ? node.text : "";
  return element;
}

/** A compaction checkpoint: where the conversation was summarized for the model. */
function renderCompaction(node) {
  const element = nodeElement(node, "details", "notice compaction");
  element.dataset.level = "info";
  const summary = document.createElement("summary");
  const count = Number.isFinite(node.compactedNodes) ? node.compactedNodes : 0;
  summary.textContent = `Conversation compacted: ${count} earlier items summarized for the model (history kept)`;
  const body = document.createElement("pre");
  body.className = "compaction-summary";
  const written = typeof node.summary === "string" ? node.summary : "";
  // The part the engine copied word for word (the task's messages).
  const copied = typeof node.verbatim === "string" && node.verbatim ? `\n\n${node.verbatim}` : "";
  body.textContent = written + copied;
  element.append(summary, body);
  return element;
}

function renderUnknown(node) {
  const element = nodeElement(node, "div", "notice");
  element.dataset.level = "info";
  element.textContent = typeof node.text === "string" && node.text ? node.text : `(${String(node.kind)})`;
  return element;
}

function badge(text, title) {
  const element = document.createElement("span");
  element.className = `badge badge-${text}`;
  element.textContent = text;
  element.title = title;
  return element;
}

// -------------------------------------------------------- message actions ---
// Fork a new thread from a message, edit the message that opened a turn (the
// new text starts a new version of the conversation from there; the old one
// is kept), and switch between versions. The engine answers an edit or a
// switch with a fresh `initialized`, which redraws the thread.

/**
 * The text Copy puts on the clipboard, per drawn message: a user message's
 * text, an answer's Markdown source (without its reasoning).
 * @type {WeakMap<Element, string>}
 */
const messageSource = new WeakMap();
/**
 * The files of each drawn user message, which an edit sends again with the
 * new text (an edit replaces the text, not the files).
 * @type {WeakMap<Element, Attachment[]>}
 */
const messageFiles = new WeakMap();
/** How long a Copy button says "Copied" (or that it failed). */
const COPY_FEEDBACK_MS = 2000;

/** The actions row under a message: Copy, Edit (only where `editable`) and Fork from here. */
function messageActions(editable) {
  const bar = document.createElement("div");
  bar.className = "node-actions";
  bar.append(actionButton("copy", "Copy", "Copy this message's text"));
  if (editable) {
    bar.append(actionButton("edit", "Edit", "Edit this message and send it again as a new version (the current version is kept)"));
  }
  bar.append(actionButton("fork", "Fork from here", "Start a new thread with the conversation up to this message"));
  return bar;
}

/**
 * Puts a message's text on the clipboard; the button says how it went for a
 * moment (and screen readers hear it: the button's name changes).
 * @param {HTMLButtonElement} button
 * @param {string} text
 */
async function copyMessage(button, text) {
  let said = "Copied";
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard access (the panel lost focus, a policy): say so, keep the text.
    said = "Could not copy";
  }
  button.textContent = said;
  clearTimeout(Number(button.dataset.resetTimer || 0));
  button.dataset.resetTimer = String(setTimeout(() => {
    button.textContent = "Copy";
    delete button.dataset.resetTimer;
  }, COPY_FEEDBACK_MS));
}

function actionButton(action, text, title) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "message-action";
  button.dataset.action = action;
  button.textContent = text;
  button.title = title;
  return button;
}

/**
 * Puts a version switcher "‹ 2/3 ›" on the first drawn message at or after
 * each branch point of the active path (an edited message's versions are the
 * `turn_context` nodes that open each one; the user message follows).
 * @param {ProtocolNode[]} nodes
 * @param {BranchPoint[]} branches
 */
function renderBranches(nodes, branches) {
  const indexById = new Map(nodes.map((node, index) => [node.id, index]));
  branches.forEach((point, pointIndex) => {
    if (!Array.isArray(point.nodeIds) || point.nodeIds.length < 2) return;
    const activeId = point.nodeIds[point.active];
    let index = indexById.get(activeId);
    if (index === undefined) return;
    let element = null;
    for (; index < nodes.length && !element; index += 1) {
      const candidate = view.elementsById.get(nodes[index].id);
      if (candidate && !candidate.hidden && candidate.classList.contains("node")) element = candidate;
    }
    if (!element) return;
    const count = point.nodeIds.length;
    const position = point.active + 1;
    const switcher = document.createElement("div");
    switcher.className = "branch-switcher";
    switcher.setAttribute("role", "group");
    switcher.setAttribute("aria-label", `Version ${position} of ${count}`);
    switcher.dataset.branchIndex = String(pointIndex);
    const previous = document.createElement("button");
    previous.type = "button";
    previous.className = "icon-button";
    previous.dataset.action = "branch-previous";
    previous.dataset.target = position > 1 ? point.nodeIds[point.active - 1] : "";
    previous.disabled = position === 1;
    previous.textContent = "‹";
    previous.setAttribute("aria-label", "Previous version");
    const label = document.createElement("span");
    label.className = "branch-position";
    label.textContent = `${position}/${count}`;
    const next = document.createElement("button");
    next.type = "button";
    next.className = "icon-button";
    next.dataset.action = "branch-next";
    next.dataset.target = position < count ? point.nodeIds[point.active + 1] : "";
    next.disabled = position === count;
    next.textContent = "›";
    next.setAttribute("aria-label", "Next version");
    switcher.append(previous, label, next);
    let bar = element.querySelector(":scope > .node-actions");
    if (!bar) {
      bar = document.createElement("div");
      bar.className = "node-actions";
      element.append(bar);
    }
    bar.prepend(switcher);
    element.dataset.branchIndex = String(pointIndex);
  });
}

// ------------------------------------------------------- earlier history ---

function earlierLabel() {
  return `Show earlier messages (${view.olderNodes} more ${view.olderNodes === 1 ? "item" : "items"})`;
}

function buildEarlierButton() {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "load-earlier";
  button.dataset.action = "load-earlier";
  button.textContent = earlierLabel();
  return button;
}

/** @param {HTMLButtonElement} button */
function loadEarlier(button) {
  if (state.threadId === null || view.firstNodeId === null) return;
  button.disabled = true;
  button.textContent = "Loading earlier messages…";
  sendOp("thread.history", { threadId: state.threadId, beforeNodeId: view.firstNodeId });
}

/**
 * The next page of earlier messages, without a click, when the reader is near
 * the top of the list or the list is not full. Never while a scroll to the
 * bottom is pending (a redraw's position is transient then), never while the
 * list is not laid out (hidden, its scrollTop is 0: every page would follow),
 * and never twice for one page: the button is disabled until its page arrives.
 */
function maybeLoadEarlier() {
  if (view.scrollScheduled || dom.messages.clientHeight === 0) return;
  const button = dom.messages.querySelector(":scope > .load-earlier");
  if (!(button instanceof HTMLButtonElement) || button.disabled) return;
  if (dom.messages.scrollTop > EARLIER_AUTOLOAD_PX) return;
  loadEarlier(button);
}

function resetEarlierButton() {
  const button = dom.messages.querySelector(":scope > .load-earlier");
  if (!(button instanceof HTMLButtonElement)) return;
  button.disabled = false;
  button.textContent = earlierLabel();
}

/**
 * A page of earlier nodes: drawn above what is shown, the reader's place kept.
 * @param {any} result
 */
function prependHistory(result) {
  if (!result || result.threadId !== state.threadId || !Array.isArray(result.nodes)) return;
  const list = dom.messages;
  const button = list.querySelector(":scope > .load-earlier");
  const hadFocus = button !== null && button === document.activeElement;
  const anchor = button ? button.nextSibling : list.firstChild;
  const fromBottom = list.scrollHeight - list.scrollTop;
  // placeNode appends to dom.messages: draw the page into a holder first.
  const holder = document.createElement("div");
  dom.messages = holder;
  try {
    for (const node of result.nodes) placeNode(node);
  } finally {
    dom.messages = list;
  }
  const first = holder.firstElementChild;
  const fragment = document.createDocumentFragment();
  fragment.append(...holder.childNodes);
  list.insertBefore(fragment, anchor);
  // A page brings the version switchers of its own nodes (a snapshot carries
  // only those of the nodes it shows).
  if (Array.isArray(result.branches)) {
    const known = new Set(view.branches.map((point) => point.nodeIds[point.active]));
    view.branches = view.branches.concat(result.branches.filter((point) => !known.has(point.nodeIds[point.active])));
  }
  renderBranches(result.nodes, view.branches);
  view.olderNodes = typeof result.olderNodes === "number" ? result.olderNodes : 0;
  if (result.nodes.length > 0) view.firstNodeId = result.nodes[0].id;
  if (button instanceof HTMLButtonElement) {
    if (view.olderNodes > 0) {
      button.disabled = false;
      button.textContent = earlierLabel();
    } else {
      button.remove();
      // Keyboard users continue from the earliest message.
      if (hadFocus && first instanceof HTMLElement) {
        first.tabIndex = -1;
        first.focus();
      }
    }
  }
  list.scrollTop = list.scrollHeight - fromBottom;
  maybeLoadEarlier();
}

/** @param {MouseEvent} event */
function onMessageAction(event) {
  const button = event.target instanceof Element ? event.target.closest("button[data-action]") : null;
  if (!(button instanceof HTMLButtonElement) || !dom.messages.contains(button) || button.disabled) return;
  // While another thread opens, the messages shown are the previous
  // thread's: no clicks reach them (CSS), and no key press either.
  if (refusedWhileOpening()) return;
  if (button.dataset.action === "load-earlier") {
    loadEarlier(button);
    return;
  }
  const element = /** @type {HTMLElement | null} */ (button.closest("#messages .node"));
  const nodeId = element ? element.dataset.nodeId : "";
  if (!element || !nodeId || state.threadId === null) return;
  switch (button.dataset.action) {
    case "copy":
      copyMessage(button, messageSource.get(element) ?? "");
      break;
    case "edit":
      openEditor(element, nodeId, null, true);
      break;
    case "fork":
      hideError();
      setNote("Forking…");
      sendOp("thread.fork", { threadId: state.threadId, nodeId });
      expectNewThread();
      break;
    case "branch-previous":
    case "branch-next": {
      const target = button.dataset.target;
      if (!target) return;
      hideError();
      const switcher = /** @type {HTMLElement} */ (button.closest(".branch-switcher"));
      // Keyboard users keep their place: the same button of the redrawn switcher.
      view.focusAfterSnapshot = `.branch-switcher[data-branch-index="${switcher.dataset.branchIndex}"] [data-action="${button.dataset.action}"]:not(:disabled), `
        + `.branch-switcher[data-branch-index="${switcher.dataset.branchIndex}"] button:not(:disabled)`;
      sendOp("thread.selectBranch", { threadId: state.threadId, nodeId: target });
      break;
    }
    default:
      break;
  }
}

/**
 * Opens the inline editor of a user message (one at a time): Enter sends the
 * text as a new version (`turn.submit` with `replaces`), Esc cancels.
 * @param {HTMLElement} element
 * @param {string} nodeId
 * @param {string | null} text  the draft to show (null: the message's text)
 * @param {boolean} focus
 */
function openEditor(element, nodeId, text, focus) {
  if (view.editor && view.editor.nodeId === nodeId) {
    if (focus) view.editor.textarea.focus();
    return;
  }
  closeEditor(false);
  const body = /** @type {HTMLElement | null} */ (element.querySelector(":scope > .message-text"));
  if (!body) return;
  const form = document.createElement("form");
  form.className = "message-editor";
  form.noValidate = true;
  const textarea = document.createElement("textarea");
  textarea.value = text ?? body.textContent ?? "";
  textarea.rows = Math.min(8, Math.max(2, textarea.value.split("\n").length + 1));
  textarea.setAttribute("aria-label", "Edit your message");
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.id = `edit-hint-${nodeId}`;
  hint.textContent = "Enter sends it as a new version (the current one is kept) · Shift+Enter new line · Esc cancels";
  const error = document.createElement("p");
  error.className = "editor-error";
  error.id = `edit-error-${nodeId}`;
  error.setAttribute("role", "alert");
  textarea.setAttribute("aria-describedby", `${hint.id} ${error.id}`);
  const actions = document.createElement("div");
  actions.className = "editor-actions";
  actions.append(...submitAndCancel("Send new version", () => closeEditor(true)));
  form.append(textarea, hint, error, actions);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitEdit();
  });
  textarea.addEventListener("keydown", (event) => {
    if (event.isComposing) return;
    if (event.key === "Enter" && !event.shiftKey && !event.altKey && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      submitEdit();
    } else if (event.key === "Escape") {
      // Esc closes the editor; it does not stop the running turn.
      event.preventDefault();
      event.stopPropagation();
      closeEditor(true);
    }
  });
  body.hidden = true;
  body.after(form);
  element.dataset.editing = "true";
  view.editor = { nodeId, element, body, form, textarea, error, submissionId: null };
  if (focus) {
    textarea.focus({ preventScroll: true });
    textarea.setSelectionRange(textarea.value.length, textarea.value.length);
    form.scrollIntoView({ block: "nearest" });
    view.stickToBottom = false;
  }
}

/**
 * An inline editor's two buttons: the form's primary submit and a Cancel.
 * @param {string} label
 * @param {() => void} onCancel
 * @returns {[HTMLButtonElement, HTMLButtonElement]}
 */
function submitAndCancel(label, onCancel) {
  const submit = document.createElement("button");
  submit.type = "submit";
  submit.className = "primary";
  submit.textContent = label;
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.textContent = "Cancel";
  cancel.addEventListener("click", onCancel);
  return [submit, cancel];
}

/** Closes the message editor; `refocus` puts the focus back on its Edit button. */
function closeEditor(refocus) {
  const editor = view.editor;
  if (!editor) return;
  view.editor = null;
  editor.form.remove();
  editor.body.hidden = false;
  delete editor.element.dataset.editing;
  if (refocus) {
    const button = /** @type {HTMLElement | null} */ (editor.element.querySelector(':scope > .node-actions > [data-action="edit"]'));
    if (button) button.focus();
  }
}

/** @param {MessageEditor} editor */
function setEditorBusy(editor, busy) {
  editor.textarea.readOnly = busy;
  editor.form.setAttribute("aria-busy", String(busy));
  for (const button of editor.form.querySelectorAll("button")) button.disabled = busy;
}

async function submitEdit() {
  const editor = view.editor;
  if (!editor || editor.submissionId !== null || editor.form.getAttribute("aria-busy") === "true"
    || state.threadId === null || refusedWhileOpening()) return;
  const text = editor.textarea.value.trim();
  const shown = messageFiles.get(editor.element) || [];
  if (text === "" && shown.length === 0) {
    editor.error.textContent = "Type the message, or press Esc to cancel.";
    return;
  }
  editor.error.textContent = "";
  hideError();
  // Keep the focus in the editor while its buttons are disabled.
  editor.textarea.focus({ preventScroll: true });
  setEditorBusy(editor, true);
  const threadId = state.threadId;
  // The files go again whole: those the snapshot left out are fetched first.
  const { files: attachments, error } = await filesToResend(editor.nodeId, shown);
  if (view.editor !== editor || state.threadId !== threadId) return;
  if (attachments === undefined) {
    setEditorBusy(editor, false);
    editor.error.textContent = `Not sent: ${error}`;
    editor.textarea.focus();
    return;
  }
  editor.submissionId = sendOp("turn.submit", { threadId, input: withFiles(text, attachments), replaces: editor.nodeId }, { editNodeId: editor.nodeId });
}

// ------------------------------------------------------------- tool cards ---

/**
 * @param {{ id: string, callId?: string, name?: string, label?: string, args?: JsonValue, status: string }} call
 */
function buildToolCard({ id, callId, name, label, args, status }) {
  const card = document.createElement("article");
  card.className = "node tool-call";
  card.dataset.kind = "tool_call";
  card.dataset.nodeId = id;
  if (typeof callId === "string") card.dataset.callId = callId;
  card.dataset.status = status;

  const header = document.createElement("header");
  header.className = "tool-header";
  const title = document.createElement("span");
  title.className = "tool-label";
  title.textContent = label || name || "Tool call";
  header.append(title);
  if (name && label && label !== name) {
    const nameElement = document.createElement("code");
    nameElement.className = "tool-name";
    nameElement.textContent = name;
    header.append(nameElement);
  }
  const statusElement = document.createElement("span");
  statusElement.className = "tool-status";
  statusElement.textContent = status;
  header.append(statusElement);
  card.append(header);
  card.setAttribute("aria-label", `Tool: ${title.textContent}`);

  if (args !== undefined) {
    const argsElement = document.createElement("pre");
    argsElement.className = "tool-args";
    argsElement.textContent = prettyJson(args);
    card.append(argsElement);
  }
  const progress = document.createElement("pre");
  progress.className = "tool-progress";
  progress.hidden = true;
  progress.append(document.createTextNode(""));
  card.append(progress);
  return card;
}

function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

function appendProgress(card, text) {
  const progress = card.querySelector(":scope > .tool-progress");
  if (!progress) return;
  progress.hidden = false;
  progress.firstChild.appendData(text);
}

function carryProgress(from, to) {
  const old = from.querySelector(":scope > .tool-progress");
  if (old && !old.hidden) appendProgress(to, old.textContent);
}

function placeToolResult(node) {
  const callId = typeof node.callId === "string" ? node.callId : "";
  view.resultsByCallId.set(callId, node);
  if (state.inFlightTool && state.inFlightTool.callId === callId) state.inFlightTool = null;
  const card = view.cardsByCallId.get(callId);
  if (card) {
    setCardResult(card, node);
    return;
  }
  // No call on screen to attach to: show the result on its own.
  const element = nodeElement(node, "article", "tool-call orphan-result");
  element.dataset.callId = callId;
  element.dataset.status = node.status || "ok";
  const header = document.createElement("header");
  header.className = "tool-header";
  const title = document.createElement("span");
  title.className = "tool-label";
  title.textContent = node.name || "Tool result";
  header.append(title);
  element.append(header, buildResultSection(node, false));
  setResultExtras(element, node);
  const existing = view.elementsById.get(node.id);
  if (existing && existing.isConnected) existing.replaceWith(element);
  else dom.messages.append(element);
  view.elementsById.set(node.id, element);
}

function setCardResult(card, node) {
  const status = typeof node.status === "string" ? node.status : "ok";
  card.dataset.status = status;
  const statusElement = card.querySelector(":scope > .tool-header > .tool-status");
  if (statusElement) statusElement.textContent = status;
  const existing = card.querySelector(":scope > .tool-result");
  const section = buildResultSection(node, true);
  if (existing) existing.replaceWith(section);
  else card.append(section);
  view.elementsById.set(node.id, section);
  setResultExtras(card, node);
  if (node.approval && typeof node.approval.status === "string") markApproval(card, node.approval);
  if (node.name === "ask_user") {
    const content = typeof node.content === "string" ? node.content : "";
    const answered = status === "ok" && content.startsWith(ANSWER_PREFIX);
    if (answered && statusElement) statusElement.textContent = "answered";
    showAnswerOnCard(card, answered ? content.slice(ANSWER_PREFIX.length) : null);
  }
}

/** The user's answer to an ask_user call, as text under the call (null removes it). */
function showAnswerOnCard(card, answer) {
  let line = card.querySelector(":scope > .tool-answer");
  if (answer === null) {
    if (line) line.remove();
    return;
  }
  if (!line) {
    line = document.createElement("p");
    line.className = "tool-answer";
    const result = card.querySelector(":scope > .tool-result");
    card.insertBefore(line, result);
  }
  const label = document.createElement("strong");
  label.textContent = "Your answer: ";
  line.replaceChildren(label, document.createTextNode(answer));
}

function buildResultSection(node, asChild) {
  const details = document.createElement("details");
  details.className = asChild ? "node tool-result" : "tool-result";
  if (asChild) {
    details.dataset.kind = "tool_result";
    details.dataset.nodeId = node.id;
    details.dataset.status = node.status || "ok";
  }
  const summary = document.createElement("summary");
  const raw = typeof node.content === "string" ? node.content : prettyJson(node.content);
  const page = untrustedPageContent(raw);
  const content = page ? page.text : raw;
  const firstLine = content.split("\n").find((line) => line.trim() !== "") || "";
  if (page) {
    // Text the page wrote: shown as inert text (textContent), never followed or rendered as HTML.
    details.dataset.untrusted = "true";
    if (page.origin) details.dataset.origin = page.origin;
    const label = document.createElement("span");
    label.className = "badge badge-page-content";
    label.textContent = "page content";
    label.title = `Text from ${page.origin || "the web page"}. The agent is told to treat it as data, not as instructions.`;
    summary.append(document.createTextNode(`Result (${node.status || "ok"}) `), label, document.createTextNode(firstLine.slice(0, 100)));
  } else {
    summary.textContent = `Result (${node.status || "ok"})${firstLine ? `: ${firstLine.slice(0, 100)}` : ""}`;
  }
  const body = document.createElement("pre");
  body.className = "tool-result-text";
  body.textContent = content;
  details.append(summary, body);
  // Screenshots: only image data URLs are shown, as <img> (never as HTML).
  for (const image of Array.isArray(node.images) ? node.images : []) {
    if (!image || !/^image\/(png|jpeg|webp)$/.test(image.mediaType) || typeof image.data !== "string") continue;
    const img = document.createElement("img");
    img.className = "tool-result-image";
    img.alt = "Screenshot returned by the tool";
    img.src = `data:${image.mediaType};base64,${image.data}`;
    details.append(img);
  }
  return details;
}

const THUMBNAIL_URL = /^data:image\/(png|jpeg|webp);base64,[A-Za-z0-9+/]+=*$/;

/**
 * What a result's `details` show in its card, always visible: a screenshot's
 * thumbnail, and what changed since the previous snapshot of the same page.
 * Replaces what an earlier rendering of the card showed.
 */
function setResultExtras(card, node) {
  const old = card.querySelector(":scope > .tool-extras");
  if (old) old.remove();
  const details = node.details && typeof node.details === "object" ? node.details : null;
  if (!details) return;
  const extras = document.createElement("div");
  extras.className = "tool-extras";
  extras.dataset.nodeId = node.id;
  if (typeof details.thumbnail === "string" && THUMBNAIL_URL.test(details.thumbnail)) {
    const img = document.createElement("img");
    img.className = "tool-thumbnail";
    img.alt = `Screenshot thumbnail${typeof details.title === "string" && details.title ? ` of ${details.title}` : ""}`;
    if (Number.isInteger(details.thumbnailWidth) && Number.isInteger(details.thumbnailHeight)) {
      img.width = details.thumbnailWidth;
      img.height = details.thumbnailHeight;
    }
    img.src = details.thumbnail;
    extras.append(img);
  }
  const diff = details.diff;
  if (diff && typeof diff === "object" && Number.isInteger(diff.added) && Number.isInteger(diff.removed)) {
    extras.append(buildSnapshotDiff(diff));
  }
  if (typeof node.name === "string" && !BUILT_IN_TOOL_NAMES.has(node.name)) extras.append(buildToolDetails(details));
  if (extras.childElementCount > 0) card.append(extras);
}

/**
 * An extension tool's details (its `{ content, details }`), closed under
 * the result: the data as indented JSON text, never rendered as HTML. A
 * note the engine left for details too large to keep reads as that note.
 * @param {object} details
 */
function buildToolDetails(details) {
  const box = document.createElement("details");
  box.className = "tool-details-data";
  const summary = document.createElement("summary");
  const body = document.createElement("pre");
  body.className = "tool-details-text";
  const keys = Object.keys(details);
  if (keys.length === 1 && keys[0] === "omitted" && typeof details.omitted === "string") {
    summary.textContent = "Details not kept";
    body.textContent = details.omitted;
  } else {
    summary.textContent = "Details";
    const text = prettyJson(details);
    body.textContent = text.length > MAX_SHOWN_DETAILS_CHARS
      ? `${text.slice(0, MAX_SHOWN_DETAILS_CHARS)}\n… ${text.length - MAX_SHOWN_DETAILS_CHARS} more characters not shown`
      : text;
  }
  box.append(summary, body);
  return box;
}

/** A snapshot's changes against the previous one: counts, then the changed lines as text. */
function buildSnapshotDiff(diff) {
  const box = document.createElement("details");
  box.className = "snapshot-diff";
  const summary = document.createElement("summary");
  const unchanged = diff.added === 0 && diff.removed === 0;
  summary.textContent = unchanged
    ? "No change since the previous snapshot of this page"
    : `Changed since the previous snapshot: ${diff.added} added, ${diff.removed} removed`;
  box.append(summary);
  const changes = Array.isArray(diff.changes) ? diff.changes : [];
  if (changes.length > 0) {
    const list = document.createElement("pre");
    list.className = "snapshot-diff-lines";
    for (const change of changes) {
      if (!change || typeof change.line !== "string") continue;
      const added = change.kind === "added";
      const line = document.createElement("span");
      line.className = added ? "diff-added" : "diff-removed";
      // Page text: shown as text only.
      line.textContent = `${added ? "+" : "−"} ${change.line}\n`;
      list.append(line);
    }
    if (diff.truncated === true) {
      const more = diff.added + diff.removed - changes.length;
      list.append(document.createTextNode(`… ${more} more change${more === 1 ? "" : "s"} not listed`));
    }
    box.append(list);
    box.open = true;
  }
  return box;
}

/**
 * Splits a page tool's result `<untrusted_page_content origin="…">\n…\n</untrusted_page_content>\n<warning>`
 * into { origin, text }; null for any other content.
 */
function untrustedPageContent(content) {
  if (!content.startsWith(UNTRUSTED_OPEN)) return null;
  const openEnd = content.indexOf(">");
  if (openEnd === -1) return null;
  const origin = /\sorigin="([^"]*)"/.exec(content.slice(0, openEnd));
  const close = content.lastIndexOf(UNTRUSTED_CLOSE);
  if (close === -1 || close < openEnd) return null;
  const text = content.slice(openEnd + 1, close).replace(/^\n/, "").replace(/\n$/, "");
  return { origin: origin ? origin[1] : "", text };
}

// -------------------------------------------------------------- markdown ---
// A small, safe subset: paragraphs, fenced code, `code`, **bold**, lists and
// headings. Everything becomes elements + text nodes; no HTML is parsed.

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([^`]*)$/;
const LIST_ITEM = /^\s{0,6}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;

function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  let index = 0;
  while (index < lines.length) {
    const line = lines[index];
    const fence = FENCE.exec(line);
    if (fence) {
      const marker = fence[1];
      const code = [];
      index += 1;
      while (index < lines.length && !lines[index].trim().startsWith(marker)) {
        code.push(lines[index]);
        index += 1;
      }
      index += 1; // closing fence (or end of text)
      const pre = document.createElement("pre");
      const codeElement = document.createElement("code");
      const language = fence[2].trim().split(/\s+/)[0];
      if (language) codeElement.dataset.language = language;
      codeElement.textContent = code.join("\n");
      pre.append(codeElement);
      fragment.append(pre);
      continue;
    }
    if (line.trim() === "") {
      index += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const level = Math.min(heading[1].length + 2, 6);
      const element = document.createElement(`h${level}`);
      appendInline(element, heading[2]);
      fragment.append(element);
      index += 1;
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      const ordered = /\d/.test(item[1]);
      const list = document.createElement(ordered ? "ol" : "ul");
      if (ordered && parseInt(item[1], 10) !== 1) /** @type {HTMLOListElement} */ (list).start = parseInt(item[1], 10);
      let current = null;
      while (index < lines.length) {
        const next = LIST_ITEM.exec(lines[index]);
        if (next && /\d/.test(next[1]) === ordered) {
          current = document.createElement("li");
          appendInline(current, next[2]);
          list.append(current);
        } else if (current && !next && lines[index].trim() !== "" && /^\s+/.test(lines[index]) && !FENCE.test(lines[index])) {
          current.append(document.createElement("br"));
          appendInline(current, lines[index].trim());
        } else {
          break;
        }
        index += 1;
      }
      fragment.append(list);
      continue;
    }
    const paragraph = document.createElement("p");
    let first = true;
    while (index < lines.length) {
      const next = lines[index];
      if (next.trim() === "" || FENCE.test(next) || HEADING.test(next) || (!first && LIST_ITEM.test(next))) break;
      if (!first) paragraph.append(document.createElement("br"));
      appendInline(paragraph, next);
      first = false;
      index += 1;
    }
    fragment.append(paragraph);
  }
  return fragment;
}

function appendInline(parent, text) {
  const codeSpan = /`([^`]+)`/g;
  let last = 0;
  for (let match = codeSpan.exec(text); match !== null; match = codeSpan.exec(text)) {
    appendBold(parent, text.slice(last, match.index));
    const code = document.createElement("code");
    code.textContent = match[1];
    parent.append(code);
    last = match.index + match[0].length;
  }
  appendBold(parent, text.slice(last));
}

function appendBold(parent, text) {
  const bold = /\*\*(?=\S)([^*]*?\S)\*\*|__(?=\S)([^_]*?\S)__/g;
  let last = 0;
  for (let match = bold.exec(text); match !== null; match = bold.exec(text)) {
    if (match.index > last) parent.append(document.createTextNode(text.slice(last, match.index)));
    const strong = document.createElement("strong");
    strong.textContent = match[1] ?? match[2];
    parent.append(strong);
    last = match.index + match[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

// ------------------------------------------------------- other rendering ---

/** @param {ThreadSummary[] | undefined} threads */
function renderThreads(threads) {
  if (Array.isArray(threads)) {
    state.threads = threads
      .filter((thread) => thread && typeof thread.id === "string")
      .slice()
      .sort((a, b) => (b.updatedAt || 0) - (a.updatedAt || 0));
  }
  const select = dom.threadList;
  const options = [];
  const known = state.threads.some((thread) => thread.id === state.threadId);
  if (state.threadId === null || !known) {
    const fresh = document.createElement("option");
    fresh.value = state.threadId || "";
    fresh.textContent = state.threadId === null ? "New thread" : "Current thread";
    options.push(fresh);
  }
  for (const thread of state.threads) {
    const option = document.createElement("option");
    option.value = thread.id;
    option.dataset.threadId = thread.id;
    option.textContent = thread.title && thread.title.trim() ? thread.title : "Untitled thread";
    if (thread.updatedAt) option.title = `Updated ${new Date(thread.updatedAt).toLocaleString()}`;
    options.push(option);
  }
  select.replaceChildren(...options);
  select.value = state.threadId || "";
  const title = state.threads.find((thread) => thread.id === state.threadId);
  dom.deleteThread.disabled = !title;
  dom.deleteThread.setAttribute("aria-label", title ? `Delete thread: ${clipText(title.title || "Untitled thread", 60)}` : "Delete thread");
  // A rename is for the thread it started on.
  if (renaming && renaming.threadId !== state.threadId) closeRename(false);
  renderRenameButton();
  // A confirmation is for the thread it asked about.
  if (dom.deleteThread.dataset.threadId !== state.threadId) cancelDelete();
}

// ---------------------------------------------------------- delete thread ---
// Two presses: the first asks, the second deletes (every version and message
// of the thread). Leaving the button, or Esc, cancels. While the thread's
// turn runs the question says so and the button reads "Stop and delete":
// the delete is sent with `stopTurn`, and the engine stops the turn (its
// end is saved and shown) before it deletes the thread.

/** The question and the button's label, by whether the turn runs. */
function renderDeleteQuestion() {
  const running = isRunning();
  const label = running ? "Stop and delete" : "Confirm delete";
  dom.deleteThread.textContent = label;
  dom.deleteNote.textContent = running
    ? `This thread's turn is running. Stop it and delete the thread with all its messages and versions? Press “${label}” again; Esc cancels.`
    : `Delete this thread with all its messages and versions? Press “${label}” again; Esc cancels.`;
}

function askOrDelete() {
  if (state.threadId === null || refusedWhileOpening()) return;
  if (dom.deleteThread.dataset.confirm !== "true") {
    dom.deleteThread.dataset.confirm = "true";
    dom.deleteThread.dataset.threadId = state.threadId;
    renderDeleteQuestion();
    return;
  }
  const threadId = state.threadId;
  const stopTurn = isRunning();
  cancelDelete();
  hideError();
  sendOp("thread.delete", stopTurn ? { threadId, stopTurn } : { threadId });
}

// ---------------------------------------------------------- rename thread ---
// Rename swaps the thread list for a field holding the title: Enter (or
// leaving the field) saves, Esc cancels. A rename is taken while the
// thread's turn runs too: the engine saves it between the turn's
// checkpoints, and the ACK comes once it is saved.

/** The rename under way. @type {{ threadId: string, original: string, submissionId: string | null } | null} */
let renaming = null;

function renderRenameButton() {
  const thread = state.threads.find((t) => t.id === state.threadId);
  dom.renameThread.disabled = !thread;
  dom.renameThread.setAttribute("aria-label", thread ? `Rename thread: ${clipText(thread.title || "Untitled thread", 60)}` : "Rename thread");
}

function openRename() {
  if (state.threadId === null || refusedWhileOpening()) return;
  const thread = state.threads.find((t) => t.id === state.threadId);
  if (!thread) return;
  cancelDelete();
  renaming = { threadId: thread.id, original: thread.title || "", submissionId: null };
  dom.threadTitleInput.value = thread.title || "";
  dom.threadTitleInput.readOnly = false;
  dom.threadList.hidden = true;
  dom.threadTitleInput.hidden = false;
  dom.threadTitleInput.focus();
  dom.threadTitleInput.select();
}

/** @param {boolean} focusButton give the keyboard back to Rename */
function closeRename(focusButton) {
  if (!renaming) return;
  renaming = null;
  dom.threadTitleInput.hidden = true;
  dom.threadTitleInput.readOnly = false;
  dom.threadList.hidden = false;
  if (dom.deleteNote.dataset.from === "rename") {
    dom.deleteNote.textContent = "";
    delete dom.deleteNote.dataset.from;
  }
  if (focusButton) dom.renameThread.focus();
}

function saveRename() {
  if (!renaming || renaming.submissionId !== null) return;
  const title = dom.threadTitleInput.value.replace(/\s+/g, " ").trim();
  if (title === "" || title === renaming.original) {
    closeRename(document.activeElement === dom.threadTitleInput);
    return;
  }
  renaming.submissionId = sendOp("thread.rename", { threadId: renaming.threadId, title });
  dom.threadTitleInput.readOnly = true;
}

/** The engine refused the rename: said under the field, which stays open. @param {ErrorInfo} error */
function onRenameRefused(error) {
  if (!renaming) return;
  renaming.submissionId = null;
  dom.threadTitleInput.readOnly = false;
  dom.deleteNote.dataset.from = "rename";
  dom.deleteNote.textContent = `Not renamed: ${explainError(error).text}`;
  dom.threadTitleInput.focus();
}

function cancelDelete() {
  if (dom.deleteThread.dataset.confirm !== "true") return;
  delete dom.deleteThread.dataset.confirm;
  delete dom.deleteThread.dataset.threadId;
  dom.deleteThread.textContent = "Delete";
  dom.deleteNote.textContent = "";
}

function renderQueue() {
  const items = state.queue.filter((item) => item && typeof item.id === "string");
  const editor = view.queueEditor;
  const editing = editor ? items.find((item) => item.id === editor.itemId) : undefined;
  if (editor && !editing) {
    // The item started (or was removed elsewhere) while being edited.
    closeQueueEditor(false);
    setNote("That queued message has already started (or was removed), so it could not be changed.");
  }
  const hadFocus = editor !== null && editing !== undefined && editor.li.contains(document.activeElement);
  // Redrawing must not drop the keyboard focus: remember which item's control had it.
  const active = document.activeElement;
  const focusedLi = !hadFocus && active instanceof HTMLElement && dom.queueList.contains(active)
    ? /** @type {HTMLElement | null} */ (active.closest("li[data-queue-item-id]"))
    : null;
  const focusedControl = focusedLi ? (active.classList.contains("queue-edit") ? ".queue-edit" : ".icon-button") : null;
  const focusedIndex = focusedLi ? [...dom.queueList.children].indexOf(focusedLi) : -1;
  dom.queueList.replaceChildren(...items.map((item) => {
    if (view.queueEditor && item.id === view.queueEditor.itemId) return view.queueEditor.li;
    const li = document.createElement("li");
    li.dataset.queueItemId = item.id;
    const text = document.createElement("span");
    text.className = "queue-text";
    text.textContent = item.text || "";
    const files = attachmentsOf(item);
    const edit = document.createElement("button");
    edit.type = "button";
    edit.className = "queue-edit";
    edit.textContent = "Edit";
    edit.setAttribute("aria-label", `Edit queued message: ${clipText(item.text || "", 60)}`);
    edit.addEventListener("click", () => openQueueEditor(item));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove queued message: ${clipText(item.text || "", 60)}`);
    remove.addEventListener("click", () => {
      if (state.threadId && !refusedWhileOpening()) sendOp("queue.remove", { threadId: state.threadId, itemId: item.id });
    });
    li.append(text);
    if (files.length > 0) li.append(attachmentList(files, item.id, true));
    li.append(edit, remove);
    return li;
  }));
  if (hadFocus && view.queueEditor) view.queueEditor.input.focus({ preventScroll: true });
  if (focusedLi) {
    const lis = [...dom.queueList.children];
    const same = lis.find((li) => li instanceof HTMLElement && li.dataset.queueItemId === focusedLi.dataset.queueItemId);
    // The item is gone (removed, or started): the one now in its place, else the composer.
    const target = same || lis[Math.min(focusedIndex, lis.length - 1)];
    const control = target ? /** @type {HTMLElement | null} */ (target.querySelector(focusedControl)) : null;
    (control || dom.input).focus({ preventScroll: true });
  }
  updateWaitingSection();
}

/**
 * Edits a queued message in place: Enter saves (`queue.update`), Esc cancels.
 * @param {QueueItem} item
 */
function openQueueEditor(item) {
  closeQueueEditor(false);
  const li = document.createElement("li");
  li.dataset.queueItemId = item.id;
  li.className = "queue-editing";
  const form = document.createElement("form");
  form.className = "queue-editor";
  form.noValidate = true;
  const input = document.createElement("input");
  input.type = "text";
  input.value = item.text || "";
  input.setAttribute("aria-label", "Edit queued message");
  input.setAttribute("aria-describedby", `queue-edit-hint queue-edit-error-${item.id}`);
  const [save, cancel] = submitAndCancel("Save", () => closeQueueEditor(true));
  const hint = document.createElement("span");
  hint.id = "queue-edit-hint";
  hint.className = "visually-hidden";
  hint.textContent = "Enter saves, Esc cancels.";
  const error = document.createElement("p");
  error.className = "editor-error";
  error.id = `queue-edit-error-${item.id}`;
  error.setAttribute("role", "alert");
  form.append(input, save, cancel, hint);
  li.append(form, error);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    saveQueueEdit();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      closeQueueEditor(true);
    }
  });
  view.queueEditor = { itemId: item.id, li, input, error, submissionId: null, sentText: "" };
  renderQueue();
  input.focus();
  input.select();
}

async function saveQueueEdit() {
  const editor = view.queueEditor;
  if (!editor || editor.submissionId !== null || editor.input.readOnly || state.threadId === null || refusedWhileOpening()) return;
  const text = editor.input.value.trim();
  const current = state.queue.find((item) => item.id === editor.itemId);
  // The files stay with the queued message; the editor changes its text.
  const shown = current ? attachmentsOf(current) : [];
  if (text === "" && shown.length === 0) {
    editor.error.textContent = "Type the message, or remove it from the queue with ×.";
    return;
  }
  if (current && current.text === text) {
    closeQueueEditor(true);
    return;
  }
  editor.error.textContent = "";
  editor.input.readOnly = true;
  const threadId = state.threadId;
  // A queued turn's files are shown by name only: fetched to go again.
  const { files: attachments, error } = await filesToResend(editor.itemId, shown);
  if (view.queueEditor !== editor || state.threadId !== threadId) return;
  if (attachments === undefined) {
    editor.input.readOnly = false;
    editor.error.textContent = `Not saved: ${error}`;
    editor.input.focus();
    return;
  }
  editor.sentText = text;
  editor.submissionId = sendOp("queue.update", { threadId, itemId: editor.itemId, input: withFiles(text, attachments) });
}

/** Closes the queue item editor; `refocus` puts the focus on the item's Edit button. */
function closeQueueEditor(refocus) {
  const editor = view.queueEditor;
  if (!editor) return;
  view.queueEditor = null;
  renderQueue();
  if (refocus) {
    const li = [...dom.queueList.children].find((child) => child instanceof HTMLElement && child.dataset.queueItemId === editor.itemId);
    const button = li ? /** @type {HTMLElement | null} */ (li.querySelector(".queue-edit")) : null;
    (button || dom.input).focus();
  }
}

function renderPendingSteers() {
  if (dom.steerList === null) {
    dom.steerList = document.createElement("ul");
    dom.steerList.id = "steer-list";
    dom.steerList.className = "steer-list";
    dom.steerList.setAttribute("aria-label", "Steering messages the agent has not read yet");
    dom.queueSection.prepend(dom.steerList);
  }
  dom.steerList.replaceChildren(...state.pendingSteers.map((steer) => {
    const li = document.createElement("li");
    li.dataset.steerId = steer.id;
    li.append(badge("steer", "The agent reads this at its next step"), document.createTextNode(` ${steer.text || ""}`));
    const files = attachmentsOf(steer);
    if (files.length > 0) li.append(attachmentList(files, steer.id, true));
    return li;
  }));
  updateWaitingSection();
}

/**
 * A steered user message arrived: the steer it is no longer waits. Its node
 * id is the steer's id; a message stored by an older build (another id) is
 * matched by its text.
 * @param {{ id: string, text: string }} node
 */
function dropPendingSteer(node) {
  const text = typeof node.text === "string" ? node.text : "";
  let index = state.pendingSteers.findIndex((steer) => steer.id === node.id);
  if (index === -1) {
    index = state.pendingSteers.findIndex((steer) => steer.text === text || (steer.text !== "" && text.startsWith(steer.text)));
  }
  if (index === -1) return;
  state.pendingSteers.splice(index, 1);
  renderPendingSteers();
}

function updateWaitingSection() {
  dom.queueSection.hidden = state.queue.length === 0 && state.pendingSteers.length === 0;
  dom.queueList.hidden = state.queue.length === 0;
  $("queue-heading").hidden = state.queue.length === 0;
}

function renderRunState() {
  dom.status.dataset.state = state.runState;
  dom.status.dataset.turnId = state.turnId || "";
  renderStatusText();
  const running = isRunning();
  dom.stop.disabled = !running;
  dom.send.textContent = running ? "Steer" : "Send";
  dom.send.title = running ? "Add this to the running turn (Enter)" : "Send (Enter)";
  const canContinue = !running && state.threadId !== null
    && (state.runState === "interrupted" || state.runState === "failed" || state.lastStopReason === "interrupted");
  dom.continue.hidden = !canContinue;
  dom.interruptedBanner.hidden = !(canContinue && (state.runState === "interrupted" || state.lastStopReason === "interrupted"));
  renderRenameButton();
  // A question asked while the turn ran (or before it started) follows it.
  if (dom.deleteThread.dataset.confirm === "true") renderDeleteQuestion();
  renderApproval();
  renderInteraction();
  renderUncertain();
}

// -------------------------------------------------------------- approval ---
// A write (a click) on a site without a rule waits (`waiting_approval`) until
// the user allows it once, allows it on the site, or declines it.

function isPendingApproval(value) {
  return value !== null && typeof value === "object" && typeof value.id === "string"
    && (value.status === undefined || value.status === "pending");
}

/** @param {EventOf<"approval.request">} event */
function onApprovalRequest(event) {
  const approval = event.approval;
  if (!isPendingApproval(approval)) return;
  if (state.approval && state.approval.id === approval.id) return; // already shown
  state.approval = approval;
  state.approvalAnswer = null;
  dom.approvalStatus.textContent = "";
  if (event.turnId) state.turnId = event.turnId;
  renderApproval();
}

/** @param {EventOf<"approval.resolved">} event */
function onApprovalResolved(event) {
  const status = typeof event.status === "string" ? event.status : "";
  const shown = state.approval && state.approval.id === event.approvalId ? state.approval : null;
  if (shown) markApprovalOnCard(shown.callId, status);
  if (!shown) return;
  state.approval = null;
  state.approvalAnswer = null;
  dom.approvalStatus.textContent = "";
  renderApproval();
}

/** Show the decision on the tool card of the call, as soon as it is answered. */
function markApprovalOnCard(callId, status) {
  const card = view.cardsByCallId.get(callId);
  if (card) markApproval(card, { status });
}

/**
 * The user's answer to a call's approval request as a badge in its card's
 * header: from the answer as it happens, then from the result node's
 * `approval` (kept with the conversation, so a redraw or a reload shows it).
 * @param {HTMLElement} card
 * @param {{ status: string, origin?: string, decidedAt?: number | null, byRule?: boolean }} note
 */
function markApproval(card, note) {
  const text = APPROVAL_STATUS_TEXT[note.status];
  if (!text) return;
  const header = card.querySelector(":scope > .tool-header");
  if (!header) return;
  let mark = /** @type {HTMLElement | null} */ (header.querySelector(":scope > .badge-approval"));
  if (!mark) {
    mark = document.createElement("span");
    mark.className = "badge badge-approval";
    const statusElement = header.querySelector(":scope > .tool-status");
    header.insertBefore(mark, statusElement);
  }
  mark.dataset.status = note.status;
  const on = note.origin ? ` on ${hostOf(note.origin)}` : "";
  const at = typeof note.decidedAt === "number" ? ` at ${new Date(note.decidedAt).toLocaleString()}` : "";
  if (note.byRule === true) {
    // Not asked: the user's "Allow on this site" rule let it run.
    mark.dataset.byRule = "true";
    mark.textContent = "allowed by site rule";
    mark.title = `Not asked: your rule for this site${on} (made${at || " earlier"}) let it run. Settings lists the rules.`;
  } else {
    mark.textContent = text;
    mark.title = `Your answer to the approval request${on}: ${text}${at}`;
  }
  card.dataset.approval = note.status;
}

function hostOf(origin) {
  try {
    return new URL(origin).host || origin;
  } catch {
    return origin;
  }
}

function renderApproval() {
  const card = dom.approvalCard;
  const approval = state.approval;
  const show = approval !== null && state.threadId !== null
    && (typeof approval.threadId !== "string" || approval.threadId === state.threadId);
  for (const marked of /** @type {NodeListOf<HTMLElement>} */ (dom.messages.querySelectorAll(".node.tool-call[data-awaiting-approval]"))) {
    if (show && marked.dataset.callId === approval.callId) continue;
    delete marked.dataset.awaitingApproval;
    const statusElement = marked.querySelector(":scope > .tool-header > .tool-status");
    if (statusElement) statusElement.textContent = marked.dataset.status || "";
  }
  if (!show) {
    if (!card.hidden && card.contains(document.activeElement)) dom.input.focus();
    card.hidden = true;
    delete card.dataset.approvalId;
    delete card.dataset.callId;
    card.removeAttribute("aria-busy");
    return;
  }
  const origin = typeof approval.origin === "string" ? approval.origin : "";
  const url = typeof approval.url === "string" ? approval.url : "";
  const name = typeof approval.toolName === "string" ? approval.toolName : "";
  const label = typeof approval.label === "string" && approval.label ? approval.label : name || "this action";
  dom.approvalHeadingAction.textContent = `“${label}”`;
  dom.approvalHeadingSite.textContent = hostOf(origin) || "this page";
  // One of the extension's own tools (src/platform/host_tools.rs) or of an
  // MCP server (src/platform/mcp.rs) acts on no page: no site to name, none
  // to allow it for (the engine refuses that).
  const offPage = origin === "";
  const server = typeof approval.server === "string" ? approval.server : "";
  const serverUrl = typeof approval.serverUrl === "string" ? approval.serverUrl : "";
  dom.approvalHeadingOn.hidden = offPage;
  dom.approvalHelp.textContent = server
    ? `The agent wants to send this to the MCP server “${server}”, a service outside your browser, which runs it. Nothing happens until you answer.`
    : offPage
      ? "The agent wants to run this action of the extension. Nothing happens until you answer."
      : "The agent wants to do this on that site, in your tab, as you (with your login). Nothing happens until you answer.";
  dom.approvalServer.textContent = server ? `${server} (${serverUrl || "no address"})` : "";
  dom.approvalServer.hidden = server === "";
  dom.approvalServerTerm.hidden = server === "";
  for (const element of [dom.approvalOriginTerm, dom.approvalOrigin, dom.approvalUrlTerm, dom.approvalUrl]) {
    element.hidden = offPage;
  }
  // A page without a host (a local file: "file://") is no site to allow:
  // it would allow every file (the engine refuses that, gatekeeper::is_site).
  const siteless = !/^[^:/]+:\/\/[^/]/.test(origin);
  dom.approvalButtons.acceptForSite.hidden = siteless;
  dom.approvalSiteHint.hidden = siteless;
  dom.approvalLabel.textContent = label;
  dom.approvalName.textContent = name && name !== label ? name : "";
  dom.approvalName.hidden = dom.approvalName.textContent === "";
  dom.approvalOrigin.textContent = origin || "(unknown)";
  dom.approvalUrl.textContent = url || "(unknown)";
  // An action inside a frame of another site: the site above is the frame's (that is what is approved).
  const pageUrl = typeof approval.pageUrl === "string" ? approval.pageUrl : "";
  dom.approvalFrame.textContent = pageUrl ? `a frame of the page ${pageUrl}` : "";
  dom.approvalFrame.hidden = pageUrl === "";
  dom.approvalFrameTerm.hidden = pageUrl === "";
  dom.approvalHintSite.textContent = origin || "this site";
  dom.approvalParams.textContent = approval.params !== undefined ? prettyJson(approval.params) : "{}";
  const element = offPage ? "" : describeTarget(approval);
  dom.approvalElement.textContent = element;
  dom.approvalElement.hidden = element === "";
  dom.approvalElementTerm.hidden = element === "";
  card.dataset.approvalId = approval.id;
  card.dataset.epoch = state.epoch || "";
  if (typeof approval.callId === "string") card.dataset.callId = approval.callId;

  const toolCard = view.cardsByCallId.get(approval.callId);
  if (toolCard && !view.resultsByCallId.has(approval.callId)) {
    toolCard.dataset.awaitingApproval = "true";
    const statusElement = toolCard.querySelector(":scope > .tool-header > .tool-status");
    if (statusElement) statusElement.textContent = "waiting for your approval";
  }

  const busy = state.approvalAnswer !== null;
  card.setAttribute("aria-busy", String(busy));
  for (const button of Object.values(dom.approvalButtons)) button.disabled = busy;
  const appearing = card.hidden;
  card.hidden = false;
  if (appearing) {
    // Bring the question to keyboard and screen-reader users, unless they are typing.
    if (!userIsTyping()) card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }
}

/**
 * What a page action would hit, in words: the element the engine found
 * under its `ref` (or its visible `text`) when it asked, as the page
 * described it then (`approval.element`: the approved write acts on that
 * element only, or does nothing); without one, the `text` it names.
 */
function describeTarget(approval) {
  const element = approval.element;
  if (element && typeof element === "object" && typeof element.role === "string" && typeof element.name === "string") {
    const state = typeof element.state === "string" && element.state ? ` ${clipText(element.state, 80)}` : "";
    return `${element.role} ${JSON.stringify(clipText(element.name, 80))}${state}`;
  }
  const params = approval.params;
  if (!params || typeof params !== "object") return "";
  if (typeof params.ref === "string" && params.ref.trim()) {
    return `${clipText(params.ref.trim(), 40)}, which the page could not describe when asked`;
  }
  if (typeof params.text === "string" && params.text) return `the element named ${JSON.stringify(clipText(params.text, 80))}`;
  return "";
}

function userIsTyping() {
  const active = document.activeElement;
  return active !== null
    && ((active instanceof HTMLTextAreaElement && active.value.trim() !== "") || active.tagName === "INPUT" || active.tagName === "SELECT");
}

function answerApproval(decision) {
  const approval = state.approval;
  if (approval === null || state.threadId === null || state.approvalAnswer !== null || refusedWhileOpening()) return;
  // Keep focus inside the card while its buttons are disabled (a disabled button drops focus).
  dom.approvalCard.focus({ preventScroll: true });
  const submissionId = sendOp("approval.response", { threadId: state.threadId, approvalId: approval.id, decision });
  state.approvalAnswer = { submissionId, approvalId: approval.id, decision };
  dom.approvalStatus.textContent = APPROVAL_DECISION_TEXT[decision] || "Sending…";
  hideError();
  renderApproval();
}

// ----------------------------------------------------------- interaction ---
// The model asked the user a question (the built-in `ask_user` tool): the run
// waits (`waiting_interaction`) until the user picks an option or types an
// answer. The answer is claimed once; after a restart the snapshot's
// `pendingInteraction` shows the same question again.

function isPendingInteraction(value) {
  return value !== null && typeof value === "object" && typeof value.id === "string"
    && (value.status === undefined || value.status === "pending");
}

/** @param {EventOf<"interaction.request">} event */
function onInteractionRequest(event) {
  const interaction = event.interaction;
  if (!isPendingInteraction(interaction)) return;
  if (state.interaction && state.interaction.id === interaction.id) return; // already shown
  state.interaction = interaction;
  state.interactionAnswer = null;
  dom.interactionStatus.textContent = "";
  if (event.turnId) state.turnId = event.turnId;
  renderInteraction();
}

/** @param {EventOf<"interaction.resolved">} event */
function onInteractionResolved(event) {
  const shown = state.interaction && state.interaction.id === event.interactionId ? state.interaction : null;
  if (!shown) return;
  const sent = state.interactionAnswer && state.interactionAnswer.interactionId === shown.id ? state.interactionAnswer : null;
  markInteractionEnd(shown, typeof event.status === "string" ? event.status : "", sent, event);
  state.interaction = null;
  state.interactionAnswer = null;
  dom.interactionStatus.textContent = "";
  renderInteraction();
}

/**
 * Shows how a question ended on its tool card: the agent's (`ask_user`) or
 * an MCP server's request for input. `sent` is what this panel sent, if it
 * answered; `event` the interaction.resolved, if any.
 * @param {InteractionRecord} interaction
 * @param {string} status
 * @param {{ answer: string | null, action?: ElicitationAction } | null} sent
 * @param {EventOf<"interaction.resolved"> | null} [event]
 */
function markInteractionEnd(interaction, status, sent, event = null) {
  if (elicitationOf(interaction) === null) {
    markInteractionOnCard(interaction.callId, status, sent ? sent.answer : null);
    return;
  }
  // Another panel's answer: the event says which.
  const told = event ? event.action : undefined;
  const action = sent && sent.action ? sent.action : typeof told === "string" ? told : "";
  markElicitationOnCard(interaction.callId, status, action, elicitationOf(interaction).server);
}

/**
 * Shows how an MCP server's request for input ended on the call's tool card
 * (a badge: accepted, declined, cancelled, request withdrawn), until the
 * next snapshot redraws it; the call itself goes on running.
 */
function markElicitationOnCard(callId, status, action, server) {
  const card = view.cardsByCallId.get(callId);
  const key = status === "answered" ? (ELICITATION_END_TEXT[action] ? action : "answered") : status === "cancelled" ? "withdrawn" : "";
  if (!card || !key) return;
  const header = card.querySelector(":scope > .tool-header");
  if (!header) return;
  const statusElement = header.querySelector(":scope > .tool-status");
  let mark = /** @type {HTMLElement | null} */ (header.querySelector(":scope > .badge-elicitation"));
  if (!mark) {
    mark = document.createElement("span");
    mark.className = "badge badge-elicitation";
    header.insertBefore(mark, statusElement);
  }
  mark.dataset.status = key;
  mark.textContent = ELICITATION_END_TEXT[key];
  const to = `the MCP server “${server}”`;
  mark.title = {
    accept: `You sent your answer to ${to}`,
    decline: `You declined the request of ${to}`,
    cancel: `You cancelled the request of ${to} without answering`,
    answered: `The request of ${to} was answered`,
    withdrawn: `The request of ${to} ended before you answered`,
  }[key];
  card.dataset.elicitation = key;
  delete card.dataset.awaitingAnswer;
  if (statusElement && statusElement.textContent === "waiting for your answer") statusElement.textContent = card.dataset.status || "";
}

/** Show how the question ended on the ask_user tool card (until its result or the next snapshot redraws it). */
function markInteractionOnCard(callId, status, answer) {
  const card = view.cardsByCallId.get(callId);
  if (!card || !INTERACTION_STATUS_TEXT[status]) return;
  const header = card.querySelector(":scope > .tool-header");
  if (!header) return;
  const statusElement = header.querySelector(":scope > .tool-status");
  let mark = header.querySelector(":scope > .badge-interaction");
  if (!mark) {
    mark = document.createElement("span");
    mark.className = "badge badge-approval badge-interaction";
    header.insertBefore(mark, statusElement);
  }
  mark.dataset.status = status;
  mark.textContent = INTERACTION_STATUS_TEXT[status];
  mark.title = status === "answered" ? "You answered the agent's question" : "The run ended before the question was answered";
  card.dataset.interaction = status;
  delete card.dataset.awaitingAnswer;
  if (statusElement && !view.resultsByCallId.has(callId)) statusElement.textContent = INTERACTION_STATUS_TEXT[status];
  if (status === "answered" && typeof answer === "string" && !view.resultsByCallId.has(callId)) showAnswerOnCard(card, answer);
}

/**
 * The status line's words: the run's state, or, while an MCP server's call
 * waits for the user's answer to its request (the run is executing that
 * call), that the run waits for the user.
 */
function renderStatusText() {
  const serverAsks = state.interaction !== null && state.runState === "executing_tools" && elicitationOf(state.interaction) !== null;
  dom.statusText.textContent = serverAsks ? STATE_TEXT.waiting_interaction : STATE_TEXT[state.runState] || state.runState.replace(/_/g, " ");
}

function renderInteraction() {
  renderStatusText();
  const card = dom.interactionCard;
  const interaction = state.interaction;
  const show = interaction !== null && state.threadId !== null
    && (typeof interaction.threadId !== "string" || interaction.threadId === state.threadId);
  for (const marked of /** @type {NodeListOf<HTMLElement>} */ (dom.messages.querySelectorAll(".node.tool-call[data-awaiting-answer]"))) {
    if (show && marked.dataset.callId === interaction.callId) continue;
    delete marked.dataset.awaitingAnswer;
    const statusElement = marked.querySelector(":scope > .tool-header > .tool-status");
    if (statusElement && statusElement.textContent === "waiting for your answer") statusElement.textContent = marked.dataset.status || "";
  }
  if (!show) {
    if (!card.hidden && card.contains(document.activeElement)) dom.input.focus();
    card.hidden = true;
    delete card.dataset.interactionId;
    delete card.dataset.callId;
    delete card.dataset.server;
    card.removeAttribute("aria-busy");
    dom.interactionAnswer.value = "";
    // What was typed for a server goes nowhere once its request is gone.
    dom.elicitationFields.replaceChildren();
    return;
  }
  if (card.dataset.interactionId !== interaction.id) {
    // A new question: draw it (kept as is while it stays open, so typed text survives redraws).
    const question = typeof interaction.question === "string" ? interaction.question : "";
    dom.interactionQuestion.textContent = question;
    const elicitation = elicitationOf(interaction);
    if (elicitation !== null) {
      drawElicitation(elicitation);
    } else {
      dom.interactionHeading.textContent = "The agent asks you";
      dom.interactionServerUrl.textContent = "";
      dom.interactionServerUrl.hidden = true;
      dom.elicitationForm.hidden = true;
      dom.elicitationFields.replaceChildren();
      dom.interactionForm.hidden = false;
      card.setAttribute("aria-describedby", "interaction-question");
      delete card.dataset.server;
      const options = Array.isArray(interaction.options)
        ? interaction.options.filter((option) => typeof option === "string" && option.trim() !== "")
        : [];
      dom.interactionOptions.replaceChildren(...options.map((option) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "interaction-option";
        button.textContent = option;
        button.dataset.answer = option;
        button.addEventListener("click", () => answerInteraction(option));
        return button;
      }));
      dom.interactionOptions.hidden = options.length === 0;
      dom.interactionAnswer.value = "";
      dom.interactionAnswer.placeholder = options.length ? "Or type another answer…" : "Type your answer…";
      dom.interactionSubmit.textContent = "Answer";
    }
  }
  card.dataset.interactionId = interaction.id;
  card.dataset.epoch = state.epoch || "";
  if (typeof interaction.callId === "string") card.dataset.callId = interaction.callId;

  const toolCard = view.cardsByCallId.get(interaction.callId);
  if (toolCard && !view.resultsByCallId.has(interaction.callId)) {
    toolCard.dataset.awaitingAnswer = "true";
    const statusElement = toolCard.querySelector(":scope > .tool-header > .tool-status");
    if (statusElement) statusElement.textContent = "waiting for your answer";
  }

  const busy = state.interactionAnswer !== null;
  card.setAttribute("aria-busy", String(busy));
  // Every control of the card (the question's and the server form's) waits while an answer is on its way.
  for (const control of /** @type {NodeListOf<HTMLButtonElement | HTMLInputElement | HTMLSelectElement>} */ (card.querySelectorAll("button, input, select"))) {
    control.disabled = busy;
  }
  const appearing = card.hidden;
  card.hidden = false;
  if (appearing) {
    // Bring the question to keyboard and screen-reader users, unless they are typing.
    if (!userIsTyping()) card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }
}

function answerInteraction(answer) {
  const interaction = state.interaction;
  if (interaction === null || state.threadId === null || state.interactionAnswer !== null || refusedWhileOpening()) return;
  if (typeof answer !== "string" || answer.trim() === "") {
    dom.interactionStatus.textContent = "Type an answer or choose one of the suggestions.";
    dom.interactionAnswer.focus();
    return;
  }
  // Keep focus inside the card while its controls are disabled (a disabled control drops focus).
  dom.interactionCard.focus({ preventScroll: true });
  const submissionId = sendOp("interaction.response", { threadId: state.threadId, interactionId: interaction.id, answer });
  state.interactionAnswer = { submissionId, interactionId: interaction.id, answer };
  dom.interactionStatus.textContent = `Sending your answer: ${clipText(answer, 80)}`;
  hideError();
  renderInteraction();
}

// ----------------------------------------------------------- elicitation ---
// An MCP server asks the user for input during a call of one of its tools
// (`elicitation/create`): the engine shows it as an interaction whose record
// names the server, with the server's form. The card then shows that form;
// the answer (Submit, Decline or Cancel) goes to the server, not to the
// agent, as `elicitation.response`. The panel checks the values first; the
// engine checks them again and its refusal names the field.

/**
 * The server's request in an InteractionRecord, or null for the agent's own
 * question (`ask_user`). Every field is checked here (what arrives is the
 * worker's JSON), and the rest of the panel uses what this returns.
 * @param {InteractionRecord} interaction
 * @returns {Elicitation | null}
 */
function elicitationOf(interaction) {
  if (!interaction || typeof interaction.server !== "string" || interaction.server === "") return null;
  const form = interaction.form && typeof interaction.form === "object" ? interaction.form : null;
  /** @type {unknown[]} */
  const raw = form && Array.isArray(form.fields) ? form.fields : [];
  return {
    server: interaction.server,
    serverUrl: typeof interaction.serverUrl === "string" ? interaction.serverUrl : "",
    fields: raw.map(fieldOf).filter((field) => field !== null),
  };
}

/** The most characters a user may type in one field of a server's form (the engine's bound). */
const MAX_ELICITATION_CHARS = 10000;

/** One field of the server's form, or null when it is not one (no name). @returns {ElicitationField | null} */
function fieldOf(value) {
  if (!value || typeof value !== "object" || typeof value.name !== "string" || value.name === "") return null;
  const number = (key) => (typeof value[key] === "number" && Number.isFinite(value[key]) ? value[key] : null);
  const text = (key) => (typeof value[key] === "string" ? value[key] : "");
  const type = ["string", "number", "integer", "boolean"].includes(value.type) ? value.type : "string";
  const options = Array.isArray(value.options) ? value.options.filter((option) => typeof option === "string") : null;
  const labels = options && Array.isArray(value.optionLabels) && value.optionLabels.length === options.length
    ? value.optionLabels.map((label, index) => (typeof label === "string" && label.trim() !== "" ? label : options[index]))
    : null;
  const fallback = value.default;
  return {
    name: value.name,
    type,
    title: text("title").trim() || value.name,
    description: text("description").trim(),
    required: value.required === true,
    options: options && options.length > 0 ? options : null,
    optionLabels: labels,
    format: text("format"),
    // As the engine bounds what a user may type (src/elicitation.rs, MAX_VALUE_CHARS).
    minLength: number("minLength") === null ? null : Math.min(number("minLength"), MAX_ELICITATION_CHARS),
    maxLength: number("maxLength") === null ? null : Math.min(number("maxLength"), MAX_ELICITATION_CHARS),
    minimum: number("minimum"),
    maximum: number("maximum"),
    default: typeof fallback === "string" || typeof fallback === "boolean" || (typeof fallback === "number" && Number.isFinite(fallback)) ? fallback : null,
  };
}

/** Draws the server's request in the interaction card: heading, address, one control per field. @param {Elicitation} elicitation */
function drawElicitation(elicitation) {
  const card = dom.interactionCard;
  dom.interactionHeading.textContent = `The MCP server “${elicitation.server}” asks you`;
  dom.interactionServerUrl.textContent = elicitation.serverUrl;
  dom.interactionServerUrl.hidden = elicitation.serverUrl === "";
  dom.interactionOptions.replaceChildren();
  dom.interactionOptions.hidden = true;
  dom.interactionForm.hidden = true;
  dom.interactionAnswer.value = "";
  dom.elicitationNoteServer.textContent = `“${elicitation.server}”`;
  dom.elicitationFields.replaceChildren(...elicitation.fields.map(buildElicitationField));
  dom.elicitationRequiredNote.hidden = !elicitation.fields.some((field) => field.required && field.type !== "boolean");
  dom.elicitationForm.hidden = false;
  card.dataset.server = elicitation.server;
  // Read with the message: where the answer goes, and what not to share.
  card.setAttribute("aria-describedby", "interaction-question elicitation-note");
}

/**
 * The label, control, hint and error line of one field. A field with
 * options is a select (with an empty choice when it is not required); a
 * boolean a checkbox; a number a number input; a string a text input of its
 * format. The server's default is filled in.
 * @param {ElicitationField} field
 * @param {number} index
 */
function buildElicitationField(field, index) {
  const id = `elicitation-field-${index}`;
  const wrapper = document.createElement("div");
  wrapper.className = "elicitation-field";
  wrapper.dataset.field = field.name;
  wrapper.dataset.type = field.type;
  const label = document.createElement("label");
  label.htmlFor = id;
  /** @type {HTMLInputElement | HTMLSelectElement} */
  let control;
  if (field.options !== null) {
    const select = document.createElement("select");
    const empty = document.createElement("option");
    empty.value = "";
    if (field.required) {
      // Not a choice: the user picks one (unless the server named a default).
      empty.textContent = "Choose…";
      empty.disabled = true;
    } else {
      empty.textContent = "(none)";
    }
    select.append(empty, ...field.options.map((value, optionIndex) => {
      const option = document.createElement("option");
      option.value = String(optionIndex);
      option.textContent = field.optionLabels ? field.optionLabels[optionIndex] : value;
      return option;
    }));
    const chosen = field.default === null ? -1 : field.options.indexOf(String(field.default));
    select.selectedIndex = chosen + 1;
    control = select;
  } else {
    const input = document.createElement("input");
    input.autocomplete = "off";
    if (field.type === "boolean") {
      input.type = "checkbox";
      input.checked = field.default === true;
    } else if (field.type === "number" || field.type === "integer") {
      input.type = "number";
      input.step = field.type === "integer" ? "1" : "any";
      input.inputMode = field.type === "integer" ? "numeric" : "decimal";
      if (field.minimum !== null) input.min = String(field.minimum);
      if (field.maximum !== null) input.max = String(field.maximum);
      if (typeof field.default === "number") input.value = String(field.default);
    } else {
      input.type = FORMAT_INPUT_TYPES[field.format] || "text";
      if (field.minLength !== null) input.minLength = field.minLength;
      if (field.maxLength !== null) input.maxLength = field.maxLength;
      if (input.type !== "text") input.spellcheck = false;
      if (typeof field.default === "string") {
        input.value = field.format === "date-time" ? localDateTimeOf(field.default) : field.default;
      }
    }
    control = input;
  }
  control.id = id;
  control.name = field.name;
  control.dataset.field = field.name;
  // A checkbox always has a value (checked or not): nothing to require.
  const required = field.required && field.type !== "boolean";
  if (required) {
    control.required = true;
    control.setAttribute("aria-required", "true");
  }
  const describedBy = [];
  if (field.description) describedBy.push(`${id}-hint`);
  describedBy.push(`${id}-error`);
  control.setAttribute("aria-describedby", describedBy.join(" "));

  if (field.type === "boolean" && field.options === null) {
    label.className = "check";
    label.append(control, document.createTextNode(field.title));
    wrapper.append(label);
  } else {
    label.textContent = field.title;
    if (required) {
      const mark = document.createElement("span");
      mark.className = "required-mark";
      mark.setAttribute("aria-hidden", "true");
      mark.textContent = " *";
      label.append(mark);
    }
    wrapper.append(label, control);
  }
  if (field.description) {
    const hint = document.createElement("p");
    hint.id = `${id}-hint`;
    hint.className = "hint elicitation-hint";
    hint.textContent = field.description;
    wrapper.append(hint);
  }
  const error = document.createElement("p");
  error.id = `${id}-error`;
  error.className = "field-error";
  wrapper.append(error);
  return wrapper;
}

/** The control of the field named `name` in the drawn form, or null. */
function elicitationControl(name) {
  for (const control of /** @type {NodeListOf<HTMLInputElement | HTMLSelectElement>} */ (dom.elicitationFields.querySelectorAll("input, select"))) {
    if (control.dataset.field === name) return control;
  }
  return null;
}

/**
 * The form's values as the server's JSON types (numbers as numbers,
 * booleans as booleans; an empty optional field left out), and what is
 * wrong with each field that does not fit its schema.
 * @param {ElicitationField[]} fields
 * @returns {{ content: { [key: string]: JsonValue }, errors: Map<string, string> }}
 */
function readElicitationForm(fields) {
  /** @type {[string, JsonValue][]} */
  const entries = [];
  const errors = new Map();
  for (const field of fields) {
    const control = elicitationControl(field.name);
    if (control === null) continue;
    const read = readElicitationField(field, control);
    if (read.error) errors.set(field.name, read.error);
    else if (read.value !== undefined) entries.push([field.name, read.value]);
  }
  // Own keys whatever the names (a field called "__proto__" too).
  return { content: Object.fromEntries(entries), errors };
}

/**
 * One field's value, or what is wrong with it (the checks a server's
 * schema makes: required, type, range, length, options, format).
 * @param {ElicitationField} field
 * @param {HTMLInputElement | HTMLSelectElement} control
 * @returns {{ value?: JsonValue, error?: string }}
 */
function readElicitationField(field, control) {
  if (control instanceof HTMLInputElement && control.type === "checkbox") return { value: control.checked };
  // A choice's value is its option's index (an option may be "" or have edge spaces).
  const raw = control instanceof HTMLSelectElement
    ? (control.value === "" ? "" : field.options?.[Number(control.value)] ?? "")
    : control.value.trim();
  if (control instanceof HTMLInputElement && control.validity.badInput) {
    if (control.type === "number") return { error: field.type === "integer" ? "Enter a whole number." : "Enter a number." };
    if (control.type === "date") return { error: "Enter a complete date." };
    if (control.type === "datetime-local") return { error: "Enter a complete date and time." };
    return { error: "Enter a valid value." };
  }
  const chose = control instanceof HTMLSelectElement && control.value !== "";
  if (raw === "" && !chose) return field.required ? { error: field.options ? "Required: choose one." : "Required: fill this in." } : {};
  if (field.options !== null && !field.options.includes(raw)) return { error: "Choose one of the options." };
  if (field.type === "number" || field.type === "integer") {
    const number = Number(raw);
    if (!Number.isFinite(number)) return { error: field.type === "integer" ? "Enter a whole number." : "Enter a number." };
    if (field.type === "integer" && !Number.isInteger(number)) return { error: "Enter a whole number." };
    const below = field.minimum !== null && number < field.minimum;
    const above = field.maximum !== null && number > field.maximum;
    if (below || above) {
      if (field.minimum !== null && field.maximum !== null) return { error: `Enter a number from ${field.minimum} to ${field.maximum}.` };
      return { error: below ? `Enter ${field.minimum} or more.` : `Enter ${field.maximum} or less.` };
    }
    return { value: number };
  }
  if (field.type === "boolean") {
    // A boolean with options (not drawn as a checkbox): "true" or "false".
    if (raw !== "true" && raw !== "false") return { error: "Choose yes or no." };
    return { value: raw === "true" };
  }
  const length = [...raw].length;
  if (field.minLength !== null && length < field.minLength) return { error: `Use at least ${field.minLength} character${field.minLength === 1 ? "" : "s"}.` };
  if (field.maxLength !== null && length > field.maxLength) return { error: `Use at most ${field.maxLength} character${field.maxLength === 1 ? "" : "s"}.` };
  // As the engine checks it (src/elicitation.rs): a dot in the domain, no empty label.
  if (field.format === "email" && (!/^[^\s@]+@[^\s@.]+(\.[^\s@.]+)+$/.test(raw) || (control instanceof HTMLInputElement && control.validity.typeMismatch))) {
    return { error: "Enter an email address, like name@example.com." };
  }
  if (field.format === "uri") {
    try {
      new URL(raw);
    } catch {
      return { error: "Enter a full address, like https://example.com." };
    }
  }
  if (field.format === "date" && !/^\d{4}-\d{2}-\d{2}$/.test(raw)) return { error: "Enter a date, like 2025-07-01." };
  if (field.format === "date-time") {
    const dateTime = rfc3339Of(raw);
    return dateTime ? { value: dateTime } : { error: "Enter a date and time." };
  }
  return { value: raw };
}

/**
 * A `datetime-local` value (local time, no zone) as RFC 3339 with the
 * browser's offset (JSON Schema's `date-time`), or "" when it is none.
 */
function rfc3339Of(local) {
  const date = new Date(local);
  if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/.test(local) || Number.isNaN(date.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  const offset = -date.getTimezoneOffset();
  const zone = offset === 0 ? "Z" : `${offset > 0 ? "+" : "-"}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}${zone}`;
}

/** A `date-time` default (RFC 3339) as a `datetime-local` value in the browser's time zone ("" when it is none). */
function localDateTimeOf(value) {
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  const seconds = date.getSeconds() ? `:${pad(date.getSeconds())}` : "";
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}${seconds}`;
}

/** Says what is wrong next to a field (its error line, read with the control) and marks it invalid. */
function showFieldError(name, message) {
  const control = elicitationControl(name);
  if (control === null) return null;
  const error = document.getElementById(`${control.id}-error`);
  if (error) error.textContent = message;
  control.setAttribute("aria-invalid", "true");
  return control;
}

function clearFieldError(control) {
  const error = document.getElementById(`${control.id}-error`);
  if (error) error.textContent = "";
  control.removeAttribute("aria-invalid");
}

function clearFieldErrors() {
  for (const control of /** @type {NodeListOf<HTMLInputElement | HTMLSelectElement>} */ (dom.elicitationFields.querySelectorAll("input, select"))) {
    clearFieldError(control);
  }
}

/**
 * Answers the server's request shown in the card: `accept` sends the
 * form's values once they fit its schema (else each field that does not
 * says why, and nothing is sent); `decline` and `cancel` send no values.
 * @param {ElicitationAction} action
 */
function answerElicitation(action) {
  const interaction = state.interaction;
  const elicitation = interaction === null ? null : elicitationOf(interaction);
  if (elicitation === null || state.threadId === null || state.interactionAnswer !== null || refusedWhileOpening()) return;
  clearFieldErrors();
  /** @type {{ [key: string]: JsonValue } | null} */
  let content = null;
  if (action === "accept") {
    const read = readElicitationForm(elicitation.fields);
    if (read.errors.size > 0) {
      let first = null;
      for (const [name, message] of read.errors) {
        const control = showFieldError(name, message);
        if (first === null) first = control;
      }
      dom.interactionStatus.textContent = read.errors.size === 1
        ? "Not sent: check the marked field."
        : `Not sent: check the ${read.errors.size} marked fields.`;
      if (first) first.focus();
      return;
    }
    content = read.content;
  }
  // Keep focus inside the card while its controls are disabled (a disabled control drops focus).
  dom.interactionCard.focus({ preventScroll: true });
  const submissionId = sendOp("elicitation.response", {
    threadId: state.threadId,
    interactionId: interaction.id,
    action,
    ...(content !== null ? { content } : {}),
  });
  state.interactionAnswer = { submissionId, interactionId: interaction.id, answer: null, action, content };
  dom.interactionStatus.textContent = ELICITATION_SENDING_TEXT[action];
  hideError();
  renderInteraction();
}

/** Whether `submissionId` is the elicitation.response this panel sent for the request shown. */
function isElicitationReply(submissionId) {
  const sent = state.interactionAnswer;
  return sent !== null && sent.submissionId === submissionId && typeof sent.action === "string";
}

/**
 * The engine refused the answer to the server's request (its values do not
 * fit the form, the request is gone, …): said in the card, next to the field
 * it names (`Field "email": …`), and the controls work again so the user can
 * fix it. Returns false when the card no longer shows that request (the
 * caller then says it in the banner).
 * @param {ErrorInfo} error
 */
function onElicitationRejected(error) {
  const sent = state.interactionAnswer;
  state.interactionAnswer = null;
  const shown = state.interaction !== null && state.interaction.id === sent.interactionId;
  if (!shown) return false;
  const text = explainError(error).text;
  dom.interactionStatus.textContent = `Not sent: ${text}`;
  renderInteraction();
  const message = error && typeof error.message === "string" ? error.message.trim() : "";
  const named = /^Field "([^"]+)":\s*(.*)$/s.exec(message);
  const control = named ? showFieldError(named[1], capitalize(named[2]) || text) : null;
  if (control) control.focus();
  else dom.interactionCard.focus({ preventScroll: true });
  if (error && error.kind !== "invalid_command") showError(error, `Could not ${OP_VERBS["elicitation.response"]}: `);
  return true;
}

function capitalize(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

// ------------------------------------------------------------ provider retry ---

/** @param {EventOf<"run.retry">} event */
function onRunRetry(event) {
  const delayMs = Number.isFinite(event.delayMs) ? Math.max(0, event.delayMs) : 0;
  state.retry = {
    turnId: event.turnId || state.turnId,
    // `attempt` counts the failed attempts so far; the retry is the next one.
    next: Number.isFinite(event.attempt) ? event.attempt + 1 : null,
    maxAttempts: Number.isFinite(event.maxAttempts) ? event.maxAttempts : null,
    message: retryCause(event.error),
    detail: event.error && typeof event.error.message === "string" ? event.error.message : "",
    // The worker's time of the retry (the same clock as ours), so an event
    // read late counts down what is really left; else from its arrival.
    // Never later than the delay from now (a bogus time shows no long count).
    until: Number.isFinite(event.retryAt) && event.retryAt > 0 ? Math.min(event.retryAt, Date.now() + delayMs) : Date.now() + delayMs,
  };
  renderRetry(true);
}

function retryText(retry) {
  const left = retry.until - Date.now();
  const when = left > 0 ? `Retrying in ${Math.ceil(left / 1000)} s` : "Retrying now";
  const attempt = retry.next !== null && retry.maxAttempts !== null ? ` (attempt ${retry.next} of ${retry.maxAttempts})` : "";
  return { left, text: `Provider error: ${retry.message.replace(/[.\s]+$/, "")}. ${when}${attempt}.` };
}

/**
 * The retry line counts down once per second. Screen readers hear it once per
 * run.retry: the live text is set when the event arrives; the ticking copy is
 * hidden from them.
 */
function renderRetry(announce = false) {
  if (state.retryTimer !== null) {
    clearTimeout(state.retryTimer);
    state.retryTimer = null;
  }
  const retry = state.retry;
  if (retry === null) {
    dom.retryLine.hidden = true;
    dom.retryLine.replaceChildren();
    dom.retryLine.title = "";
    return;
  }
  const { left, text } = retryText(retry);
  let spoken = dom.retryLine.querySelector(":scope > .retry-spoken");
  let shown = dom.retryLine.querySelector(":scope > .retry-shown");
  if (!spoken || !shown) {
    spoken = document.createElement("span");
    spoken.className = "retry-spoken visually-hidden";
    shown = document.createElement("span");
    shown.className = "retry-shown";
    shown.setAttribute("aria-hidden", "true");
    dom.retryLine.replaceChildren(spoken, shown);
  }
  if (announce) spoken.textContent = text;
  shown.textContent = text;
  dom.retryLine.title = retry.detail ? `Details: ${retry.detail}` : "";
  dom.retryLine.hidden = false;
  if (left > 0) state.retryTimer = setTimeout(renderRetry, left % 1000 || 1000);
}

function clearRetry() {
  if (state.retry === null && state.retryTimer === null) return;
  state.retry = null;
  renderRetry();
}

// ------------------------------------------------------ uncertain action ---
// A never-retry action (a click) was running when the worker died: its outcome
// is unknown and the run waits (`paused_uncertain`) for the user to decide.

function isInFlightTool(value) {
  return value !== null && typeof value === "object" && typeof value.callId === "string";
}

/** The tool call the paused run asks about: the run's inFlightTool, else the last call without a result. */
function uncertainCall() {
  const flight = state.inFlightTool;
  if (flight) {
    const drawn = view.toolCalls.get(flight.callId);
    return { callId: flight.callId, name: (drawn && drawn.name) || flight.name, label: drawn ? drawn.label : null, args: drawn ? drawn.args : undefined };
  }
  const open = [...view.toolCalls].filter(([callId]) => !view.resultsByCallId.has(callId));
  if (open.length === 0) return null;
  const [callId, drawn] = open[open.length - 1];
  return { callId, ...drawn };
}

function renderUncertain() {
  const card = dom.uncertainCard;
  const show = state.runState === "paused_uncertain" && state.threadId !== null;
  for (const marked of /** @type {NodeListOf<HTMLElement>} */ (dom.messages.querySelectorAll(".node.tool-call[data-uncertain]"))) {
    delete marked.dataset.uncertain;
    const statusElement = marked.querySelector(":scope > .tool-header > .tool-status");
    if (statusElement) statusElement.textContent = marked.dataset.status || "";
  }
  if (!show) {
    if (!card.hidden && card.contains(document.activeElement)) dom.input.focus();
    card.hidden = true;
    delete card.dataset.callId;
    state.resolveSubmission = null;
    dom.uncertainStatus.textContent = "";
    return;
  }
  const call = uncertainCall();
  const name = call && call.name ? call.name : "";
  const label = call && call.label ? call.label : name || "The last page action";
  dom.uncertainLabel.textContent = label;
  dom.uncertainName.textContent = name && name !== label ? name : "";
  dom.uncertainName.hidden = dom.uncertainName.textContent === "";
  dom.uncertainArgs.textContent = call && call.args !== undefined ? prettyJson(call.args) : "";
  dom.uncertainArgs.hidden = dom.uncertainArgs.textContent === "";
  if (call) {
    card.dataset.callId = call.callId;
    const toolCard = view.cardsByCallId.get(call.callId);
    if (toolCard && !view.resultsByCallId.has(call.callId)) {
      toolCard.dataset.uncertain = "true";
      const statusElement = toolCard.querySelector(":scope > .tool-header > .tool-status");
      if (statusElement) statusElement.textContent = "outcome unknown";
    }
  } else {
    delete card.dataset.callId;
  }
  const busy = state.resolveSubmission !== null;
  card.setAttribute("aria-busy", String(busy));
  for (const button of Object.values(dom.uncertainButtons)) button.disabled = busy;
  const appearing = card.hidden;
  card.hidden = false;
  if (appearing) {
    // Bring the question to keyboard and screen-reader users, unless they are typing.
    if (!userIsTyping()) card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }
}

function resolveUncertain(choice) {
  if (state.runState !== "paused_uncertain" || state.threadId === null || state.resolveSubmission !== null || refusedWhileOpening()) return;
  // Keep focus inside the card while its buttons are disabled (a disabled button drops focus).
  dom.uncertainCard.focus({ preventScroll: true });
  state.resolveSubmission = sendOp("run.resolveUncertain", { threadId: state.threadId, choice });
  dom.uncertainStatus.textContent = UNCERTAIN_CHOICE_TEXT[choice] || "Sending…";
  hideError();
  renderUncertain();
}

/** @param {EventOf<"token.usage">} event */
function renderUsage(event) {
  const parts = [];
  if (event.turnTotal !== undefined) parts.push(`turn ${formatUsage(event.turnTotal)}`);
  if (event.threadTotal !== undefined) parts.push(`thread ${formatUsage(event.threadTotal)}`);
  if (parts.length === 0 && event.usage) parts.push(formatUsage(event.usage));
  dom.usageText.textContent = parts.length ? `Tokens: ${parts.join(" · ")}` : "";
}

function formatUsage(usage) {
  if (typeof usage === "number") return usage.toLocaleString();
  if (usage && typeof usage === "object") {
    return `${Number(usage.input || 0).toLocaleString()} in / ${Number(usage.output || 0).toLocaleString()} out`;
  }
  return "";
}

function isRunning() {
  return RUNNING_STATES.has(state.runState);
}

/**
 * An ErrorInfo in plain words: `text` says what happened and what to do,
 * `detail` is the engine's own message when it adds something, `settings` the
 * id of the settings field the fix is in (or null).
 */
/**
 * @param {ErrorInfo | null | undefined} error
 * @returns {{ kind: string, text: string, detail: string, settings: string | null }}
 */
function explainError(error) {
  const kind = error && typeof error === "object" && typeof error.kind === "string" ? error.kind : "";
  const message = error && typeof error === "object" && typeof error.message === "string" ? error.message.trim() : "";
  const words = ERROR_WORDS[kind];
  if (words && !MESSAGE_FIRST_KINDS.has(kind)) {
    return { kind, text: words.text, detail: message && message !== words.text ? message : "", settings: words.settings || null };
  }
  if (message) return { kind, text: /[.!?]$/.test(message) ? message : `${message}.`, detail: "", settings: null };
  if (kind === "invalid_command") return { kind, text: "That is not possible right now.", detail: "", settings: null };
  if (kind === "not_found") return { kind, text: "That no longer exists. It may have been deleted.", detail: "", settings: null };
  return { kind, text: "Something went wrong. Press Continue to try again.", detail: "", settings: null };
}

/**
 * The short cause of a provider retry for the retry line: the kind in words and
 * the HTTP status when the engine's message names one (the full message is the
 * line's tooltip). The action is the countdown: the engine retries by itself.
 */
function retryCause(error) {
  const kind = error && typeof error.kind === "string" ? error.kind : "";
  const message = error && typeof error.message === "string" ? error.message.trim() : "";
  const status = /\bHTTP \d{3}\b/.exec(message);
  const cause = RETRY_WORDS[kind] || "the request failed";
  return status ? `${cause} (${status[0]})` : cause;
}

/**
 * Shows an ErrorInfo (or a sentence) in the error banner; `prefix` says what failed.
 * @param {ErrorInfo | string} error
 */
function showError(error, prefix = "") {
  const explained = typeof error === "string"
    ? { kind: "", text: error, detail: "", settings: null }
    : explainError(error);
  dom.errorBanner.dataset.kind = explained.kind;
  dom.errorText.textContent = `${prefix}${explained.text}`;
  dom.errorDetail.textContent = explained.detail ? `Details: ${explained.detail}` : "";
  dom.errorDetail.hidden = !explained.detail;
  dom.errorSettings.hidden = explained.settings === null;
  dom.errorSettings.dataset.field = explained.settings || "";
  dom.errorBanner.hidden = false;
}

function hideError() {
  dom.errorBanner.hidden = true;
  dom.errorBanner.dataset.kind = "";
  dom.errorText.textContent = "";
  dom.errorDetail.textContent = "";
  dom.errorDetail.hidden = true;
  dom.errorSettings.hidden = true;
}

function setNote(text) {
  dom.note.textContent = text;
}

function removeEmptyHint() {
  const hint = dom.messages.querySelector(":scope > .empty-hint");
  if (hint) hint.remove();
}

function clipText(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** At most one scroll per frame, and only if the reader was at the bottom. */
function scheduleScroll() {
  if (view.scrollScheduled) return;
  view.scrollScheduled = true;
  requestAnimationFrame(() => {
    view.scrollScheduled = false;
    if (view.stickToBottom) dom.messages.scrollTop = dom.messages.scrollHeight;
    maybeLoadEarlier();
  });
}

// ----------------------------------------------------------- attachments ---
// Images, PDFs and text files go with a message (the engine's bounds,
// src/model.rs: at most 4 files, an image of at most 1 MiB of base64, a PDF of
// at most 4 MiB of it, a text file of at most 200,000 characters, 6 MiB in all). Images are scaled to at most 1568 px on their longer
// side (what both providers use at most) and compressed as JPEG until they
// fit; a file that cannot be sent is named in the composer's note and left out.

const MAX_ATTACHMENTS = 4;
const MAX_IMAGE_CHARS = 1024 * 1024;
const MAX_TEXT_CHARS = 200_000;
const MAX_PDF_CHARS = 4 * 1024 * 1024;
const MAX_TOTAL_CHARS = 6 * 1024 * 1024;
const MAX_IMAGE_SIDE = 1568;
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/** Text files whose type the browser does not know (or calls application/…). */
const TEXT_NAME = /\.(txt|md|markdown|csv|tsv|json|jsonl|xml|ya?ml|log|html?|css|m?js|ts|py|rs|go|java|c|h|cpp|sh|sql|toml|ini)$/i;

/**
 * The files a node, queued message or steer carries (none if malformed).
 * @param {{ attachments?: unknown }} holder
 * @returns {Attachment[]}
 */
function attachmentsOf(holder) {
  const files = holder && Array.isArray(holder.attachments) ? holder.attachments : [];
  return files.filter((file) => file && typeof file === "object" && typeof file.name === "string"
    && FILE_KINDS.includes(file.kind === "omitted" ? file.of : file.kind));
}

const FILE_KINDS = ["image", "text", "pdf"];

/** The kind of file it is (an omitted one's `of`). @param {Attachment} file */
function fileKind(file) {
  return file.kind === "omitted" ? file.of : file.kind;
}

/**
 * A list of files as shown in the conversation: images as thumbnails, text
 * files by name. `compact`: names only (queued messages, steers). `ownerId`:
 * the message (or queued turn, or steer) they belong to, where a file the
 * engine left out of its view (`kind: "omitted"`) is fetched from.
 * @param {Attachment[]} files
 * @param {string} ownerId
 * @param {boolean} [compact]
 */
function attachmentList(files, ownerId, compact = false) {
  const list = document.createElement("ul");
  list.className = compact ? "attachment-list compact" : "attachment-list";
  list.setAttribute("aria-label", files.length === 1 ? "1 attached file" : `${files.length} attached files`);
  files.forEach((file, index) => {
    const kind = fileKind(file);
    const item = document.createElement("li");
    item.className = `attachment attachment-${kind}`;
    item.dataset.kind = kind;
    if (file.kind === "omitted") item.dataset.omitted = "true";
    // A full list opens each file (`openAttachment`); a compact one names it.
    const holder = compact ? item : document.createElement("button");
    if (holder instanceof HTMLButtonElement) {
      holder.type = "button";
      holder.className = "attachment-open";
      holder.setAttribute("aria-label", `Open ${file.name}`);
      holder.addEventListener("click", () => openAttachment(file, holder, ownerId, index));
      item.append(holder);
    }
    if (file.kind === "omitted" && kind === "image" && !compact) {
      // Its thumbnail is fetched when it scrolls into view.
      holder.dataset.ownerId = ownerId;
      holder.dataset.index = String(index);
      thumbnailObserver.observe(holder);
    }
    if (file.kind === "image" && !compact && typeof file.data === "string" && IMAGE_TYPES.includes(file.mediaType)) {
      const image = document.createElement("img");
      image.src = `data:${file.mediaType};base64,${file.data}`;
      image.alt = file.name;
      image.loading = "lazy";
      holder.append(image);
    }
    if (file.kind !== "image") {
      // What kind of file: the name's extension, else the media type's subtype
      // (an image the view left out is named the same way, without its thumbnail).
      const type = document.createElement("span");
      type.className = "attachment-type";
      const extension = /\.([a-z0-9]{1,8})$/i.exec(file.name);
      type.textContent = extension ? extension[1] : String(file.mediaType).split("/").pop() || "text";
      type.setAttribute("aria-hidden", "true");
      holder.append(type);
    }
    const name = document.createElement("span");
    name.className = "attachment-name";
    name.textContent = file.name;
    name.title = file.kind === "text" ? `${file.name} (${file.mediaType}, ${file.text.length} characters)`
      : file.kind === "pdf" ? `${file.name} (PDF, ${Math.round((file.data.length / 4) * 3 / 1024)} KiB)`
        : file.kind === "omitted" ? `${file.name} (${kind === "text" ? `${file.size} characters` : `${Math.round((file.size / 4) * 3 / 1024)} KiB`}; loaded when opened)`
          : file.name;
    holder.append(name);
    list.append(item);
  });
  return list;
}

/**
 * Fetches the thumbnail of an image a view left out once its button comes
 * near the visible part of the conversation (one fetch per drawn button).
 */
const thumbnailObserver = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    thumbnailObserver.unobserve(entry.target);
    loadThumbnail(/** @type {HTMLElement} */ (entry.target));
  }
}, { rootMargin: "200px" });

/** @param {HTMLElement} holder an omitted image's button (`attachmentList`) */
async function loadThumbnail(holder) {
  const { ownerId, index } = holder.dataset;
  if (ownerId === undefined || index === undefined) return;
  let file;
  try {
    file = await fetchAttachment(ownerId, Number(index));
  } catch {
    return; // The name stays; pressed, it says why the file cannot be opened.
  }
  if (!holder.isConnected || file.kind !== "image" || !IMAGE_TYPES.includes(file.mediaType)) return;
  const image = document.createElement("img");
  image.src = `data:${file.mediaType};base64,${file.data}`;
  image.alt = file.name;
  holder.querySelector(".attachment-type")?.remove();
  holder.prepend(image);
}

/**
 * Shows an attached file: an image or a text file in the viewer dialog
 * (Esc or Close closes it and puts the focus back on `opener`), a PDF in a
 * new tab (Chrome's own viewer, from a `blob:` URL of this page). One the
 * view left out is fetched first (`ownerId`'s file `index`).
 * @param {Attachment} file
 * @param {HTMLElement} opener
 * @param {string} ownerId
 * @param {number} index
 */
async function openAttachment(file, opener, ownerId, index) {
  if (file.kind === "omitted") {
    if (opener.getAttribute("aria-busy") === "true") return;
    opener.setAttribute("aria-busy", "true");
    try {
      file = await fetchAttachment(ownerId, index);
    } catch (error) {
      setNote(`Could not open ${file.name}: ${fileFetchError(error)}`);
      return;
    } finally {
      opener.removeAttribute("aria-busy");
    }
    if (!opener.isConnected || file.kind === "omitted") return;
  }
  if (file.kind === "pdf") {
    const bytes = Uint8Array.from(atob(file.data), (c) => c.charCodeAt(0));
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/pdf" }));
    window.open(url, "_blank");
    // The new tab has loaded it by then.
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    return;
  }
  const viewer = /** @type {HTMLDialogElement} */ ($("attachment-viewer"));
  $("attachment-viewer-name").textContent = file.name;
  const body = $("attachment-viewer-body");
  if (file.kind === "image") {
    const image = document.createElement("img");
    image.src = `data:${file.mediaType};base64,${file.data}`;
    image.alt = file.name;
    body.replaceChildren(image);
  } else if (file.kind === "text") {
    const text = document.createElement("pre");
    text.textContent = file.text;
    body.replaceChildren(text);
  }
  viewer.addEventListener("close", () => {
    body.replaceChildren();
    if (opener.isConnected) opener.focus();
  }, { once: true });
  viewer.showModal();
  $button("attachment-viewer-close").focus();
}

/** The composer's files, each with a button that takes it out. */
function renderComposerAttachments() {
  dom.attachList.hidden = state.attachments.length === 0;
  dom.attachList.replaceChildren(...state.attachments.map((file, index) => {
    // The composer's files are whole: they have no owner to be fetched from.
    const item = attachmentList([file], "").firstElementChild || document.createElement("li");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove attached file ${file.name}`);
    remove.addEventListener("click", () => {
      state.attachments.splice(index, 1);
      renderComposerAttachments();
      dom.input.focus();
    });
    item.append(remove);
    return item;
  }));
}

/**
 * Reads picked, pasted or dropped files into the composer, in order.
 * @param {Iterable<File>} files
 */
async function attachFiles(files) {
  for (const file of files) {
    if (state.attachments.length + state.attaching >= MAX_ATTACHMENTS) {
      setNote(`At most ${MAX_ATTACHMENTS} files go with one message; ${file.name || "the rest"} was left out.`);
      return;
    }
    state.attaching += 1;
    try {
      const attachment = await prepareAttachment(file);
      const total = [...state.attachments, attachment].reduce((sum, a) => sum + attachmentSize(a), 0);
      if (total > MAX_TOTAL_CHARS) throw new Error(`with it the files would hold more than ${MAX_TOTAL_CHARS / 1024 / 1024} MiB, more than one message takes.`);
      state.attachments.push(attachment);
      renderComposerAttachments();
    } catch (error) {
      setNote(`${file.name || "The file"}: ${error instanceof Error ? error.message : String(error)}`);
    } finally {
      state.attaching -= 1;
    }
  }
}

/**
 * An op's input: the text, and the files when there are any (the field is
 * left out otherwise, as the protocol's default).
 * @param {string} text
 * @param {Attachment[]} attachments
 * @returns {{ text: string, attachments?: Attachment[] }}
 */
function withFiles(text, attachments) {
  return attachments.length > 0 ? { text, attachments } : { text };
}

/** What the engine's per-message bound counts of a file (src/model.rs `Attachment::size`). @param {Attachment} file */
function attachmentSize(file) {
  if (file.kind === "omitted") return file.size;
  // UTF-8 bytes of a text file, as Rust's `str::len`.
  return file.kind === "text" ? new TextEncoder().encode(file.text).length : file.data.length;
}

/**
 * Files fetched whole, for the thread shown now (`attachment.get`): a few,
 * so opening a file twice or opening it then editing its message asks once.
 * @type {Map<string, Attachment>}
 */
const fetchedFiles = new Map();
const MAX_FETCHED_FILES = 8;

/**
 * The `index`th file of `ownerId` (a message, queued turn or steer of the
 * thread shown), whole.
 * @param {string} ownerId
 * @param {number} index
 * @returns {Promise<Attachment>}
 */
async function fetchAttachment(ownerId, index) {
  const threadId = state.threadId;
  if (threadId === null) throw new Error("no thread is open.");
  const key = `${threadId}\u001f${ownerId}\u001f${index}`;
  const cached = fetchedFiles.get(key);
  if (cached) return cached;
  const result = await requestOp("attachment.get", { threadId, ownerId, index });
  const [file] = attachmentsOf({ attachments: [result.attachment] });
  if (!file || file.kind === "omitted") throw new Error("the engine sent no file.");
  fetchedFiles.set(key, file);
  while (fetchedFiles.size > MAX_FETCHED_FILES) fetchedFiles.delete(fetchedFiles.keys().next().value || "");
  return file;
}

/**
 * `files` as they go in an input: those a view left out fetched whole.
 * @param {string} ownerId
 * @param {Attachment[]} files
 * @returns {Promise<Attachment[]>}
 */
function wholeFiles(ownerId, files) {
  return Promise.all(files.map((file, index) => (file.kind === "omitted" ? fetchAttachment(ownerId, index) : file)));
}

/**
 * `shown` (a message's or queued turn's files as drawn) ready to be sent
 * again, or why they cannot be, in words.
 * @param {string} ownerId
 * @param {Attachment[]} shown
 * @returns {Promise<{ files?: Attachment[], error?: string }>}
 */
async function filesToResend(ownerId, shown) {
  try {
    return { files: await wholeFiles(ownerId, shown) };
  } catch (error) {
    return { error: fileFetchError(error) };
  }
}

/** Why a file could not be fetched, in words. @param {unknown} error */
function fileFetchError(error) {
  if (error instanceof Error) return error.message;
  return explainError(/** @type {ErrorInfo} */ (error)).text;
}

/**
 * @param {File} file
 * @returns {Promise<Attachment>}
 */
async function prepareAttachment(file) {
  const name = (file.name || (file.type.startsWith("image/") ? "pasted image" : "pasted file"))
    .replace(/[\u0000-\u001f\u007f]/g, " ").slice(0, 200);
  if (file.type.startsWith("image/")) return { kind: "image", name, ...(await prepareImage(file)) };
  if (file.type === "application/pdf" || /\.pdf$/i.test(name)) {
    const data = await base64Of(file);
    if (data.length > MAX_PDF_CHARS) {
      throw new Error(`the PDF is ${Math.round(file.size / 1024)} KiB; at most ${(MAX_PDF_CHARS / 4) * 3 / 1024} KiB fit in a message.`);
    }
    // Every PDF starts with "%PDF-" ("JVBERi0" in base64).
    if (!data.startsWith("JVBERi0")) throw new Error("this is not a PDF.");
    return { kind: "pdf", name, mediaType: "application/pdf", data };
  }
  if (file.type.startsWith("text/") || TEXT_NAME.test(name) || /json|xml|yaml/.test(file.type)) {
    const text = await file.text();
    if (text.includes("\u0000")) throw new Error("this is not a text file, so it cannot be attached.");
    if (text.length > MAX_TEXT_CHARS) {
      throw new Error(`the file holds ${text.length} characters; at most ${MAX_TEXT_CHARS} fit in a message.`);
    }
    return { kind: "text", name, mediaType: (file.type || "text/plain").slice(0, 100), text };
  }
  throw new Error("only images (PNG, JPEG, GIF, WebP), PDFs and text files can be attached.");
}

/**
 * An image as the engine takes it: as it is when its type, size and sides
 * fit, else scaled and compressed as JPEG.
 * @param {Blob} file
 * @returns {Promise<{ mediaType: string, data: string }>}
 */
async function prepareImage(file) {
  /** @type {ImageBitmap} */
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    throw new Error("the image could not be read.");
  }
  const scale = Math.min(1, MAX_IMAGE_SIDE / Math.max(bitmap.width, bitmap.height));
  if (scale === 1 && IMAGE_TYPES.includes(file.type) && Math.ceil(file.size / 3) * 4 <= MAX_IMAGE_CHARS) {
    bitmap.close();
    return { mediaType: file.type, data: await base64Of(file) };
  }
  const width = Math.max(1, Math.round(bitmap.width * scale));
  const height = Math.max(1, Math.round(bitmap.height * scale));
  const canvas = new OffscreenCanvas(width, height);
  const context = canvas.getContext("2d");
  if (!context) throw new Error("the image could not be scaled.");
  // JPEG has no transparency: transparent parts become white, not black.
  context.fillStyle = "#ffffff";
  context.fillRect(0, 0, width, height);
  context.drawImage(bitmap, 0, 0, width, height);
  bitmap.close();
  for (const quality of [0.85, 0.7, 0.5, 0.3]) {
    const data = await base64Of(await canvas.convertToBlob({ type: "image/jpeg", quality }));
    if (data.length <= MAX_IMAGE_CHARS) return { mediaType: "image/jpeg", data };
  }
  throw new Error("the image stays too large even compressed.");
}

/** @param {Blob} blob @returns {Promise<string>} base64 without the data: prefix */
function base64Of(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const url = String(reader.result);
      resolve(url.slice(url.indexOf(",") + 1));
    };
    reader.onerror = () => reject(new Error("the file could not be read."));
    reader.readAsDataURL(blob);
  });
}

dom.attach.addEventListener("click", () => dom.attachInput.click());
$button("attachment-viewer-close").addEventListener("click", () => /** @type {HTMLDialogElement} */ ($("attachment-viewer")).close());
dom.attachInput.addEventListener("change", () => {
  const files = [...(dom.attachInput.files || [])];
  dom.attachInput.value = "";
  attachFiles(files).then(() => dom.input.focus());
});
dom.input.addEventListener("paste", (event) => {
  const files = [...(event.clipboardData ? event.clipboardData.files : [])];
  if (files.length === 0) return;
  // Text copied along with the files (a page's selection) is pasted as usual.
  if (!event.clipboardData || event.clipboardData.getData("text/plain") === "") event.preventDefault();
  attachFiles(files);
});
// Files dropped anywhere on the panel go with the next message; the
// composer shows where they go while they are dragged over.
document.addEventListener("dragover", (event) => {
  if (event.dataTransfer && [...event.dataTransfer.types].includes("Files")) {
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
    dom.composer.dataset.dropping = "true";
  }
});
document.addEventListener("dragleave", (event) => {
  // Left the panel (not just one element for another inside it).
  if (event.relatedTarget === null) delete dom.composer.dataset.dropping;
});
document.addEventListener("drop", (event) => {
  delete dom.composer.dataset.dropping;
  const files = [...(event.dataTransfer ? event.dataTransfer.files : [])];
  if (files.length === 0) return;
  event.preventDefault();
  attachFiles(files);
});

// ----------------------------------------------------------------- input ---

function submitInput(mode) {
  const text = dom.input.value.trim();
  if (state.attaching > 0) {
    setNote("Wait a moment: the attached files are still being read.");
    return;
  }
  const attachments = state.attachments.slice();
  if (text === "" && attachments.length === 0) return;
  if (threadPending()) {
    state.heldSubmit = mode;
    setNote("Sends when the thread is shown…");
    return;
  }
  setNote("");
  const input = withFiles(text, attachments);
  const meta = { text, attachments };
  if (mode === "enqueue" && state.threadId !== null) {
    sendOp("turn.enqueue", { threadId: state.threadId, input }, meta);
  } else if (isRunning() && state.threadId !== null && state.turnId !== null) {
    sendOp("turn.steer", { threadId: state.threadId, expectedTurnId: state.turnId, input }, meta);
  } else {
    sendOp("turn.submit", { threadId: state.threadId, input }, meta);
  }
  dom.input.value = "";
  state.attachments = [];
  renderComposerAttachments();
  view.stickToBottom = true;
}

function interrupt() {
  // Stop acts on the run the panel shows: not while another thread opens.
  if (state.threadId === null || refusedWhileOpening()) return;
  sendOp("turn.interrupt", { threadId: state.threadId });
}

dom.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  submitInput("auto");
});

dom.input.addEventListener("keydown", (event) => {
  if (event.isComposing) return;
  if (event.key === "Enter") {
    if (event.shiftKey && event.altKey) {
      event.preventDefault();
      submitInput("enqueue");
    } else if (!event.shiftKey && !event.altKey && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      submitInput("auto");
    }
  } else if (event.key === "Escape") {
    event.preventDefault();
    interrupt();
  }
});

// Esc stops a running turn, but not when it closes something of its own:
// an open dialog (the attachment viewer closes itself on Esc, as its
// default action, so nothing marks the event) or a Settings field.
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape" || event.defaultPrevented || event.target === dom.input || !isRunning()) return;
  if (event.target instanceof Element && event.target.closest("dialog[open], #settings-section")) return;
  interrupt();
});

dom.enqueue.addEventListener("click", () => submitInput("enqueue"));
dom.stop.addEventListener("click", interrupt);
dom.continue.addEventListener("click", () => {
  if (state.threadId !== null && !refusedWhileOpening()) sendOp("run.resume", { threadId: state.threadId });
});
dom.newThread.addEventListener("click", () => {
  sendOp("thread.create", {});
  expectNewThread();
});
for (const [choice, button] of Object.entries(dom.uncertainButtons)) {
  button.addEventListener("click", () => resolveUncertain(choice));
}
for (const [decision, button] of Object.entries(dom.approvalButtons)) {
  button.addEventListener("click", () => answerApproval(decision));
}
dom.interactionForm.addEventListener("submit", (event) => {
  event.preventDefault();
  answerInteraction(dom.interactionAnswer.value.trim());
});
dom.elicitationForm.addEventListener("submit", (event) => {
  event.preventDefault();
  answerElicitation("accept");
});
dom.elicitationButtons.decline.addEventListener("click", () => answerElicitation("decline"));
dom.elicitationButtons.cancel.addEventListener("click", () => answerElicitation("cancel"));
// A field the user changes is no longer marked wrong (the next Submit checks it again).
for (const type of ["input", "change"]) {
  dom.elicitationFields.addEventListener(type, (event) => {
    const control = event.target;
    if ((control instanceof HTMLInputElement || control instanceof HTMLSelectElement) && control.hasAttribute("aria-invalid")) clearFieldError(control);
  });
}
dom.threadList.addEventListener("change", () => {
  const threadId = dom.threadList.value;
  if (!threadId || threadId === state.threadId) return;
  // Events of the old thread stop counting now; the snapshot redraws everything.
  expectThread(threadId);
  // Input held for the thread chosen before stays in the composer, unsent.
  state.heldSubmit = null;
  setNote("");
  sendInitialize();
});
dom.messages.addEventListener("click", onMessageAction);
dom.deleteThread.addEventListener("click", askOrDelete);
dom.renameThread.addEventListener("click", openRename);
dom.threadTitleInput.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.isComposing) {
    event.preventDefault();
    saveRename();
  } else if (event.key === "Escape") {
    event.preventDefault();
    closeRename(true);
  }
});
// Leaving the field saves, as Enter does (Esc closed it first to cancel).
dom.threadTitleInput.addEventListener("blur", saveRename);
dom.deleteThread.addEventListener("blur", cancelDelete);
dom.deleteThread.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && dom.deleteThread.dataset.confirm === "true") {
    event.preventDefault();
    cancelDelete();
  }
});
dom.errorDismiss.addEventListener("click", hideError);
dom.errorSettings.addEventListener("click", () => {
  const field = document.getElementById(dom.errorSettings.dataset.field || "") || dom.settingsProvider;
  openSettings().then(() => field.focus());
});
dom.messages.addEventListener("scroll", () => {
  const { scrollTop, scrollHeight, clientHeight } = dom.messages;
  view.stickToBottom = scrollHeight - scrollTop - clientHeight < 40;
  maybeLoadEarlier();
}, { passive: true });

// -------------------------------------------------------------- settings ---

/** The engine's own defaults of the checkbox fields (src/settings.rs `profile_of`). */
const ENGINE_FLAG_DEFAULTS = { toolUse: true, vision: false };

/** @type {Promise<Record<string, any>> | null} */
let settingsDefaults = null;
/** Settles `settingsDefaults` with the engine's answer. @type {((defaults: Record<string, any>) => void) | null} */
let settingsDefaultsArrived = null;

/** How long the form waits for the engine's defaults before it goes on without them. */
const SETTINGS_DEFAULTS_WAIT_MS = 5000;

/**
 * The embedding extension's settings defaults (extension/settings-defaults.js)
 * as the engine kept them (`settings.defaults`): it checked each field, so
 * the form never shows one the engine left out. {} when there are none, when
 * the engine refused the question, or when it did not answer within
 * SETTINGS_DEFAULTS_WAIT_MS (a worker that cannot start must not hold the
 * form or a save; without the defaults a save stores every field, which is
 * what the engine would have used anyway). Asked again the next time then.
 * @returns {Promise<Record<string, any>>}
 */
function loadSettingsDefaults() {
  settingsDefaults ??= new Promise((resolve) => {
    settingsDefaultsArrived = resolve;
    sendOp("settings.defaults", {}, { quiet: true });
    setTimeout(() => {
      if (settingsDefaultsArrived === resolve) onSettingsDefaults(null);
    }, SETTINGS_DEFAULTS_WAIT_MS);
  });
  return settingsDefaults;
}

/** @param {unknown} defaults the `defaults` of the engine's answer; null when refused or late */
function onSettingsDefaults(defaults) {
  const arrived = settingsDefaultsArrived;
  settingsDefaultsArrived = null;
  if (defaults === null) settingsDefaults = null;
  if (arrived) arrived(defaults !== null && typeof defaults === "object" && !Array.isArray(defaults) ? defaults : {});
}

/**
 * A stored field counts when it is set (not absent, null or empty text);
 * otherwise the extension's default applies (src/settings.rs `effective`).
 * @param {unknown} value
 */
function isSetSetting(value) {
  return value !== undefined && value !== null && !(typeof value === "string" && value.trim() === "");
}

async function loadSettings() {
  try {
    const [{ settings }, defaults] = await Promise.all([chrome.storage.local.get("settings"), loadSettingsDefaults()]);
    /** @type {Record<string, any>} */
    const current = { ...defaults };
    if (settings && typeof settings === "object") {
      for (const [key, value] of Object.entries(settings)) if (isSetSetting(value)) current[key] = value;
    }
    const provider = current.provider === "anthropic" ? "anthropic" : "openai";
    dom.settingsProvider.value = provider;
    dom.settingsBaseUrl.value = typeof current.baseUrl === "string" ? current.baseUrl : DEFAULT_BASE_URLS[provider];
    dom.settingsModel.value = typeof current.model === "string" ? current.model : "";
    dom.settingsApiKey.value = typeof current.apiKey === "string" ? current.apiKey : "";
    dom.settingsMaxTokens.value = Number.isFinite(current.maxOutputTokens) ? String(current.maxOutputTokens) : "4096";
    dom.settingsTemperature.value = Number.isFinite(current.temperature) ? String(current.temperature) : "";
    dom.settingsToolUse.checked = current.toolUse !== false;
    dom.settingsVision.checked = current.vision === true;
    dom.settingsContextWindow.value = Number.isFinite(current.contextWindow) ? String(current.contextWindow) : "";
    dom.settingsTokenBudget.value = Number.isFinite(current.tokenBudget) ? String(current.tokenBudget) : "";
    dom.settingsBaseUrl.placeholder = DEFAULT_BASE_URLS[provider];
  } catch (err) {
    setSettingsStatus(`Could not load settings: ${err && err.message ? err.message : err}`, true);
  }
}

function readSettingsForm() {
  const provider = dom.settingsProvider.value === "anthropic" ? "anthropic" : "openai";
  const baseUrl = dom.settingsBaseUrl.value.trim() || DEFAULT_BASE_URLS[provider];
  try {
    const url = new URL(baseUrl);
    if (url.protocol !== "https:" && url.protocol !== "http:") throw new Error("not http");
  } catch {
    return { error: "Base URL must be an http(s) address, like https://api.openai.com/v1.", field: dom.settingsBaseUrl };
  }
  const model = dom.settingsModel.value.trim();
  if (model === "") return { error: "Enter a model name.", field: dom.settingsModel };
  const maxTokensText = dom.settingsMaxTokens.value.trim();
  let maxOutputTokens = null;
  if (maxTokensText !== "") {
    maxOutputTokens = Number(maxTokensText);
    if (!Number.isInteger(maxOutputTokens) || maxOutputTokens < 1) {
      return { error: "Max output tokens must be a whole number of at least 1.", field: dom.settingsMaxTokens };
    }
  }
  const temperatureText = dom.settingsTemperature.value.trim();
  let temperature = null;
  if (temperatureText !== "") {
    temperature = Number(temperatureText);
    if (!Number.isFinite(temperature) || temperature < 0 || temperature > 2) {
      return { error: "Temperature must be a number from 0 to 2, or empty for the model's default.", field: dom.settingsTemperature };
    }
  }
  const wholeNumber = (input, min, message) => {
    const text = input.value.trim();
    if (text === "") return { value: null };
    const value = Number(text);
    return Number.isInteger(value) && value >= min ? { value } : { error: message, field: input };
  };
  const contextWindow = wholeNumber(dom.settingsContextWindow, 1000, "Context window must be a whole number of tokens (at least 1000), or empty if unknown.");
  if (contextWindow.error) return contextWindow;
  const tokenBudget = wholeNumber(dom.settingsTokenBudget, 1, "Token budget must be a whole number of tokens, or empty for no budget.");
  if (tokenBudget.error) return tokenBudget;
  return {
    settings: {
      contextWindow: contextWindow.value,
      tokenBudget: tokenBudget.value,
      provider,
      baseUrl: baseUrl.replace(/\/+$/, ""),
      model,
      apiKey: dom.settingsApiKey.value.trim(),
      maxOutputTokens,
      temperature,
      toolUse: dom.settingsToolUse.checked,
      vision: dom.settingsVision.checked,
    },
  };
}

/** @param {SubmitEvent} event */
async function saveSettings(event) {
  event.preventDefault();
  await validateAndStoreSettings();
}

/**
 * Validates the form and stores it in chrome.storage.local; resolves with the
 * stored settings, or null (the problem is shown next to the form).
 * @returns {Promise<Record<string, any> | null>}
 */
async function validateAndStoreSettings() {
  const { settings, error, field } = readSettingsForm();
  if (error) {
    setSettingsStatus(error, true);
    field.setAttribute("aria-invalid", "true");
    field.focus();
    return null;
  }
  for (const input of dom.settingsForm.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
  setSettingsStatus("Saving…", false);
  dom.settingsSave.disabled = true;
  try {
    const [{ settings: previous }, defaults] = await Promise.all([chrome.storage.local.get("settings"), loadSettingsDefaults()]);
    // Keep keys this form does not know about (written by a newer version).
    /** @type {Record<string, any>} */
    const merged = { ...(previous && typeof previous === "object" ? previous : {}), ...settings };
    // A value equal to its default is not stored: a default changed by an
    // update (or one the extension adds later) then reaches this user too.
    // The checkboxes have no "unset" state: left as the engine's own
    // default, they are not stored either.
    /** @type {Record<string, any>} */
    const effectiveDefaults = { ...ENGINE_FLAG_DEFAULTS, ...defaults };
    for (const [key, value] of Object.entries(effectiveDefaults)) if (merged[key] === value) delete merged[key];
    await chrome.storage.local.set({ settings: merged });
    setSettingsStatus("Saved", false);
    return settings;
  } catch (err) {
    setSettingsStatus(`Could not save: ${err && err.message ? err.message : err}`, true);
    return null;
  } finally {
    dom.settingsSave.disabled = false;
  }
}

// ------------------------------------------------------- test connection ---
// Saves the form (the engine reads the API key from storage, never from a
// Port), then asks the engine for one tiny real request with these settings
// (`provider.test`) and says how it went, in words a user can act on.

/** What to do about a failed test, per error kind; `{model}` and `{baseUrl}` are filled in. */
const TEST_ERROR_WORDS = {
  auth: "The provider rejected the API key. Copy the key again from your provider's dashboard, paste it above, and test again.",
  model_not_found: "The provider does not know the model “{model}”. Check the model name (and that your key may use it), then test again.",
  rate_limited: "The provider is rate limiting requests right now. Wait a minute and test again; if it keeps happening, check your plan's limits with the provider.",
  quota_exceeded: "The provider accepted the key, but the account has no credit or quota left. Add credit or raise the limit with your provider, then test again.",
  network: "Could not reach the provider at {baseUrl}. Check the base URL and your internet connection; for a local server, check that it is running and accepts requests from this extension.",
  provider_unavailable: "The provider is overloaded or having problems right now. Wait a moment and test again.",
  provider_protocol: "The provider answered, but not the way an {api} API does. Check the provider type and the base URL (it usually ends in /v1).",
  context_overflow: "The provider refused even a tiny request as too long. Check the model name.",
  not_configured: "Enter the base URL and the model first.",
};

/** The settings being tested, for the result's wording. */
let testedSettings = null;
/** submissionId of the provider.test in flight. */
let testSubmission = null;

async function testConnection() {
  if (testSubmission !== null) return;
  setTestResult("", "");
  dom.settingsTest.disabled = true;
  const settings = await validateAndStoreSettings();
  if (settings === null) {
    dom.settingsTest.disabled = false;
    return;
  }
  testedSettings = settings;
  /** @type {ProviderProfile} */
  const profile = {
    kind: settings.provider,
    baseUrl: settings.baseUrl,
    model: settings.model,
    maxOutputTokens: settings.maxOutputTokens,
    temperatureCenti: settings.temperature === null ? null : Math.round(settings.temperature * 100),
    vision: settings.vision,
    toolUse: settings.toolUse,
    tokenBudget: settings.tokenBudget,
    contextWindow: settings.contextWindow,
  };
  setTestResult("pending", `Testing ${settings.model} at ${settings.baseUrl}…`);
  dom.settingsTestResult.setAttribute("aria-busy", "true");
  testSubmission = sendOp("provider.test", { profile });
}

/**
 * The engine's answer to provider.test: an ack's result or a reject's error.
 * @param {{ [key: string]: JsonValue } | null} result
 * @param {ErrorInfo | null} error
 */
function onProviderTestResult(result, error) {
  testSubmission = null;
  dom.settingsTest.disabled = false;
  dom.settingsTestResult.removeAttribute("aria-busy");
  const settings = testedSettings || {};
  if (error === null && result) {
    const model = typeof result.model === "string" ? result.model : settings.model;
    const latency = typeof result.latencyMs === "number" ? ` in ${Math.round(result.latencyMs).toLocaleString()} ms` : "";
    const reply = typeof result.reply === "string" && result.reply.trim() ? ` It replied: “${clipText(result.reply.trim(), 80)}”.` : "";
    setTestResult("ok", `Connection works: ${model} answered${latency}.${reply}`);
    return;
  }
  const kind = error && typeof error.kind === "string" ? error.kind : "";
  const template = TEST_ERROR_WORDS[kind];
  const text = template
    ? template
      .replace("{model}", settings.model || "")
      .replace("{baseUrl}", settings.baseUrl || "the base URL")
      .replace("{api}", settings.provider === "anthropic" ? "Anthropic" : "OpenAI-compatible")
    : explainError(error).text;
  const detail = error && typeof error.message === "string" && error.message.trim() ? error.message.trim() : "";
  setTestResult("error", `Test failed: ${text}`, detail, kind);
}

function setTestResult(outcome, text, detail = "", kind = "") {
  const element = dom.settingsTestResult;
  element.dataset.outcome = outcome;
  element.dataset.kind = kind;
  element.classList.toggle("error", outcome === "error");
  element.replaceChildren();
  if (text) element.append(document.createTextNode(text));
  if (detail) {
    const details = document.createElement("span");
    details.className = "error-detail";
    details.textContent = `Details: ${detail}`;
    element.append(document.createElement("br"), details);
  }
  element.hidden = text === "";
  if (text) element.scrollIntoView({ block: "nearest" });
}

function setSettingsStatus(text, isError) {
  dom.settingsStatus.textContent = text;
  dom.settingsStatus.classList.toggle("error", isError);
}

dom.settingsForm.addEventListener("submit", saveSettings);
dom.settingsTest.addEventListener("click", () => {
  testConnection().catch((err) => {
    testSubmission = null;
    dom.settingsTest.disabled = false;
    setTestResult("error", `Test failed: ${err && err.message ? err.message : err}`);
  });
});
dom.settingsForm.addEventListener("input", () => {
  setSettingsStatus("", false);
  // A result about other values would mislead.
  if (testSubmission === null) setTestResult("", "");
});
dom.settingsProvider.addEventListener("change", () => {
  const provider = dom.settingsProvider.value;
  const baseUrl = dom.settingsBaseUrl.value.trim().replace(/\/+$/, "");
  // Swap the address only if it was the other provider's default (or empty).
  if (baseUrl === "" || Object.values(DEFAULT_BASE_URLS).includes(baseUrl)) {
    dom.settingsBaseUrl.value = DEFAULT_BASE_URLS[provider] || "";
  }
  dom.settingsBaseUrl.placeholder = DEFAULT_BASE_URLS[provider] || "";
});
/** Opens the settings section (loading the stored values); resolves when the form is filled. */
function openSettings() {
  if (!dom.settingsSection.hidden) return Promise.resolve();
  dom.settingsSection.hidden = false;
  dom.settingsToggle.setAttribute("aria-expanded", "true");
  setSettingsStatus("", false);
  requestSiteRules();
  requestMcpServers();
  return loadSettings();
}

// ----------------------------------------------------------- MCP servers ---
// The MCP servers whose tools the agent is offered: the embedding
// extension's (extension/mcp-servers.js) and the user's own, added here and
// kept in chrome.storage.local.mcpUserServers (the worker follows that key:
// it connects or lets go of a server, then sends `mcpServers.updated`). Each
// is listed with where the engine stands with it, who added it and the tools
// of it offered (`mcpServers.list`, asked for whenever Settings opens; kept
// current by `mcpServers.updated`). The user's have Remove; an entry of the
// user's the worker could not use is listed as refused, with the reason.

/** The `mcpServers.list` whose answer is drawn (an older one is ignored). */
let mcpServersSubmission = null;
/**
 * The servers last drawn, as the engine listed them (fields read
 * defensively: `addedBy` and the `refused` state came later).
 * @type {Record<string, any>[]}
 */
let mcpServersShown = [];

/** Where the worker reads the user's servers (an array of MCP_SERVERS entries). */
const MCP_USER_SERVERS_KEY = "mcpUserServers";
/** The worker uses at most this many servers, the extension's and the user's. */
const MCP_MAX_SERVERS = 8;
/** Headers the MCP client sets itself (src/mcp.rs): an entry may not. */
const MCP_CLIENT_HEADERS = ["accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"];
/** The header name the form starts with. */
const MCP_DEFAULT_HEADER = "Authorization";

function requestMcpServers() {
  mcpServersSubmission = sendOp("mcpServers.list", {});
}

/**
 * The line under the list: `about` says what it reports ("list": the list
 * could not be read, cleared by the next list; "remove": a removal;
 * "refresh": asking a server again; "sign-in": signing in or out).
 * @param {string} text @param {boolean} isError @param {"list" | "remove" | "refresh" | "sign-in"} about
 */
function setMcpServersStatus(text, isError, about) {
  dom.mcpServersStatus.textContent = text;
  dom.mcpServersStatus.classList.toggle("error", isError);
  dom.mcpServersStatus.dataset.about = about;
}

/** What a server's state means, in words. */
const MCP_STATE_TEXT = {
  listing: "Asking for its tools…",
  ready: "Connected",
  unreachable: "Not reachable",
  refused: "Not used",
  sign_in_needed: "Sign-in needed",
};

/** The name an entry is listed and stored under ("" when it has none in text). */
const mcpNameOf = (entry) => (entry !== null && typeof entry === "object" && typeof entry.name === "string" ? entry.name : "");

/**
 * Brings the list to the engine's (a `mcpServers.list` answer or a
 * `mcpServers.updated`). Items that stay are updated in place, so focus on a
 * Remove button stays put; a removed server's focus moves on to the next
 * Remove button, the one before, or the heading.
 * @param {unknown} servers
 */
function renderMcpServers(servers) {
  /** @type {Record<string, any>[]} */
  const shown = Array.isArray(servers)
    ? servers.filter((s) => s !== null && typeof s === "object" && (typeof s.name === "string" || s.addedBy === "user"))
    : [];
  mcpServersShown = shown;
  if (dom.mcpServersStatus.dataset.about === "list") setMcpServersStatus("", false, "list");
  // "The sign-in window is open" goes once no window is.
  if (dom.mcpServersStatus.dataset.about === "sign-in" && !dom.mcpServersStatus.classList.contains("error") && !shown.some((s) => s.signingIn === true)) {
    setMcpServersStatus("", false, "sign-in");
  }
  const list = dom.mcpServersList;
  const before = [...list.children];
  const focused = before.find((item) => item.contains(document.activeElement)) ?? null;
  const focusedAt = focused ? before.indexOf(focused) : -1;
  /** @type {Map<string, HTMLElement>} */
  const present = new Map();
  for (const item of before) if (item instanceof HTMLElement) present.set(item.dataset.key ?? "", item);
  /** @type {Map<string, number>} */
  const seen = new Map();
  let refusedAt = 0;
  const items = shown.map((server) => {
    const addedBy = server.addedBy === "user" ? "user" : "extension";
    const refused = server.state === "refused";
    const base = `${addedBy}:${refused ? "refused" : "server"}:${mcpNameOf(server)}`;
    const occurrence = seen.get(base) ?? 0;
    seen.set(base, occurrence + 1);
    const key = `${base}#${occurrence}`;
    const item = present.get(key) ?? document.createElement("li");
    present.delete(key);
    fillMcpServerItem(item, server, key, addedBy === "user", refused ? refusedAt++ : -1);
    return item;
  });
  for (const gone of present.values()) gone.remove();
  // Kept items stay in their order: only new ones are inserted, so no
  // focused button is moved (which would blur it).
  items.forEach((item, i) => {
    if (list.children[i] !== item) list.insertBefore(item, list.children[i] ?? null);
  });
  list.hidden = items.length === 0;
  dom.mcpServersEmpty.hidden = items.length !== 0;
  if (focused && !focused.isConnected) {
    const buttons = items.map((item) => item.querySelector("button.mcp-remove"));
    const next = buttons.slice(focusedAt).find((b) => b) ?? buttons.slice(0, focusedAt).reverse().find((b) => b);
    (/** @type {HTMLElement | null} */ (next) ?? dom.mcpServersHeading).focus();
  }
}

/**
 * Writes one server into its list item (new or kept): its words in a fresh
 * `.mcp-info`, and for a server of the user's a Remove button kept across
 * redraws.
 * @param {HTMLElement} item
 * @param {Record<string, any>} server
 * @param {string} key which item this is across redraws
 * @param {boolean} byUser added by the user (else by the extension)
 * @param {number} refusedAt a refused entry's place among the refused ones listed (-1: not refused)
 */
function fillMcpServerItem(item, server, key, byUser, refusedAt) {
  const name = mcpNameOf(server);
  const state = typeof server.state === "string" ? server.state : "";
  item.dataset.key = key;
  item.dataset.server = name;
  item.dataset.state = state;
  item.dataset.addedBy = byUser ? "user" : "extension";
  if (refusedAt >= 0) item.dataset.refusedAt = String(refusedAt);
  else delete item.dataset.refusedAt;
  const tools = Array.isArray(server.tools) ? server.tools.filter((t) => t && typeof t.name === "string") : [];

  const info = document.createElement("div");
  info.className = "mcp-info";
  const title = document.createElement("strong");
  title.textContent = name || "(no name)";
  const status = document.createElement("span");
  status.className = "mcp-state";
  status.dataset.state = state;
  const problem = typeof server.problem === "string" ? server.problem.trim() : "";
  let text = MCP_STATE_TEXT[state] ?? state;
  if ((state === "unreachable" || state === "refused") && problem) text = `${text}: ${problem}`;
  else if (problem) text = `${text}. ${problem}`;
  if (state !== "ready" && tools.length > 0) text += ` Offering the ${tools.length === 1 ? "tool" : `${tools.length} tools`} it listed before.`;
  status.textContent = ` — ${text}`;
  const url = document.createElement("span");
  url.className = "mcp-url";
  url.textContent = typeof server.url === "string" ? server.url : "";
  const origin = document.createElement("span");
  origin.className = "mcp-added-by";
  origin.textContent = byUser ? "Added by you" : "Added by the extension";
  const list = document.createElement("span");
  list.className = "mcp-tools";
  list.textContent = tools.length === 0
    ? "No tools offered."
    : `${tools.length === 1 ? "1 tool" : `${tools.length} tools`}: ${tools.map((t) => (typeof t.label === "string" && t.label ? t.label : t.name)).join(", ")}`;
  info.append(title, status, url, origin, list);
  const old = item.querySelector(":scope > .mcp-info");
  if (old) old.replaceWith(info);
  else item.prepend(info);

  fillMcpSignButton(item, name, state, server.signedIn === true, server.signingIn === true);
  fillMcpRefreshButton(item, name, state);
  let remove = /** @type {HTMLButtonElement | null} */ (item.querySelector(":scope > button.mcp-remove"));
  if (!byUser) {
    remove?.remove();
    return;
  }
  if (remove === null) {
    remove = document.createElement("button");
    remove.type = "button";
    remove.className = "mcp-remove";
    remove.textContent = "Remove";
    const button = remove;
    button.addEventListener("click", () => {
      removeMcpServer(item, button).catch((err) => {
        button.removeAttribute("aria-disabled");
        setMcpServersStatus(`Could not remove the server: ${err && err.message ? err.message : err}`, true, "remove");
      });
    });
    item.append(remove);
  }
  remove.removeAttribute("aria-disabled");
  remove.setAttribute("aria-label", name ? `Remove the MCP server ${name}` : `Remove the MCP server entry ${refusedAt + 1} without a name`);
}

/**
 * "Sign in" for a server that asks for one (`mcpServers.signIn`: the
 * worker opens the server's sign-in window), "Sign out" for one the user is
 * signed in to (`mcpServers.signOut`); none otherwise. Kept across redraws
 * while it stays the same kind.
 * @param {HTMLElement} item @param {string} name @param {string} state @param {boolean} signedIn @param {boolean} signingIn
 */
function fillMcpSignButton(item, name, state, signedIn, signingIn) {
  const kind = state === "sign_in_needed" ? "in" : signedIn && state !== "refused" ? "out" : "";
  let button = /** @type {HTMLButtonElement | null} */ (item.querySelector(":scope > button.mcp-sign"));
  if (!kind || !name) {
    button?.remove();
    return;
  }
  if (button === null) {
    const created = document.createElement("button");
    created.type = "button";
    created.className = "mcp-sign";
    created.addEventListener("click", () => {
      if (created.getAttribute("aria-disabled") === "true") return;
      const signIn = created.dataset.kind === "in";
      if (signIn) {
        created.setAttribute("aria-disabled", "true");
        created.textContent = "Signing in…";
      }
      sendOp(signIn ? "mcpServers.signIn" : "mcpServers.signOut", { name: item.dataset.server ?? "" });
    });
    const after = item.querySelector(":scope > button.mcp-refresh") ?? item.querySelector(":scope > button.mcp-remove");
    item.insertBefore(created, after);
    button = created;
  }
  // The same element whatever it offers, so focus stays on it.
  button.dataset.kind = kind;
  const waiting = kind === "in" && signingIn;
  button.textContent = waiting ? "Signing in…" : kind === "in" ? "Sign in" : "Sign out";
  if (waiting) button.setAttribute("aria-disabled", "true");
  else button.removeAttribute("aria-disabled");
  button.setAttribute("aria-label", kind === "in" ? `Sign in to the MCP server ${name}` : `Sign out of the MCP server ${name}`);
}

/**
 * "Check again" (`mcpServers.refresh`): for a server in use, kept across
 * redraws; while its tools are being asked for it says so and does
 * nothing (aria-disabled, so focus stays on it). A refused entry has none:
 * asking it again changes nothing (it is changed or removed).
 * @param {HTMLElement} item @param {string} name @param {string} state
 */
function fillMcpRefreshButton(item, name, state) {
  let refresh = /** @type {HTMLButtonElement | null} */ (item.querySelector(":scope > button.mcp-refresh"));
  if (state === "refused" || !name) {
    refresh?.remove();
    return;
  }
  if (refresh === null) {
    refresh = document.createElement("button");
    refresh.type = "button";
    refresh.className = "mcp-refresh";
    const button = refresh;
    button.addEventListener("click", () => {
      if (button.getAttribute("aria-disabled") === "true") return;
      if (dom.mcpServersStatus.dataset.about === "refresh") setMcpServersStatus("", false, "refresh");
      sendOp("mcpServers.refresh", { name: item.dataset.server ?? "" });
    });
    const remove = item.querySelector(":scope > button.mcp-remove");
    item.insertBefore(refresh, remove);
  }
  const listing = state === "listing";
  refresh.textContent = listing ? "Checking…" : "Check again";
  if (listing) refresh.setAttribute("aria-disabled", "true");
  else refresh.removeAttribute("aria-disabled");
  refresh.setAttribute("aria-label", `Ask the MCP server ${name} for its tools again`);
}

/**
 * The user's servers as stored, as the worker reads them: none, a list, or
 * (written by hand) one entry.
 * @param {unknown} stored
 * @returns {unknown[]}
 */
function mcpUserEntries(stored) {
  if (stored === undefined || stored === null) return [];
  return Array.isArray(stored) ? stored : [stored];
}

/**
 * Which of the user's entries the worker uses, as it decides (src/mcp.rs
 * `parse_user_servers`): a well-formed entry whose name no server of the
 * extension's and no earlier entry has, while there is room.
 * @param {unknown[]} entries
 * @returns {boolean[]}
 */
function mcpEntriesUsed(entries) {
  const taken = mcpServersShown.filter((s) => s.addedBy !== "user").map(mcpNameOf);
  const room = MCP_MAX_SERVERS - taken.length;
  /** @type {string[]} */
  const names = [];
  return entries.map((entry) => {
    const name = mcpNameOf(entry);
    const used = mcpEntryWellFormed(entry) && !taken.includes(name) && !names.includes(name) && names.length < room;
    if (used) names.push(name);
    return used;
  });
}

/**
 * Where a listed server of the user's is in `entries`, or -1: a server in
 * use is the used entry of its name; a refused one, the refused entry at
 * its place among the refused ones (the worker lists those in their
 * order), if it has the listed name. Else the first entry of that name.
 * @param {unknown[]} entries @param {HTMLElement} item
 */
function mcpEntryIndex(entries, item) {
  const name = item.dataset.server ?? "";
  const used = mcpEntriesUsed(entries);
  const refusedAt = Number(item.dataset.refusedAt ?? -1);
  let at = -1;
  if (refusedAt < 0) {
    at = entries.findIndex((entry, i) => used[i] && mcpNameOf(entry) === name);
  } else {
    const refused = entries.map((_, i) => i).filter((i) => !used[i]);
    at = refused[refusedAt] ?? -1;
    if (at >= 0 && mcpNameOf(entries[at]) !== name) at = refused.find((i) => mcpNameOf(entries[i]) === name) ?? -1;
  }
  return at >= 0 ? at : entries.findIndex((entry) => mcpNameOf(entry) === name);
}

/**
 * Remove: writes the user's servers without this one (the worker lets go
 * of it and lists the servers again). Asks nothing: adding it again undoes
 * it.
 * @param {HTMLElement} item @param {HTMLButtonElement} button
 */
async function removeMcpServer(item, button) {
  // aria-disabled, not disabled: a disabled button loses focus, which then
  // could not move on to the next server once this one is gone.
  if (button.getAttribute("aria-disabled") === "true") return;
  button.setAttribute("aria-disabled", "true");
  const name = item.dataset.server ?? "";
  const called = name ? `“${name}”` : "the entry without a name";
  setMcpServersStatus(`Removing ${called}…`, false, "remove");
  const { [MCP_USER_SERVERS_KEY]: stored } = await chrome.storage.local.get(MCP_USER_SERVERS_KEY);
  const entries = mcpUserEntries(stored);
  const at = mcpEntryIndex(entries, item);
  if (at < 0) {
    // Gone already (another panel): the engine's list says so.
    button.removeAttribute("aria-disabled");
    setMcpServersStatus(`${called[0].toUpperCase()}${called.slice(1)} was already removed.`, false, "remove");
    requestMcpServers();
    return;
  }
  await chrome.storage.local.set({ [MCP_USER_SERVERS_KEY]: entries.filter((_, i) => i !== at) });
  setMcpServersStatus(`Removed ${called}.`, false, "remove");
}

// -------------------------------------------------- add an MCP server ---
// The form under the list: checked here as the worker checks an entry
// (src/mcp.rs), each problem next to its field; only a valid entry is
// added to chrome.storage.local.mcpUserServers.

/** An entry's problem with one field of the form. @typedef {{ field: HTMLInputElement, message: string }} McpAddProblem */

/** The fields an entry may have (MCP_SERVERS' shape). */
const MCP_ENTRY_FIELDS = ["name", "url", "headers", "timeoutMs", "oauth"];
/** A call's longest time limit an entry may set (ms; src/tools.rs HOST_TOOL_MAX_TIME_LIMIT_MS). */
const MCP_MAX_TIMEOUT_MS = 300000;

/** Whether the worker takes `name` for a server: 1-24 of a-z, 0-9 and -. */
const mcpNameOk = (name) => /^[a-z0-9-]{1,24}$/.test(name);

/** The part of an http(s) URL between the scheme and the path, as the worker cuts it; null: no http(s) URL. */
function mcpUrlAuthority(url) {
  const rest = /^https?:\/\//.test(url) ? url.replace(/^https?:\/\//, "") : null;
  return rest === null ? null : rest.split(/[/?#]/)[0];
}

/** Whether the worker takes `url` (src/mcp.rs): http(s) with a host, no user@, no white space. */
function mcpUrlOk(url) {
  const authority = mcpUrlAuthority(url);
  return authority !== null && authority !== "" && !authority.includes("@") && !/\s/.test(url);
}

/** Why the worker would refuse header `name` ("" when it takes it). */
function mcpHeaderNameProblem(name) {
  if (name === "") return `Enter the header's name, like ${MCP_DEFAULT_HEADER}.`;
  if (!/^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/.test(name)) return "A header name has only letters, digits and ! # $ % & ' * + - . ^ _ ` | ~ (no spaces or colons).";
  if (MCP_CLIENT_HEADERS.includes(name.toLowerCase())) return `The client sets ${name} itself: use another header.`;
  return "";
}

/** Whether the worker takes a header's value: text on one line. */
const mcpHeaderValueOk = (value) => typeof value === "string" && !/[\u0000-\u001f\u007f-\u009f]/.test(value);

/**
 * Whether the worker could use `entry` as a server, names of other servers
 * aside (src/mcp.rs `parse_server`).
 * @param {unknown} entry
 */
function mcpEntryWellFormed(entry) {
  if (entry === null || typeof entry !== "object" || Array.isArray(entry)) return false;
  /** @type {Record<string, unknown>} */
  const fields = /** @type {any} */ (entry);
  if (typeof fields.name !== "string" || !mcpNameOk(fields.name)) return false;
  if (Object.keys(fields).some((key) => !MCP_ENTRY_FIELDS.includes(key))) return false;
  if (typeof fields.url !== "string" || !mcpUrlOk(fields.url)) return false;
  const headers = fields.headers;
  if (headers !== undefined && headers !== null) {
    if (typeof headers !== "object" || Array.isArray(headers)) return false;
    for (const [name, value] of Object.entries(headers)) {
      if (mcpHeaderNameProblem(name) !== "" || !mcpHeaderValueOk(value)) return false;
    }
  }
  const timeout = fields.timeoutMs;
  const timeoutOk = timeout === undefined || timeout === null
    || (typeof timeout === "number" && Number.isInteger(timeout) && timeout >= 1 && timeout <= MCP_MAX_TIMEOUT_MS);
  return timeoutOk && mcpOauthOk(fields.oauth, headers);
}

/**
 * Whether an entry's `oauth` is one the worker takes (src/oauth.rs
 * `ClientConfig::parse`): none, or `{ clientId?, clientMetadataUrl? }`,
 * and not beside an Authorization header of the entry's own.
 * @param {unknown} oauth @param {unknown} headers
 */
function mcpOauthOk(oauth, headers) {
  if (oauth === undefined || oauth === null) return true;
  if (typeof oauth !== "object" || Array.isArray(oauth)) return false;
  /** @type {Record<string, unknown>} */
  const fields = /** @type {any} */ (oauth);
  if (Object.keys(fields).some((key) => key !== "clientId" && key !== "clientMetadataUrl")) return false;
  const { clientId, clientMetadataUrl } = fields;
  if (clientId !== undefined && clientId !== null && !mcpClientIdOk(clientId)) return false;
  if (clientMetadataUrl !== undefined && clientMetadataUrl !== null && !mcpClientMetadataUrlOk(clientMetadataUrl)) return false;
  const given = (clientId ?? null) !== null || (clientMetadataUrl ?? null) !== null;
  const ownAuthorization = headers !== null && typeof headers === "object"
    && Object.keys(headers).some((name) => name.toLowerCase() === "authorization");
  return !(given && ownAuthorization);
}

/**
 * Whether the worker takes a client ID metadata document's address
 * (src/oauth.rs `check_client_metadata_url`): at most 255 characters,
 * https (http only to this machine), no user name, no fragment, a path
 * with no `.`, `..` (spelt out or as %2e) or empty segment.
 * @param {unknown} url
 */
function mcpClientMetadataUrlOk(url) {
  if (typeof url !== "string" || url.length > 255 || /[\s\\\u0000-\u001f\u007f]/.test(url) || url.includes("#")) return false;
  const authority = mcpUrlAuthority(url);
  if (authority === null || authority === "" || authority.includes("@")) return false;
  if (url.startsWith("http://")) {
    const host = authority.startsWith("[") ? authority.slice(1, authority.indexOf("]")) : authority.split(":")[0];
    if (!["127.0.0.1", "localhost", "::1"].includes(host)) return false;
  }
  const afterScheme = url.replace(/^https?:\/\//, "");
  const path = afterScheme.slice(authority.length).split("?")[0];
  if (path.length <= 1) return false;
  return path.split("/").slice(1).every((segment) => {
    const decoded = segment.toLowerCase().replaceAll("%2e", ".");
    return segment !== "" && decoded !== "." && decoded !== "..";
  });
}

/** A client id as RFC 6749 spells one (visible ASCII and spaces, none at either end), at most 255. @param {unknown} id */
function mcpClientIdOk(id) {
  return typeof id === "string" && id.length >= 1 && id.length <= 255 && /^[\x20-\x7e]+$/.test(id) && id.trim() === id;
}

/**
 * Why `text` is no address to add, or "" when it is one: the worker's rule,
 * and one a browser can parse. `text` is trimmed, its scheme in lower case.
 */
function mcpUrlProblem(text) {
  const example = "like https://mcp.example.com/mcp";
  if (text === "") return `Enter the server's address, ${example}.`;
  const authority = mcpUrlAuthority(text);
  if (authority === null) return `The address must start with http:// or https://, ${example}.`;
  if (/\s/.test(text)) return "The address cannot contain spaces.";
  if (authority.includes("@")) return "Leave the user name out of the address (no “name@”): put a token in the header below instead.";
  let host = "";
  try {
    host = new URL(text).hostname;
  } catch {
    return `This is not a valid address: write it ${example}.`;
  }
  if (authority === "" || host === "") return `The address needs a host, ${example}.`;
  return "";
}

/**
 * Reads the add form: the entry to store, or what is wrong (field by field).
 * @returns {{ entry: { name: string, url: string, headers?: Record<string, string>, oauth?: { clientId: string } } | null, problems: McpAddProblem[] }}
 */
function readMcpAddForm() {
  /** @type {McpAddProblem[]} */
  const problems = [];
  const name = dom.mcpAddName.value.trim();
  if (name === "") problems.push({ field: dom.mcpAddName, message: "Enter a name for the server, like docs." });
  else if (!mcpNameOk(name)) {
    problems.push({ field: dom.mcpAddName, message: "Use 1 to 24 characters of a–z, 0–9 and - (no capitals, spaces or other signs): the name prefixes its tools' names." });
  }
  // The scheme in lower case (the worker compares it as written).
  const url = dom.mcpAddUrl.value.trim().replace(/^https?:/i, (scheme) => scheme.toLowerCase());
  const urlProblem = mcpUrlProblem(url);
  if (urlProblem) problems.push({ field: dom.mcpAddUrl, message: urlProblem });
  const headerName = dom.mcpAddHeaderName.value.trim();
  const headerValue = dom.mcpAddHeaderValue.value.trim();
  /** @type {Record<string, string> | null} */
  let headers = null;
  if (headerValue !== "") {
    const nameProblem = mcpHeaderNameProblem(headerName);
    if (nameProblem) problems.push({ field: dom.mcpAddHeaderName, message: nameProblem });
    if (!mcpHeaderValueOk(headerValue)) {
      problems.push({ field: dom.mcpAddHeaderValue, message: "The value must be one line of text." });
    } else if (/[^\u0000-\u00ff]/.test(headerValue)) {
      // fetch() refuses such a header: the server could never be reached.
      problems.push({ field: dom.mcpAddHeaderValue, message: "A header value can hold only Latin letters, digits and signs." });
    }
    headers = { [headerName]: headerValue };
  } else if (headerName !== "" && headerName.toLowerCase() !== MCP_DEFAULT_HEADER.toLowerCase()) {
    problems.push({ field: dom.mcpAddHeaderValue, message: `Enter the value of ${headerName}, or clear the header's name to send none.` });
  }
  // A client id registered by hand with the server's sign-in server
  // (the worker checks it too: `oauth.clientId`).
  const clientId = dom.mcpAddClientId.value.trim();
  if (clientId !== "") {
    if (!mcpClientIdOk(clientId)) {
      problems.push({ field: dom.mcpAddClientId, message: "A client id is up to 255 Latin letters, digits and signs." });
    } else if (headers && headerName.toLowerCase() === "authorization") {
      problems.push({ field: dom.mcpAddClientId, message: "This server is sent its own Authorization header, so it does not sign in: clear one of the two." });
    }
  }
  if (problems.length > 0) return { entry: null, problems };
  /** @type {{ name: string, url: string, headers?: Record<string, string>, oauth?: { clientId: string } }} */
  const entry = { name, url };
  if (headers) entry.headers = headers;
  if (clientId !== "") entry.oauth = { clientId };
  return { entry, problems };
}

/** Says what is wrong next to a field of the add form and marks it invalid. @param {McpAddProblem} problem */
function showMcpAddProblem({ field, message }) {
  const error = document.getElementById(`${field.id}-error`);
  if (error) error.textContent = message;
  field.setAttribute("aria-invalid", "true");
}

/** @param {HTMLInputElement} field */
function clearMcpAddProblem(field) {
  const error = document.getElementById(`${field.id}-error`);
  if (error) error.textContent = "";
  field.removeAttribute("aria-invalid");
}

function clearMcpAddProblems() {
  for (const field of [dom.mcpAddName, dom.mcpAddUrl, dom.mcpAddHeaderName, dom.mcpAddHeaderValue, dom.mcpAddClientId]) clearMcpAddProblem(field);
}

/** @param {string} text @param {boolean} isError */
function setMcpAddStatus(text, isError) {
  dom.mcpAddStatus.textContent = text;
  dom.mcpAddStatus.classList.toggle("error", isError);
}

/** Shows the problems (focus on the first field to fix); nothing is stored. @param {McpAddProblem[]} problems */
function refuseMcpAdd(problems) {
  for (const problem of problems) showMcpAddProblem(problem);
  setMcpAddStatus(problems.length === 1 ? "Not added: check the marked field." : `Not added: check the ${problems.length} marked fields.`, true);
  problems[0].field.focus();
}

/** Whether an Add is being saved. */
let mcpAdding = false;

/** Add: checks the form, then appends the entry to the user's servers (read-modify-write). */
async function addMcpServer() {
  if (mcpAdding) return;
  clearMcpAddProblems();
  setMcpAddStatus("", false);
  const { entry, problems } = readMcpAddForm();
  if (entry === null) {
    refuseMcpAdd(problems);
    return;
  }
  mcpAdding = true;
  dom.mcpAddSubmit.setAttribute("aria-disabled", "true");
  setMcpAddStatus("Adding…", false);
  try {
    const { [MCP_USER_SERVERS_KEY]: stored } = await chrome.storage.local.get(MCP_USER_SERVERS_KEY);
    const entries = mcpUserEntries(stored);
    const extensionNames = mcpServersShown.filter((s) => s.addedBy !== "user").map(mcpNameOf);
    // Not even a refused entry of that name: it would be unclear which one Remove takes.
    if (extensionNames.includes(entry.name) || entries.some((e) => mcpNameOf(e) === entry.name)) {
      refuseMcpAdd([{ field: dom.mcpAddName, message: `Another server is already called “${entry.name}”: choose another name.` }]);
      return;
    }
    // Refused entries take no room.
    if (extensionNames.length + mcpEntriesUsed(entries).filter(Boolean).length >= MCP_MAX_SERVERS) {
      setMcpAddStatus(`Not added: at most ${MCP_MAX_SERVERS} MCP servers can be used. Remove one of yours first.`, true);
      return;
    }
    await chrome.storage.local.set({ [MCP_USER_SERVERS_KEY]: [...entries, entry] });
    dom.mcpAddForm.reset();
    dom.mcpAddHeaderName.value = MCP_DEFAULT_HEADER;
    setMcpAddStatus(`Added “${entry.name}”: the list above shows when it is connected.`, false);
  } catch (err) {
    setMcpAddStatus(`Could not add the server: ${err && err.message ? err.message : err}`, true);
  } finally {
    mcpAdding = false;
    dom.mcpAddSubmit.removeAttribute("aria-disabled");
  }
}

dom.mcpAddForm.addEventListener("submit", (event) => {
  event.preventDefault();
  addMcpServer();
});
dom.mcpAddForm.addEventListener("input", (event) => {
  const field = event.target;
  if (field instanceof HTMLInputElement && field.hasAttribute("aria-invalid")) clearMcpAddProblem(field);
  if (!mcpAdding) setMcpAddStatus("", false);
});

// ------------------------------------------------------------ site rules ---
// The sites where "Allow on this site" lets the agent's page changes run
// without asking (`siteRules.list`), each with Remove (`siteRule.revoke`):
// asked for whenever Settings opens, and kept current by the engine's
// `siteRules.updated` (a site allowed or removed in any panel).

/** The `siteRules.list` whose answer is drawn (an older one is ignored). */
let siteRulesSubmission = null;

function requestSiteRules() {
  siteRulesSubmission = sendOp("siteRules.list", {});
}

/** @param {string} text @param {boolean} isError */
function setSiteRulesStatus(text, isError) {
  dom.siteRulesStatus.textContent = text;
  dom.siteRulesStatus.classList.toggle("error", isError);
}

/**
 * The rules a list shows: those that allow writes, with an origin.
 * @param {unknown} rules
 * @returns {{ origin: string, createdAt?: unknown }[]}
 */
function shownSiteRules(rules) {
  return Array.isArray(rules)
    ? rules.filter((rule) => rule !== null && typeof rule === "object" && typeof rule.origin === "string" && rule.allowWrites === true)
    : [];
}

/**
 * Brings the list to the engine's (a `siteRules.list` answer, or a
 * `siteRules.updated` after a site was allowed or removed in any panel) and
 * keeps the items that stay, so focus on one of their buttons stays put; a
 * removed site's focus moves on as for Remove.
 * @param {unknown} rules the engine's list, by origin
 */
function syncSiteRules(rules) {
  const shown = shownSiteRules(rules);
  const wanted = new Set(shown.map((rule) => rule.origin));
  for (const item of [...dom.siteRulesList.querySelectorAll("li")]) {
    const origin = item.dataset.origin ?? "";
    if (!wanted.has(origin)) forgetSiteRule(origin);
  }
  /** @type {Map<string, Element>} */
  const present = new Map();
  for (const item of dom.siteRulesList.querySelectorAll("li")) present.set(item.dataset.origin ?? "", item);
  /** @type {Element | null} */
  let previous = null;
  for (const rule of shown) {
    const item = present.get(rule.origin) ?? siteRuleItem(rule);
    // Kept items are already in order (both lists are by origin): only a
    // new site is inserted, so no focused button is moved.
    if (previous === null) {
      if (dom.siteRulesList.firstElementChild !== item) dom.siteRulesList.prepend(item);
    } else if (previous.nextElementSibling !== item) {
      previous.after(item);
    }
    previous = item;
  }
  showSiteRulesEmpty();
}

function showSiteRulesEmpty() {
  const none = dom.siteRulesList.children.length === 0;
  dom.siteRulesList.hidden = none;
  dom.siteRulesEmpty.hidden = !none;
}

/** @param {{ origin: string, createdAt?: unknown }} rule */
function siteRuleItem(rule) {
  const item = document.createElement("li");
  item.dataset.origin = rule.origin;
  const origin = document.createElement("span");
  origin.className = "site-origin";
  origin.textContent = rule.origin;
  if (typeof rule.createdAt === "number" && Number.isFinite(rule.createdAt)) {
    origin.title = `Allowed ${new Date(rule.createdAt).toLocaleString()}`;
  }
  const remove = document.createElement("button");
  remove.type = "button";
  remove.textContent = "Remove";
  remove.setAttribute("aria-label", `Remove ${rule.origin}: the agent will ask before acting there`);
  remove.addEventListener("click", () => {
    // aria-disabled, not disabled: a disabled button loses focus, which
    // then could not move on to the next site once this one is gone.
    if (remove.getAttribute("aria-disabled") === "true") return;
    remove.setAttribute("aria-disabled", "true");
    setSiteRulesStatus(`Removing ${rule.origin}…`, false);
    sendOp("siteRule.revoke", { origin: rule.origin });
  });
  item.append(origin, remove);
  return item;
}

/**
 * Takes a removed site off the list. Focus on its button moves to the next
 * site's, the one before, or the heading, never to the page's start.
 * @param {string} origin
 */
function forgetSiteRule(origin) {
  for (const item of dom.siteRulesList.querySelectorAll("li")) {
    if (item.dataset.origin !== origin) continue;
    const hadFocus = item.contains(document.activeElement);
    const neighbour = item.nextElementSibling ?? item.previousElementSibling;
    item.remove();
    if (hadFocus) {
      const button = neighbour ? neighbour.querySelector("button") : null;
      (button ?? dom.siteRulesHeading).focus();
    }
  }
  showSiteRulesEmpty();
}

/**
 * @param {string} opType
 * @param {Op | null} message the op as sent
 * @param {ErrorInfo} error
 */
function onSiteRuleReject(opType, message, error) {
  const { kind, text } = explainError(error);
  if (opType === "siteRules.list") {
    if (message && message.submissionId === siteRulesSubmission) {
      setSiteRulesStatus(`Could not list the sites: ${text}`, true);
    }
    return;
  }
  const origin = message && message.type === "siteRule.revoke" ? message.origin : "";
  if (kind === "not_found") {
    // Removed already (another panel, an earlier try): the list says so.
    forgetSiteRule(origin);
    setSiteRulesStatus(`${origin} was already removed.`, false);
    return;
  }
  for (const item of dom.siteRulesList.querySelectorAll("li")) {
    if (item.dataset.origin === origin) item.querySelector("button")?.removeAttribute("aria-disabled");
  }
  setSiteRulesStatus(`Could not remove ${origin}: ${text}`, true);
}

dom.settingsToggle.addEventListener("click", () => {
  if (dom.settingsSection.hidden) {
    openSettings().then(() => dom.settingsProvider.focus());
  } else {
    dom.settingsSection.hidden = true;
    dom.settingsToggle.setAttribute("aria-expanded", "false");
  }
});

// ----------------------------------------------------------------- start ---

renderRunState();
document.addEventListener("visibilitychange", onVisibilityChange);
connect();
// After connect(): the form waits for the engine's answer about defaults.
loadSettings();
if (document.visibilityState === "hidden") onVisibilityChange();
