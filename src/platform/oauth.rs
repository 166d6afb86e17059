//! Signing in to an MCP server (`crate::oauth` is the half without IO):
//! the metadata requests, the client registration, the sign-in window
//! (`chrome.identity.launchWebAuthFlow`), the token requests, and the grant
//! kept in `chrome.storage.local` under the server's address.
//!
//! Must not: send a token anywhere but to the server it was given for, or
//! keep a grant the user did not complete a sign-in for.

use gloo_timers::callback::Timeout;
use serde_json::Value;
use wasm_bindgen::JsValue;
use web_sys::AbortController;

use super::{chrome, fetch};
use crate::mcp::ServerConfig;
use crate::oauth::{
    self, AuthServer, Authorization, Grant, KeptClient, OAuthError, ResourceMetadata,
};

/// How long one metadata, registration or token request may take.
const REQUEST_TIMEOUT_MS: u32 = 30_000;

/// The longest answer read from a metadata, registration or token
/// endpoint (1 MiB: each is a small JSON document).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The path of the extension's redirect address for sign-ins.
const REDIRECT_PATH: &str = "mcp-sign-in";

/// One request and its answer's status and text, given up after
/// `REQUEST_TIMEOUT_MS`; a redirect is an error (the body may carry a
/// secret), an answer past `MAX_ANSWER_BYTES` too.
async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let controller = AbortController::new().map_err(|_| "no AbortController".to_string())?;
    let aborter = controller.clone();
    let _deadline = Timeout::new(REQUEST_TIMEOUT_MS, move || aborter.abort());
    let body = body.map(JsValue::from_str);
    let response = fetch::open_without_redirects(method, url, headers, body.as_ref(), &controller)
        .await
        .map_err(|e| e.message)?;
    let status = response.status;
    let text = response
        .text_within(MAX_ANSWER_BYTES)
        .await
        .map_err(|e| e.message)?;
    Ok((status, text))
}

/// GET a JSON document (2xx with a JSON object, else why not).
async fn get_json(url: &str) -> Result<Value, String> {
    let (status, text) = request(
        "GET",
        url,
        &[
            ("accept", "application/json"),
            ("mcp-protocol-version", crate::mcp::PROTOCOL_VERSION),
        ],
        None,
    )
    .await?;
    if !(200..300).contains(&status) {
        return Err(format!("{url} answered HTTP {status}"));
    }
    serde_json::from_str::<Value>(&text)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| format!("{url} did not answer a JSON object"))
}

/// Sign in to `server`: its metadata (from the 401's `challenge` when it
/// named it), the authorization server's, the client this extension is
/// there (`oauth::choose_client`), the sign-in window, then the code
/// exchanged for tokens.
pub async fn sign_in(
    server: &ServerConfig,
    challenge: Option<&str>,
    now: impl Fn() -> u64,
) -> Result<Grant, OAuthError> {
    // A token goes with every message to the server: never in clear text
    // over the network.
    if !oauth::is_secure_url(&server.url) {
        return Err(OAuthError::Insecure(server.url.clone()));
    }
    let metadata_urls = oauth::resource_metadata_urls(challenge, &server.url);
    if metadata_urls.is_empty() {
        return Err(OAuthError::Discovery(format!(
            "{} is not an http(s) address",
            server.url
        )));
    }
    let resource = first_document(&metadata_urls, |value| {
        ResourceMetadata::parse(value, &server.url)
    })
    .await?;
    let auth_server = first_document(
        &oauth::auth_server_metadata_urls(&resource.issuer),
        |value| AuthServer::parse(value, &resource.issuer),
    )
    .await?;
    let redirect =
        chrome::redirect_url(REDIRECT_PATH).map_err(|e| OAuthError::Denied(e.message))?;
    let choice = oauth::choose_client(&server.oauth, &auth_server, &redirect)?;
    // A client registered on request is kept under the sign-in server's
    // token endpoint (which a grant names too) and used again, else a new
    // one is registered (kept at once: a sign-in denied now still has it
    // for the next). A client id given with the server, or a metadata
    // document's address, is used as it is.
    let issuer_key = auth_server.token_endpoint.as_str();
    let (client_id, registered_before) = match choice {
        oauth::ClientChoice::Given(id) | oauth::ClientChoice::MetadataDocument(id) => {
            (id.to_string(), false)
        }
        oauth::ClientChoice::Register(endpoint) => match load_client(issuer_key, &redirect).await {
            Some(client) => (client.client_id, true),
            None => {
                let client_id = register(endpoint, &redirect).await?;
                let client = KeptClient {
                    client_id: client_id.clone(),
                    redirect_uri: redirect.clone(),
                };
                keep_client(issuer_key, Some(&client)).await;
                (client_id, false)
            }
        },
    };
    let result = authorize(
        server,
        challenge,
        &resource,
        &auth_server,
        &client_id,
        &redirect,
        now,
    )
    .await;
    // The server refused the client: its sign-in page cannot be shown
    // (Chrome: "Authorization page could not be loaded"), or it says so. A
    // kept client it no longer knows is forgotten (the next sign-in
    // registers a new one); a given id or a document is named. A window
    // the user closed says nothing of the client.
    match result {
        Err(e) if e.blames_client() || e.page_not_shown() => {
            let fresh = matches!(choice, oauth::ClientChoice::Register(_)) && !registered_before;
            if registered_before {
                keep_client(issuer_key, None).await;
            }
            if fresh {
                Err(e)
            } else {
                Err(e.with_note(&choice.refused_note()))
            }
        }
        other => other,
    }
}

