//! Signing in to an MCP server that asks for it (MCP authorization,
//! revision 2025-06-18): OAuth 2.1's authorization code grant with PKCE,
//! the half without IO (`crate::platform::oauth` does the requests and
//! opens the sign-in window).
//!
//! Owns: where the server's protected resource metadata is (RFC 9728: the
//! `resource_metadata` of its `WWW-Authenticate` challenge, else the
//! well-known addresses with its path, then at its root), the
//! authorization server's metadata addresses (RFC 8414, then OpenID
//! discovery) and what they must say (the issuer they were asked for,
//! S256 PKCE, endpoints over https or on this machine), the scopes to ask
//! for (the challenge's, else the metadata's; a 403 `insufficient_scope`
//! names more), the dynamic client registration body (RFC 7591), the PKCE
//! verifier and challenge, the authorization address (with `state` and
//! the `resource` indicator, RFC 8707), the code read back from the
//! redirect (its `state`, and its issuer: RFC 9207), the token requests
//! and answers, and the grant kept in `chrome.storage.local`.
//!
//! Must not: send anything, or accept a token for another server: every
//! request names the MCP server as the `resource`, and a grant is kept
//! under the server's address.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The client name a server's registration shows the user.
pub const CLIENT_NAME: &str = "SW Agent";

/// Where grants are kept in `chrome.storage.local`: this prefix and the
/// MCP server's address.
pub const GRANT_KEY_PREFIX: &str = "mcpGrant:";

/// An access token this close to its end is renewed before it is used.
pub const EXPIRY_MARGIN_MS: u64 = 30_000;

/// What went wrong signing in, in words for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OAuthError {
    /// A metadata document could not be read or does not say what it must.
    Discovery(String),
    /// An endpoint is neither https nor on this machine.
    Insecure(String),
    /// The server registers no clients (no `registration_endpoint`) and
    /// the server's entry gives no client id (nor a metadata document it
    /// takes: `metadata_url_refused` when the entry gives one), so this
    /// extension has no client id for it.
    NoRegistration {
        redirect: String,
        metadata_url_refused: bool,
    },
    /// Registering the client failed.
    Registration(String),
    /// The server refused (its answer to the sign-in window).
    Denied(String),
    /// The sign-in window closed (by the user, or a page that could not
    /// be shown) without coming back.
    WindowClosed(String),
    /// The redirect did not carry the `state` sent.
    StateMismatch,
    /// The redirect named another issuer than the one asked, or none where
    /// the issuer says it always does (RFC 9207: a mix-up).
    IssuerMismatch(String),
    /// The token endpoint refused or answered something else.
    Token(String),
    /// The token endpoint could not be reached (the grant is kept).
    Unreachable(String),
}

impl OAuthError {
    /// The server refused the client itself (RFC 6749 `invalid_client` or
    /// `unauthorized_client`): a kept client it no longer knows.
    pub fn blames_client(&self) -> bool {
        let why = match self {
            OAuthError::Denied(why) | OAuthError::Token(why) => why,
            _ => return false,
        };
        ["invalid_client", "unauthorized_client"]
            .iter()
            .any(|code| why.split([' ', ',', ':']).any(|word| word == *code))
    }

    /// The sign-in window failed to show the server's page (Chrome's
    /// "Authorization page could not be loaded"), as for a client the
    /// server does not know; not a window the user closed.
    pub fn page_not_shown(&self) -> bool {
        matches!(self, OAuthError::WindowClosed(why) if why.contains("could not be loaded"))
    }

    /// The same error with a sentence for the user after its reason.
    pub fn with_note(self, note: &str) -> Self {
        let join = |why: String| format!("{}; {note}", why.trim_end_matches('.'));
        match self {
            OAuthError::Denied(why) => OAuthError::Denied(join(why)),
            OAuthError::WindowClosed(why) => OAuthError::WindowClosed(join(why)),
            OAuthError::Token(why) => OAuthError::Token(join(why)),
            other => other,
        }
    }

