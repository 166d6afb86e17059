// Mock MCP server for the tests and the demo: MCP's Streamable HTTP
// transport (protocol revisions 2025-06-18 and 2025-03-26) on 127.0.0.1.
//
// Owns: the one MCP endpoint (`/mcp`). POST: JSON-RPC requests,
// notifications and responses; `initialize` (the revision agreed on, an
// `Mcp-Session-Id`, `capabilities.tools.listChanged`), the checks a real
// server makes on every later message (the session id known, else 404; the
// `MCP-Protocol-Version` header of the session; an Accept of both
// application/json and text/event-stream, else 406; a JSON body, else
// 415/400), answers as one JSON body or as an event stream
// (`event: message`) carrying progress notifications, other notifications
// and requests of the server's before the result, `ping` (an empty result),
// `tools/list` in pages (`nextCursor`), `tools/call` of scripted tools,
// `notifications/cancelled` (the running call's signal aborts, and a request
// of the server's it waits on stops waiting), elicitation
// (`elicitation/create` on a call's event stream, only to a client whose
// `initialize` declared `capabilities.elicitation`; the client's answer is a
// POST of its own, 202). GET: the server-initiated event stream of a session
// (only with `listChanged`, else 405; the same session and version checks
// as POST; an Accept listing text/event-stream, else 406), on which
// `notifications/tools/list_changed` goes out when the tools change; several
// per session. DELETE: forgets the session (and ends its GET streams).
// Optionally (`resumable`), resumability and redelivery: numbered events,
// an answer stream cut on demand, GET streams ended or broken on demand,
// and GET with `Last-Event-ID` replaying the rest of either (see
// `resumable` below).
// Also: sessions forgotten on demand, and a log of every message for
// assertions. Optionally (`auth`), an OAuth 2.1 authorization server on the
// same origin, as MCP's authorization spec (2025-06-18) describes: /mcp then
// wants a Bearer token of its own (see `auth` below); its clients register
// dynamically, are pre-registered, or (2025-11-25) name a Client ID
// Metadata Document, which the mock can serve itself.
// Must not: listen on anything but 127.0.0.1, depend on any package, or reach
// the network (it fetches Client ID Metadata Documents on 127.0.0.1 only).
//
// CLI:  node tests/mock-mcp/server.mjs [--port N] [--auth]
//       prints `MOCK_MCP_URL=http://127.0.0.1:<port>/mcp` as its first
//       stdout line and serves the demo tools (demoTools) until killed;
//       --auth: /mcp wants sign-in (auth: { autoApprove: false }).
// In-process: `startMockMcp({ port, tools, pageSize, answer, versions,
//   listChanged, resumable, resumeRetryMs, getStreamPolling, auth })` →
//   { url, origin, state, log, calls, cancellations, responses,
//     elicitations, elicitationResponses, streams, sent, tickets, bookings,
//     toolNames, setTools, notifyListChanged, closeStreams, breakStreams,
//     streamCount, setDown, expireSessions, sessionCount, waitFor, reset,
//     close, cutNextCallStream, cuts, resumes, keptStreams, keptGetStreams,
//     forgetKeptGetStreams, failNextResumptions, forcedResumptionsLeft,
//     auth, setAutoApprove, expireAccessTokens, revokeGrants, authLog,
//     clients, tokens, setRedirectIss, setTokenDelay, tokenRequestsReceived,
//     setClientMetadata, clientMetadataFetches }.
//   `tools`: [{ name, description, inputSchema, annotations?, title?,
//     answer?: 'json'|'sse', run(args, ctx) → CallToolResult }]
//     (default: demoTools(state), which include `add_faq_tool`: it publishes
//     a new read-only tool `faq_<topic>` and notifies list_changed).
//   ctx: { signal, progress(progress, total?, message?), notify(method,
//     params?) → true if sent (a notification on this call's event stream;
//     false once the stream closed or in a JSON answer; true too when kept
//     on a stream cut with resumable on), ask(method, params)
//     → the client's answer (a JSON-RPC response object; e.g.
//     `ask('ping', {})`: the client must answer `ping` with an empty result,
//     `{ jsonrpc, id, result: {} }`, POSTed like any answer, 202),
//     elicit(message, requestedSchema) → the client's answer to
//     `elicitation/create` (a JSON-RPC response object; rejects when the call
//     is cancelled or its stream closes), clientCapabilities (of the
//     session's initialize), canElicit, sleep(ms) }.
//   `answer`: 'sse' (default) or 'json', how results are sent unless a tool
//   says otherwise; progress, ctx.notify and server requests need 'sse'.
//   `listChanged` (default true): what `initialize` declares in
//   `capabilities.tools.listChanged`, and whether GET opens an event stream
//   (false: GET is 405, as a server without one answers; a resumption
//   below excepted).
//   `resumable` (default false; 2025-06-18 "Resumability and Redelivery"):
//     off, no event carries an id and a Last-Event-ID header is ignored (a
//     GET with one is a plain GET; failNextResumptions counts it all the
//     same). On: every event of a POST's answer stream (a tools/call
//     answered as 'sse') carries `id: <stream>:<n>`,
//     <stream> `post-<k>` (k from 1, one per answer stream, never reused,
//     reset() included), n = 1, 2, … within the stream; its first event also
//     `retry: <resumeRetryMs>` (option, default 200; null: no retry field;
//     startMockMcp throws on anything but an integer >= 0 or null); the
//     fields in the order `event: message`, id, retry, data. Events of GET
//     streams carry `id: get-<stream>:<n>` (<stream> its number in the log,
//     n = 1, 2, … within the stream) and no retry; see "GET streams" below
//     for how they are kept and resumed. The server keeps each
//     answer stream's events (keptStreams()) until its JSON-RPC response
//     went out on a live connection (its POST, or a resuming GET): then it
//     is dropped and resuming it is refused. A client that closes an answer
//     stream nobody cut stops the call as without resumable (outcome
//     'disconnected'; not kept): only a cut (cutNextCallStream) or a
//     resumption taking over leaves a call running unattached.
//     GET /mcp with `Last-Event-ID: <stream>:<n>` (any id not starting
//     with `get-`): the checks of any GET (406 without text/event-stream in
//     Accept, 400 no Mcp-Session-Id, 404 an unknown session, 400 an
//     MCP-Protocol-Version not the session's; each a `rejected` entry,
//     method 'GET', `lastEventId`), but not the 405 of listChanged false
//     (the stream resumed is a POST's). Then, when
//     <stream> is kept in that session and 0 <= n <= its event count: 200
//     text/event-stream that first writes the kept events after n as first
//     written (ids and retry included), then the stream's further events as
//     they happen, and ends (res.end()) right after its response (at once
//     when that was kept already). The connection the stream was on (its
//     POST if never cut, or an earlier resuming GET) is ended first
//     (res.end()): a message goes out on one stream only. Else (an id not
//     of that form, no such kept stream, another session's, or n beyond
//     the count): 400 with a JSON-RPC error body (-32600,
//     "Unknown Last-Event-ID: <value> (<why>).") — never 404, which
//     clients read as their session gone.
//     GET streams (resumable only; off, nothing below: a GET stream ends
//     for good and Last-Event-ID is ignored): each keeps its events, as
//     written, the last 100 (older ones dropped), as long as its session
//     lives (a DELETE, expireSessions(), reset() and close() forget them).
//     A GET stream whose connection ends (closeStreams(), breakStreams(),
//     or the client closing it) is detached, not gone: the notifications
//     setTools/notifyListChanged send while it is are kept on it (numbered
//     on, written nowhere, not counted in their return; a `sent` entry with
//     kept: true). Each stream is on its own: a session's detached streams
//     keep on keeping notifications after it opened a new plain GET stream
//     (until resumed, or the session ends). GET /mcp with `Last-Event-ID:
//     get-<k>:<n>`: the same checks as above (listChanged false: no GET
//     streams, so 400), then, when get-<k> is kept in that session and
//     0 <= n <= its event count and event n+1 is still kept: 200
//     text/event-stream that first writes the kept events after n as first
//     written (ids included; nothing else: no `: open` comment), then goes
//     on as that stream, live (later notifications written on it, the
//     numbering continued), until it ends again (detached again, resumable
//     again). The connection the stream is still on, if any (its plain GET
//     or an earlier resumption), is ended first (res.end(); its entry
//     closedBy 'server'): a message goes out on one stream only. Else 400
//     as above, <why> one of "no such GET stream kept in this session"
//     (unknown, another session's, forgotten, not of the form get-<k>:<n>),
//     "the stream has <count> events" (n beyond), "too old: the stream
//     keeps its last 100 events, from get-<k>:<first kept>".
//   `getStreamPolling` (default null; resumable only, else startMockMcp
//     throws, as it does on anything but null or { closeAfterMs: a number
//     >= 0, retryMs: an integer >= 0 }, no other field): GET streams are
//     polled, as a server that does not hold them open (2025-11-25's SSE
//     polling; the official TypeScript SDK's priming events). Every
//     connection of a GET stream, a plain GET's (right after its `: open`
//     comment) or a resumption's (right after the events it replays),
//     first gets a priming event: `id: get-<k>:<n>` (the stream's next number, counted
//     and kept like any of its events, so a later resumption from before it
//     replays it as written), `retry: <retryMs>`, `data: ` (empty; no
//     `event:` field; the fields in that order, as the SDK writes them). A
//     client's SSE parser dispatches nothing for it (empty data) but takes
//     its id as the last event id. closeAfterMs after the priming the
//     server ends the connection (res.end(), as closeStreams does; its
//     `stream`/`resume` entry closedBy 'server') unless it ended before;
//     the stream is then detached and keeps the notifications sent
//     meanwhile. A resumption from the priming id (`Last-Event-ID:
//     get-<k>:<n>`) replays those notifications, primes again (the next
//     number) and ends again closeAfterMs later: a client that resumes
//     after each end polls. Notifications sent while a connection is open
//     are written on it as ever. Primed regardless of the revision agreed.
//   cutNextCallStream({ afterEvents = 1, close = false } = {}) (resumable
//     or not; throws on an afterEvents not an integer >= 0 or a close not a
//     boolean): the next tools/call answered as an event stream is cut
//     right after its afterEvents-th event (0: right after its headers), or
//     just before its response if that comes first (a cut stream never
//     carries its response): its socket destroyed once what was written
//     went out (the client sees the body break off: a network error), or
//     with close ended cleanly (res.end(): the body ends without the
//     response). The call runs on (not aborted): its later notifications,
//     requests (ctx.ask/elicit wait for the client's POSTed answer as ever)
//     and response are kept for a resumption when resumable, else lost.
//     Logged as a `cut` entry. cuts() → the `cut` entries; resumes() → the
//     `resume` entries (both also in log(), in order with the rest).
//     keptStreams() → the answer streams kept: { stream, session, callId,
//     events (written so far), answered (the response among them),
//     detached (cut or taken over: off its POST) }. keptGetStreams() → the
//     GET streams kept (resumable; else []), in order: { stream
//     ('get-<k>'), number (k), session, events (numbered so far, kept ones
//     and getStreamPolling's priming events included), kept (how many of
//     them are still kept, at most 100), detached (on no connection now),
//     resumes (resumptions answered 200) }. reset() forgets the
//     kept streams (ending resuming GETs) and a pending cut; a DELETE or
//     expireSessions() forgets the session's; close() destroys resuming
//     GETs. A stream forgotten while its call still runs goes nowhere (one
//     still on its POST answers there).
//   setTools(tools, { notify = true }) → the number of GET streams notified:
//     the next tools/list lists `tools`; with notify, every open GET stream
//     gets `notifications/tools/list_changed` (resumable: every detached
//     one keeps it, not counted). notifyListChanged() → that number too,
//     tools unchanged. closeStreams() → how many open GET streams the
//     server ended (res.end()); breakStreams() → how many open GET streams
//     had their socket destroyed once what was written went out (the
//     client sees the body break off: a network error), resumable or not;
//     forgetKeptGetStreams() → how many kept GET streams it forgot (the
//     open ones ended first, res.end()); sessions stay: a server that lost
//     its event store, so resuming one is refused 400.
//     failNextResumptions(status, count = 1): the next `count` GETs that
//     carry a Last-Event-ID header (either kind, answer stream or GET
//     stream; resumable or not) are answered HTTP `status` (an integer
//     400-599; else, or a count not an integer >= 1, TypeError) after
//     setDown's status and the Bearer check (auth), before anything else
//     (the 405 of listChanged false, the Accept and session checks, the
//     id): a JSON-RPC error body (-32000, "Forced: HTTP <status>.", for
//     409 "Conflict: Stream already has an active connection", as the
//     official TypeScript SDK answers a second connection to a stream),
//     logged as a `rejected` entry (method 'GET', lastEventId, forced:
//     true; no `resume` entry). The streams asked for are untouched (a
//     later resumption of them succeeds). A new call replaces what was
//     pending; failNextResumptions(null) cancels, and so does reset().
//     forcedResumptionsLeft() → how many it will still refuse (0: none).
//     streamCount(session?) → how many GET connections are open (of one
//     session), a resuming GET's included. setDown(status) answers every
//     message, GET included, with `status` (open streams stay open).
//     expireSessions() forgets every session and ends their GET streams
//     (kept ones forgotten); reset() and close() end every GET stream and
//     forget the kept ones (close() destroys them: it never waits on an
//     open stream).
//   `log` entries: { kind: request|notification|response|rejected|
//     elicitation|elicitation-response|stream|sent|delete|cut|resume|prime,
//     method?, id?, params?, headers, status, session }. `elicitation` is
//     the server's `elicitation/create` as sent on a call's stream (with
//     that call's headers, `callId` the call's JSON-RPC id, `answered` once
//     the client answered); `elicitation-response` the client's POST
//     answering one (`action`, `content`, `requestSession`: the session the
//     question was asked in, `late`: it answered nothing that still waited).
//     `stream` a GET event stream opened (method 'GET', status 200, `stream`:
//     its number from 1, `closed`: false until it ends, then true with
//     `closedAt` (Date.now()) and `closedBy`: 'client'|'server'; it
//     describes the plain GET's connection only: a resumption of the stream
//     is a `resume` entry, and streams() lists one entry per stream, closed
//     once its first connection ended, resumed or not); a refused
//     GET is a `rejected` entry with method 'GET' (failNextResumptions':
//     with lastEventId and `forced: true`); a request to another
//     path than /mcp is a `rejected` entry (status 404) with its `path`. `sent` a notification the
//     server sent: { kind: 'sent', method, params?, session, stream (its
//     number), headers (the GET's whose connection it was written on:
//     the plain GET's or a resumption's; when kept, the stream's latest
//     connection's) } per GET stream written or (resumable) kept, or {
//     kind: 'sent', method, params?, session, callId, headers (the call's) }
//     for ctx.notify on a call's stream; resumable, both also carry
//     `eventId` (the event's id), and `kept: true` when it went on no
//     connection (a detached GET stream; a call's stream cut, not resumed
//     yet). `delete` a DELETE of a session (status 200).
//     `cut` (cutNextCallStream): { kind: 'cut', stream (its id, e.g.
//     'post-3'), method: 'tools/call', id (the call's JSON-RPC id),
//     afterEvents (as asked), written (the events the cut connection
//     carried: afterEvents, fewer when the response came first), how:
//     'destroy'|'close', session, headers (the call's) }. `resume` a GET
//     with Last-Event-ID past the session checks (resumable): { kind:
//     'resume', method: 'GET', lastEventId (as sent), stream (null when
//     refused), callId?, replayed (events written from the store), status
//     (200|400), rejected? (400: the message), delivered (200: false until
//     the response went out on it), closed (200: false until it ends, then
//     true with closedAt and closedBy: 'server' (the response delivered,
//     taken over by a later resumption, reset, the session's end) |
//     'client'), session, headers }; a GET stream's: stream 'get-<k>', no
//     callId, no delivered, closedBy 'server' (closeStreams, breakStreams,
//     taken over by a later resumption, reset, close, the session's end,
//     getStreamPolling's close) | 'client'. `prime` (getStreamPolling) a
//     priming event written: { kind: 'prime', stream (k, the GET stream's
//     number), eventId ('get-<k>:<n>'), session, headers (the GET's whose
//     connection it was written on: the plain GET's or a resumption's) },
//     after that connection's `stream` or `resume` entry.
//   `auth` (default off): true, or { autoApprove = false, accessTtlSeconds =
//     3600, scopes = ['tools'], challengeScope = null, challengeMetadata =
//     true, metadataAt = 'path', scopedTools = {}, issParameter = false,
//     registration = true, clients = [], clientMetadataDocuments = false }
//     (startMockMcp throws on a metadataAt other than 'path'|'root'|'both',
//     a challengeScope not a string or null, a challengeMetadata,
//     registration or clientMetadataDocuments not a boolean, a scopedTools
//     scope not in scopes, or clients not an array of valid clients; each
//     Error names the option and what is wrong). registration false: no
//     dynamic client registration (no registration_endpoint in the
//     metadata, /register 404). clients: pre-registered public clients, {
//     client_id (a non-empty string, not of the form client-<n> /register
//     gives out, not given twice), redirect_uris (a non-empty array of
//     https or http://127.0.0.1 URLs, no fragment), client_name? (a string,
//     the Allow page shows it) }, no other field; known to /authorize and
//     /token from the start and after reset(). clientMetadataDocuments
//     (Client ID Metadata Documents, MCP 2025-11-25;
//     draft-ietf-oauth-client-id-metadata-document): a client_id that is
//     an http(s) URL and neither a pre-registered nor a registered
//     client's names a document the authorization server fetches (see
//     /authorize); off, such a client_id is an unknown client like any
//     other (nothing fetched). `auth` off: the paths below are 404 like
//     any other, and /mcp wants no token. On, with O =
//     http://127.0.0.1:<port> and M the metadata address the challenges
//     name (metadataAt 'path' or 'both':
//     O/.well-known/oauth-protected-resource/mcp, the path-inserted one;
//     'root': O/.well-known/oauth-protected-resource):
//     /mcp (POST, GET, DELETE; after setDown's status, before every other
//     check) wants `Authorization: Bearer <access token>` issued here, live
//     (not expired, not revoked); else 401, `WWW-Authenticate: Bearer
//     resource_metadata="M"` (plus `, error="invalid_token"` when a Bearer
//     token was sent but is not valid, then `, scope="<challengeScope>"`
//     when challengeScope is set; challengeMetadata false: no
//     resource_metadata, the rest as is, e.g. `Bearer error="invalid_token"`
//     or `Bearer scope="tools"`, and `Bearer realm="mock-mcp"` when nothing
//     is left), a JSON-RPC error body (-32600, "Unauthorized: ..."), and a
//     `rejected` log entry (status 401, method: a POST's JSON-RPC method or
//     'GET'/'DELETE', `authError`: 'missing'|'invalid_token').
//     scopedTools ({ tool name: scope }, step-up authorization): a
//     `tools/call` naming such a tool (listed or not; after the session
//     checks) whose live token's scope (space-separated) lacks that scope
//     → 403, `WWW-Authenticate: Bearer error="insufficient_scope",
//     scope="<the token's scopes, then the needed one; space-separated, no
//     duplicates>", resource_metadata="M"` (resource_metadata left out when
//     challengeMetadata is false), a JSON-RPC error body (-32600,
//     "Forbidden: the access token lacks the scope <s>."), and a `rejected`
//     log entry (status 403, method 'tools/call', id, params, tool,
//     `authError`: 'insufficient_scope'); the tool does not run.
//     GET  M (RFC 9728; metadataAt 'both': at either address, else only at
//       M, the other 404 like any unknown path; logged as kind 'metadata'
//       at either, `path` telling which):
//       { resource: O/mcp (at the root: O), authorization_servers: [O], scopes_supported,
//       bearer_methods_supported: ['header'] }.
//     GET  O/.well-known/oauth-authorization-server (RFC 8414): { issuer: O,
//       authorization_endpoint: O/authorize, token_endpoint: O/token,
//       registration_endpoint: O/register (registration only),
//       response_types_supported: ['code'], grant_types_supported:
//       ['authorization_code', 'refresh_token'],
//       code_challenge_methods_supported: ['S256'],
//       token_endpoint_auth_methods_supported: ['none'], scopes_supported,
//       authorization_response_iss_parameter_supported: true (issParameter
//       only), client_id_metadata_document_supported: true
//       (clientMetadataDocuments only) }.
//     POST O/register (RFC 7591; registration false: 404 { error:
//       'invalid_request', error_description } to any method, logged as a
//       'register' entry, status 404; Content-Type application/json): wants
//       redirect_uris (a non-empty array of https URLs or http://127.0.0.1
//       URLs, no fragment; else 400 invalid_redirect_uri),
//       token_endpoint_auth_method 'none' or absent, grant_types ⊆
//       [authorization_code, refresh_token], response_types ⊆ [code] (else
//       400 invalid_client_metadata) → 201 { client_id: 'client-<n>',
//       client_id_issued_at, redirect_uris, grant_types, response_types,
//       token_endpoint_auth_method: 'none', client_name? (as given), scope?
//       (as given) }. Client ids are never reused, reset() included.
//     GET  O/authorize?response_type=code&client_id&redirect_uri
//       &code_challenge&code_challenge_method=S256&state&resource[&scope]:
//       the client_id is looked up among the pre-registered clients
//       (auth.clients), then the registered ones; with
//       clientMetadataDocuments, one found in neither that is an http(s)
//       URL is a Client ID Metadata Document's address, fetched at every
//       authorization request (none cached): only on 127.0.0.1 (https, or
//       http there), with a path, no fragment, no user name or password
//       (else refused unfetched: "client_id <url> cannot be a Client ID
//       Metadata Document URL: <why>."); GET, Accept: application/json,
//       redirects not followed, given up after 5 s; it must answer HTTP 200
//       with a JSON object whose client_id is the URL exactly, whose
//       redirect_uris (an array) include the request's redirect_uri
//       exactly, and whose token_endpoint_auth_method, if present, is
//       'none'; its client_name (a string) is shown on the Allow page. A
//       document that passes is remembered for /token (a later failing
//       fetch forgets nothing); one that does not → the 400 HTML below, the
//       reason in its text ("The Client ID Metadata Document at <url> is
//       refused: <reason>.").
//       Each fetch is a 'client-metadata' authLog entry (before the
//       request's 'authorize' one). An unknown client_id or a redirect_uri
//       not registered for it (exact match) → 400 HTML (no redirect; the
//       reason in `<p id="error">`); any other problem (a parameter
//       twice, response_type not code, method not S256, no 43-character
//       challenge, resource not O/mcp (RFC 8707), an unknown scope) → 302
//       redirect_uri?error=invalid_request&error_description=..&state=..;
//       autoApprove → 302 redirect_uri?code=..&state=..; else 200 HTML
//       titled "Sign in to mock-mcp": the client's name (#client-name, its
//       client_name or client_id), the scope (#scope), and GET forms whose
//       buttons `<button id="allow">Allow</button>` and `<button
//       id="deny">Deny</button>` (each with data-href, the same URL) lead to
//     GET  O/authorize/decide?request=<id>&allow=1|0 (each request decided
//       once; else 400 HTML) → 302 redirect_uri?code=..&state=.. or
//       redirect_uri?error=access_denied&state=... state is left out when
//       the request had none. Granted scope: the asked one, else all scopes.
//       Codes: single use, 60 s, bound to client, redirect_uri, challenge,
//       resource and scope. issParameter (RFC 9207): every redirect of
//       /authorize and /authorize/decide back to the client, with a code or
//       an error, also carries iss=O (last, after state); setRedirectIss
//       changes that.
//     POST O/token (held setTokenDelay's milliseconds first, then handled;
//       Content-Type application/x-www-form-urlencoded, else
//       400 invalid_request; no parameter twice; client_id a pre-registered
//       or registered client's, or a Client ID Metadata Document's URL
//       validated at /authorize (never fetched here), else invalid_client):
//       grant_type=authorization_code, code, redirect_uri, client_id,
//       code_verifier, resource (all required): PKCE S256 checked
//       (pkceChallenge(verifier) === code_challenge); a failed check does
//       not use the code up; a code used a second time is refused and
//       revokes every token issued from it (OAuth 2.1);
//       grant_type=refresh_token, refresh_token, client_id[, resource]
//       [, scope ⊆ the grant's]: rotation, the old refresh token is revoked
//       (the access tokens issued before stay live until they expire).
//       → 200 { access_token, token_type: 'Bearer', expires_in:
//       accessTtlSeconds, refresh_token, scope } with Cache-Control:
//       no-store. Errors: 400 { error: invalid_request | invalid_client
//       (unknown client_id) | invalid_grant (code or refresh token unknown,
//       used, expired, revoked, of another client, or redirect_uri,
//       resource or verifier not matching) | unsupported_grant_type |
//       invalid_scope, error_description }.
//     GET  O/client-metadata.json: setClientMetadata's document as JSON
//       (200), 404 { error: 'not_found', error_description } while it is
//       null (the default); OPTIONS 204, another method 405. Served
//       whether clientMetadataDocuments is on or not; not logged (the
//       authorization server's fetches of it are).
//     All of these answer `Access-Control-Allow-Origin: *`, OPTIONS with 204
//     (Allow-Methods `GET, POST`, Allow-Headers `content-type,
//     authorization, mcp-protocol-version`; the document's: `GET`); another
//     method: 405 invalid_request. setDown does not touch them.
//   Controls: `auth` → null (off) or { issuer, resourceMetadataUrl (M),
//     authorizationServerMetadataUrl, authorizationEndpoint, decideEndpoint,
//     tokenEndpoint, registrationEndpoint (null when registration is off),
//     clientMetadataUrl (O/client-metadata.json), scopes, accessTtlSeconds,
//     metadataAt, challengeScope, challengeMetadata, scopedTools,
//     issParameter, registration, clients (as given),
//     clientMetadataDocuments }.
//     addClient(client): pre-registers one more client as auth.clients does
//     (checked the same way, else TypeError; kept across reset()), for a
//     test that learns its redirect address only after start.
//     setClientMetadata(doc): GET O/client-metadata.json answers doc (a
//     copy; an object, else TypeError) as JSON; null (default): 404.
//     clientMetadataFetches() → how many Client ID Metadata Documents the
//     authorization server fetched (counted as each fetch starts, refused
//     ones included; waitFor's check runs on each).
//     setAutoApprove(bool). setRedirectIss(value): the iss of those
//     redirects: undefined (default) the issuer O when issParameter is on
//     (none when off), a string that string instead (issParameter on or
//     off: a mix-up attack), null none even when issParameter is on.
//     setTokenDelay(ms) (default 0): POST /token requests are held ms
//     milliseconds before being handled (close() drops held ones).
//     tokenRequestsReceived() → how many POST /token requests have arrived
//     (counted on arrival, before the hold; waitFor's check runs on each).
//     expireAccessTokens(): every access token issued so far is expired
//     (refresh tokens still work). revokeGrants(): every access token,
//     refresh token, unused code and undecided request stops working.
//     clients() → the registration answers (dynamically registered clients
//     only: not auth.clients, not documents). tokens() → the access tokens
//     issued, in order: { accessToken, refreshToken (issued with it),
//     clientId, scope, resource, grant (n: one sign-in through its
//     refreshes), grantType, issuedAt, expiresAt (ms), expired, revoked }.
//     reset() forgets the registered clients (not auth.clients), the
//     documents remembered, codes, tokens and the auth log, restores
//     autoApprove and setRedirectIss (undefined), sets the token delay back
//     to 0, the client metadata document back to null, and zeroes
//     tokenRequestsReceived and clientMetadataFetches. authLog() → every
//     request to those endpoints (OPTIONS and O/client-metadata.json
//     aside) and every fetch of a Client ID Metadata Document, in order:
//     { kind: 'metadata'|'as-metadata'|'register'|'authorize'|'decide'|
//     'token', method, path, status, params (the query; /register's JSON
//     body (its raw text if not JSON); /token's form, all values kept,
//     code_verifier and refresh_token included), headers, error?,
//     errorDescription? (when refused or redirected with an error),
//     location? (a 302's), request? (authorize: the request's id; decide:
//     the one asked for), approved?: 'auto', allow? (decide: true|false),
//     clientId? (register: the new one), grantType? (token), issued?
//     (token: { accessToken, refreshToken }) }; a fetch: { kind:
//     'client-metadata', url (the client_id), status (the fetch's HTTP
//     status, 0 when it failed: no answer, timed out), ok (the document
//     passed), reason? (why not, when not ok) }.
//     waitFor's check is also run on every authLog entry (read
//     mock.authLog() in it).

