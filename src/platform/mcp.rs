//! MCP servers over Streamable HTTP: the client (`crate::mcp` is the half
//! without IO).
//!
//! Owns: the session with each server the embedding extension configured
//! (`initialize`, `notifications/initialized`, each given up at its time
//! limit like a page of `tools/list`, the `Mcp-Session-Id` and
//! `MCP-Protocol-Version` headers, a new session when the server forgot
//! the old one), `tools/list` (every page), `tools/call` with its progress
//! notifications, `notifications/cancelled` for a call given up, a request
//! for the user's input during a call (`elicitation/create`, handed to the
//! caller; its answer sent back with [`Server::send`]), and the answer to
//! any other request of the server's (sampling and roots are refused as
//! "method not found"), an answer stream that broke resumed after its
//! last numbered event (GET with `Last-Event-ID`), the event stream of
//! announcements, and the user's sign-in to each address (`GrantSlot`:
//! one grant for every server there, read once, renewed once at a time).
//!
//! Must not: decide whether a call may run (the engine gatekept it), or
//! retry a call (only the session is set up again when the server says it
//! does not know it, before it ran anything).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use js_sys::Function;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use web_sys::AbortController;

use super::error::js_to_error;
use super::fetch;
use crate::engine::ToolOutcome;
use crate::mcp::{self, AnswerReader, Incoming, McpError, ServerConfig};
use crate::model::McpServerOrigin;
use crate::oauth::{Grant, OAuthError};
use crate::vecmap::VecMap;

/// How many pages of `tools/list` are read at most (a server that keeps
/// sending cursors is cut off there).
const MAX_LIST_PAGES: usize = 16;

/// A session a server agreed to.
#[derive(Debug, Clone)]
struct Session {
    /// `Mcp-Session-Id`, when the server gave one.
    id: Option<String>,
    /// The protocol revision agreed on.
    version: String,
    /// The server announces changes of its tool list
    /// (`capabilities.tools.listChanged`).
    lists_changes: bool,
}

/// How a server's event stream ended.
enum StreamEnd {
    /// Open for a while, then closed: open it again.
    Closed,
    /// Not opened, or cut short: open it again later, less often.
    Failed,
    /// Not to be opened again by this loop (none offered, the session
    /// forgotten, given up by us).
    Stop,
    /// The server cannot resume it where it broke off (its answer to the
    /// `Last-Event-ID`): open a new one at once.
    NotResumed,
}

/// One opening of a server's event stream: how it ended, the id of the
/// last event it carried (to resume after; kept from before when it
/// carried none), whether it opened, and how long the server asked to
/// wait before the next (`retry:`).
struct StreamRead {
    end: StreamEnd,
    last_event_id: Option<String>,
    opened: bool,
    retry_ms: Option<u64>,
}

/// Resumptions of the event stream that fail in a row before a new
/// stream is opened instead (a server whose event store fails).
const MAX_STREAM_RESUME_FAILURES: u32 = 2;

/// A stream that ends sooner than this after opening counts as a failure
/// (a server that closes every stream at once is not asked every second).
const STREAM_MIN_OPEN_MS: f64 = 5_000.0;

/// One configured server and this worker's session with it.
pub struct Server {
    pub config: ServerConfig,
    /// The extension's or the user's.
    pub added_by: McpServerOrigin,
    session: RefCell<Option<Session>>,
    /// Held while a session is set up, so that calls starting together
    /// (discovery and a resumed run's call) share one.
    setting_up: futures::lock::Mutex<()>,
    next_id: Cell<u64>,
    /// The model's name of each tool → the server's name.
    remote: RefCell<VecMap<String, String>>,
    /// Called when the server says its tools changed (on its event
    /// stream or in the answer to a request): the driver lists them again.
    on_tools_changed: RefCell<Option<Rc<dyn Fn()>>>,
    /// What ends the loop following the server's event stream, while
    /// there is one.
    stream: RefCell<Option<AbortController>>,
    /// A new listing of the tools: None idle, Some(again) running
    /// (`again`: asked for once more meanwhile).
    relisting: Cell<Option<bool>>,
    /// The user's sign-in to the server's address (shared with any other
    /// server configured at the same address).
    grant: Rc<GrantSlot>,
    /// How many requests were refused for want of a sign-in (a call
    /// compares it before and after).
    sign_in_refusals: Cell<u64>,
}

/// How reading an answer's body ended.
enum ReadEnd {
    /// The response to the request (a result or the server's error).
    Answered(Result<Value, McpError>),
    /// The body ended or broke before it (why).
    Broke(McpError),
}

/// How asking for the rest of a broken answer stream went.
enum Resumed {
    /// The stream goes on in this response.
    Opened(fetch::Streaming),
    /// Not reached, or the server's trouble: asked again after a while.
    Failed,
    /// The server cannot resume it.
    Refused,
}

/// How a renewal of the grant went.
enum Renewal {
    /// A new access token to try (renewed here, or by a request refused
    /// at the same time).
    Renewed,
    /// None: the user signs in again.
    Refused,
    /// The sign-in server could not be reached; the grant is kept.
    Unreachable(String),
}

/// The user's sign-in to one address (`crate::oauth`), shared by every
/// configured server at that address (the extension's and the user's may
/// name the same server): one grant in memory, read from storage once,
/// renewed once at a time. A refresh token is good for one renewal, so
/// two copies of a grant would each spend it and one would be refused.
pub struct GrantSlot {
    url: String,
    grant: RefCell<Option<Grant>>,
    /// Read from storage (or replaced) in this worker.
    loaded: Cell<bool>,
    /// Held while the grant is renewed, so that requests refused together
    /// renew it once.
    renewing: futures::lock::Mutex<()>,
    /// Bumped by every sign-in, sign-out and refused renewal, and when no
    /// server uses the address any more: a renewal that finishes after
    /// one of those keeps nothing (it would undo it).
    epoch: Cell<u64>,
    /// A sign-in window is open for the address.
    signing_in: Cell<bool>,
    /// The `WWW-Authenticate` of the last 401 or 403 asking for a sign-in
    /// at the address (where its metadata is, which scopes it wants), from
    /// whichever server there was refused.
    challenge: RefCell<Option<String>>,
    /// No configured server uses the address any more: a sign-in that
    /// completes now keeps nothing.
    retired: Cell<bool>,
}