/// The first of `urls` that answers a JSON object, checked by `parse`
/// (a document that does not say what it must is an error, not a reason
/// to try the next address); why each failed when none answered.
async fn first_document<T>(
    urls: &[String],
    parse: impl Fn(&Value) -> Result<T, OAuthError>,
) -> Result<T, OAuthError> {
    let mut tried = Vec::new();
    for url in urls {
        match get_json(url).await {
            Ok(value) => return parse(&value),
            Err(why) => tried.push(why),
        }
    }
    Err(OAuthError::Discovery(tried.join("; ")))
}

/// Forget the client kept for the authorization server whose token
/// endpoint is `token_endpoint` if it is `client_id` (that server refused
/// a renewal for it; a client id given with a server is not one kept).
pub async fn forget_client(token_endpoint: &str, client_id: &str) {
    let Ok(redirect) = chrome::redirect_url(REDIRECT_PATH) else {
        return;
    };
    let kept = load_client(token_endpoint, &redirect).await;
    if kept.is_some_and(|client| client.client_id == client_id) {
        keep_client(token_endpoint, None).await;
    }
}

/// Register this extension as a public client (RFC 7591): its client id.
async fn register(registration: &str, redirect: &str) -> Result<String, OAuthError> {
    let (status, text) = request(
        "POST",
        registration,
        &[
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ],
        Some(&oauth::registration_body(redirect)),
    )
    .await
    .map_err(OAuthError::Registration)?;
    if !(200..300).contains(&status) {
        return Err(OAuthError::Registration(format!(
            "HTTP {status}: {}",
            text.chars().take(300).collect::<String>()
        )));
    }
    oauth::client_id(&serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The sign-in window with `client_id`, then its code exchanged.
async fn authorize(
    server: &ServerConfig,
    challenge: Option<&str>,
    resource: &ResourceMetadata,
    auth_server: &AuthServer,
    client_id: &str,
    redirect: &str,
    now: impl Fn() -> u64,
) -> Result<Grant, OAuthError> {
    let mut random = [0u8; 48];
    getrandom::fill(&mut random).map_err(|e| OAuthError::Denied(format!("no randomness: {e}")))?;
    let (verifier, challenge_s256) = oauth::pkce(random[..32].try_into().expect("32 bytes"));
    let state = oauth::base64url(&random[32..]);
    let url = Authorization {
        endpoint: &auth_server.authorization_endpoint,
        client_id,
        redirect_uri: redirect,
        challenge: &challenge_s256,
        state: &state,
        resource: &server.url,
        scopes: &resource.scopes_to_ask(challenge),
    }
    .url();
    let back = chrome::launch_web_auth_flow(&url)
        .await
        .map_err(|e| OAuthError::WindowClosed(e.message))?;
    let code = oauth::code_from_redirect(&back, &state, auth_server)?;
    let body = oauth::code_request(&code, &verifier, client_id, redirect, &server.url);
    let tokens = token_request(&auth_server.token_endpoint, &body).await?;
    Grant::from_tokens(
        &tokens,
        now(),
        &server.url,
        &auth_server.token_endpoint,
        client_id,
        None,
    )
}

/// Renew `grant` with its refresh token (none: the user signs in again).
pub async fn refresh(grant: &Grant, now: u64) -> Result<Grant, OAuthError> {
    let body = oauth::refresh_request(grant)
        .ok_or_else(|| OAuthError::Token("the sign-in has no refresh token".into()))?;
    let tokens = token_request(&grant.token_endpoint, &body).await?;
    Grant::from_tokens(
        &tokens,
        now,
        &grant.server_url,
        &grant.token_endpoint,
        &grant.client_id,
        Some(grant),
    )
}

async fn token_request(endpoint: &str, body: &str) -> Result<Value, OAuthError> {
    let (status, text) = request(
        "POST",
        endpoint,
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("accept", "application/json"),
        ],
        Some(body),
    )
    .await
    .map_err(OAuthError::Unreachable)?;
    // The server's trouble (5xx, too many requests, a timeout) is no
    // refusal: a kept grant stays for the next try.
    if status >= 500 || status == 408 || status == 429 {
        return Err(OAuthError::Unreachable(format!("HTTP {status}")));
    }
    if !(200..300).contains(&status) {
        return Err(oauth::token_error(status, &text));
    }
    serde_json::from_str(&text)
        .map_err(|_| OAuthError::Unreachable("the answer is not JSON".into()))
}

/// The grant kept for the server at `url`, if any (one kept for another
/// address is not used); an error when storage could not be read.
pub async fn load_grant(url: &str) -> Result<Option<Grant>, String> {
    let value = chrome::load_local(&oauth::grant_key(url))
        .await
        .map_err(|e| e.message)?;
    Ok(Grant::from_json(&value, url))
}

/// The grants kept for the servers at `urls`, in one read.
pub async fn load_grants(urls: &[&str]) -> Result<Vec<Option<Grant>>, String> {
    let keys: Vec<String> = urls.iter().map(|url| oauth::grant_key(url)).collect();
    let values = chrome::load_locals(&keys).await.map_err(|e| e.message)?;
    Ok(values
        .iter()
        .zip(urls)
        .map(|(value, url)| Grant::from_json(value, url))
        .collect())
}

/// Keep `grant` for its server, or forget the server's (None).
pub async fn keep_grant(url: &str, grant: Option<&Grant>) {
    let what = format!("the sign-in for {url}");
    keep_or_forget(&oauth::grant_key(url), grant.map(Grant::to_json), &what).await;
}

/// Forget the grants of addresses no server of `servers` (read when the
/// keys are, so one added meanwhile keeps its sign-in) has.
pub async fn forget_orphan_grants(servers: &super::mcp::McpServers) {
    let keys = match chrome::local_keys().await {
        Ok(keys) => keys,
        Err(e) => {
            return super::console_error(&format!(
                "sign-ins of removed MCP servers were not looked for: {}",
                e.message
            ));
        }
    };
    let all = servers.all();
    let in_use: Vec<&str> = all.iter().map(|s| s.config.url.as_str()).collect();
    for key in oauth::orphan_grant_keys(&keys, &in_use) {
        if let Err(e) = chrome::remove_local(key).await {
            super::console_error(&format!("{key} was not forgotten: {}", e.message));
        }
    }
}

/// Store `value` under `key` in `chrome.storage.local`, or remove the key
/// (None); a failure is named in the console as `what`.
async fn keep_or_forget(key: &str, value: Option<Value>, what: &str) {
    let kept = match value {
        Some(value) => chrome::store_local(key, &value).await,
        None => chrome::remove_local(key).await,
    };
    if let Err(e) = kept {
        super::console_error(&format!("{what} was not kept: {}", e.message));
    }
}

/// The client kept for the authorization server of `token_endpoint`
/// (registered for `redirect`).
async fn load_client(token_endpoint: &str, redirect: &str) -> Option<KeptClient> {
    let value = chrome::load_local(&oauth::client_key(token_endpoint))
        .await
        .ok()?;
    KeptClient::from_json(&value, redirect)
}

/// Keep the client registered with the authorization server of
/// `token_endpoint`, or forget it (None).
async fn keep_client(token_endpoint: &str, client: Option<&KeptClient>) {
    let what = format!("the client registered for {token_endpoint}");
    keep_or_forget(
        &oauth::client_key(token_endpoint),
        client.map(KeptClient::to_json),
        &what,
    )
    .await;
}