    pub fn describe(&self, server: &str) -> String {
        let why = match self {
            OAuthError::Discovery(why) => format!("its sign-in could not be found ({why})"),
            OAuthError::Insecure(url) => {
                format!("its sign-in address {url} is not https (only this machine may use http)")
            }
            OAuthError::NoRegistration {
                redirect,
                metadata_url_refused,
            } => format!(
                "its sign-in server registers no new clients{}, so this extension has no client id for it (a client registered there for the redirect {redirect} can be given with the server: Settings' Sign-in client id for a server you added, oauth.clientId in the extension's MCP_SERVERS)",
                if *metadata_url_refused {
                    " and takes no client metadata document"
                } else {
                    ""
                },
            ),
            OAuthError::Registration(why) => format!("this extension could not register with its sign-in server ({why})"),
            OAuthError::Denied(why) | OAuthError::WindowClosed(why) => {
                format!("the sign-in did not complete ({why})")
            }
            OAuthError::StateMismatch => {
                "the sign-in answer did not belong to this sign-in (its state differed); nothing was kept".into()
            }
            OAuthError::IssuerMismatch(why) => format!(
                "the sign-in answer did not come from its sign-in server ({why}); nothing was kept"
            ),
            OAuthError::Token(why) => format!("its sign-in server gave no token ({why})"),
            OAuthError::Unreachable(why) => format!("its sign-in server could not be reached ({why})"),
        };
        format!("Signing in to the MCP server \"{server}\" failed: {why}.")
    }
}

/// `scheme://authority` and the path (without query or fragment) of an
/// http(s) URL.
fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let scheme_len = url.len() - rest.len();
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if authority_end == 0 {
        return None;
    }
    let origin = &url[..scheme_len + authority_end];
    let after = &rest[authority_end..];
    let path_end = after.find(['?', '#']).unwrap_or(after.len());
    Some((origin, &after[..path_end]))
}

/// https, or http to this machine (a server under development). An
/// address with a backslash, a space or a control character is refused
/// whatever its scheme: the browser reads those differently (a `\` ends
/// the host there) than a plain split does.
pub fn is_secure_url(url: &str) -> bool {
    if url
        .chars()
        .any(|c| c == '\\' || c.is_whitespace() || c.is_control())
    {
        return false;
    }
    if url.starts_with("https://") {
        return split_url(url).is_some();
    }
    let Some((origin, _)) = split_url(url) else {
        return false;
    };
    let host = origin.trim_start_matches("http://");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split_once(']').map_or(host, |(h, _)| &h[1..])
    } else {
        host.split(':').next().unwrap_or(host)
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

/// Where the server's protected resource metadata may be, in the order to
/// try: the `resource_metadata` of its `WWW-Authenticate` challenge when it
/// names one, else the well-known addresses for its URL (RFC 9728 §3.1:
/// with the URL's path, then at the root of its origin). Empty for an
/// address that is not http(s).
pub fn resource_metadata_urls(www_authenticate: Option<&str>, server_url: &str) -> Vec<String> {
    // Only an https address (or one on this machine) is taken from the
    // challenge; anything else is ignored for the well-known addresses.
    if let Some(url) = www_authenticate
        .and_then(|h| challenge_param(h, "resource_metadata"))
        .filter(|url| is_secure_url(url))
    {
        return vec![url];
    }
    let Some((origin, path)) = split_url(server_url) else {
        return Vec::new();
    };
    let path = path.trim_end_matches('/');
    let root = format!("{origin}/.well-known/oauth-protected-resource");
    if path.is_empty() {
        vec![root]
    } else {
        vec![format!("{root}{path}"), root]
    }
}

/// The scopes a challenge asks for (its `scope`, RFC 6750 §3), if any.
/// Only scope tokens as RFC 6749 §3.3 spells them, at most
/// `MAX_CHALLENGE_SCOPES` of at most 100 characters each: the server's
/// words reach the sign-in address, the model and Settings.
pub fn challenge_scopes(www_authenticate: Option<&str>) -> Option<Vec<String>> {
    let scope = challenge_param(www_authenticate?, "scope")?;
    let scopes: Vec<String> = scope
        .split(' ')
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 100
                && s.bytes()
                    .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
        })
        .take(MAX_CHALLENGE_SCOPES)
        .map(str::to_string)
        .collect();
    (!scopes.is_empty()).then_some(scopes)
}

/// The most scopes taken from a challenge.
pub const MAX_CHALLENGE_SCOPES: usize = 20;