impl GrantSlot {
    fn new(url: &str) -> Self {
        GrantSlot {
            url: url.to_string(),
            grant: RefCell::new(None),
            loaded: Cell::new(false),
            renewing: futures::lock::Mutex::new(()),
            epoch: Cell::new(0),
            signing_in: Cell::new(false),
            challenge: RefCell::new(None),
            retired: Cell::new(false),
        }
    }

    /// Read the kept grant once per worker (storage that cannot be read
    /// is read again at the next request).
    async fn load(&self) {
        if self.loaded.get() {
            return;
        }
        match super::oauth::load_grant(&self.url).await {
            Ok(kept) => self.loaded_from(kept),
            Err(why) => super::console_error(&format!(
                "the sign-in for {} could not be read: {why}",
                self.url
            )),
        }
    }

    /// The grant read from storage, unless one was read or replaced
    /// meanwhile.
    fn loaded_from(&self, kept: Option<Grant>) {
        if !self.loaded.replace(true) {
            *self.grant.borrow_mut() = kept;
        }
    }

    fn access_token(&self) -> Option<String> {
        self.grant.borrow().as_ref().map(|g| g.access_token.clone())
    }

    fn expiring(&self) -> bool {
        self.grant
            .borrow()
            .as_ref()
            .is_some_and(|g| g.expiring(js_sys::Date::now() as u64))
    }

    /// A new grant, or none (signed in or out).
    fn replace(&self, grant: Option<Grant>) {
        *self.grant.borrow_mut() = grant;
        self.loaded.set(true);
        self.epoch.set(self.epoch.get() + 1);
    }

    /// No server uses the address any more.
    fn retire(&self) {
        self.retired.set(true);
        self.epoch.set(self.epoch.get() + 1);
    }

    /// Renew the grant whose access token `failed` was refused or is
    /// ending (`server` names it in the console). The renewal runs as a
    /// task of its own: a request given up meanwhile (its time limit,
    /// Stop) does not lose a refresh token the sign-in server already
    /// rotated.
    async fn renew(self: &Rc<Self>, failed: Option<String>, server: &str) -> Renewal {
        let (done, renewal) = futures::channel::oneshot::channel();
        let slot = self.clone();
        let server = server.to_string();
        wasm_bindgen_futures::spawn_local(async move {
            let _ = done.send(slot.renew_now(failed.as_deref(), &server).await);
        });
        renewal.await.unwrap_or(Renewal::Refused)
    }

    async fn renew_now(&self, failed: Option<&str>, server: &str) -> Renewal {
        let _one_at_a_time = self.renewing.lock().await;
        // No server uses the address any more: nothing is renewed or
        // written (its grant may have been forgotten with it).
        if self.retired.get() {
            return Renewal::Refused;
        }
        let Some(grant) = self.grant.borrow().clone() else {
            return Renewal::Refused;
        };
        // Renewed by another request meanwhile.
        if Some(grant.access_token.as_str()) != failed {
            return Renewal::Renewed;
        }
        let epoch = self.epoch.get();
        let result = super::oauth::refresh(&grant, js_sys::Date::now() as u64).await;
        // Signed in again, out, or no longer used meanwhile: that stands.
        if self.epoch.get() != epoch {
            return if self.grant.borrow().is_some() {
                Renewal::Renewed
            } else {
                Renewal::Refused
            };
        }
        match result {
            Ok(renewed) => {
                *self.grant.borrow_mut() = Some(renewed.clone());
                super::oauth::keep_grant(&self.url, Some(&renewed)).await;
                Renewal::Renewed
            }
            Err(OAuthError::Unreachable(why)) => Renewal::Unreachable(why),
            Err(e) => {
                super::console_error(&e.describe(server));
                self.replace(None);
                super::oauth::keep_grant(&self.url, None).await;
                // A client the server no longer knows: the next sign-in
                // registers a new one.
                if e.blames_client() {
                    super::oauth::forget_client(&grant.token_endpoint, &grant.client_id).await;
                }
                Renewal::Refused
            }
        }
    }
}

/// How long one page of `tools/list` may take.
const LIST_TIMEOUT_MS: u32 = 30_000;

/// How long each message of a session's setup may take (`initialize`'s
/// answer, then the acceptance of `notifications/initialized`): a server
/// that never answers does not hold discovery, the Check again of it, or
/// anything else waiting on the session, for ever. As long as a page of
/// the list: a server that answers at all does so well within it.
const INITIALIZE_TIMEOUT_MS: u32 = 30_000;

/// How long a message that expects no answer ([`Server::send`]) may take
/// to be accepted.
const SEND_TIMEOUT_MS: u32 = 30_000;

/// A controller aborted once its time limit passed, and whether it was
/// (the timer is cleared when this is dropped).
struct Deadline {
    controller: AbortController,
    expired: Rc<Cell<bool>>,
    limit_ms: u32,
    _timer: gloo_timers::callback::Timeout,
}

impl Deadline {
    fn new(limit_ms: u32) -> Result<Self, McpError> {
        let controller = new_controller()?;
        let expired = Rc::new(Cell::new(false));
        let timer = {
            let controller = controller.clone();
            let expired = expired.clone();
            gloo_timers::callback::Timeout::new(limit_ms, move || {
                expired.set(true);
                controller.abort();
            })
        };
        Ok(Deadline {
            controller,
            expired,
            limit_ms,
            _timer: timer,
        })
    }