import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import { fileURLToPath } from 'node:url';

const HOST = '127.0.0.1';
export const SUPPORTED_VERSIONS = ['2025-06-18', '2025-03-26'];

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason ?? new Error('aborted'));
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason ?? new Error('aborted'));
    }, { once: true });
  });
}

const text = (value) => ({ content: [{ type: 'text', text: value }] });

/** PKCE S256: base64url(sha256(code_verifier)) without padding (RFC 7636). */
export function pkceChallenge(verifier) {
  return createHash('sha256').update(String(verifier), 'ascii').digest('base64url');
}

// RFC 9728's addresses of the protected resource metadata of O/mcp: the
// well-known path with the resource's path inserted (what the 401 names by
// default), and the origin's root one, which clients fall back to.
const METADATA_AT_PATH = '/.well-known/oauth-protected-resource/mcp';
const METADATA_AT_ROOT = '/.well-known/oauth-protected-resource';
/** `auth.metadataAt` → the metadata paths served, the one the challenges name first. */
const METADATA_PATHS = { path: [METADATA_AT_PATH], root: [METADATA_AT_ROOT], both: [METADATA_AT_PATH, METADATA_AT_ROOT] };

/** The OAuth endpoints `auth` adds, by path: the log kind and the HTTP method each takes. */
const OAUTH_ROUTES = {
  [METADATA_AT_PATH]: { kind: 'metadata', method: 'GET' },
  [METADATA_AT_ROOT]: { kind: 'metadata', method: 'GET' },
  '/.well-known/oauth-authorization-server': { kind: 'as-metadata', method: 'GET' },
  '/register': { kind: 'register', method: 'POST' },
  '/authorize': { kind: 'authorize', method: 'GET' },
  '/authorize/decide': { kind: 'decide', method: 'GET' },
  '/token': { kind: 'token', method: 'POST' },
};
const CORS = { 'Access-Control-Allow-Origin': '*' };
const CODE_TTL_MS = 60_000;
/** Where `auth` serves setClientMetadata's document (a Client ID Metadata Document a test needs no second server for). */
const CLIENT_METADATA_PATH = '/client-metadata.json';
/** How long the authorization server waits for a Client ID Metadata Document. */
const CLIENT_METADATA_TIMEOUT_MS = 5000;

