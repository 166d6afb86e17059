//! One provider request over `fetch`: send, stream, decode, with an idle
//! timeout and abort. Independent of chrome.* so browser tests can drive it.

use futures::FutureExt;
use gloo_timers::future::TimeoutFuture;
use web_sys::AbortController;

use super::error::JsError;
use super::fetch;
use crate::protocol::ErrorKind;
use crate::provider::{
    error_from_http, json_instead_of_stream, parse_retry_after, Decoder, ProviderError,
    ProviderResponse, StreamEvent, Transport,
};

/// Send `body` (`fetch::request_body` of a text, or a composed `Blob`) to
/// `url` with `headers`, feed every delta to `on_delta`, and return the assembled
/// response or a typed error. A response that sends nothing for
/// `idle_timeout_ms` (headers, stream body or error body) is aborted as a
/// retryable error; aborting `controller` ends the request at any point. When
/// the call returns early with an error (a mid-stream error event, a
/// malformed chunk), `controller` is aborted so the connection is released.
pub async fn stream_response(
    url: &str,
    headers: &[(String, String)],
    body: &wasm_bindgen::JsValue,
    transport: Transport,
    controller: &AbortController,
    idle_timeout_ms: u64,
    mut on_delta: impl FnMut(StreamEvent),
) -> Result<ProviderResponse, ProviderError> {
    let aborted = || ProviderError::new(ErrorKind::Network, "The request was aborted.", false);
    let unreachable = |e: JsError| {
        if e.is_abort() {
            return aborted();
        }
        if e.is_redirect() {
            return redirected(url);
        }
        ProviderError::new(
            ErrorKind::Network,
            format!(
                "Could not reach the provider at {url} ({}). Check the base URL in Settings and that the server is running.",
                e.message
            ),
            true,
        )
    };
    // The provider answered, then the body failed: not a configuration problem.
    let lost = |e: JsError| {
        if e.is_abort() {
            return aborted();
        }
        ProviderError::new(
            ErrorKind::Network,
            format!(
                "The connection to the provider was lost while the answer was streaming ({}).",
                e.message
            ),
            true,
        )
    };
    let stalled = || {
        controller.abort();
        ProviderError::new(
            ErrorKind::Network,
            format!(
                "The provider sent nothing for {} s; the request was aborted.",
                idle_timeout_ms.div_ceil(1000)
            ),
            true,
        )
    };
    let idle = || TimeoutFuture::new(idle_timeout_ms.min(u64::from(u32::MAX)) as u32).fuse();
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // The request carries the API key, which must go nowhere but `url`.
    let response =
        fetch::post_json(url, &headers, body, controller, fetch::Redirects::Refuse).fuse();
    futures::pin_mut!(response);
    let mut response = futures::select! {
        r = response => r.map_err(unreachable)?,
        _ = idle() => return Err(stalled()),
    };
    let succeeded = (200..300).contains(&response.status);
    let json = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .get(..16)
            .is_some_and(|t| t.eq_ignore_ascii_case("application/json"))
    });
    if !succeeded || json {
        let status = response.status;
        let retry_after = parse_retry_after(
            response.header("retry-after").as_deref(),
            response.header("retry-after-ms").as_deref(),
        );
        // The status alone is enough to type the error; a body that does not
        // arrive in time, or is longer than any error, is given up on (the
        // connection is aborted). Read through the body's reader: a 2xx
        // JSON one (a gateway's `200 {"error":…}`) is locked to it.
        let text = {
            let body = response.text_within(fetch::ERROR_BODY_MAX_BYTES).fuse();
            futures::pin_mut!(body);
            futures::select! {
                t = body => t.unwrap_or_else(|_| {
                    controller.abort();
                    String::new()
                }),
                _ = idle() => {
                    controller.abort();
                    String::new()
                }
            }
        };
        if succeeded {
            return Err(json_instead_of_stream(transport, &text));
        }
        return Err(error_from_http(transport, status, &text, retry_after));
    }
    // What the response keeps for replay is bound to the host it came from.
    let mut decoder = Decoder::for_url(transport, url);
    loop {
        let chunk = {
            let next = response.next_chunk().fuse();
            futures::pin_mut!(next);
            futures::select! {
                c = next => c.map_err(lost)?,
                _ = idle() => return Err(stalled()),
            }
        };
        let Some(chunk) = chunk else { break };
        if let Err(e) = decoder.push_with(&chunk, &mut on_delta) {
            controller.abort();
            return Err(e);
        }
    }
    decoder.finish()
}

/// The provider answered with a redirect, which is not followed: the
/// request carries the API key, which goes only to the address Settings
/// name (`provider::key_may_go_to`). A protocol error, not retried: asking
/// again gets the same redirect, and the fix is the base URL. Not a
/// network error: the provider was reached. The browser does not tell
/// where the redirect pointed.
fn redirected(url: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::ProviderProtocol,
        format!(
            "The provider at {url} answered with a redirect to another address. The request (with \
the API key) was not sent there: the key goes only to the address in Settings. Set the base URL in \
Settings to the address the provider answers at (for example https:// instead of http://)."
        ),
        false,
    )
}