    /// What `request`, sent with this controller, came to: given up at
    /// the time limit, [`McpError::TimedOut`].
    fn judge<T>(&self, request: &str, result: Result<T, McpError>) -> Result<T, McpError> {
        mcp::within_time_limit(result, self.expired.get(), request, self.limit_ms)
    }
}

impl Server {
    fn new(config: ServerConfig, added_by: McpServerOrigin, grant: Rc<GrantSlot>) -> Self {
        Server {
            config,
            added_by,
            session: RefCell::new(None),
            setting_up: futures::lock::Mutex::new(()),
            next_id: Cell::new(1),
            remote: RefCell::new(VecMap::new()),
            on_tools_changed: RefCell::new(None),
            stream: RefCell::new(None),
            relisting: Cell::new(None),
            grant,
            sign_in_refusals: Cell::new(0),
        }
    }

    /// A grant may be used with this server: it has no `Authorization`
    /// of its own and is https (or on this machine): a token never
    /// crosses the network in clear text.
    pub fn takes_grant(&self) -> bool {
        !self.own_authorization() && crate::oauth::is_secure_url(&self.config.url)
    }

    /// The headers of the extension's entry name an `Authorization` of its
    /// own: no sign-in is offered (a 401 is a wrong credential).
    fn own_authorization(&self) -> bool {
        self.config
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    }

    /// Whether the user is signed in to the server (a grant is kept for
    /// its address and used with it).
    pub fn signed_in(&self) -> bool {
        self.takes_grant() && self.grant.grant.borrow().is_some()
    }

    /// How many requests were refused for want of a sign-in so far.
    pub fn sign_in_refusals(&self) -> u64 {
        self.sign_in_refusals.get()
    }

    /// Whether a sign-in window is open for the server's address.
    pub fn signing_in(&self) -> bool {
        self.grant.signing_in.get()
    }

    /// The server shares its sign-in with `other` (the same address).
    pub fn shares_grant_with(&self, other: &Server) -> bool {
        Rc::ptr_eq(&self.grant, &other.grant)
    }

    /// The access token to send the server, if it takes one.
    fn access_token(&self) -> Option<String> {
        self.grant.access_token().filter(|_| self.takes_grant())
    }

    /// Renew the grant whose access token `failed` was refused or is
    /// ending.
    async fn renew(&self, failed: Option<String>) -> Renewal {
        self.grant.renew(failed, &self.config.name).await
    }

    /// The session and the event stream opened with another grant are
    /// dropped (the next request sets up new ones).
    pub fn drop_session(&self) {
        *self.session.borrow_mut() = None;
        if let Some(controller) = self.stream.borrow_mut().take() {
            controller.abort();
        }
    }

    /// Sign in (the user asked, Settings): the sign-in window, then the
    /// grant kept for the server's address (every server there shares
    /// it). One window per address at a time: `Err(None)` while one is
    /// open (nothing changes), `Err(Some(why))` when the sign-in failed.
    pub async fn sign_in(&self) -> Result<(), Option<String>> {
        let name = &self.config.name;
        if self.own_authorization() {
            return Err(Some(format!(
                "The MCP server \"{name}\" is given an Authorization header by its entry; it has no sign-in."
            )));
        }
        let slot = &self.grant;
        if slot.signing_in.replace(true) {
            return Err(None);
        }
        let challenge = slot.challenge.borrow().clone();
        let result = super::oauth::sign_in(&self.config, challenge.as_deref(), || {
            js_sys::Date::now() as u64
        })
        .await;
        slot.signing_in.set(false);
        let grant = result.map_err(|e| Some(e.describe(name)))?;
        if slot.retired.get() {
            return Err(None);
        }
        // In memory first: a renewal finishing meanwhile then keeps
        // nothing over it (the epoch moved).
        slot.replace(Some(grant.clone()));
        super::oauth::keep_grant(&slot.url, Some(&grant)).await;
        Ok(())
    }