const SSE_HEADERS = { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' };
/** How many of its latest events a GET stream keeps for a resumption (resumable); older ones are dropped. */
const GET_STREAM_KEPT_EVENTS = 100;

/**
 * One event carrying a JSON-RPC message: `event: message`, then `id:` and
 * `retry:` when given (resumability), then `data:`. The event field stays
 * first: the tests' readers (client.mjs) look for it there.
 */
function sseEvent(payload, { id = null, retry = null } = {}) {
  const idLine = id === null ? '' : `id: ${id}\n`;
  const retryLine = retry === null ? '' : `retry: ${retry}\n`;
  return `event: message\n${idLine}${retryLine}data: ${JSON.stringify(payload)}\n\n`;
}

/** `resumeRetryMs` as given (null: no retry field), or an Error thrown at start-up. */
function checkedResumeRetry(value) {
  if (value === null || (Number.isInteger(value) && value >= 0)) return value;
  throw new Error(`mock-mcp: resumeRetryMs must be an integer of milliseconds >= 0 or null, not ${JSON.stringify(value)}.`);
}

/** `getStreamPolling` as given (null: off), or an Error thrown at start-up (it needs `resumable`). */
function checkedGetStreamPolling(value, resumable) {
  if (value === null || value === undefined) return null;
  const problem = (why) => new Error(`mock-mcp: getStreamPolling ${why}, not ${JSON.stringify(value)}.`);
  if (typeof value !== 'object' || Array.isArray(value)) throw problem('must be { closeAfterMs, retryMs } or null');
  const unknown = Object.keys(value).filter((key) => key !== 'closeAfterMs' && key !== 'retryMs');
  if (unknown.length) throw problem(`takes closeAfterMs and retryMs only (${unknown.join(', ')} unknown)`);
  const { closeAfterMs, retryMs } = value;
  if (typeof closeAfterMs !== 'number' || !Number.isFinite(closeAfterMs) || closeAfterMs < 0) throw problem('wants closeAfterMs, a number of milliseconds >= 0');
  if (!Number.isInteger(retryMs) || retryMs < 0) throw problem('wants retryMs, an integer of milliseconds >= 0');
  if (!resumable) throw problem('needs resumable: true (a polled stream is resumed)');
  return { closeAfterMs, retryMs };
}

/** What failNextResumptions' answers say: the official TypeScript SDK's words for a 409, else the status. */
const forcedMessage = (status) => (status === 409 ? 'Conflict: Stream already has an active connection' : `Forced: HTTP ${status}.`);

const escapeHtml = (value) => String(value).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

/** Whether `value` is an absolute http or https URL (a client_id that may name a Client ID Metadata Document). */
function isHttpUrl(value) {
  if (typeof value !== 'string') return false;
  try {
    const { protocol } = new URL(value);
    return protocol === 'https:' || protocol === 'http:';
  } catch {
    return false;
  }
}

/** Why a redirect URI may not be registered (null: it may): https, or http on 127.0.0.1; no fragment. */
function redirectUriProblem(uri) {
  if (typeof uri !== 'string') return 'is not a string';
  let parsed;
  try {
    parsed = new URL(uri);
  } catch {
    return 'is not an absolute URL';
  }
  if (uri.includes('#')) return 'has a fragment';
  if (parsed.protocol === 'https:' && parsed.hostname) return null;
  if (parsed.protocol === 'http:' && parsed.hostname === '127.0.0.1') return null;
  return 'must be an https URL or an http://127.0.0.1 URL';
}

/** The form `book_table` asks the user to fill in (elicitation/create's requestedSchema). */
export const BOOKING_SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', title: 'Your name', minLength: 2, maxLength: 60 },
    email: { type: 'string', format: 'email', title: 'Email', description: 'The confirmation goes there.' },
    partySize: { type: 'integer', title: 'Guests', minimum: 1, maximum: 12, default: 2 },
    seating: {
      type: 'string',
      title: 'Seating',
      enum: ['indoor', 'terrace', 'bar'],
      enumNames: ['Indoors', 'On the terrace', 'At the bar'],
    },
    highChair: { type: 'boolean', title: 'High chair needed', description: 'For a small child.', default: false },
  },
  required: ['name', 'email', 'partySize'],
};

/** The form `check_availability` (a read) asks the user to fill in. */
export const AVAILABILITY_SCHEMA = {
  type: 'object',
  properties: { day: { type: 'string', format: 'date', title: 'Day' } },
  required: ['day'],
};

export const AVAILABILITY_MESSAGE = 'Which day shall I look at?';

export const BOOKING_MESSAGE = 'Who is the table for? The restaurant needs a name, an email and the number of guests.';

/**
 * Where an accepted booking's `content` does not fit BOOKING_SCHEMA, in words
 * (null: it fits), as a server checks what it is given.
 */
export function bookingProblem(content) {
  if (content === null || typeof content !== 'object' || Array.isArray(content)) return 'no content';
  for (const name of BOOKING_SCHEMA.required) {
    if (content[name] === undefined) return `${name} is missing`;
  }
  for (const [name, value] of Object.entries(content)) {
    const field = BOOKING_SCHEMA.properties[name];
    if (!field) return `${name} is not a field of the form`;
    if (field.type === 'integer' && !Number.isInteger(value)) return `${name} is not an integer: ${JSON.stringify(value)}`;
    if (field.type === 'integer' && (value < field.minimum || value > field.maximum)) return `${name} is out of range: ${value}`;
    if (field.type === 'boolean' && typeof value !== 'boolean') return `${name} is not a boolean: ${JSON.stringify(value)}`;
    if (field.type === 'string' && typeof value !== 'string') return `${name} is not a string: ${JSON.stringify(value)}`;
    if (field.enum && !field.enum.includes(value)) return `${name} is not one of ${field.enum.join(', ')}: ${JSON.stringify(value)}`;
    if (field.format === 'email' && !/^[^\s@]+@[^\s@]+$/.test(value)) return `${name} is not an email address: ${JSON.stringify(value)}`;
    if (field.minLength !== undefined && [...value].length < field.minLength) return `${name} is too short`;
    if (field.maxLength !== undefined && [...value].length > field.maxLength) return `${name} is too long`;
  }
  return null;
}

/**
 * The demo tools: a docs search (read), a ticket desk (write), a slow report
 * with progress (read), a tool that fails, one that asks the client for
 * a model answer (sampling, which the engine refuses), a table booking
 * (write) that asks the user for the booking's details (elicitation), and
 * an availability check (read) that asks the user for a day, and
 * `add_faq_tool` (write), which publishes a new read-only tool and tells the
 * clients' GET streams (`notifications/tools/list_changed`): it needs
 * `state.publishTool(tool)` (startMockMcp gives its state one; without it
 * the call fails with isError).
 */
export function demoTools(state) {
  return [
    {
      name: 'search',
      title: 'Search the docs',
      description: 'Search the product documentation. Returns the best matching passages.',
      annotations: { readOnlyHint: true },
      inputSchema: {
        type: 'object',
        properties: { query: { type: 'string', description: 'What to look for.' } },
        required: ['query'],
      },
      run: ({ query }) => ({
        content: [{ type: 'text', text: `2 passages for "${query}":\n1. Refunds are paid within 14 days.\n2. A refund needs the order number.` }],
        structuredContent: { query, passages: 2 },
      }),
    },
    {
      name: 'create_ticket',
      description: 'Open a support ticket.',
      inputSchema: {
        type: 'object',
        properties: { subject: { type: 'string' }, body: { type: 'string' } },
        required: ['subject'],
      },
      run: ({ subject }) => {
        state.tickets.push(subject);
        return text(`Opened ticket T-${state.tickets.length}: ${subject}`);
      },
    },
    {
      name: 'slow_report',
      title: 'Build a report',
      description: 'Build a usage report; takes `steps` × 300 ms and reports progress.',
      annotations: { readOnlyHint: true },
      inputSchema: {
        type: 'object',
        properties: { steps: { type: 'integer', minimum: 1, maximum: 1000 } },
      },
      run: async ({ steps = 3 }, ctx) => {
        for (let i = 1; i <= steps; i += 1) {
          await ctx.sleep(300);
          ctx.progress(i, steps, `Step ${i} of ${steps}`);
        }
        return text(`The report has ${steps} sections.`);
      },
    },
    {
      name: 'broken',
      description: 'Always fails.',
      inputSchema: { type: 'object', properties: {} },
      run: () => ({ content: [{ type: 'text', text: 'The database is down.' }], isError: true }),
    },
    {
      name: 'ask_model',
      description: 'Asks the client to sample a model answer.',
      annotations: { readOnlyHint: true },
      inputSchema: { type: 'object', properties: {} },
      run: async (_args, ctx) => {
        const answer = await ctx.ask('sampling/createMessage', {
          messages: [{ role: 'user', content: { type: 'text', text: 'Hi' } }],
          maxTokens: 10,
        });
        return text(answer.error ? `The client refused: ${answer.error.code} ${answer.error.message}` : 'The client sampled.');
      },
    },
    {
      name: 'book_table',
      title: 'Book a table',
      description: 'Book a table at the restaurant. Asks the user who it is for (name, email, guests, seating).',
      inputSchema: {
        type: 'object',
        properties: { date: { type: 'string', description: 'The day, as YYYY-MM-DD.' } },
      },
      run: async ({ date }, ctx) => {
        if (!ctx.canElicit) {
          return {
            content: [{ type: 'text', text: 'This client cannot answer questions (it declared no elicitation capability): the booking needs a name, an email and the number of guests.' }],
            isError: true,
          };
        }
        const answer = await ctx.elicit(BOOKING_MESSAGE, BOOKING_SCHEMA);
        if (answer.error) return { content: [{ type: 'text', text: `The client refused: ${answer.error.code} ${answer.error.message}` }], isError: true };
        const action = answer.result?.action;
        if (action === 'decline') return text('Booking declined');
        if (action === 'cancel') return text('Booking cancelled');
        if (action !== 'accept') return { content: [{ type: 'text', text: `Unknown action: ${JSON.stringify(action)}` }], isError: true };
        const content = answer.result.content;
        const problem = bookingProblem(content);
        if (problem) return { content: [{ type: 'text', text: `Invalid booking: ${problem}` }], isError: true };
        state.bookings.push({ date: date ?? null, ...content });
        const seating = content.seating ? `, seating: ${content.seating}` : '';
        const chair = content.highChair === undefined ? '' : `, high chair: ${content.highChair ? 'yes' : 'no'}`;
        return {
          content: [{ type: 'text', text: `Booked for ${content.partySize}${date ? ` on ${date}` : ''} (name: ${content.name}, email: ${content.email}${seating}${chair})` }],
          structuredContent: { booking: state.bookings.length, ...content },
        };
      },
    },
    {
      name: 'check_availability',
      title: 'Check availability',
      description: 'Say which tables are free on a day. Asks the user which day.',
      annotations: { readOnlyHint: true },
      inputSchema: { type: 'object', properties: {} },
      run: async (_args, ctx) => {
        if (!ctx.canElicit) return { content: [{ type: 'text', text: 'This client cannot answer questions.' }], isError: true };
        const answer = await ctx.elicit(AVAILABILITY_MESSAGE, AVAILABILITY_SCHEMA);
        const action = answer.result?.action;
        if (action !== 'accept') return text(`No day given (${action ?? 'error'})`);
        return text(`Tables free on ${answer.result.content.day}: 3`);
      },
    },
    {
      name: 'add_faq_tool',
      title: 'Publish a FAQ tool',
      description: 'Publish a new tool that answers questions about a topic. The server\'s tool list changes.',
      inputSchema: {
        type: 'object',
        properties: { topic: { type: 'string', description: 'What the new tool answers questions about.' } },
        required: ['topic'],
      },
      run: ({ topic }) => {
        if (typeof topic !== 'string' || !faqName(topic)) {
          return { content: [{ type: 'text', text: 'The topic needs a letter or a digit.' }], isError: true };
        }
        if (typeof state.publishTool !== 'function') {
          return { content: [{ type: 'text', text: 'This server cannot publish tools.' }], isError: true };
        }
        const tool = faqTool(topic);
        state.publishTool(tool);
        return text(`Published ${tool.name}.`);
      },
    },
  ];
}

/**
 * The name `add_faq_tool` gives a topic's tool, without `faq_`: lower case,
 * accents dropped, every run of characters other than [a-z0-9] one `_`, no
 * `_` at either end, at most 20 characters ('' when nothing is left).
 */
export function faqName(topic) {
  return String(topic)
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .replace(/^_+|_+$/g, '')
    .slice(0, 20)
    .replace(/_+$/, '');
}

/** The read-only tool `add_faq_tool` publishes for `topic`. */
export function faqTool(topic) {
  return {
    name: `faq_${faqName(topic)}`,
    description: `Answer questions about ${topic}.`,
    annotations: { readOnlyHint: true },
    inputSchema: {
      type: 'object',
      properties: { question: { type: 'string', description: 'The question.' } },
    },
    run: () => text(`FAQ on ${topic}: see the help centre.`),
  };
}

/**
 * `auth`'s settings as given, or an Error thrown at start-up: a mistake in a
 * test's options should fail the test at once, not show up as a puzzling
 * sign-in later.
 */
function checkedAuthConfig(config) {
  if (!Object.hasOwn(METADATA_PATHS, config.metadataAt)) {
    throw new Error(`mock-mcp: auth.metadataAt must be 'path', 'root' or 'both', not ${JSON.stringify(config.metadataAt)}.`);
  }
  if (config.challengeScope !== null && typeof config.challengeScope !== 'string') {
    throw new Error(`mock-mcp: auth.challengeScope must be a string or null, not ${JSON.stringify(config.challengeScope)}.`);
  }
  if (typeof config.challengeMetadata !== 'boolean') {
    throw new Error(`mock-mcp: auth.challengeMetadata must be true or false, not ${JSON.stringify(config.challengeMetadata)}.`);
  }
  for (const [tool, scope] of Object.entries(config.scopedTools)) {
    if (!config.scopes.includes(scope)) {
      throw new Error(`mock-mcp: auth.scopedTools.${tool} needs ${JSON.stringify(scope)}, which is not one of auth.scopes (${config.scopes.join(', ')}).`);
    }
  }
  if (typeof config.registration !== 'boolean') {
    throw new Error(`mock-mcp: auth.registration must be true or false, not ${JSON.stringify(config.registration)}.`);
  }
  if (typeof config.clientMetadataDocuments !== 'boolean') {
    throw new Error(`mock-mcp: auth.clientMetadataDocuments must be true or false, not ${JSON.stringify(config.clientMetadataDocuments)}.`);
  }
  if (!Array.isArray(config.clients)) {
    throw new Error(`mock-mcp: auth.clients must be an array of { client_id, redirect_uris }, not ${JSON.stringify(config.clients)}.`);
  }
  const seen = new Set();
  config.clients.forEach((client, i) => {
    const problem = preRegisteredClientProblem(client, seen);
    if (problem) throw new Error(`mock-mcp: auth.clients[${i}] ${problem}.`);
    seen.add(client.client_id);
  });
  return config;
}