/// The challenge of a 403 says the token lacks a scope (RFC 6750 §3.1
/// `insufficient_scope`): signing in again for it may help.
pub fn is_insufficient_scope(www_authenticate: &str) -> bool {
    challenge_param(www_authenticate, "error").as_deref() == Some("insufficient_scope")
}

/// A parameter of a `WWW-Authenticate` challenge (quoted or not).
pub fn challenge_param(header: &str, name: &str) -> Option<String> {
    let lower = header.to_ascii_lowercase();
    let mut from = 0;
    while let Some(found) = lower[from..].find(name) {
        let at = from + found;
        from = at + name.len();
        let before = lower[..at].trim_end();
        if !(before.is_empty() || before.ends_with(',') || before.ends_with("bearer")) {
            continue;
        }
        let rest = header[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let rest = rest.trim_start();
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.chars();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
            value
        } else {
            rest.split([',', ' ']).next().unwrap_or("").to_string()
        };
        return (!value.is_empty()).then_some(value);
    }
    None
}

/// What the server's protected resource metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceMetadata {
    /// The first authorization server it names (the issuer).
    pub issuer: String,
    /// The scopes it names (`scopes_supported`).
    pub scopes: Vec<String>,
}

impl ResourceMetadata {
    /// The scopes a sign-in asks for: the challenge's, when the server's
    /// 401 or 403 named them, else every scope the metadata names (none:
    /// no `scope` is sent). MCP authorization's scope selection.
    pub fn scopes_to_ask(&self, challenge: Option<&str>) -> Vec<String> {
        challenge_scopes(challenge).unwrap_or_else(|| self.scopes.clone())
    }
}

impl ResourceMetadata {
    /// Checks the document against the server it was fetched for.
    pub fn parse(value: &Value, server_url: &str) -> Result<Self, OAuthError> {
        if let Some(resource) = value.get("resource") {
            let resource = resource.as_str().unwrap_or("");
            if !covers(resource, server_url) {
                return Err(OAuthError::Discovery(format!(
                    "its metadata is for {resource:?}, not for {server_url}"
                )));
            }
        }
        let issuer = value
            .get("authorization_servers")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find_map(Value::as_str))
            .ok_or_else(|| {
                OAuthError::Discovery("its metadata names no authorization server".into())
            })?
            .to_string();
        if !is_secure_url(&issuer) {
            return Err(OAuthError::Insecure(issuer));
        }
        let scopes = value
            .get("scopes_supported")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .filter(|s| !s.is_empty() && !s.contains(' '))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(ResourceMetadata { issuer, scopes })
    }
}

/// The protected resource `resource` is the server at `server_url` or a
/// part of its origin above it (metadata at the origin's root names the
/// origin, RFC 9728 §3.3): same origin, and the server's path is the
/// resource's or under it.
fn covers(resource: &str, server_url: &str) -> bool {
    let (Some((origin, path)), Some((server_origin, server_path))) =
        (split_url(resource), split_url(server_url))
    else {
        return false;
    };
    let path = path.trim_end_matches('/');
    let server_path = server_path.trim_end_matches('/');
    origin.eq_ignore_ascii_case(server_origin)
        && (server_path == path
            || server_path
                .strip_prefix(path)
                .is_some_and(|rest| rest.starts_with('/')))
}

/// Where an issuer's metadata may be, in the order to try (RFC 8414 §3.1,
/// then OpenID Connect discovery).
pub fn auth_server_metadata_urls(issuer: &str) -> Vec<String> {
    let Some((origin, path)) = split_url(issuer) else {
        return Vec::new();
    };
    let path = path.trim_end_matches('/');
    let mut urls = vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}/.well-known/openid-configuration{path}"),
    ];
    if !path.is_empty() {
        urls.push(format!("{origin}{path}/.well-known/openid-configuration"));
    }
    urls
}

/// The authorization server's endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthServer {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub registration_endpoint: Option<String>,
    /// It reads client ID metadata documents
    /// (`client_id_metadata_document_supported`).
    pub takes_client_metadata: bool,
    /// The redirect back always names the issuer
    /// (`authorization_response_iss_parameter_supported`, RFC 9207).
    pub names_issuer: bool,
}