    /// Forget the user's sign-in to the server's address (kept and in
    /// memory).
    pub async fn sign_out(&self) {
        // An entry with its own Authorization holds no sign-in to forget
        // (a server of the user's at the same address may).
        if !self.takes_grant() {
            return;
        }
        self.grant.replace(None);
        super::oauth::keep_grant(&self.grant.url, None).await;
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// Remember the server's names of its tools (the model's name → its own).
    pub fn set_tools(&self, tools: &[mcp::RemoteTool]) {
        let mut remote = self.remote.borrow_mut();
        *remote = VecMap::new();
        for tool in tools {
            remote.insert(tool.descriptor.name.clone(), tool.remote.clone());
        }
    }

    fn session_id(&self) -> Option<String> {
        self.session.borrow().as_ref().and_then(|s| s.id.clone())
    }

    /// The headers of every request after `initialize`.
    fn headers(&self, session: Option<&Session>) -> Vec<(String, String)> {
        let mut headers = vec![(
            "accept".to_string(),
            "application/json, text/event-stream".to_string(),
        )];
        headers.extend(self.config.headers.iter().cloned());
        if let Some(token) = self.access_token() {
            headers.push(("authorization".into(), format!("Bearer {token}")));
        }
        if let Some(session) = session {
            if let Some(id) = &session.id {
                headers.push(("mcp-session-id".into(), id.clone()));
            }
            headers.push(("mcp-protocol-version".into(), session.version.clone()));
        }
        headers
    }

    /// Whether a request to the server follows a redirect: not when it
    /// carries the headers of the server's entry or a sign-in's token,
    /// which go to its address only (browsers keep them on a redirect to
    /// any origin).
    fn redirects(&self) -> fetch::Redirects {
        if self.config.headers.is_empty() && self.access_token().is_none() {
            fetch::Redirects::Follow
        } else {
            fetch::Redirects::Refuse
        }
    }

    /// POST one message and read the answer to request `id` (None: a
    /// notification or an answer of ours, whose answer is only its
    /// status). Notifications the server sends meanwhile go to `on_note`,
    /// its requests for input to `on_ask` (id, params, field order) when
    /// there is one; its other requests are refused.
    async fn post(
        self: &Rc<Self>,
        body: String,
        id: Option<u64>,
        session: Option<&Session>,
        controller: &AbortController,
        on_note: &mut dyn FnMut(&str, &Value),
        on_ask: Option<&dyn Fn(Value, Value, Vec<String>)>,
    ) -> Result<(Option<String>, Option<Value>), McpError> {
        let headers = self.headers(session);
        let redirects = self.redirects();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut response = fetch::post_json(
            &self.config.url,
            &headers,
            &JsValue::from_str(&body),
            controller,
            redirects,
        )
        .await
        .map_err(|e| {
            McpError::Unreachable(if e.is_redirect() {
                format!(
                    "{}: its headers and sign-in go only to the address configured for it",
                    e.message
                )
            } else {
                e.message
            })
        })?;
        let status = response.status;
        if status == 404 && session.is_some_and(|s| s.id.is_some()) {
            return Err(McpError::SessionExpired);
        }
        if status == 401 && self.takes_grant() {
            return Err(McpError::SignInNeeded(response.header("www-authenticate")));
        }
        // A token that lacks a scope: signing in again may grant it.
        if status == 403 && self.access_token().is_some() {
            if let Some(challenge) = response
                .header("www-authenticate")
                .filter(|c| crate::oauth::is_insufficient_scope(c))
            {
                return Err(McpError::MorePermissionNeeded(challenge));
            }
        }
        if !(200..300).contains(&status) {
            // Only the start of an error is worth reading; a longer body
            // is not read on (the status says enough).
            let body = match response.text_within(fetch::ERROR_BODY_MAX_BYTES).await {
                Ok(body) => body,
                Err(_) => {
                    controller.abort();
                    String::new()
                }
            };
            return Err(McpError::Http { status, body });
        }
        let session_id = response.header("mcp-session-id");
        let Some(id) = id else {
            controller.abort();
            return Ok((session_id, None));
        };
        let content_type = response.header("content-type").unwrap_or_default();
        let mut reader = AnswerReader::new(&content_type);
        let mut resumes = 0;
        loop {
            let broke = match self
                .read_answer(&mut response, &mut reader, id, on_note, on_ask)
                .await?
            {
                ReadEnd::Answered(answer) => {
                    // The rest of the stream is not needed.
                    controller.abort();
                    return answer.map(|result| (session_id, Some(result)));
                }
                ReadEnd::Broke(why) => why,
            };
            // The stream broke before the answer. A server that numbers
            // its events is asked for the rest (`Last-Event-ID`): the
            // request is not sent again, so nothing runs twice.
            let Some(last) = reader.last_event_id() else {
                return Err(broke);
            };
            response = loop {
                let Some(delay) = mcp::resume_delay_ms(resumes, reader.retry_ms()) else {
                    return Err(broke);
                };
                resumes += 1;
                gloo_timers::future::TimeoutFuture::new(delay).await;
                if controller.signal().aborted() {
                    return Err(broke);
                }
                match self.resume(session, &last, controller).await {
                    Resumed::Opened(response) => break response,
                    Resumed::Failed => {}
                    Resumed::Refused => return Err(broke),
                }
            };
            reader = reader.resumed(&response.header("content-type").unwrap_or_default());
        }
    }

    /// Read an answer's body until the response to request `id`, handing
    /// notifications and requests on as `post` says. `Broke` when the body
    /// ended or failed before it; an error for a body that is not MCP.
    async fn read_answer(
        self: &Rc<Self>,
        response: &mut fetch::Streaming,
        reader: &mut AnswerReader,
        id: u64,
        on_note: &mut dyn FnMut(&str, &Value),
        on_ask: Option<&dyn Fn(Value, Value, Vec<String>)>,
    ) -> Result<ReadEnd, McpError> {
        loop {
            let chunk = match response.next_chunk().await {
                Ok(chunk) => chunk,
                Err(e) => return Ok(ReadEnd::Broke(McpError::AnswerBroke(e.message))),
            };
            let messages = match &chunk {
                Some(bytes) => reader.push(bytes)?,
                None => reader.finish()?,
            };
            for message in messages {
                match message {
                    Incoming::Response { id: got, answer } if mcp::is_ours(&got, id) => {
                        return Ok(ReadEnd::Answered(answer));
                    }
                    Incoming::Response { .. } => {}
                    Incoming::Request {
                        id,
                        method,
                        params,
                        order,
                    } => match on_ask {
                        Some(ask) if method == crate::elicitation::METHOD => ask(id, params, order),
                        _ => self.send(mcp::answer_request(&id, &method)),
                    },
                    Incoming::Notification { method, params } => on_note(&method, &params),
                }
            }
            if chunk.is_none() {
                return Ok(ReadEnd::Broke(McpError::NoAnswer));
            }
        }
    }

    /// GET an event stream in the session: the announcements' (no
    /// `last_event_id`) or the rest of an answer's.
    async fn get_stream(
        &self,
        session: Option<&Session>,
        last_event_id: Option<&str>,
        controller: &AbortController,
    ) -> Result<fetch::Streaming, super::error::JsError> {
        let mut headers = self.headers(session);
        let redirects = self.redirects();
        headers[0].1 = "text/event-stream".to_string();
        if let Some(last) = last_event_id {
            headers.push(("last-event-id".into(), last.to_string()));
        }
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        fetch::get(&self.config.url, &headers, controller, redirects).await
    }

    /// Ask the server for the rest of an answer stream that broke after
    /// event `last` (GET with `Last-Event-ID`, in the session).
    async fn resume(
        self: &Rc<Self>,
        session: Option<&Session>,
        last: &str,
        controller: &AbortController,
    ) -> Resumed {
        let sent = self.access_token();
        let Ok(response) = self.get_stream(session, Some(last), controller).await else {
            return Resumed::Failed;
        };
        let is_stream =
            AnswerReader::new(&response.header("content-type").unwrap_or_default()).is_stream();
        match response.status {
            200..=299 if is_stream => Resumed::Opened(response),
            // The token ended meanwhile: renewed, asked again.
            401 if sent.is_some() => {
                response.cancel();
                match self.renew(sent).await {
                    Renewal::Renewed => Resumed::Failed,
                    _ => Resumed::Refused,
                }
            }
            // The server's trouble, or the broken connection not yet seen
            // as closed there (409: the stream still has one): asked
            // again after a while.
            408 | 409 | 429 | 500..=599 => {
                response.cancel();
                Resumed::Failed
            }
            // It keeps no such stream (or none at all).
            _ => {
                response.cancel();
                Resumed::Refused
            }
        }
    }

    /// Send a message that expects no answer (an answer to a request of the
    /// server's, a cancellation) in the background: what the server does
    /// with it is not ours to wait for. Given up after [`SEND_TIMEOUT_MS`]:
    /// a server that never answers holds no connection for ever.
    pub fn send(self: &Rc<Self>, body: String) {
        let server = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            if let Ok(deadline) = Deadline::new(SEND_TIMEOUT_MS) {
                let session = server.session.borrow().clone();
                let _ = server
                    .post(
                        body,
                        None,
                        session.as_ref(),
                        &deadline.controller,
                        &mut |_, _| {},
                        None,
                    )
                    .await;
            }
        });
    }

    /// Set up a session: `initialize`, then `notifications/initialized`;
    /// only then do other requests use it. Each within
    /// [`INITIALIZE_TIMEOUT_MS`], else given up ([`McpError::TimedOut`]).
    async fn initialize(self: &Rc<Self>) -> Result<(), McpError> {
        let id = self.next_id();
        let deadline = Deadline::new(INITIALIZE_TIMEOUT_MS)?;
        let answer = self
            .post(
                mcp::request(id, "initialize", mcp::initialize_params()),
                Some(id),
                None,
                &deadline.controller,
                &mut |_, _| {},
                None,
            )
            .await;
        let (session_id, result) = deadline.judge("initialize", answer)?;
        let result = result.unwrap_or(Value::Null);
        let version = mcp::agreed_version(&result)?;
        let session = Session {
            id: session_id,
            version,
            lists_changes: mcp::lists_changes(&result),
        };
        let deadline = Deadline::new(INITIALIZE_TIMEOUT_MS)?;
        let accepted = self
            .post(
                mcp::notification("notifications/initialized", None),
                None,
                Some(&session),
                &deadline.controller,
                &mut |_, _| {},
                None,
            )
            .await;
        deadline.judge("notifications/initialized", accepted)?;
        *self.session.borrow_mut() = Some(session);
        self.open_stream();
        Ok(())
    }

    /// One request in the session (set up first if there is none, and once
    /// more if the server forgot it).
    async fn rpc(
        self: &Rc<Self>,
        method: &str,
        params: Value,
        controller: &AbortController,
        on_request: &mut dyn FnMut(u64),
        on_note: &mut dyn FnMut(&str, &Value),
        on_ask: Option<&dyn Fn(Value, Value, Vec<String>)>,
    ) -> Result<Value, McpError> {
        if self.takes_grant() {
            self.grant.load().await;
        }
        let mut session_retried = false;
        let mut renewed = false;
        loop {
            if !renewed && self.takes_grant() && self.grant.expiring() {
                renewed = true;
                // A refused renewal leaves no grant: the request says so.
                if let Renewal::Unreachable(why) = self.renew(self.access_token()).await {
                    return Err(McpError::Unreachable(format!(
                        "its sign-in could not be renewed: {why}"
                    )));
                }
            }
            let token = self.access_token();
            let outcome = self
                .request_once(method, &params, controller, on_request, on_note, on_ask)
                .await;
            match outcome {
                Err(McpError::SessionExpired) if !session_retried => session_retried = true,
                Err(McpError::SignInNeeded(challenge)) => {
                    if challenge.is_some() {
                        *self.grant.challenge.borrow_mut() = challenge.clone();
                    }
                    if !renewed && token.is_some() {
                        renewed = true;
                        match self.renew(token).await {
                            Renewal::Renewed => continue,
                            Renewal::Unreachable(why) => {
                                return Err(McpError::Unreachable(format!(
                                    "its sign-in could not be renewed: {why}"
                                )))
                            }
                            Renewal::Refused => {}
                        }
                    }
                    self.sign_in_refusals.set(self.sign_in_refusals.get() + 1);
                    return Err(McpError::SignInNeeded(challenge));
                }
                // No renewal grants a scope: the user signs in again, and
                // the sign-in asks for the challenge's scopes.
                Err(McpError::MorePermissionNeeded(challenge)) => {
                    *self.grant.challenge.borrow_mut() = Some(challenge.clone());
                    self.sign_in_refusals.set(self.sign_in_refusals.get() + 1);
                    return Err(McpError::MorePermissionNeeded(challenge));
                }
                other => return other,
            }
        }
    }

    /// One request in the session (set up first if there is none); a
    /// session the server forgot is dropped.
    async fn request_once(
        self: &Rc<Self>,
        method: &str,
        params: &Value,
        controller: &AbortController,
        on_request: &mut dyn FnMut(u64),
        on_note: &mut dyn FnMut(&str, &Value),
        on_ask: Option<&dyn Fn(Value, Value, Vec<String>)>,
    ) -> Result<Value, McpError> {
        if self.session.borrow().is_none() {
            let _one_at_a_time = self.setting_up.lock().await;
            if self.session.borrow().is_none() {
                self.initialize().await?;
            }
        }
        let session = self.session.borrow().clone();
        let used = session.as_ref().and_then(|s| s.id.clone());
        let id = self.next_id();
        on_request(id);
        // A change of the tools announced in the answer to a listing is
        // that listing's (acting on it would list again for ever).
        let listing = method == "tools/list";
        let mut notes = |name: &str, params: &Value| {
            if name == mcp::LIST_CHANGED && !listing {
                self.tools_changed();
            }
            on_note(name, params)
        };
        let result = self
            .post(
                mcp::request(id, method, params.clone()),
                Some(id),
                session.as_ref(),
                controller,
                &mut notes,
                on_ask,
            )
            .await;
        if let Err(McpError::SessionExpired) = result {
            // Unless another request already set up a new one.
            if self.session_id() == used {
                *self.session.borrow_mut() = None;
            }
        }
        result.map(|(_, result)| result.unwrap_or(Value::Null))
    }

    /// Every tool the server lists (`tools/list`, all its pages).
    pub async fn list_tools(self: &Rc<Self>) -> Result<Vec<Value>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            // A server that never answers a page does not hold the
            // listing (and the Check again of it) for ever.
            let deadline = Deadline::new(LIST_TIMEOUT_MS)?;
            let answer = self
                .rpc(
                    "tools/list",
                    params,
                    &deadline.controller,
                    &mut |_| {},
                    &mut |_, _| {},
                    None,
                )
                .await;
            let result = deadline.judge("tools/list", answer)?;
            let (page, next) = mcp::tools_page(&result)?;
            tools.extend(page);
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(tools)
    }

    fn tools_changed(&self) {
        let on_changed = self.on_tools_changed.borrow().clone();
        if let Some(on_changed) = on_changed {
            on_changed();
        }
    }

    /// Start a new listing of the tools unless one is running, in which
    /// case it runs once more when done (`finish_relist`). True: start one.
    pub fn begin_relist(&self) -> bool {
        let idle = self.relisting.get().is_none();
        self.relisting.set(Some(!idle));
        idle
    }

    /// A listing ended: true if it was asked for again meanwhile (run it
    /// once more).
    pub fn finish_relist(&self) -> bool {
        let again = self.relisting.get() == Some(true);
        self.relisting.set(again.then_some(false));
        again
    }

    /// Follow what the server announces while this worker lives: once the
    /// session says it announces changes of its tools, open its event
    /// stream (GET) and call `on_changed` for each
    /// `notifications/tools/list_changed` (the same notification in the
    /// answer to a request of ours calls it too). A stream that ends is
    /// opened again (after 1 s, backing off after failures, given up after
    /// 8 in a row); a server that offers none (405) or forgot the session
    /// (404) is not asked again until a new session is set up (the next
    /// request finds out, `initialize` opens it again). A stream that
    /// ended is resumed after its last event (`Last-Event-ID`) when the
    /// server numbers them, so what it announced meanwhile is replayed;
    /// one that cannot be resumed is replaced by a new one, and the tools
    /// are listed again once that is open (a change may have been
    /// announced in between).
    pub fn follow(self: &Rc<Self>, on_changed: Rc<dyn Fn()>) {
        *self.on_tools_changed.borrow_mut() = Some(on_changed);
        self.open_stream();
    }

    /// Open the event stream if the server is followed, announces changes
    /// and none is open.
    fn open_stream(self: &Rc<Self>) {
        if self.on_tools_changed.borrow().is_none() {
            return;
        }
        let announces = self
            .session
            .borrow()
            .as_ref()
            .is_some_and(|s| s.lists_changes);
        if !announces || self.stream.borrow().is_some() {
            return;
        }
        let Ok(controller) = AbortController::new() else {
            return;
        };
        *self.stream.borrow_mut() = Some(controller.clone());
        let server = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            server.listen(&controller).await;
            let mut stream = server.stream.borrow_mut();
            if stream.as_ref() == Some(&controller) {
                *stream = None;
            }
        });
    }

    /// Stop following the server (it was removed): its stream is closed
    /// and nothing it announces is acted on.
    pub fn stop_following(&self) {
        if let Some(controller) = self.stream.borrow_mut().take() {
            controller.abort();
        }
        *self.on_tools_changed.borrow_mut() = None;
    }

    async fn listen(self: &Rc<Self>, controller: &AbortController) {
        let mut failures = 0u32;
        // Where the last stream broke off (the session's id, the last
        // event's): the next one resumes there (MCP resumability), so an
        // announcement made meanwhile is replayed. None (the server
        // numbers no events, or cannot resume): the next stream is a new
        // one, and the tools are listed again once it is open, since an
        // announcement may have been missed.
        let mut resume_from: Option<(Option<String>, String)> = None;
        let mut resume_failures = 0u32;
        let mut opened_before = false;
        loop {
            let session = self.session.borrow().clone();
            let Some(session) = session.filter(|s| s.lists_changes) else {
                return;
            };
            let from = resume_from
                .take()
                .filter(|(id, _)| *id == session.id)
                .map(|(_, last)| last);
            let resuming = from.is_some();
            let read = self
                .read_stream(&session, from.as_deref(), opened_before, controller)
                .await;
            opened_before |= read.opened;
            resume_from = read.last_event_id.map(|last| (session.id.clone(), last));
            match read.end {
                StreamEnd::Closed => failures = 0,
                StreamEnd::Failed => failures += 1,
                StreamEnd::Stop => return,
                // A new stream at once; what it missed is listed.
                StreamEnd::NotResumed => {
                    resume_from = None;
                    resume_failures = 0;
                    continue;
                }
            }
            // Resumptions that keep failing (the server's event store, say):
            // a new stream instead.
            resume_failures = if resuming && !read.opened {
                resume_failures + 1
            } else {
                0
            };
            if resume_failures >= MAX_STREAM_RESUME_FAILURES {
                resume_from = None;
                resume_failures = 0;
            }
            if controller.signal().aborted() {
                return;
            }
            let Some(delay) = mcp::stream_retry_ms(failures) else {
                super::console_error(&format!(
                    "MCP server \"{}\": its event stream could not be kept open; changes of its tools are seen when they are listed again",
                    self.config.name
                ));
                return;
            };
            // At least as long as the server asked (`retry:`), at most a
            // minute.
            let asked = read.retry_ms.map_or(0, |ms| ms.min(60_000) as u32);
            gloo_timers::future::TimeoutFuture::new(delay.max(asked)).await;
            if controller.signal().aborted() {
                return;
            }
        }
    }

    /// Open the server's event stream once (resumed after event `from`
    /// when given) and read it to its end. `reopened`: a stream was open
    /// before in this worker, so a new (not resumed) one lists the tools
    /// again once open.
    async fn read_stream(
        self: &Rc<Self>,
        session: &Session,
        from: Option<&str>,
        reopened: bool,
        controller: &AbortController,
    ) -> StreamRead {
        let mut read = StreamRead {
            end: StreamEnd::Failed,
            last_event_id: from.map(str::to_string),
            opened: false,
            retry_ms: None,
        };
        read.end = self
            .read_stream_once(session, &mut read, reopened, controller)
            .await;
        read
    }

    async fn read_stream_once(
        self: &Rc<Self>,
        session: &Session,
        read: &mut StreamRead,
        reopened: bool,
        controller: &AbortController,
    ) -> StreamEnd {
        // A token about to end is renewed first (a stream reopened after
        // it ended would be refused).
        if self.takes_grant() && self.grant.expiring() {
            self.renew(self.access_token()).await;
        }
        // The token sent: a refusal renews that one (another server at the
        // address may have renewed it meanwhile).
        let sent = self.access_token();
        let opened = js_sys::Date::now();
        let failed = || {
            if controller.signal().aborted() {
                StreamEnd::Stop
            } else {
                StreamEnd::Failed
            }
        };
        let resuming = read.last_event_id.is_some();
        let Ok(mut response) = self
            .get_stream(Some(session), read.last_event_id.as_deref(), controller)
            .await
        else {
            return failed();
        };
        let status = response.status;
        if !(200..=299).contains(&status) {
            response.cancel();
        }
        match status {
            // A token refused: renewed, the stream is opened again soon;
            // else the next request finds out the sign-in is wanted.
            401 if sent.is_some() => {
                return match self.renew(sent).await {
                    Renewal::Renewed => StreamEnd::Failed,
                    _ => StreamEnd::Stop,
                };
            }
            // A sign-in wanted: the next request finds that out itself.
            401 | 403 => return StreamEnd::Stop,
            // The server's trouble, or (409) the broken connection not yet
            // seen as closed there: asked again later, from the same event.
            408 | 409 | 429 => return StreamEnd::Failed,
            // It keeps no such stream (any other refusal of the
            // Last-Event-ID, a 404 or 405 included: some servers answer
            // an unknown id so): a new one, which finds out whether the
            // session is gone.
            400..=499 if resuming => return StreamEnd::NotResumed,
            // None offered, or the session forgotten: the next request
            // finds that out itself (a new session opens the stream again).
            404 | 405 => return StreamEnd::Stop,
            200..=299 => {}
            _ => return StreamEnd::Failed,
        }
        let content_type = response.header("content-type").unwrap_or_default();
        let mut reader = AnswerReader::new(&content_type);
        if !reader.is_stream() {
            response.cancel();
            return StreamEnd::Failed;
        }
        read.opened = true;
        // A new stream after one that ended: what was announced between
        // them is not replayed, so the tools are listed again.
        if reopened && !resuming {
            self.tools_changed();
        }
        loop {
            let chunk = match response.next_chunk().await {
                Ok(chunk) => chunk,
                Err(_) => return failed(),
            };
            let messages = match &chunk {
                Some(bytes) => reader.push(bytes),
                None => reader.finish(),
            };
            // The id the server last set (`last_event_id`: an empty `id:`
            // resets it, so no resuming from an older one).
            if reader.stream_event_id().is_some() {
                read.last_event_id = reader.last_event_id();
            }
            read.retry_ms = reader.retry_ms();
            let Ok(messages) = messages else {
                // Too big or not JSON-RPC: this stream is not read on (nor
                // resumed: the same would come again).
                response.cancel();
                read.last_event_id = None;
                return StreamEnd::Failed;
            };
            for message in messages {
                match message {
                    Incoming::Notification { method, .. } if method == mcp::LIST_CHANGED => {
                        self.tools_changed()
                    }
                    Incoming::Notification { .. } | Incoming::Response { .. } => {}
                    // A request for the user's input belongs to a call; on
                    // this stream there is none, so it is refused too.
                    Incoming::Request { id, method, .. } => {
                        self.send(mcp::answer_request(&id, &method))
                    }
                }
            }
            if chunk.is_none() {
                // Ended by the server. A short-lived stream is a failure
                // (no server is asked every second), unless it numbered
                // its events: a server may close a stream it can resume
                // whenever it likes (MCP 2025-11-25, polling).
                let short = js_sys::Date::now() - opened < STREAM_MIN_OPEN_MS;
                return if short && read.last_event_id.is_none() {
                    StreamEnd::Failed
                } else {
                    StreamEnd::Closed
                };
            }
        }
    }

    /// Call the tool the model knows as `name`. `progress` gets the text of
    /// each progress notification, `ask` each request for the user's input
    /// (id, params, field order); aborting `controller` gives the call up
    /// (the server is told: `notifications/cancelled`). `call_id` is the
    /// model's call; `changes_something`: not a read, so an answer lost
    /// after the server had the call leaves its outcome unknown.
    pub async fn call(
        self: &Rc<Self>,
        (name, call_id): (&str, &str),
        params: &Value,
        controller: &AbortController,
        progress: &Function,
        ask: &dyn Fn(Value, Value, Vec<String>),
        changes_something: bool,
    ) -> Result<ToolOutcome, String> {
        let server = &self.config.name;
        let remote = self.remote.borrow().get(name).cloned().ok_or_else(|| {
            format!("{name} is no longer offered by the MCP server \"{server}\".")
        })?;
        let token = call_id.to_string();
        let sent = Rc::new(Cell::new(None::<u64>));
        let on_request = {
            let sent = sent.clone();
            move |id| sent.set(Some(id))
        };
        let guard = CancelOnDrop {
            server: self.clone(),
            request: sent,
            controller: controller.clone(),
        };
        let result = self
            .rpc(
                "tools/call",
                mcp::call_params(&remote, params, &token),
                controller,
                &mut { on_request },
                &mut |method, note| {
                    if method == "notifications/progress" {
                        if let Some(text) = mcp::progress_text(note, &token) {
                            let _ = progress.call1(&JsValue::UNDEFINED, &JsValue::from_str(&text));
                        }
                    }
                },
                Some(ask),
            )
            .await;
        // A stop aborts the request: the fetch fails, but the server still
        // runs the call unless told (a disconnection is no cancellation,
        // says the transport spec). A call the server answered, in any
        // form, disarms the guard; one whose answer never came (aborted,
        // the stream broke) is cancelled.
        if !matches!(
            result,
            Err(McpError::Unreachable(_) | McpError::NoAnswer | McpError::AnswerBroke(_))
        ) {
            guard.answered();
        }
        let result = result.map_err(|e| mcp::call_error(&e, server, changes_something))?;
        Ok(mcp::call_outcome(server, &remote, &result))
    }
}