/** The fields a pre-registered client (auth.clients) may have. */
const PRE_REGISTERED_FIELDS = ['client_id', 'redirect_uris', 'client_name'];

/** What is wrong with one of auth.clients, in words (null: nothing); `seen`: the client ids before it. */
function preRegisteredClientProblem(client, seen) {
  if (!client || typeof client !== 'object' || Array.isArray(client)) return `must be an object { client_id, redirect_uris }, not ${JSON.stringify(client)}`;
  const extra = Object.keys(client).find((name) => !PRE_REGISTERED_FIELDS.includes(name));
  if (extra) return `has ${extra}, which is not one of ${PRE_REGISTERED_FIELDS.join(', ')}`;
  const id = client.client_id;
  if (typeof id !== 'string' || id === '') return `needs a client_id, a non-empty string, not ${JSON.stringify(id)}`;
  // The registration endpoint gives out client-<n>: one of those could name two clients.
  if (/^client-\d+$/.test(id)) return `client_id ${JSON.stringify(id)} has the form /register gives out (client-<n>)`;
  if (seen.has(id)) return `client_id ${JSON.stringify(id)} is given twice`;
  const uris = client.redirect_uris;
  if (!Array.isArray(uris) || uris.length === 0) return `redirect_uris must be a non-empty array, not ${JSON.stringify(uris)}`;
  for (const uri of uris) {
    const problem = redirectUriProblem(uri);
    if (problem) return `redirect_uris: ${JSON.stringify(uri)} ${problem}`;
  }
  if (client.client_name !== undefined && typeof client.client_name !== 'string') return `client_name must be a string, not ${JSON.stringify(client.client_name)}`;
  return null;
}

/**
 * Why a client_id that is an http(s) URL cannot be a Client ID Metadata
 * Document's address here (null: the mock fetches it): https, or http on
 * 127.0.0.1 (the draft wants https; tests serve http); on 127.0.0.1 only,
 * since the mock must not reach the network; a path; no fragment, no
 * user name or password (draft-ietf-oauth-client-id-metadata-document).
 */
function clientMetadataUrlProblem(clientId) {
  const url = new URL(clientId);
  if (url.protocol !== 'https:' && url.hostname !== '127.0.0.1') return 'it must be an https URL (http only on 127.0.0.1)';
  if (url.hostname !== '127.0.0.1') return 'the mock fetches documents on 127.0.0.1 only (it must not reach the network)';
  if (url.pathname === '/' || url.pathname === '') return 'it has no path';
  if (clientId.includes('#')) return 'it has a fragment';
  if (url.username || url.password) return 'it has a user name or password';
  return null;
}

