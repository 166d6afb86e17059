// Your extension's own tools, for the agent to call next to the built-in
// page tools. sw.js hands this list to Engine.start() at every worker start,
// so a tool is defined once here and exists in every worker. This module is
// evaluated at every worker start, before anything else: keep its top level
// to definitions (an exception here stops the worker). The engine
// checks each definition; a wrong one is left out (the others work) and the
// worker's console names it and what to fix.
//
// A definition:
//   name         1-64 characters of a-z, A-Z, 0-9, _ or -; not a built-in's
//   label        shown in the side panel (default: the name)
//   description  what the model reads to decide when to call it
//   parameters   a JSON Schema of type "object" (default: no parameters);
//                the model's arguments are checked against it first
//   effects      "read" or "write": reads run at once, every write asks the
//                user in the side panel first ("Allow once" or "Decline";
//                such a tool is on no site, so never "for this site")
//   recovery     optional: "retry-safe" (the default for reads),
//                "inspect-first" or "never-retry" (the default for writes:
//                if the worker dies while it runs, the user is asked whether
//                it happened, and it is never run twice by itself)
//   parallelSafe optional, for reads that are safe to run again (recovery
//                "retry-safe"): true lets neighbouring calls of such reads
//                (yours and the page reads) run together, up to
//                MAX_PARALLEL_READS (below) at once;
//                otherwise calls run one at a time in the model's order
//   timeoutMs    optional: how long a call may take, in ms (1 to 300000;
//                default 60000). Past it the call's `signal` aborts and the
//                model gets the error "The tool did not finish within …".
//                Chrome stops a worker busy longer than 5 minutes; the
//                tool's recovery then decides, as after any crash.
//   execute      (params, { callId, signal, progress }) => result, or a
//                Promise of it. The result is the text the model gets, or
//                { content: text, details: JSON kept with the result for a
//                UI; never sent to the model; this side panel shows it as
//                data under the result; more than 64 KiB as JSON is left
//                out with a note }.
//                Throw (or reject) to give the model an error it can act on.
//                `signal` aborts when the user stops the turn or at the
//                time limit (timeoutMs);
//                `progress(text)` shows a line in the side panel while the
//                call runs (not after it returned). A call that returns
//                nothing (undefined) is an error result: say what happened.
//
// Example (add it to the list to try it):
//
//   {
//     name: "extension_version",
//     label: "Extension version",
//     description: "The version of this browser extension.",
//     effects: "read",
//     execute: () => chrome.runtime.getManifest().version,
//   }
//
// The engine keeps what a call returned in IndexedDB with the conversation,
// like every tool result. A run that started with one set of tools is not
// resumed by a worker with another (an update changed this file): the side
// panel says which tool changed.

/** @type {Array<object>} */
export const HOST_TOOLS = [];

// The built-in tools the agent keeps next to yours, by name; null keeps all
// of them: page_snapshot, read_page, click, type, select, scroll, wait_for,
// navigate, go_back, screenshot, list_tabs, switch_tab, ask_user. For
// example ["page_snapshot", "read_page", "ask_user"] lets the agent read
// pages and ask the user, but not act on pages. A name that is not a
// built-in tool is named in the worker's console. A name left out may be
// used by one of your own tools.
/** @type {string[] | null} */
export const BUILT_IN_TOOLS = null;

// How many parallel-safe reads (yours with parallelSafe, and the page reads)
// may run together: a whole number from 1 to 16; null keeps the default, 4.
// Any other value is named in the worker's console and the default is kept.
/** @type {number | null} */
export const MAX_PARALLEL_READS = null;