/// Tells the server a call was given up when the call's future is dropped
/// (the time limit, a stop) or its request aborted before the answer.
struct CancelOnDrop {
    server: Rc<Server>,
    request: Rc<Cell<Option<u64>>>,
    controller: AbortController,
}

impl CancelOnDrop {
    fn answered(self) {
        self.request.set(None);
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.request.take() else {
            return;
        };
        self.controller.abort();
        self.server.send(mcp::notification(
            "notifications/cancelled",
            Some(json!({ "requestId": id, "reason": "The call was given up." })),
        ));
    }
}

fn new_controller() -> Result<AbortController, McpError> {
    AbortController::new().map_err(|e| McpError::Unreachable(js_to_error(e).message))
}

/// Every configured server: the extension's, then the user's.
#[derive(Default)]
pub struct McpServers {
    servers: RefCell<Vec<Rc<Server>>>,
}

impl McpServers {
    pub fn new(configs: Vec<(ServerConfig, McpServerOrigin)>) -> Self {
        let servers = McpServers::default();
        for (config, origin) in configs {
            servers.add(config, origin);
        }
        servers
    }

    /// The server of that name.
    pub fn get(&self, name: &str) -> Option<Rc<Server>> {
        self.servers
            .borrow()
            .iter()
            .find(|s| s.config.name == name)
            .cloned()
    }

