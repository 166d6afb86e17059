// The MCP servers whose tools the agent may call, next to the built-in page
// tools and yours (host-tools.js). sw.js hands this list to Engine.start() at
// every worker start. The engine checks each entry; a wrong one is left out
// (the others work) and the worker's console names it and what to fix.
//
// The engine speaks MCP's Streamable HTTP transport (protocol revisions
// 2025-06-18 and 2025-03-26): a POST per message to the server's one
// endpoint, answered with JSON or an event stream. Servers that only speak
// stdio or the older HTTP+SSE transport need a bridge in front of them.
//
// An entry:
//   name       1-24 characters of a-z, 0-9 or -. The model sees the
//              server's tool `search` as `<name>__search`.
//   url        the server's MCP endpoint, http or https. The extension's
//              host permissions (<all_urls>) let the worker reach it
//              without CORS.
//   headers    optional: sent with every request, for example
//              { Authorization: "Bearer …" }. Every file of an extension can
//              be read by whoever installs it: put no secret here that is
//              not meant for every user (a server for your users
//              authenticates them some other way, or sits behind your
//              backend).
//   timeoutMs  optional: how long one call may take, in ms (1 to 300000;
//              default 60000). Past it the call is given up, the server is
//              told (notifications/cancelled) and the model gets the error.
//
// What happens:
// - At every worker start the engine asks each server for its tools
//   (tools/list) and offers them from the next model request on. A new
//   worker offers the tools the last one saw at once (they are kept in
//   chrome.storage.local), so a run that used them resumes before the
//   servers answer; a server whose tools changed since a run started means
//   that run is not resumed (the side panel says which tool changed).
// - Every call of a server's tool asks the user first ("Allow once" or
//   "Decline"), whatever the server says of the tool: a server is a party
//   the user does not control. What a call returns reaches the model marked
//   as data from that server, not as instructions.
// - A tool the server marks readOnlyHint is run again after a crash
//   mid-call; any other is never run twice by itself: the user is asked
//   whether it happened.
// - A server may ask the user for values during one of its calls
//   (elicitation): the side panel shows its form, and the answer goes to
//   that server only. Sampling and roots requests are answered "not
//   supported".
// - At most 8 servers and 32 tools per server.
//
// Example:
//
//   { name: "docs", url: "https://mcp.example.com/mcp" }

/** @type {Array<{ name: string, url: string, headers?: Record<string, string>, timeoutMs?: number }>} */
export const MCP_SERVERS = [];