export async function startMockMcp(options = {}) {
  const state = { tickets: [], bookings: [] };
  let tools = options.tools ?? demoTools(state);
  const pageSize = options.pageSize ?? 2;
  const defaultAnswer = options.answer ?? 'sse';
  const versions = options.versions ?? SUPPORTED_VERSIONS;
  const listChanged = options.listChanged ?? true;
  // OAuth 2.1 (MCP authorization, 2025-06-18): off unless options.auth.
  const authOptions = options.auth === true ? {} : options.auth || null;
  const authConfig = authOptions && checkedAuthConfig({
    autoApprove: Boolean(authOptions.autoApprove ?? false),
    accessTtlSeconds: authOptions.accessTtlSeconds ?? 3600,
    scopes: (authOptions.scopes ?? ['tools']).slice(),
    challengeScope: authOptions.challengeScope ?? null,
    challengeMetadata: authOptions.challengeMetadata ?? true,
    metadataAt: authOptions.metadataAt ?? 'path',
    scopedTools: { ...(authOptions.scopedTools ?? {}) },
    issParameter: Boolean(authOptions.issParameter ?? false),
    registration: authOptions.registration ?? true,
    clients: authOptions.clients ?? [],
    clientMetadataDocuments: authOptions.clientMetadataDocuments ?? false,
  });
  // Pre-registered clients (auth.clients): known from the start, reset() included.
  const preRegistered = new Map((authConfig?.clients ?? []).map((c) => [c.client_id, structuredClone(c)]));
  let autoApprove = authConfig?.autoApprove ?? false;
  let redirectIss; // setRedirectIss: undefined (the issuer, with issParameter), a string, or null (none)
  let tokenDelayMs = 0; // setTokenDelay: how long POST /token is held
  let tokenRequests = 0; // POST /token requests arrived (tokenRequestsReceived)
  let clientMetadata = null; // setClientMetadata: what GET /client-metadata.json answers (null: 404)
  let clientMetadataFetchCount = 0; // Client ID Metadata Documents fetched (clientMetadataFetches)
  const closing = new AbortController(); // aborted by close(): held /token requests stop waiting
  const oauth = {
    clients: new Map(), // client_id → the registration answer (dynamically registered only)
    documents: new Map(), // Client ID Metadata Document URL → the document last validated (auth.clientMetadataDocuments)
    pending: new Map(), // authorization request id → what /authorize/decide needs
    codes: new Map(), // code → { clientId, redirectUri, challenge, resource, scope, expiresAt, used, revoked, grant }
    access: new Map(), // access token → its record (tokens())
    refresh: new Map(), // refresh token → { clientId, scope, resource, grant, revoked }
    log: [],
  };
  let clientCounter = 0;
  let requestCounter = 0;
  let grantCounter = 0;
  let origin = ''; // http://127.0.0.1:<port>, once listening
  const sessions = new Map();
  let sessionCounter = 0;
  let serverRequestCounter = 0;
  let elicitationCounter = 0;
  let log = [];
  const running = new Map(); // `${session} ${id}` → AbortController
  const askedByServer = new Map(); // server request id → resolve
  const elicitationsAsked = new Map(); // elicitation id → its log entry
  const waiters = new Set();
  const streams = new Set(); // open GET connections (a plain GET's or a resuming one's): { res, entry, gs }
  // Every GET stream by id (`get-<k>`): { id, number, session, headers,
  // count, kept, conn, resumes }. Without resumable only while its
  // connection is open; with it until its session ends (detached, conn
  // null, between connections).
  const getStreams = new Map();
  let streamCounter = 0;
  let down = null; // an HTTP status every message gets, or null
  // Resumability (options.resumable): answer streams' events numbered and
  // kept until their response is delivered, GET streams' kept (the last
  // GET_STREAM_KEPT_EVENTS) while their session lives, for a GET with
  // Last-Event-ID.
  const resumable = Boolean(options.resumable ?? false);
  const resumeRetryMs = checkedResumeRetry(options.resumeRetryMs === undefined ? 200 : options.resumeRetryMs);
  // getStreamPolling (resumable only): { closeAfterMs, retryMs } or null.
  const getStreamPolling = checkedGetStreamPolling(options.getStreamPolling, resumable);
  let forcedResumptions = null; // failNextResumptions: { status, left } for the next GETs with Last-Event-ID, or null
  const answerStreams = new Map(); // kept answer streams (resumable): stream id → openAnswerStream's record
  let answerStreamCounter = 0; // post-<n>: never reused, reset() included, so an old id never names a new stream
  let pendingCut = null; // cutNextCallStream's { afterEvents, close }, for the next tools/call answered as a stream

  const notify = () => {
    for (const waiter of [...waiters]) {
      if (waiter.check()) {
        waiters.delete(waiter);
        waiter.resolve();
      }
    }
  };
  const record = (entry) => {
    log.push(entry);
    notify();
    return entry;
  };

  const markClosed = (entry, by) => {
    if (entry.closed) return;
    entry.closed = true;
    entry.closedAt = Date.now();
    entry.closedBy = by;
    notify();
  };
  /**
   * One GET connection ends from the server's side: its stream detached
   * (resumable: kept for a GET with Last-Event-ID; else gone), its log
   * entry (`stream` or `resume`) closed by the server. `how`: 'end'
   * (res.end()), 'destroy' (at once), or 'break' (the socket destroyed
   * once what was written went out, as a cut's: destroy() at once would
   * drop what Node still buffers).
   */
  const endConnection = (conn, how) => {
    const { res, entry, gs } = conn;
    streams.delete(conn);
    if (gs.conn === conn) gs.conn = null;
    if (!resumable) getStreams.delete(gs.id);
    markClosed(entry, 'server');
    if (res.destroyed) return;
    if (how === 'destroy') res.destroy();
    else if (how === 'break') res.write('', () => res.destroy());
    else res.end();
  };
  /** Ends the open GET connections that `which` picks, from the server's side (see endConnection); how many. */
  const endStreams = (which = () => true, how = 'end') => {
    let ended = 0;
    for (const conn of [...streams]) {
      if (!which(conn)) continue;
      endConnection(conn, how);
      ended += 1;
    }
    return ended;
  };
  /** Forgets the kept GET streams `which` picks (their session ended, reset, close); their connections end first. */
  const forgetGetStreams = (which = () => true, how = 'end') => {
    for (const gs of [...getStreams.values()]) {
      if (!which(gs)) continue;
      if (gs.conn) endConnection(gs.conn, how);
      getStreams.delete(gs.id);
    }
  };
  /** `conn` becomes its stream's connection: counted open, detached again when the client closes it. */
  const attachConnection = (gs, res, entry) => {
    const conn = { res, entry, gs };
    streams.add(conn);
    gs.conn = conn;
    gs.headers = entry.headers;
    res.on('close', () => {
      if (!streams.delete(conn)) return; // ended by the server already
      if (gs.conn === conn) gs.conn = null;
      if (!resumable) getStreams.delete(gs.id);
      markClosed(entry, 'client');
    });
    return conn;
  };
  /**
   * Writes a notification on every open GET stream; how many were written.
   * Resumable: numbered (`id: get-<k>:<n>`) and kept (the last
   * GET_STREAM_KEPT_EVENTS of each stream), and a detached stream (its
   * connection ended, its session alive) keeps it without a connection
   * (not counted; logged with kept: true).
   */
  /** Keeps an event of a GET stream's (resumable): its last GET_STREAM_KEPT_EVENTS, older ones dropped. */
  const keepEvent = (gs, event) => {
    gs.kept.push(event);
    if (gs.kept.length > GET_STREAM_KEPT_EVENTS) gs.kept.shift();
  };
  const sendOnStreams = (payload) => {
    let written = 0;
    for (const gs of [...getStreams.values()]) {
      const res = gs.conn?.res;
      const live = res && !res.writableEnded && !res.destroyed ? gs.conn : null;
      if (!live && !resumable) continue;
      gs.count += 1;
      const eventId = resumable ? `${gs.id}:${gs.count}` : null;
      const event = sseEvent(payload, { id: eventId });
      if (resumable) keepEvent(gs, event);
      if (live) live.res.write(event);
      record({
        kind: 'sent',
        method: payload.method,
        ...(payload.params !== undefined ? { params: payload.params } : {}),
        session: gs.session,
        stream: gs.number,
        ...(eventId ? { eventId } : {}),
        ...(live ? {} : { kept: true }),
        headers: live ? live.entry.headers : gs.headers,
      });
      if (live) written += 1;
    }
    return written;
  };
  /**
   * getStreamPolling: a GET stream's connection just opened (a plain GET,
   * after `: open`; a resumption, after its replay) gets a priming event
   * (the stream's next id, retry, empty data; numbered and kept like the
   * others), then is ended (res.end()) closeAfterMs later unless it ended
   * before: the stream is detached, the client polls with Last-Event-ID.
   */
  const primeAndPoll = (conn) => {
    if (!getStreamPolling) return;
    const { gs, res, entry } = conn;
    gs.count += 1;
    const eventId = `${gs.id}:${gs.count}`;
    const event = `id: ${eventId}\nretry: ${getStreamPolling.retryMs}\ndata: \n\n`;
    keepEvent(gs, event);
    res.write(event);
    record({ kind: 'prime', stream: gs.number, eventId, session: gs.session, headers: entry.headers });
    const timer = setTimeout(() => {
      if (streams.has(conn)) endConnection(conn, 'end');
    }, getStreamPolling.closeAfterMs);
    res.on('close', () => clearTimeout(timer));
  };
  const notifyListChanged = () => sendOnStreams({ jsonrpc: '2.0', method: 'notifications/tools/list_changed' });
  const setTools = (next, { notify: tell = true } = {}) => {
    tools = next;
    return tell ? notifyListChanged() : 0;
  };
  // What add_faq_tool publishes: added (or put in place of the tool of that
  // name), then list_changed on every open GET stream.
  state.publishTool = (tool) => {
    const next = tools.filter((t) => t.name !== tool.name);
    const at = tools.findIndex((t) => t.name === tool.name);
    next.splice(at < 0 ? next.length : at, 0, tool);
    return setTools(next);
  };
  /** Why the MCP-Protocol-Version header does not fit the session (null: it does). */
  const versionProblem = (session, headers) => {
    const sent = headers['mcp-protocol-version'];
    const bad = session.version === '2025-06-18' ? sent !== session.version : sent !== undefined && sent !== session.version;
    return bad ? `Bad MCP-Protocol-Version: ${sent ?? '(none)'}.` : null;
  };

  const reject = (res, entry, status, message, code = -32600, extraHeaders = {}) => {
    entry.status = status;
    entry.rejected = message;
    record(entry);
    if (res.headersSent) return;
    res.writeHead(status, { 'Content-Type': 'application/json', ...extraHeaders });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message } }));
  };

  // --- OAuth 2.1 authorization server (only with options.auth) ---

  const mcpUrl = () => `${origin}/mcp`;
  const metadataPaths = authConfig ? METADATA_PATHS[authConfig.metadataAt] : [];
  /** The metadata address the challenges name: the one served (the path-inserted one when both are). */
  const resourceMetadataUrl = () => `${origin}${metadataPaths[0]}`;
  /** Whether `auth` serves `pathname` (a metadata address only as metadataAt says). */
  const servesOAuth = (pathname) => Object.hasOwn(OAUTH_ROUTES, pathname)
    && (OAUTH_ROUTES[pathname].kind !== 'metadata' || metadataPaths.includes(pathname));
  const secret = (prefix) => `${prefix}${randomBytes(24).toString('base64url')}`;
  const authRecord = (entry) => {
    oauth.log.push(entry);
    notify();
    return entry;
  };
  const tokenExpired = (token) => Date.now() >= token.expiresAt;

  /** The token of an `Authorization: Bearer <token>` header (null: none). */
  const bearerOf = (authorization) => /^Bearer +(\S+) *$/i.exec(String(authorization ?? ''))?.[1] ?? null;

  /** Why /mcp refuses this Authorization header (null: a live access token of ours). */
  const bearerProblem = (authorization) => {
    const bearer = bearerOf(authorization);
    if (!bearer) return { invalid: false, message: authorization ? 'Unauthorized: not a Bearer token.' : 'Unauthorized: no Authorization header.' };
    const token = oauth.access.get(bearer);
    if (!token) return { invalid: true, message: 'Unauthorized: unknown access token.' };
    if (token.revoked) return { invalid: true, message: 'Unauthorized: the access token was revoked.' };
    if (tokenExpired(token)) return { invalid: true, message: 'Unauthorized: the access token expired.' };
    return null;
  };

  /** 401 for /mcp, logged as a `rejected` entry (a POST's JSON-RPC method, id and params read if they parse). */
  async function unauthorized(req, res, entry, problem) {
    if (req.method === 'POST') {
      try {
        const message = JSON.parse(await readBody(req));
        if (message && typeof message === 'object' && !Array.isArray(message)) {
          entry.method = message.method;
          entry.id = message.id;
          entry.params = message.params;
        }
      } catch {
        // Not JSON: logged without a method.
      }
    } else {
      entry.method = req.method;
    }
    entry.authError = problem.invalid ? 'invalid_token' : 'missing';
    const challenge = bearerChallenge([
      ['resource_metadata', challengeMetadataUrl()],
      ['error', problem.invalid ? 'invalid_token' : null],
      ['scope', authConfig.challengeScope],
    ]);
    return reject(res, entry, 401, problem.message, -32600, { 'WWW-Authenticate': challenge });
  }

  /** resource_metadata's value in a challenge (null: left out, auth.challengeMetadata false). */
  const challengeMetadataUrl = () => (authConfig.challengeMetadata ? resourceMetadataUrl() : null);

  /**
   * A Bearer challenge of the parameters given in order ([name, value];
   * a null value left out). With none left, `Bearer realm="mock-mcp"`: a
   * scheme alone would still parse, but a parameter keeps the header like
   * the ones real servers send.
   */
  const bearerChallenge = (params) => {
    const given = params.filter(([, value]) => value !== null && value !== undefined);
    const list = given.length ? given : [['realm', 'mock-mcp']];
    return `Bearer ${list.map(([name, value]) => `${name}="${value}"`).join(', ')}`;
  };

  /**
   * The scope a tools/call of `toolName` needs and the live token lacks
   * (auth.scopedTools; null: nothing lacking), with the token's granted
   * scopes. Only called once bearerProblem passed: the token is live.
   */
  const missingScope = (authorization, toolName) => {
    if (typeof toolName !== 'string' || !Object.hasOwn(authConfig.scopedTools, toolName)) return null;
    const needed = authConfig.scopedTools[toolName];
    const granted = String(oauth.access.get(bearerOf(authorization))?.scope ?? '').split(' ').filter(Boolean);
    return granted.includes(needed) ? null : { needed, granted };
  };

  /**
   * 403 insufficient_scope for a tools/call (RFC 6750 §3.1; MCP's step-up
   * authorization): the challenge's scope is what the client should ask
   * for next, the token's scopes plus the needed one, so signing in again
   * for it loses nothing. Logged as a `rejected` entry: the tool never ran.
   */
  const insufficientScope = (res, entry, { needed, granted }) => {
    entry.kind = 'rejected';
    entry.authError = 'insufficient_scope';
    entry.tool = entry.params?.name;
    const challenge = bearerChallenge([
      ['error', 'insufficient_scope'],
      ['scope', [...new Set([...granted, needed])].join(' ')],
      ['resource_metadata', challengeMetadataUrl()],
    ]);
    return reject(res, entry, 403, `Forbidden: the access token lacks the scope ${needed}.`, -32600, { 'WWW-Authenticate': challenge });
  };

  /**
   * The iss a redirect back to the client carries (RFC 9207; undefined:
   * none): setRedirectIss's string (sent even without issParameter, as a
   * server that forgot to advertise it), else the issuer when issParameter
   * is on; setRedirectIss(null) leaves it out.
   */
  const redirectIssuer = () => {
    if (redirectIss === null) return undefined;
    if (typeof redirectIss === 'string') return redirectIss;
    return authConfig.issParameter ? origin : undefined;
  };

  const oauthJson = (res, status, body, extraHeaders = {}) => {
    res.writeHead(status, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store', Pragma: 'no-cache', ...CORS, ...extraHeaders });
    res.end(JSON.stringify(body));
  };
  const oauthHtml = (res, status, title, body) => {
    res.writeHead(status, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store', ...CORS });
    res.end(`<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8"><title>${escapeHtml(title)}</title></head>\n<body>\n<h1>${escapeHtml(title)}</h1>\n${body}\n</body>\n</html>\n`);
  };
  /** A 302 back to the client's redirect_uri with `params` (and iss, see redirectIssuer). */
  const redirectTo = (res, entry, base, params) => {
    const location = new URL(base);
    for (const [name, value] of Object.entries({ ...params, iss: redirectIssuer() })) {
      if (value !== undefined && value !== null) location.searchParams.set(name, value);
    }
    entry.status = 302;
    entry.location = location.href;
    authRecord(entry);
    res.writeHead(302, { Location: location.href, 'Cache-Control': 'no-store', ...CORS });
    res.end();
  };

  /** A new single-use authorization code for an approved request. */
  const issueCode = (request) => {
    grantCounter += 1;
    const code = secret('code-');
    oauth.codes.set(code, {
      clientId: request.clientId,
      redirectUri: request.redirectUri,
      challenge: request.challenge,
      resource: request.resource,
      scope: request.scope,
      expiresAt: Date.now() + CODE_TTL_MS,
      used: false,
      revoked: false,
      grant: grantCounter,
    });
    return code;
  };

  /** A new access token and refresh token of `grant` (one authorization, through its rotations). */
  const issueTokens = ({ clientId, scope, resource, grant }, grantType) => {
    const accessToken = secret('at-');
    const refreshToken = secret('rt-');
    const now = Date.now();
    oauth.access.set(accessToken, {
      accessToken,
      refreshToken,
      clientId,
      scope,
      resource,
      grant,
      grantType,
      issuedAt: now,
      expiresAt: now + authConfig.accessTtlSeconds * 1000,
      revoked: false,
    });
    oauth.refresh.set(refreshToken, { clientId, scope, resource, grant, revoked: false });
    return {
      access_token: accessToken,
      token_type: 'Bearer',
      expires_in: authConfig.accessTtlSeconds,
      refresh_token: refreshToken,
      scope,
    };
  };

  /** The client table /authorize looks in: pre-registered (auth.clients), then dynamically registered (null: neither). */
  const tableClient = (clientId) => preRegistered.get(clientId) ?? oauth.clients.get(clientId) ?? null;
  /** Whether /token knows `clientId`: in the client table, or a Client ID Metadata Document validated at /authorize. */
  const tokenClientKnown = (clientId) => tableClient(clientId) !== null || oauth.documents.has(clientId);

  /**
   * Fetches the Client ID Metadata Document at `clientId` for an
   * authorization request to `redirectUri` and checks it: → { document }
   * or { reason } (in words, for the 400 page). Logged as a
   * 'client-metadata' entry per fetch; a document that passes is
   * remembered (oauth.documents) for /token, which never fetches.
   */
  const fetchClientMetadata = async (clientId, redirectUri) => {
    clientMetadataFetchCount += 1;
    notify();
    const entry = { kind: 'client-metadata', url: clientId, status: 0, ok: false };
    const done = (reason, document) => {
      if (reason) entry.reason = reason;
      else entry.ok = true;
      authRecord(entry);
      return reason ? { reason } : { document };
    };
    let body;
    try {
      const signal = AbortSignal.any([AbortSignal.timeout(CLIENT_METADATA_TIMEOUT_MS), closing.signal]);
      // Redirects are not followed: a 3xx is not the document.
      const response = await fetch(clientId, { headers: { accept: 'application/json' }, redirect: 'manual', signal });
      entry.status = response.status;
      body = await response.text();
      if (response.status !== 200) return done(`HTTP ${response.status}, not 200`);
    } catch (error) {
      entry.status = 0; // failed, the body's reading included
      const timedOut = error?.name === 'TimeoutError';
      return done(timedOut ? `no answer within ${CLIENT_METADATA_TIMEOUT_MS / 1000} s` : `the fetch failed (${error?.cause?.message ?? error?.message ?? error})`);
    }
    let document;
    try {
      document = JSON.parse(body);
    } catch {
      return done('the body is not JSON');
    }
    if (!document || typeof document !== 'object' || Array.isArray(document)) return done('the body is not a JSON object');
    if (document.client_id !== clientId) return done(`its client_id is ${JSON.stringify(document.client_id)}, not the document's URL`);
    if (!Array.isArray(document.redirect_uris)) return done(`redirect_uris is not an array: ${JSON.stringify(document.redirect_uris)}`);
    if (!document.redirect_uris.includes(redirectUri)) return done(`its redirect_uris do not include ${redirectUri ?? '(none)'}`);
    const method = document.token_endpoint_auth_method;
    if (method !== undefined && method !== 'none') return done(`token_endpoint_auth_method must be "none" (a public client), not ${JSON.stringify(method)}`);
    oauth.documents.set(clientId, structuredClone(document));
    return done(null, document);
  };

  /** GET O/client-metadata.json: setClientMetadata's document (404 while null). Not logged: the fetches of it are. */
  const serveClientMetadata = async (req, res) => {
    if (req.method === 'OPTIONS') {
      res.writeHead(204, { ...CORS, 'Access-Control-Allow-Methods': 'GET', 'Access-Control-Max-Age': '600' });
      return res.end();
    }
    await readBody(req);
    if (req.method !== 'GET') return oauthJson(res, 405, { error: 'invalid_request', error_description: `${CLIENT_METADATA_PATH} takes GET, not ${req.method}.` }, { Allow: 'GET, OPTIONS' });
    if (clientMetadata === null) return oauthJson(res, 404, { error: 'not_found', error_description: 'No client metadata document is set (setClientMetadata).' });
    return oauthJson(res, 200, clientMetadata);
  };

  const revokeGrant = (grant) => {
    for (const token of oauth.access.values()) if (token.grant === grant) token.revoked = true;
    for (const token of oauth.refresh.values()) if (token.grant === grant) token.revoked = true;
  };

  async function handleOAuth(req, res, url) {
    const route = OAUTH_ROUTES[url.pathname];
    if (req.method === 'OPTIONS') {
      res.writeHead(204, {
        ...CORS,
        'Access-Control-Allow-Methods': 'GET, POST',
        'Access-Control-Allow-Headers': 'content-type, authorization, mcp-protocol-version',
        'Access-Control-Max-Age': '600',
      });
      return res.end();
    }
    if (route.kind === 'token' && req.method === 'POST') {
      // Counted (and waitFor told) on arrival, before the hold, so a test
      // can act while a renewal is in flight.
      tokenRequests += 1;
      notify();
      if (tokenDelayMs > 0) {
        await sleep(tokenDelayMs, closing.signal).catch(() => {});
        if (closing.signal.aborted) return res.destroy();
      }
    }
    const entry = { kind: route.kind, method: req.method, path: url.pathname, status: 0, params: Object.fromEntries(url.searchParams), headers: { ...req.headers } };
    const fail = (status, error, description, extraHeaders) => {
      entry.status = status;
      entry.error = error;
      entry.errorDescription = description;
      authRecord(entry);
      return oauthJson(res, status, { error, error_description: description }, extraHeaders);
    };
    if (route.kind === 'register' && !authConfig.registration) {
      // No dynamic client registration (auth.registration false): no such endpoint, whatever the method.
      const raw = await readBody(req);
      if (req.method === 'POST') {
        try {
          entry.params = JSON.parse(raw);
        } catch {
          entry.params = raw;
        }
      }
      return fail(404, 'invalid_request', 'This authorization server offers no dynamic client registration (auth.registration is false).');
    }
    if (req.method !== route.method) {
      await readBody(req);
      return fail(405, 'invalid_request', `${url.pathname} takes ${route.method}, not ${req.method}.`, { Allow: `${route.method}, OPTIONS` });
    }
    const scopes = authConfig.scopes;

    if (route.kind === 'metadata') {
      entry.status = 200;
      authRecord(entry);
      // The document at the origin's root describes the origin (RFC 9728 §3.3).
      const resource = url.pathname === METADATA_AT_ROOT ? origin : mcpUrl();
      return oauthJson(res, 200, { resource, authorization_servers: [origin], scopes_supported: scopes, bearer_methods_supported: ['header'] });
    }

    if (route.kind === 'as-metadata') {
      entry.status = 200;
      authRecord(entry);
      return oauthJson(res, 200, {
        issuer: origin,
        authorization_endpoint: `${origin}/authorize`,
        token_endpoint: `${origin}/token`,
        ...(authConfig.registration ? { registration_endpoint: `${origin}/register` } : {}),
        response_types_supported: ['code'],
        grant_types_supported: ['authorization_code', 'refresh_token'],
        code_challenge_methods_supported: ['S256'],
        token_endpoint_auth_methods_supported: ['none'],
        scopes_supported: scopes,
        ...(authConfig.issParameter ? { authorization_response_iss_parameter_supported: true } : {}),
        ...(authConfig.clientMetadataDocuments ? { client_id_metadata_document_supported: true } : {}),
      });
    }

    if (route.kind === 'register') {
      const raw = await readBody(req);
      let body;
      try {
        body = JSON.parse(raw);
      } catch {
        entry.params = raw;
        return fail(400, 'invalid_client_metadata', 'The body is not JSON.');
      }
      entry.params = body;
      if (!String(entry.headers['content-type'] ?? '').startsWith('application/json')) {
        return fail(400, 'invalid_client_metadata', 'Content-Type must be application/json.');
      }
      if (!body || typeof body !== 'object' || Array.isArray(body)) return fail(400, 'invalid_client_metadata', 'The body is not a JSON object.');
      const uris = body.redirect_uris;
      if (!Array.isArray(uris) || uris.length === 0) return fail(400, 'invalid_redirect_uri', 'redirect_uris must be a non-empty array.');
      for (const uri of uris) {
        const problem = redirectUriProblem(uri);
        if (problem) return fail(400, 'invalid_redirect_uri', `${JSON.stringify(uri)} ${problem}.`);
      }
      const method = body.token_endpoint_auth_method;
      if (method !== undefined && method !== 'none') {
        return fail(400, 'invalid_client_metadata', `token_endpoint_auth_method must be "none" (a public client), not ${JSON.stringify(method)}.`);
      }
      const grantTypes = body.grant_types ?? ['authorization_code', 'refresh_token'];
      if (!Array.isArray(grantTypes) || grantTypes.some((g) => !['authorization_code', 'refresh_token'].includes(g))) {
        return fail(400, 'invalid_client_metadata', 'grant_types may only hold authorization_code and refresh_token.');
      }
      const responseTypes = body.response_types ?? ['code'];
      if (!Array.isArray(responseTypes) || responseTypes.some((r) => r !== 'code')) {
        return fail(400, 'invalid_client_metadata', 'response_types may only hold code.');
      }
      if (body.client_name !== undefined && typeof body.client_name !== 'string') {
        return fail(400, 'invalid_client_metadata', 'client_name must be a string.');
      }
      clientCounter += 1;
      const client = {
        client_id: `client-${clientCounter}`,
        client_id_issued_at: Math.floor(Date.now() / 1000),
        redirect_uris: uris.slice(),
        grant_types: grantTypes.slice(),
        response_types: responseTypes.slice(),
        token_endpoint_auth_method: 'none',
        ...(body.client_name !== undefined ? { client_name: body.client_name } : {}),
        ...(typeof body.scope === 'string' ? { scope: body.scope } : {}),
      };
      oauth.clients.set(client.client_id, client);
      entry.status = 201;
      entry.clientId = client.client_id;
      authRecord(entry);
      return oauthJson(res, 201, client);
    }

    if (route.kind === 'authorize') {
      const q = url.searchParams;
      const refuse = (description) => {
        entry.status = 400;
        entry.error = 'invalid_request';
        entry.errorDescription = description;
        authRecord(entry);
        return oauthHtml(res, 400, 'mock-mcp: bad authorization request', `<p id="error">${escapeHtml(description)}</p>`);
      };
      const clientId = q.get('client_id');
      const redirectUri = q.get('redirect_uri');
      let client = tableClient(clientId);
      if (!client && authConfig.clientMetadataDocuments && isHttpUrl(clientId)) {
        // A Client ID Metadata Document: fetched at every authorization request.
        const unfit = clientMetadataUrlProblem(clientId);
        if (unfit) return refuse(`client_id ${clientId} cannot be a Client ID Metadata Document URL: ${unfit}.`);
        const fetched = await fetchClientMetadata(clientId, redirectUri);
        if (fetched.reason) return refuse(`The Client ID Metadata Document at ${clientId} is refused: ${fetched.reason}.`);
        client = fetched.document;
      }
      if (!client) return refuse(`Unknown client_id: ${clientId ?? '(none)'}.`);
      if (!redirectUri || !client.redirect_uris.includes(redirectUri)) {
        return refuse(`redirect_uri ${redirectUri ?? '(none)'} is not registered for ${client.client_id}.`);
      }
      const state = q.get('state') ?? undefined;
      const problem = (() => {
        const repeated = [...new Set([...q.keys()])].find((name) => q.getAll(name).length > 1);
        if (repeated) return `${repeated} is given more than once.`;
        if (q.get('response_type') !== 'code') return `response_type must be code, not ${q.get('response_type') ?? '(none)'}.`;
        if (q.get('code_challenge_method') !== 'S256') return `code_challenge_method must be S256, not ${q.get('code_challenge_method') ?? '(none)'}.`;
        if (!q.get('code_challenge')) return 'code_challenge is missing.';
        if (!/^[A-Za-z0-9_-]{43}$/.test(q.get('code_challenge'))) return 'code_challenge is not an S256 challenge (43 base64url characters).';
        if (q.get('resource') !== mcpUrl()) return `resource must be ${mcpUrl()}, not ${q.get('resource') ?? '(none)'}.`;
        const asked = (q.get('scope') ?? '').split(' ').filter(Boolean);
        const unknown = asked.find((s) => !scopes.includes(s));
        if (unknown) return `Unknown scope: ${unknown}.`;
        return null;
      })();
      if (problem) {
        entry.error = 'invalid_request';
        entry.errorDescription = problem;
        return redirectTo(res, entry, redirectUri, { error: 'invalid_request', error_description: problem, state });
      }
      const asked = (q.get('scope') ?? '').split(' ').filter(Boolean);
      requestCounter += 1;
      const request = {
        id: `request-${requestCounter}`,
        clientId: client.client_id,
        redirectUri,
        challenge: q.get('code_challenge'),
        resource: q.get('resource'),
        scope: (asked.length ? asked : scopes).join(' '),
        state,
      };
      entry.request = request.id;
      if (autoApprove) {
        entry.approved = 'auto';
        return redirectTo(res, entry, redirectUri, { code: issueCode(request), state });
      }
      oauth.pending.set(request.id, request);
      entry.status = 200;
      authRecord(entry);
      const decide = (allow) => `/authorize/decide?request=${encodeURIComponent(request.id)}&allow=${allow}`;
      const button = (id, allow, label) => [
        `<form method="get" action="/authorize/decide">`,
        `<input type="hidden" name="request" value="${escapeHtml(request.id)}">`,
        `<input type="hidden" name="allow" value="${allow}">`,
        `<button id="${id}" type="submit" data-href="${escapeHtml(decide(allow))}">${label}</button>`,
        `</form>`,
      ].join('');
      return oauthHtml(res, 200, 'Sign in to mock-mcp', [
        `<p><strong id="client-name">${escapeHtml(typeof client.client_name === 'string' ? client.client_name : client.client_id)}</strong> asks to use mock-mcp on your behalf (scope: <code id="scope">${escapeHtml(request.scope)}</code>).</p>`,
        button('allow', 1, 'Allow'),
        button('deny', 0, 'Deny'),
      ].join('\n'));
    }

    if (route.kind === 'decide') {
      const q = url.searchParams;
      const request = oauth.pending.get(q.get('request'));
      const allow = q.get('allow');
      entry.request = q.get('request');
      if (!request || (allow !== '1' && allow !== '0')) {
        const description = request ? `allow must be 1 or 0, not ${allow ?? '(none)'}.` : `Unknown or already decided request: ${q.get('request') ?? '(none)'}.`;
        entry.status = 400;
        entry.error = 'invalid_request';
        entry.errorDescription = description;
        authRecord(entry);
        return oauthHtml(res, 400, 'mock-mcp: bad decision', `<p id="error">${escapeHtml(description)}</p>`);
      }
      oauth.pending.delete(request.id);
      entry.allow = allow === '1';
      if (!entry.allow) {
        entry.error = 'access_denied';
        return redirectTo(res, entry, request.redirectUri, { error: 'access_denied', state: request.state });
      }
      return redirectTo(res, entry, request.redirectUri, { code: issueCode(request), state: request.state });
    }

    // route.kind === 'token'
    const raw = await readBody(req);
    const form = new URLSearchParams(raw);
    entry.params = Object.fromEntries(form);
    if (!String(entry.headers['content-type'] ?? '').startsWith('application/x-www-form-urlencoded')) {
      return fail(400, 'invalid_request', 'Content-Type must be application/x-www-form-urlencoded.');
    }
    const repeated = [...new Set([...form.keys()])].find((name) => form.getAll(name).length > 1);
    if (repeated) return fail(400, 'invalid_request', `${repeated} is given more than once.`);
    const grantType = form.get('grant_type');
    entry.grantType = grantType;
    if (!grantType) return fail(400, 'invalid_request', 'grant_type is missing.');
    if (grantType !== 'authorization_code' && grantType !== 'refresh_token') {
      return fail(400, 'unsupported_grant_type', `Unsupported grant_type: ${grantType}.`);
    }
    const clientId = form.get('client_id');
    if (!clientId) return fail(400, 'invalid_request', 'client_id is missing.');
    if (!tokenClientKnown(clientId)) return fail(400, 'invalid_client', `Unknown client_id: ${clientId}.`);
    const issued = (grant) => {
      const body = issueTokens(grant, grantType);
      entry.status = 200;
      entry.issued = { accessToken: body.access_token, refreshToken: body.refresh_token };
      authRecord(entry);
      return oauthJson(res, 200, body);
    };

    if (grantType === 'authorization_code') {
      for (const name of ['code', 'redirect_uri', 'code_verifier', 'resource']) {
        if (!form.get(name)) return fail(400, 'invalid_request', `${name} is missing.`);
      }
      const code = oauth.codes.get(form.get('code'));
      if (!code) return fail(400, 'invalid_grant', 'Unknown authorization code.');
      if (code.revoked) return fail(400, 'invalid_grant', 'The authorization code was revoked.');
      if (code.used) {
        // OAuth 2.1: a code used twice also revokes what it was exchanged for.
        revokeGrant(code.grant);
        return fail(400, 'invalid_grant', 'The authorization code was already used; the tokens issued for it are revoked.');
      }
      if (Date.now() >= code.expiresAt) return fail(400, 'invalid_grant', 'The authorization code expired.');
      if (code.clientId !== clientId) return fail(400, 'invalid_grant', 'The authorization code was issued to another client.');
      if (code.redirectUri !== form.get('redirect_uri')) return fail(400, 'invalid_grant', 'redirect_uri differs from the authorization request\'s.');
      if (code.resource !== form.get('resource')) return fail(400, 'invalid_grant', 'resource differs from the authorization request\'s.');
      const verifier = form.get('code_verifier');
      if (!/^[A-Za-z0-9._~-]{43,128}$/.test(verifier)) return fail(400, 'invalid_grant', 'code_verifier is not 43 to 128 characters of [A-Za-z0-9-._~].');
      if (pkceChallenge(verifier) !== code.challenge) return fail(400, 'invalid_grant', 'PKCE verification failed: the code_verifier does not match the code_challenge.');
      code.used = true;
      return issued(code);
    }

    // grant_type=refresh_token
    const refreshToken = form.get('refresh_token');
    if (!refreshToken) return fail(400, 'invalid_request', 'refresh_token is missing.');
    const refresh = oauth.refresh.get(refreshToken);
    if (!refresh) return fail(400, 'invalid_grant', 'Unknown refresh token.');
    if (refresh.revoked) return fail(400, 'invalid_grant', 'The refresh token was revoked (rotated or withdrawn).');
    if (refresh.clientId !== clientId) return fail(400, 'invalid_grant', 'The refresh token was issued to another client.');
    if (form.get('resource') && form.get('resource') !== refresh.resource) return fail(400, 'invalid_grant', `resource must be ${refresh.resource}.`);
    let scope = refresh.scope;
    if (form.get('scope')) {
      const asked = form.get('scope').split(' ').filter(Boolean);
      const granted = refresh.scope.split(' ');
      const extra = asked.find((s) => !granted.includes(s));
      if (extra) return fail(400, 'invalid_scope', `The grant does not cover scope ${extra}.`);
      scope = asked.join(' ');
    }
    refresh.revoked = true; // rotation
    return issued({ ...refresh, scope });
  }

  async function handle(req, res) {
    const url = new URL(req.url, `http://${HOST}`);
    if (authConfig && servesOAuth(url.pathname)) return handleOAuth(req, res, url);
    if (authConfig && url.pathname === CLIENT_METADATA_PATH) return serveClientMetadata(req, res);
    const headers = { ...req.headers };
    const entry = { kind: 'rejected', headers, status: 0, session: headers['mcp-session-id'] ?? null };
    if (req.method === 'GET') entry.method = 'GET';
    if (url.pathname !== '/mcp') {
      entry.path = url.pathname;
      return reject(res, entry, 404, `No MCP endpoint at ${url.pathname}.`);
    }
    if (down !== null) return reject(res, entry, down, 'The server is down for maintenance.', -32000);
    if (authConfig && ['POST', 'GET', 'DELETE'].includes(req.method)) {
      const problem = bearerProblem(headers.authorization);
      if (problem) return unauthorized(req, res, entry, problem);
    }
    if (req.method === 'GET' && forcedResumptions && headers['last-event-id'] !== undefined) {
      // failNextResumptions: refused before anything else of it (resumable
      // or not, any session, any id).
      const { status } = forcedResumptions;
      forcedResumptions.left -= 1;
      if (forcedResumptions.left === 0) forcedResumptions = null;
      entry.lastEventId = headers['last-event-id'];
      entry.forced = true;
      return reject(res, entry, status, forcedMessage(status), -32000);
    }
    if (req.method === 'GET') {
      // Last-Event-ID asks for the rest of an answer stream or of a GET
      // stream (resumable only; else the header means nothing here and
      // this is a plain GET).
      const lastEventId = resumable ? headers['last-event-id'] : undefined;
      if (lastEventId !== undefined) entry.lastEventId = lastEventId;
      // No server-initiated stream: allowed by the transport. Resuming
      // needs none: the stream resumed is a POST's (there are no GET
      // streams to resume).
      if (!listChanged && lastEventId === undefined) return reject(res, entry, 405, 'This server offers no event stream at GET.');
      if (!String(headers.accept ?? '').includes('text/event-stream')) {
        return reject(res, entry, 406, 'Accept must list text/event-stream.');
      }
      if (!entry.session) return reject(res, entry, 400, 'Bad Request: no Mcp-Session-Id.');
      const session = sessions.get(entry.session);
      if (!session) return reject(res, entry, 404, 'Session not found.', -32001);
      const problem = versionProblem(session, headers);
      if (problem) return reject(res, entry, 400, problem);
      if (lastEventId !== undefined && lastEventId.startsWith('get-')) return resumeGetStream(res, entry, lastEventId);
      if (lastEventId !== undefined) return resumeAnswerStream(res, entry, lastEventId);
      return openStream(res, entry);
    }
    if (req.method === 'DELETE') {
      sessions.delete(entry.session);
      endStreams((conn) => conn.entry.session === entry.session);
      forgetGetStreams((gs) => gs.session === entry.session);
      forgetAnswerStreams((stream) => stream.session === entry.session);
      entry.kind = 'delete';
      entry.status = 200;
      record(entry);
      res.writeHead(200);
      return res.end();
    }
    if (req.method !== 'POST') return reject(res, entry, 405, `${req.method} is not supported.`);
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const accept = String(headers.accept ?? '');
    if (!accept.includes('application/json') || !accept.includes('text/event-stream')) {
      return reject(res, entry, 406, 'Accept must list application/json and text/event-stream.');
    }
    if (!String(headers['content-type'] ?? '').startsWith('application/json')) {
      return reject(res, entry, 415, 'Content-Type must be application/json.');
    }
    let message;
    try {
      message = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      return reject(res, entry, 400, 'The body is not JSON.', -32700);
    }
    if (Array.isArray(message) || message?.jsonrpc !== '2.0') {
      return reject(res, entry, 400, 'One JSON-RPC 2.0 message per POST.');
    }
    entry.method = message.method;
    entry.id = message.id;
    entry.params = message.params;

    if (message.method === 'initialize') {
      entry.kind = 'request';
      const asked = message.params?.protocolVersion;
      const version = versions.includes(asked) ? asked : versions[0];
      sessionCounter += 1;
      const id = `session-${sessionCounter}-${Math.random().toString(36).slice(2)}`;
      const capabilities = message.params?.capabilities;
      sessions.set(id, { version, initialized: false, capabilities: capabilities && typeof capabilities === 'object' ? capabilities : {} });
      entry.status = 200;
      entry.session = id;
      entry.agreed = version;
      record(entry);
      res.writeHead(200, { 'Content-Type': 'application/json', 'Mcp-Session-Id': id });
      return res.end(JSON.stringify({
        jsonrpc: '2.0',
        id: message.id,
        result: {
          protocolVersion: version,
          capabilities: { tools: { listChanged } },
          serverInfo: { name: 'mock-mcp', version: '1.0.0' },
          instructions: 'Search before opening tickets.',
        },
      }));
    }

    const session = sessions.get(entry.session);
    if (!entry.session) return reject(res, entry, 400, 'Bad Request: no Mcp-Session-Id.');
    if (!session) return reject(res, entry, 404, 'Session not found.', -32001);
    const problem = versionProblem(session, headers);
    if (problem) return reject(res, entry, 400, problem);

    // A response to a request of ours, or a notification: 202, no body.
    if (message.method === undefined) {
      entry.kind = 'response';
      entry.result = message.result;
      entry.error = message.error;
      entry.status = 202;
      const asked = elicitationsAsked.get(message.id);
      if (asked || String(message.id).startsWith('elicit-')) {
        entry.kind = 'elicitation-response';
        entry.action = message.result?.action;
        entry.content = message.result?.content;
        entry.requestSession = asked?.session ?? null;
        entry.late = !askedByServer.has(message.id);
        if (asked) asked.answered = true;
      }
      record(entry);
      askedByServer.get(message.id)?.(message);
      askedByServer.delete(message.id);
      res.writeHead(202);
      return res.end();
    }
    if (message.id === undefined) {
      entry.kind = 'notification';
      entry.status = 202;
      if (message.method === 'notifications/initialized') session.initialized = true;
      if (message.method === 'notifications/cancelled') {
        running.get(`${entry.session} ${message.params?.requestId}`)?.abort(new Error('cancelled'));
      }
      record(entry);
      res.writeHead(202);
      return res.end();
    }

    entry.kind = 'request';
    if (message.method === 'ping') {
      // Allowed before notifications/initialized too.
      entry.status = 200;
      record(entry);
      return answerJson(res, { jsonrpc: '2.0', id: message.id, result: {} });
    }
    if (!session.initialized) return reject(res, entry, 400, 'The session is not initialized yet.');
    if (message.method === 'tools/list') {
      const start = message.params?.cursor === undefined ? 0 : Number(String(message.params.cursor).replace(/^page-/, ''));
      if (!Number.isInteger(start) || start < 0 || start > tools.length) {
        entry.status = 200;
        record(entry);
        return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32602, message: 'Invalid cursor.' } });
      }
      const page = tools.slice(start, start + pageSize).map(({ run, answer, ...tool }) => tool);
      const next = start + pageSize < tools.length ? `page-${start + pageSize}` : undefined;
      entry.status = 200;
      record(entry);
      return answerJson(res, { jsonrpc: '2.0', id: message.id, result: { tools: page, ...(next ? { nextCursor: next } : {}) } });
    }
    if (message.method === 'tools/call') {
      // Step-up: a scoped tool is refused before it is looked up or run.
      const lacking = authConfig && missingScope(headers.authorization, message.params?.name);
      if (lacking) return insufficientScope(res, entry, lacking);
      const tool = tools.find((t) => t.name === message.params?.name);
      entry.status = 200;
      entry.tool = message.params?.name;
      entry.arguments = message.params?.arguments;
      entry.progressToken = message.params?._meta?.progressToken;
      record(entry);
      if (!tool) {
        return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32602, message: `Unknown tool: ${message.params?.name}` } });
      }
      return callTool(req, res, entry, message, tool);
    }
    entry.status = 200;
    record(entry);
    return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `Method not found: ${message.method}` } });
  }

  // A GET event stream: open until the client closes it or the server ends
  // it (closeStreams, breakStreams, expireSessions, DELETE, reset, close);
  // resumable, then detached and kept for a GET with Last-Event-ID until
  // its session ends.
  function openStream(res, entry) {
    streamCounter += 1;
    entry.kind = 'stream';
    entry.status = 200;
    entry.stream = streamCounter;
    entry.closed = false;
    const gs = {
      id: `get-${streamCounter}`,
      number: streamCounter,
      session: entry.session,
      headers: entry.headers, // of its latest connection's GET
      count: 0, // events numbered so far (written or kept)
      kept: [], // resumable: the text of its last GET_STREAM_KEPT_EVENTS events, as first written
      conn: null, // the open connection it is on (null: detached)
      resumes: 0, // resumptions answered 200
    };
    getStreams.set(gs.id, gs);
    const conn = attachConnection(gs, res, entry);
    res.writeHead(200, SSE_HEADERS);
    res.write(': open\n\n');
    record(entry);
    primeAndPoll(conn);
  }

  /**
   * GET with `Last-Event-ID: get-<k>:<n>` (resumable), after the GET's
   * session checks: the kept events of that GET stream after n, as first
   * written, then the stream goes on live on this connection (numbering
   * continued) until it ends again. Refused with 400, never 404.
   */
  function resumeGetStream(res, entry, lastEventId) {
    entry.kind = 'resume';
    entry.stream = null;
    entry.replayed = 0;
    const refuse = (why) => reject(res, entry, 400, `Unknown Last-Event-ID: ${lastEventId} (${why}).`);
    const [, streamId, at] = /^(get-\d+):(\d+)$/.exec(lastEventId) ?? [];
    const gs = getStreams.get(streamId);
    if (!gs || gs.session !== entry.session) return refuse('no such GET stream kept in this session');
    const after = Number(at);
    if (after > gs.count) return refuse(`the stream has ${gs.count} events`);
    const dropped = gs.count - gs.kept.length; // events 1..dropped are no longer kept
    if (after < dropped) return refuse(`too old: the stream keeps its last ${GET_STREAM_KEPT_EVENTS} events, from ${gs.id}:${dropped + 1}`);
    // A message goes out on one stream only: the connection the stream is
    // still on (its plain GET, or an earlier resumption) ends.
    if (gs.conn) endConnection(gs.conn, 'end');
    const replay = gs.kept.slice(after - dropped);
    gs.resumes += 1;
    entry.stream = gs.id;
    entry.replayed = replay.length;
    entry.status = 200;
    entry.closed = false;
    const conn = attachConnection(gs, res, entry);
    res.writeHead(200, SSE_HEADERS);
    if (replay.length) res.write(replay.join(''));
    else res.flushHeaders(); // the client's GET resolves now, not at the next event
    record(entry);
    primeAndPoll(conn);
  }

  function answerJson(res, body) {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(body));
  }

  // --- Answer streams (a tools/call answered as an event stream) ---
  //
  // Each has a `sink`, the connection its events go to: the POST's
  // response, after a cut none, after a resumption the resuming GET's.
  // `detached` once it left its POST (cut or taken over): the call then
  // runs on whatever becomes of connections, its events kept (resumable)
  // for a GET with Last-Event-ID.

  /** The answer stream of a tools/call (`res` its POST's response): headers written, numbered, kept when resumable. */
  function openAnswerStream(res, entry, message) {
    answerStreamCounter += 1;
    const stream = {
      id: `post-${answerStreamCounter}`,
      session: entry.session,
      callId: message.id,
      headers: entry.headers,
      count: 0, // events written (to a connection or, resumable, to `events`)
      events: [], // resumable: the text of each event, for replays
      sink: res,
      sinkEntry: null, // the `resume` log entry of a resuming GET that is the sink
      detached: false,
      answered: false, // its JSON-RPC response written (on a connection or kept)
      dropped: false, // forgotten (reset, the session's end): later events go nowhere
      cut: pendingCut, // cutNextCallStream's { afterEvents, close }, until it happened
    };
    pendingCut = null;
    if (resumable) answerStreams.set(stream.id, stream);
    res.writeHead(200, SSE_HEADERS);
    if (stream.cut?.afterEvents === 0) cutAnswerStream(stream);
    return stream;
  }

  /** The stream's connection if it can still be written to (null: none). */
  const liveSink = (stream) => {
    const { sink } = stream;
    return sink && !sink.writableEnded && !sink.destroyed ? sink : null;
  };

  /**
   * Writes the stream's next event on its connection and, resumable, keeps
   * it: `id: <stream>:<n>`, and `retry:` on the first. False when it went
   * nowhere (no connection and nothing kept, or the stream is over).
   */
  const writeAnswerEvent = (stream, payload) => {
    if (stream.answered || stream.dropped) return false;
    const sink = liveSink(stream);
    if (!sink && !resumable) return false;
    stream.count += 1;
    const text = sseEvent(payload, resumable ? { id: `${stream.id}:${stream.count}`, retry: stream.count === 1 ? resumeRetryMs : null } : {});
    if (resumable) stream.events.push(text);
    if (sink) sink.write(text);
    return true;
  };

  /** A notification or request of the server's on the stream; the cut comes right after the event it waits for. */
  const sendOnAnswerStream = (stream, payload) => {
    const went = writeAnswerEvent(stream, payload);
    if (went && stream.cut && !stream.detached && stream.count >= stream.cut.afterEvents) cutAnswerStream(stream);
    return went;
  };

  /**
   * The call's response, the stream's last event. A cut still waiting for
   * its events happens first: a cut stream never carries its response. On
   * a live connection the response is delivered, the connection ends and
   * the stream is dropped; with none, resumable keeps it for a GET.
   */
  const answerOnStream = (stream, body) => {
    if (stream.cut && !stream.detached) cutAnswerStream(stream);
    writeAnswerEvent(stream, body);
    stream.answered = true;
    const sink = liveSink(stream);
    if (!sink) {
      if (!resumable) answerStreams.delete(stream.id);
      return;
    }
    const entry = stream.sinkEntry;
    stream.sink = null;
    stream.sinkEntry = null;
    if (entry) {
      entry.delivered = true;
      markClosed(entry, 'server');
    }
    sink.end();
    answerStreams.delete(stream.id);
  };

  /**
   * The stream leaves its connection (a cut, or a resumption taking over):
   * `how` 'end' ends it cleanly, 'destroy' destroys its socket, once what
   * was written went out (destroy() at once would drop what Node still
   * buffers: a response's writes are corked until the next tick, and an
   * empty write's callback comes after them).
   */
  const detachSink = (stream, how) => {
    const { sink, sinkEntry } = stream;
    stream.detached = true;
    stream.sink = null;
    stream.sinkEntry = null;
    if (sinkEntry) markClosed(sinkEntry, 'server');
    if (!sink || sink.destroyed || sink.writableEnded) return;
    if (how === 'destroy') sink.write('', () => sink.destroy());
    else sink.end();
  };

  /** cutNextCallStream's cut: the POST's connection ends without the response; the call runs on. */
  const cutAnswerStream = (stream) => {
    const { afterEvents, close } = stream.cut;
    stream.cut = null;
    detachSink(stream, close ? 'end' : 'destroy');
    record({
      kind: 'cut',
      stream: stream.id,
      method: 'tools/call',
      id: stream.callId,
      afterEvents,
      written: stream.count,
      how: close ? 'close' : 'destroy',
      session: stream.session,
      headers: stream.headers,
    });
  };

  /**
   * Forgets the kept answer streams `which` picks (reset, a session
   * deleted or expired): a resuming GET of theirs ends (`how`), their later
   * events go nowhere. One still on its POST answers there as it would
   * without resumable; it only can no longer be resumed.
   */
  const forgetAnswerStreams = (which = () => true, how = 'end') => {
    for (const stream of [...answerStreams.values()]) {
      if (!which(stream)) continue;
      answerStreams.delete(stream.id);
      if (!stream.detached) continue;
      stream.dropped = true;
      const { sink, sinkEntry } = stream;
      stream.sink = null;
      stream.sinkEntry = null;
      if (sinkEntry) markClosed(sinkEntry, 'server');
      if (sink && how === 'destroy') sink.destroy();
      else sink?.end();
    }
  };

  /**
   * GET with Last-Event-ID (resumable), after the GET's session checks:
   * the kept events of that answer stream after the id, then its further
   * events as they happen, ending with its response. Refused with 400,
   * never 404: a client reads 404 as its session gone.
   */
  function resumeAnswerStream(res, entry, lastEventId) {
    entry.kind = 'resume';
    entry.stream = null;
    entry.replayed = 0;
    const [, streamId, at] = /^(.+):(\d+)$/.exec(lastEventId) ?? [];
    const stream = answerStreams.get(streamId);
    if (!stream || stream.session !== entry.session) {
      return reject(res, entry, 400, `Unknown Last-Event-ID: ${lastEventId} (no such answer stream kept in this session).`);
    }
    const after = Number(at);
    if (after > stream.count) {
      return reject(res, entry, 400, `Unknown Last-Event-ID: ${lastEventId} (the stream has ${stream.count} events).`);
    }
    // A message goes out on one stream only: the connection the stream
    // was on (its POST still open, or an earlier resuming GET) ends.
    detachSink(stream, 'end');
    const replay = stream.events.slice(after);
    entry.stream = stream.id;
    entry.callId = stream.callId;
    entry.replayed = replay.length;
    entry.status = 200;
    entry.closed = false;
    entry.delivered = false;
    res.writeHead(200, SSE_HEADERS);
    if (replay.length) res.write(replay.join(''));
    else res.flushHeaders(); // the client's GET resolves now, not at the next event
    record(entry);
    if (stream.answered) {
      // Everything was kept, the response included: delivered now.
      entry.delivered = true;
      markClosed(entry, 'server');
      res.end();
      answerStreams.delete(stream.id);
      return;
    }
    stream.sink = res;
    stream.sinkEntry = entry;
    res.on('close', () => {
      if (stream.sink !== res) return;
      stream.sink = null;
      stream.sinkEntry = null;
      markClosed(entry, 'client');
    });
  }

  async function callTool(req, res, entry, message, tool) {
    const mode = tool.answer ?? defaultAnswer;
    const controller = new AbortController();
    const key = `${entry.session} ${message.id}`;
    running.set(key, controller);
    let stream = null; // the answer stream ('sse'), opened before the tool runs
    let closed = false;
    res.on('close', () => {
      // Cut, or taken over by a resumption: the call runs on, unattached.
      if (stream?.detached) return notify();
      closed = true;
      if (!res.writableFinished) {
        entry.outcome ??= 'disconnected';
        controller.abort(new Error('disconnected'));
        if (stream) answerStreams.delete(stream.id); // nothing to resume: the call stops
      }
      notify();
    });
    const send = (payload) => {
      if (closed || mode !== 'sse') return false;
      return sendOnAnswerStream(stream, payload);
    };
    /** Where ctx.notify's event went, for its `sent` entry (resumable only). */
    const eventTrace = () => (resumable ? { eventId: `${stream.id}:${stream.count}`, ...(liveSink(stream) ? {} : { kept: true }) } : {});
    const ctx = {
      signal: controller.signal,
      sleep: (ms) => sleep(ms, controller.signal),
      progress: (progress, total, text) => {
        const token = message.params?._meta?.progressToken;
        if (token === undefined) return;
        send({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: token, progress, ...(total !== undefined ? { total } : {}), ...(text ? { message: text } : {}) } });
      },
      notify: (method, params) => {
        const withParams = params !== undefined ? { params } : {};
        if (!send({ jsonrpc: '2.0', method, ...withParams })) return false;
        record({ kind: 'sent', method, ...withParams, session: entry.session, callId: message.id, ...eventTrace(), headers: entry.headers });
        return true;
      },
      ask: (method, params) => {
        serverRequestCounter += 1;
        return askClient(`srv-${serverRequestCounter}`, method, params);
      },
      clientCapabilities: sessions.get(entry.session)?.capabilities ?? {},
      canElicit: Boolean(sessions.get(entry.session)?.capabilities?.elicitation),
      elicit: (text, requestedSchema) => {
        elicitationCounter += 1;
        const id = `elicit-${elicitationCounter}`;
        const params = { message: text, requestedSchema };
        const asked = {
          kind: 'elicitation',
          method: 'elicitation/create',
          id,
          params,
          callId: message.id,
          tool: entry.tool,
          headers: entry.headers,
          session: entry.session,
          status: 200,
          answered: false,
        };
        elicitationsAsked.set(id, asked);
        return askClient(id, 'elicitation/create', params, () => record(asked));
      },
    };
    // Sends a request of the server's on this call's stream and waits for
    // the client's answer (a POST of its own); stops waiting when the call
    // is cancelled or its stream closes.
    function askClient(id, method, params, onSent = () => {}) {
      return new Promise((resolve, rejectAsk) => {
        const stop = () => {
          askedByServer.delete(id);
          rejectAsk(controller.signal.reason ?? new Error('cancelled'));
        };
        if (controller.signal.aborted) return stop();
        controller.signal.addEventListener('abort', stop, { once: true });
        askedByServer.set(id, (answer) => {
          controller.signal.removeEventListener('abort', stop);
          resolve(answer);
        });
        if (!send({ jsonrpc: '2.0', id, method, params })) {
          askedByServer.delete(id);
          controller.signal.removeEventListener('abort', stop);
          resolve({ error: { code: 0, message: 'not sent: a JSON answer cannot carry requests' } });
          return;
        }
        onSent();
      });
    }
    if (mode === 'sse') stream = openAnswerStream(res, entry, message);
    let result;
    try {
      result = await tool.run(message.params?.arguments ?? {}, ctx);
    } catch (error) {
      running.delete(key);
      entry.outcome = controller.signal.aborted ? (entry.outcome ?? 'cancelled') : 'threw';
      notify();
      if (closed) return;
      const body = { jsonrpc: '2.0', id: message.id, error: { code: -32603, message: String(error?.message ?? error) } };
      if (mode === 'sse') return answerOnStream(stream, body);
      return answerJson(res, body);
    }
    running.delete(key);
    entry.outcome = closed ? 'disconnected' : 'answered';
    entry.result = result;
    notify();
    if (closed) return;
    const body = { jsonrpc: '2.0', id: message.id, result };
    if (mode === 'sse') return answerOnStream(stream, body);
    return answerJson(res, body);
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((error) => {
      if (!res.headersSent) res.writeHead(500, { 'Content-Type': 'text/plain' });
      res.end(String(error?.stack ?? error));
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, HOST, resolve);
  });
  const { port } = server.address();
  origin = `http://${HOST}:${port}`;

  return {
    url: `${origin}/mcp`,
    origin,
    state,
    /** The OAuth URLs (null without options.auth). */
    auth: authConfig && {
      issuer: origin,
      resourceMetadataUrl: resourceMetadataUrl(),
      authorizationServerMetadataUrl: `${origin}/.well-known/oauth-authorization-server`,
      authorizationEndpoint: `${origin}/authorize`,
      decideEndpoint: `${origin}/authorize/decide`,
      tokenEndpoint: `${origin}/token`,
      registrationEndpoint: authConfig.registration ? `${origin}/register` : null,
      clientMetadataUrl: `${origin}${CLIENT_METADATA_PATH}`,
      scopes: authConfig.scopes.slice(),
      accessTtlSeconds: authConfig.accessTtlSeconds,
      metadataAt: authConfig.metadataAt,
      challengeScope: authConfig.challengeScope,
      challengeMetadata: authConfig.challengeMetadata,
      scopedTools: { ...authConfig.scopedTools },
      issParameter: authConfig.issParameter,
      registration: authConfig.registration,
      clients: structuredClone(authConfig.clients),
      clientMetadataDocuments: authConfig.clientMetadataDocuments,
    },
    /** /authorize answers at once with a code (true) or shows the Allow/Deny page (false). */
    setAutoApprove(value) {
      autoApprove = Boolean(value);
    },
    /** The iss of the redirects back to the client: undefined the issuer (with issParameter), a string that one, null none. */
    setRedirectIss(value) {
      if (value !== undefined && value !== null && typeof value !== 'string') {
        throw new TypeError(`setRedirectIss wants undefined, null or a string, not ${JSON.stringify(value)}.`);
      }
      redirectIss = value;
    },
    /** POST /token requests are held `ms` milliseconds before they are handled (0: at once). */
    setTokenDelay(ms) {
      if (!Number.isFinite(ms) || ms < 0) throw new TypeError(`setTokenDelay wants a number of milliseconds >= 0, not ${JSON.stringify(ms)}.`);
      tokenDelayMs = ms;
    },
    /** How many POST /token requests have arrived (counted before the hold). */
    tokenRequestsReceived: () => tokenRequests,
    /** GET O/client-metadata.json answers `doc` as JSON (an object; null: 404). */
    setClientMetadata(doc) {
      if (doc !== null && (typeof doc !== 'object' || Array.isArray(doc))) {
        throw new TypeError(`setClientMetadata wants an object or null, not ${JSON.stringify(doc)}.`);
      }
      clientMetadata = doc === null ? null : structuredClone(doc);
    },
    /**
     * Pre-registers one more client, as auth.clients does (checked the same
     * way; kept across reset()): for a test that learns its redirect
     * address (an extension's id) only after the mock started.
     */
    addClient(client) {
      const problem = preRegisteredClientProblem(client, new Set([...preRegistered.keys()]));
      if (problem) throw new TypeError(`addClient: the client ${problem}.`);
      preRegistered.set(client.client_id, structuredClone(client));
    },
    /** How many Client ID Metadata Documents the authorization server has fetched. */
    clientMetadataFetches: () => clientMetadataFetchCount,
    /** Every access token issued so far stops working (401 invalid_token); refresh tokens still work. */
    expireAccessTokens() {
      const now = Date.now();
      for (const token of oauth.access.values()) token.expiresAt = Math.min(token.expiresAt, now);
    },
    /** Every access and refresh token (and unused code) stops working. */
    revokeGrants() {
      for (const token of oauth.access.values()) token.revoked = true;
      for (const token of oauth.refresh.values()) token.revoked = true;
      for (const code of oauth.codes.values()) code.revoked = true;
      oauth.pending.clear();
    },
    /** Every request to an OAuth endpoint, in order (see the header). */
    authLog: () => oauth.log.slice(),
    /** The registered clients, as /register answered. */
    clients: () => [...oauth.clients.values()].map((client) => structuredClone(client)),
    /** The access tokens issued, in order: { accessToken, refreshToken, clientId, scope, resource, grant, grantType, issuedAt, expiresAt, expired, revoked }. */
    tokens: () => [...oauth.access.values()].map((token) => ({ ...token, expired: tokenExpired(token) })),
    /** Every message received, in order (see the header). */
    log: () => log.slice(),
    /** The tools/call requests received: { tool, arguments, progressToken, outcome, session, headers }. */
    calls: () => log.filter((e) => e.kind === 'request' && e.method === 'tools/call'),
    /** The notifications/cancelled received. */
    cancellations: () => log.filter((e) => e.method === 'notifications/cancelled'),
    /** The client's answers to requests of the server's (elicitation answers too). */
    responses: () => log.filter((e) => e.kind === 'response' || e.kind === 'elicitation-response'),
    /** The `elicitation/create` requests sent on calls' streams, in order. */
    elicitations: () => log.filter((e) => e.kind === 'elicitation'),
    /** The client's answers to them: { id, action, content, headers, session, requestSession, late }. */
    elicitationResponses: () => log.filter((e) => e.kind === 'elicitation-response'),
    /** The GET event streams opened by a plain GET: { stream, session, headers, closed, closedAt?, closedBy? } (its first connection's; resumptions are resumes()). */
    streams: () => log.filter((e) => e.kind === 'stream'),
    /** The notifications the server sent: on GET streams ({ stream }) and with ctx.notify ({ callId }). */
    sent: () => log.filter((e) => e.kind === 'sent'),
    /**
     * The next tools/call answered as an event stream is cut after
     * `afterEvents` events (before its response at the latest): its socket
     * destroyed, or with `close` its body ended cleanly. The call runs on;
     * resumable, its later events are kept for a GET with Last-Event-ID.
     */
    cutNextCallStream({ afterEvents = 1, close = false } = {}) {
      if (!Number.isInteger(afterEvents) || afterEvents < 0) {
        throw new TypeError(`cutNextCallStream wants afterEvents, an integer >= 0, not ${JSON.stringify(afterEvents)}.`);
      }
      if (typeof close !== 'boolean') throw new TypeError(`cutNextCallStream wants close true or false, not ${JSON.stringify(close)}.`);
      pendingCut = { afterEvents, close };
    },
    /** The cuts made: { stream, method, id, afterEvents, written, how, session, headers }. */
    cuts: () => log.filter((e) => e.kind === 'cut'),
    /** The GETs with Last-Event-ID (resumable), answered or refused, of answer streams and GET streams: { lastEventId, stream, callId?, replayed, status, delivered?, closed?, session, headers }. */
    resumes: () => log.filter((e) => e.kind === 'resume'),
    /** The answer streams kept for a resumption (resumable): { stream, session, callId, events, answered, detached }. */
    keptStreams: () => [...answerStreams.values()].map((s) => ({
      stream: s.id,
      session: s.session,
      callId: s.callId,
      events: s.count,
      answered: s.answered,
      detached: s.detached,
    })),
    tickets: () => state.tickets.slice(),
    bookings: () => state.bookings.slice(),
    /** The names of the tools the next tools/list lists. */
    toolNames: () => tools.map((t) => t.name),
    /** The next tools/list lists `next`; with notify (default), every open GET stream is told. → how many were. */
    setTools,
    /** `notifications/tools/list_changed` on every open GET stream, the tools unchanged. → how many got it. */
    notifyListChanged,
    /** Ends every open GET stream from the server's side (res.end()); resumable, they stay resumable. → how many. */
    closeStreams: () => endStreams(),
    /** Destroys the socket of every open GET stream once what was written went out (a network error); resumable, they stay resumable. → how many. */
    breakStreams: () => endStreams(() => true, 'break'),
    /**
     * Forgets every kept GET stream, ending the open ones (res.end()), the
     * sessions kept: a server that lost its event store, so a Last-Event-ID
     * naming one is refused 400. → how many were forgotten.
     */
    forgetKeptGetStreams() {
      const count = getStreams.size;
      forgetGetStreams();
      return count;
    },
    /**
     * The next `count` GETs carrying a Last-Event-ID (either kind) are
     * answered `status` (an integer 400-599) before anything else of the
     * resumption; null cancels. Replaces what was pending.
     */
    failNextResumptions(status, count = 1) {
      if (status === null) {
        forcedResumptions = null;
        return;
      }
      if (!Number.isInteger(status) || status < 400 || status > 599) {
        throw new TypeError(`failNextResumptions wants an HTTP status, an integer 400-599, or null, not ${JSON.stringify(status)}.`);
      }
      if (!Number.isInteger(count) || count < 1) throw new TypeError(`failNextResumptions wants a count, an integer >= 1, not ${JSON.stringify(count)}.`);
      forcedResumptions = { status, left: count };
    },
    /** How many GETs with Last-Event-ID failNextResumptions will still refuse. */
    forcedResumptionsLeft: () => forcedResumptions?.left ?? 0,
    /** How many GET connections are open, resumed ones included (of `session`, if given). */
    streamCount: (session) => (session === undefined ? streams.size : [...streams].filter((conn) => conn.entry.session === session).length),
    /** The GET streams kept for a resumption (resumable; else []): { stream, number, session, events, kept, detached, resumes }. */
    keptGetStreams: () => (resumable ? [...getStreams.values()] : []).map((gs) => ({
      stream: gs.id,
      number: gs.number,
      session: gs.session,
      events: gs.count,
      kept: gs.kept.length,
      detached: gs.conn === null,
      resumes: gs.resumes,
    })),
    /** Answer every message, GET included, with HTTP `status` (null: serve again). Open streams stay open. */
    setDown(status) {
      down = status;
    },
    /** Forget every session: the next message of each gets 404; their GET streams end, their kept GET and answer streams are forgotten. */
    expireSessions() {
      sessions.clear();
      endStreams();
      forgetGetStreams();
      forgetAnswerStreams();
    },
    sessionCount: () => sessions.size,
    /** Resolves when `check(log)` is true (checked on every message and call end). */
    waitFor(check, { timeout = 60000, message = 'the MCP server to see it' } = {}) {
      return new Promise((resolve, rejectWait) => {
        if (check(log)) return resolve();
        const timer = setTimeout(() => {
          if (waiters.delete(waiter)) rejectWait(new Error(`timed out waiting for ${message}; log: ${JSON.stringify(log.map((e) => [e.kind, e.method, e.tool, e.status, e.outcome]))}`));
        }, timeout);
        const waiter = {
          check: () => check(log),
          resolve: () => {
            clearTimeout(timer);
            resolve();
          },
        };
        waiters.add(waiter);
      });
    },
    reset() {
      endStreams();
      forgetGetStreams();
      forgetAnswerStreams();
      pendingCut = null;
      forcedResumptions = null;
      log = [];
      state.tickets.length = 0;
      state.bookings.length = 0;
      elicitationsAsked.clear();
      sessions.clear();
      down = null;
      oauth.clients.clear();
      oauth.documents.clear();
      oauth.pending.clear();
      oauth.codes.clear();
      oauth.access.clear();
      oauth.refresh.clear();
      oauth.log = [];
      autoApprove = authConfig?.autoApprove ?? false;
      redirectIss = undefined;
      tokenDelayMs = 0;
      tokenRequests = 0;
      clientMetadata = null;
      clientMetadataFetchCount = 0;
      for (const controller of running.values()) controller.abort(new Error('reset'));
      running.clear();
      if (!options.tools) tools = demoTools(state);
    },
    async close() {
      closing.abort(new Error('closing'));
      endStreams(() => true, 'destroy');
      forgetGetStreams(() => true, 'destroy');
      forgetAnswerStreams(() => true, 'destroy');
      for (const controller of running.values()) controller.abort(new Error('closing'));
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function parseArgs(argv) {
  const args = { port: 0, auth: false };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--port') args.port = Number(argv[++i]);
    else if (argv[i] === '--auth') args.auth = true;
    else if (argv[i] === '--help' || argv[i] === '-h') {
      process.stdout.write('usage: node tests/mock-mcp/server.mjs [--port N] [--auth]\n');
      process.exit(0);
    } else {
      process.stderr.write(`mock-mcp: unknown argument ${argv[i]}\n`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    process.stderr.write('mock-mcp: --port must be an integer 0..65535\n');
    process.exit(2);
  }
  return args;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const args = parseArgs(process.argv.slice(2));
  const mock = await startMockMcp({ port: args.port, ...(args.auth ? { auth: { autoApprove: false } } : {}) });
  process.stdout.write(`MOCK_MCP_URL=${mock.url}\n`);
  const stop = async () => {
    await mock.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