    /// Every server now.
    pub fn all(&self) -> Vec<Rc<Server>> {
        self.servers.borrow().clone()
    }

    /// The servers that use `server`'s sign-in (itself among them if it
    /// takes one; an entry with its own `Authorization` uses none).
    pub fn sharing_grant(&self, server: &Server) -> Vec<Rc<Server>> {
        self.servers
            .borrow()
            .iter()
            .filter(|s| s.shares_grant_with(server) && s.takes_grant())
            .cloned()
            .collect()
    }

    /// Whether `server` is still one of them (not removed meanwhile).
    pub fn holds(&self, server: &Rc<Server>) -> bool {
        self.servers.borrow().iter().any(|s| Rc::ptr_eq(s, server))
    }

    /// Set up a new server (sharing the sign-in of any server at the same
    /// address).
    pub fn add(&self, config: ServerConfig, added_by: McpServerOrigin) -> Rc<Server> {
        let grant = self
            .servers
            .borrow()
            .iter()
            .find(|s| s.config.url == config.url)
            .map(|s| s.grant.clone())
            .unwrap_or_else(|| Rc::new(GrantSlot::new(&config.url)));
        let server = Rc::new(Server::new(config, added_by, grant));
        self.servers.borrow_mut().push(server.clone());
        server
    }