impl AuthServer {
    /// Checks the metadata of `issuer`: the same issuer (RFC 8414 §3.3),
    /// S256 among the PKCE methods it lists, every endpoint https or on
    /// this machine. The same checks for OpenID Connect discovery's
    /// metadata (the fallback of [`auth_server_metadata_urls`]).
    pub fn parse(value: &Value, issuer: &str) -> Result<Self, OAuthError> {
        let said = value.get("issuer").and_then(Value::as_str).unwrap_or("");
        if said.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(OAuthError::Discovery(format!(
                "the authorization server's metadata names the issuer {said:?}, not {issuer}"
            )));
        }
        // Decision (MCP authorization, 2025-11-25): metadata without
        // `code_challenge_methods_supported` cannot confirm PKCE, and the
        // client must then refuse to go on, rather than send a sign-in
        // whose code anyone who sees the redirect could exchange. OpenID
        // Connect discovery does not define the field, but MCP asks a
        // server found that way to list it too, so the same applies there.
        let Some(methods) = value.get("code_challenge_methods_supported") else {
            return Err(OAuthError::Discovery(
                "the authorization server's metadata lists no code_challenge_methods_supported: its support of PKCE cannot be confirmed".into(),
            ));
        };
        let offers_s256 = methods
            .as_array()
            .is_some_and(|methods| methods.iter().any(|m| m.as_str() == Some("S256")));
        if !offers_s256 {
            return Err(OAuthError::Discovery(
                "the authorization server does not offer S256 PKCE".into(),
            ));
        }
        let endpoint = |name: &str| -> Result<Option<String>, OAuthError> {
            match value.get(name).and_then(Value::as_str) {
                None => Ok(None),
                Some(url) if is_secure_url(url) => Ok(Some(url.to_string())),
                Some(url) => Err(OAuthError::Insecure(url.to_string())),
            }
        };
        let required = |name: &str| {
            endpoint(name)?.ok_or_else(|| {
                OAuthError::Discovery(format!("the authorization server's metadata has no {name}"))
            })
        };
        Ok(AuthServer {
            // As the metadata spells it: RFC 9207 compares `iss` with it.
            issuer: said.to_string(),
            authorization_endpoint: required("authorization_endpoint")?,
            token_endpoint: required("token_endpoint")?,
            registration_endpoint: endpoint("registration_endpoint")?,
            takes_client_metadata: value
                .get("client_id_metadata_document_supported")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            names_issuer: value
                .get("authorization_response_iss_parameter_supported")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }
}

/// The dynamic client registration request (RFC 7591): a public client
/// (no secret) that comes back to `redirect_uri`.
pub fn registration_body(redirect_uri: &str) -> String {
    json!({
        "client_name": CLIENT_NAME,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })
    .to_string()
}

/// The client id a registration answered.
pub fn client_id(value: &Value) -> Result<String, OAuthError> {
    value
        .get("client_id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .ok_or_else(|| OAuthError::Registration("the answer has no client_id".into()))
}

/// Base64url without padding (RFC 7636 appendix A).
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        let digits = chunk.len() + 1;
        for i in 0..digits {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// A PKCE verifier made of `random` and its S256 challenge.
pub fn pkce(random: &[u8; 32]) -> (String, String) {
    let verifier = base64url(random);
    let challenge = base64url(&Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `application/x-www-form-urlencoded` pairs.
pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// What the sign-in window is opened at.
pub struct Authorization<'a> {
    pub endpoint: &'a str,
    pub client_id: &'a str,
    pub redirect_uri: &'a str,
    pub challenge: &'a str,
    pub state: &'a str,
    /// The MCP server's address (RFC 8707 `resource`).
    pub resource: &'a str,
    pub scopes: &'a [String],
}

impl Authorization<'_> {
    pub fn url(&self) -> String {
        let scope = self.scopes.join(" ");
        let mut pairs = vec![
            ("response_type", "code"),
            ("client_id", self.client_id),
            ("redirect_uri", self.redirect_uri),
            ("code_challenge", self.challenge),
            ("code_challenge_method", "S256"),
            ("state", self.state),
            ("resource", self.resource),
        ];
        if !scope.is_empty() {
            pairs.push(("scope", &scope));
        }
        let joiner = if self.endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{joiner}{}", self.endpoint, form(&pairs))
    }
}

/// The code in the address the sign-in window came back to, if it carries
/// the `state` sent and comes from `server`'s issuer (RFC 9207: an `iss`
/// must be that issuer, and is required when the server says it always
/// sends one); the server's refusal otherwise.
pub fn code_from_redirect(
    url: &str,
    state: &str,
    server: &AuthServer,
) -> Result<String, OAuthError> {
    let query = url
        .split_once('?')
        .map(|(_, q)| q.split('#').next().unwrap_or(q))
        .unwrap_or("");
    let pairs: Vec<(String, String)> = query
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (!k.is_empty()).then(|| (percent_decode(k), percent_decode(v)))
        })
        .collect();
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if get("state").as_deref() != Some(state) {
        return Err(OAuthError::StateMismatch);
    }
    match get("iss") {
        Some(iss) if iss != server.issuer => {
            return Err(OAuthError::IssuerMismatch(format!(
                "it names the issuer {iss:?}, not {}",
                server.issuer
            )))
        }
        None if server.names_issuer => {
            return Err(OAuthError::IssuerMismatch(format!(
                "it names no issuer, though {} always does",
                server.issuer
            )))
        }
        _ => {}
    }
    if let Some(error) = get("error") {
        let description = get("error_description").unwrap_or_default();
        let why = if description.is_empty() {
            error
        } else {
            format!("{error}: {description}")
        };
        return Err(OAuthError::Denied(why));
    }
    get("code")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| OAuthError::Denied("the answer carried no code".into()))
}

/// The token request for a code.
pub fn code_request(
    code: &str,
    verifier: &str,
    client_id: &str,
    redirect_uri: &str,
    resource: &str,
) -> String {
    form(&[
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect_uri),
        ("client_id", client_id),
        ("code_verifier", verifier),
        ("resource", resource),
    ])
}

/// The token request that renews a grant.
pub fn refresh_request(grant: &Grant) -> Option<String> {
    let refresh = grant.refresh_token.as_deref()?;
    Some(form(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh),
        ("client_id", &grant.client_id),
        ("resource", &grant.server_url),
    ]))
}

/// Why the token endpoint refused (RFC 6749 §5.2), or what it said.
pub fn token_error(status: u16, body: &str) -> OAuthError {
    let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = value.get("error").and_then(Value::as_str);
    let description = value.get("error_description").and_then(Value::as_str);
    OAuthError::Token(match (error, description) {
        (Some(e), Some(d)) => format!("HTTP {status}, {e}: {d}"),
        (Some(e), None) => format!("HTTP {status}, {e}"),
        _ => format!("HTTP {status}"),
    })
}

/// A sign-in kept for one MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The MCP server's address (the `resource` of every request).
    pub server_url: String,
    pub token_endpoint: String,
    pub client_id: String,
    pub access_token: String,
    pub refresh_token: Option<String>,
    /// When the access token ends (ms), if the server said.
    pub expires_at: Option<u64>,
}

impl Grant {
    /// The grant a token answer makes (`previous`: the grant it renews,
    /// whose refresh token stays when the answer has none).
    pub fn from_tokens(
        value: &Value,
        now: u64,
        server_url: &str,
        token_endpoint: &str,
        client_id: &str,
        previous: Option<&Grant>,
    ) -> Result<Grant, OAuthError> {
        let access_token = value
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| OAuthError::Token("the answer has no access_token".into()))?;
        let token_type = value
            .get("token_type")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !token_type.eq_ignore_ascii_case("bearer") {
            return Err(OAuthError::Token(format!(
                "the token type is {token_type:?}, not Bearer"
            )));
        }
        let expires_at = value
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|s| now.saturating_add(s.saturating_mul(1000)));
        let refresh_token = value
            .get("refresh_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .or_else(|| previous.and_then(|p| p.refresh_token.clone()));
        Ok(Grant {
            server_url: server_url.to_string(),
            token_endpoint: token_endpoint.to_string(),
            client_id: client_id.to_string(),
            access_token: access_token.to_string(),
            refresh_token,
            expires_at,
        })
    }

    /// Whether the access token should be renewed before it is used.
    pub fn expiring(&self, now: u64) -> bool {
        self.expires_at
            .is_some_and(|at| at <= now.saturating_add(EXPIRY_MARGIN_MS))
    }

    pub fn to_json(&self) -> Value {
        json!({
            "serverUrl": self.server_url,
            "tokenEndpoint": self.token_endpoint,
            "clientId": self.client_id,
            "accessToken": self.access_token,
            "refreshToken": self.refresh_token,
            "expiresAt": self.expires_at,
        })
    }

    /// A kept grant, if it is one for `server_url` (anything else is
    /// dropped: the user signs in again).
    pub fn from_json(value: &Value, server_url: &str) -> Option<Grant> {
        let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
        let grant = Grant {
            server_url: text("serverUrl")?,
            token_endpoint: text("tokenEndpoint")?,
            client_id: text("clientId")?,
            access_token: text("accessToken")?,
            refresh_token: text("refreshToken"),
            expires_at: value.get("expiresAt").and_then(Value::as_u64),
        };
        (grant.server_url == server_url
            && is_secure_url(&grant.token_endpoint)
            && !grant.access_token.is_empty())
        .then_some(grant)
    }
}