    /// Forget `server` (its session ends with it; its address's sign-in
    /// with it if no other server uses the address).
    pub fn remove(&self, server: &Rc<Server>) {
        let mut servers = self.servers.borrow_mut();
        let Some(at) = servers.iter().position(|s| Rc::ptr_eq(s, server)) else {
            return;
        };
        let server = servers.remove(at);
        // Its stream closed; nothing it announces is acted on.
        server.stop_following();
        if !servers.iter().any(|s| s.shares_grant_with(&server)) {
            server.grant.retire();
        }
    }

    /// Read the kept sign-ins of every server that takes one and has not
    /// read it yet, in one storage read (a server's first request would
    /// otherwise read its own).
    pub async fn load_grants(&self) {
        let mut slots: Vec<Rc<GrantSlot>> = Vec::new();
        for server in self.servers.borrow().iter() {
            let slot = &server.grant;
            if server.takes_grant()
                && !slot.loaded.get()
                && !slots.iter().any(|s| Rc::ptr_eq(s, slot))
            {
                slots.push(slot.clone());
            }
        }
        if slots.is_empty() {
            return;
        }
        let urls: Vec<&str> = slots.iter().map(|s| s.url.as_str()).collect();
        // Storage that cannot be read: each server reads its own at its
        // first request.
        if let Ok(kept) = super::oauth::load_grants(&urls).await {
            for (slot, grant) in slots.iter().zip(kept) {
                slot.loaded_from(grant);
            }
        }
    }
}