/// The `chrome.storage.local` key of a server's grant.
pub fn grant_key(server_url: &str) -> String {
    format!("{GRANT_KEY_PREFIX}{server_url}")
}

/// Of `keys` (all of `chrome.storage.local`'s), the grants of addresses
/// no server in `in_use` has: a server the extension stopped naming (an
/// update) or that left the user's list while no worker ran. Its sign-in
/// can no longer be reached from Settings to sign out, so it is forgotten.
pub fn orphan_grant_keys<'a>(keys: &'a [String], in_use: &[&str]) -> Vec<&'a str> {
    keys.iter()
        .filter_map(|key| {
            let url = key.strip_prefix(GRANT_KEY_PREFIX)?;
            (!in_use.contains(&url)).then_some(key.as_str())
        })
        .collect()
}

/// Where the client this extension registered with an authorization
/// server is kept: this prefix and the server's token endpoint (which a
/// grant names, so a renewal refused for the client can forget it).
pub const CLIENT_KEY_PREFIX: &str = "mcpClient:";

pub fn client_key(token_endpoint: &str) -> String {
    format!("{CLIENT_KEY_PREFIX}{token_endpoint}")
}

/// The client registered with an authorization server, kept so that the
/// next sign-in there uses it instead of registering another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptClient {
    pub client_id: String,
    /// The redirect address it was registered with (another one, say of a
    /// reinstalled extension, needs a new client).
    pub redirect_uri: String,
}

impl KeptClient {
    pub fn to_json(&self) -> Value {
        json!({ "clientId": self.client_id, "redirectUri": self.redirect_uri })
    }

    /// The kept client, if it was registered for `redirect_uri`.
    pub fn from_json(value: &Value, redirect_uri: &str) -> Option<KeptClient> {
        let text = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let client = KeptClient {
            client_id: text("clientId")?.to_string(),
            redirect_uri: text("redirectUri")?.to_string(),
        };
        (client.redirect_uri == redirect_uri).then_some(client)
    }
}

/// How this extension names itself to a server's sign-in server when that
/// server registers no clients on request (MCP revision 2025-11-25's
/// order: a client id given beforehand, else a client ID metadata
/// document if the sign-in server takes one, else dynamic registration).
/// From an MCP server's entry (`oauth: { clientId, clientMetadataUrl }`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientConfig {
    /// A public client registered beforehand with the sign-in server, for
    /// this extension's redirect address.
    pub client_id: Option<String>,
    /// The https address of a client ID metadata document (its address is
    /// the client id; the sign-in server reads it to learn the redirect).
    pub metadata_url: Option<String>,
}

/// The longest client id or metadata address an entry may give.
const MAX_CLIENT_ID_LEN: usize = 255;

impl ClientConfig {
    /// Reads an entry's `oauth` (absent or null: nothing configured); why
    /// not, in words for whoever wrote the entry.
    pub fn parse(value: Option<&Value>) -> Result<Self, String> {
        const FIELDS: [&str; 2] = ["clientId", "clientMetadataUrl"];
        let object = match value {
            None | Some(Value::Null) => return Ok(Self::default()),
            Some(Value::Object(object)) => object,
            Some(_) => {
                return Err("`oauth` must be an object { clientId?, clientMetadataUrl? }".into())
            }
        };
        if let Some(key) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "unknown field `oauth.{key}` (known: {})",
                FIELDS.join(", ")
            ));
        }
        let text = |name: &str| -> Result<Option<String>, String> {
            match object.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("`oauth.{name}` must be text")),
            }
        };
        let client_id = text("clientId")?;
        if let Some(id) = &client_id {
            // RFC 6749 appendix A.1: visible ASCII and spaces; none at
            // either end, where they are surely a slip.
            let ok = (1..=MAX_CLIENT_ID_LEN).contains(&id.len())
                && id.bytes().all(|b| (0x20..=0x7e).contains(&b))
                && id.trim() == id;
            if !ok {
                return Err(format!(
                    "`oauth.clientId` must be 1-{MAX_CLIENT_ID_LEN} visible ASCII characters"
                ));
            }
        }
        let metadata_url = text("clientMetadataUrl")?;
        if let Some(url) = &metadata_url {
            if let Err(why) = check_client_metadata_url(url) {
                return Err(format!("`oauth.clientMetadataUrl` {why} ({url:?})"));
            }
        }
        Ok(Self {
            client_id,
            metadata_url,
        })
    }

    /// Whether the entry gives anything (an entry that sends its own
    /// `Authorization` has no sign-in, so this would be a slip there).
    pub fn is_set(&self) -> bool {
        self.client_id.is_some() || self.metadata_url.is_some()
    }
}

/// What a client ID metadata document's address must be
/// (draft-ietf-oauth-client-id-metadata-document §3): https (http only on
/// this machine), with a path, no `.` or `..` segment, no fragment, no
/// user name.
fn check_client_metadata_url(url: &str) -> Result<(), &'static str> {
    if url.len() > MAX_CLIENT_ID_LEN {
        return Err("is too long");
    }
    if !is_secure_url(url) {
        return Err("must be an https address (http only on this machine)");
    }
    let (origin, path) = split_url(url).ok_or("must be an https address")?;
    if origin.contains('@') {
        return Err("must not carry a user name");
    }
    if url.contains('#') {
        return Err("must not carry a fragment");
    }
    if path.len() <= 1 {
        return Err("must have a path (the document's address, not the site's)");
    }
    // Dot segments, spelt out or percent-encoded (a URL parser reads
    // `%2e` as `.`), and empty ones are no document's own address.
    let dots = |segment: &str| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    };
    if path
        .split('/')
        .skip(1)
        .any(|segment| dots(segment) || segment.is_empty())
    {
        return Err("must not have `.`, `..` or empty segments");
    }
    Ok(())
}

/// How this extension names itself to one sign-in server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientChoice<'a> {
    /// The client id the entry gives.
    Given(&'a str),
    /// The entry's client ID metadata document (its address is the id).
    MetadataDocument(&'a str),
    /// A client registered on request (RFC 7591) at this endpoint: the
    /// one kept from an earlier sign-in there, else a new one.
    Register(&'a str),
}

impl ClientChoice<'_> {
    /// A note for the user when the sign-in server refused this client.
    pub fn refused_note(&self) -> String {
        match self {
            ClientChoice::Given(id) => format!(
                "the sign-in server may not know the client id {id:?} given with this server"
            ),
            ClientChoice::MetadataDocument(url) => format!(
                "the sign-in server may not have accepted this extension's client metadata document ({url})"
            ),
            ClientChoice::Register(_) => "the client this extension had registered there was forgotten: sign in again to register a new one".into(),
        }
    }
}

/// The client to use with `auth_server` (MCP 2025-11-25's order: given
/// beforehand, a metadata document the server takes, registration);
/// none of them: `NoRegistration` (naming this extension's `redirect`,
/// which a client registered by hand needs).
pub fn choose_client<'a>(
    config: &'a ClientConfig,
    auth_server: &'a AuthServer,
    redirect: &str,
) -> Result<ClientChoice<'a>, OAuthError> {
    if let Some(id) = &config.client_id {
        return Ok(ClientChoice::Given(id));
    }
    if let Some(url) = config
        .metadata_url
        .as_deref()
        .filter(|_| auth_server.takes_client_metadata)
    {
        return Ok(ClientChoice::MetadataDocument(url));
    }
    match &auth_server.registration_endpoint {
        Some(endpoint) => Ok(ClientChoice::Register(endpoint)),
        None => Err(OAuthError::NoRegistration {
            redirect: redirect.to_string(),
            metadata_url_refused: config.metadata_url.is_some(),
        }),
    }
}

#[cfg(test)]
#[path = "oauth_tests.rs"]
mod tests;
