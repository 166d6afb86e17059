//! Streaming `fetch` for provider and MCP requests, with abort.
//!
//! Owns: opening a request (its redirect policy: [`Redirects`]), and
//! reading its answer's body chunk by chunk or whole within a size limit.
//! Must not: read a body from a network peer without a limit, or follow a
//! redirect with a request the caller says carries a secret.

use js_sys::{Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, Headers, ReadableStreamDefaultReader, Request, RequestInit, Response,
    ResponseType,
};

use super::error::{js_to_error, JsError};

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (works in a service worker, which has no `window`).
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(request: &Request) -> Promise;
}

/// The longest error body read (a non-2xx answer's, or a JSON document
/// where a stream was asked for): an error says what it is in far less.
/// The rest is not read.
pub const ERROR_BODY_MAX_BYTES: usize = 64 * 1024;

/// The name of the [`JsError`] a refused redirect is
/// ([`JsError::is_redirect`]).
pub const REDIRECT_ERROR: &str = "RedirectError";

/// What a request does when its server answers with a redirect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirects {
    /// Followed: the request carries nothing secret.
    Follow,
    /// Not followed: nothing is sent to the other address, and the answer
    /// is a [`REDIRECT_ERROR`]. For a request that carries a key, a token
    /// or a secret body: browsers keep custom headers (`x-api-key`, an MCP
    /// server's configured ones) on a redirect to any origin, and a
    /// 307/308 keeps the body. The browser does not say where the redirect
    /// pointed (an opaque redirect), so the error names the address that
    /// answered with it.
    Refuse,
}

/// An HTTP response whose body is read incrementally.
pub struct Streaming {
    pub status: u16,
    pub headers: Headers,
    /// Every body is read through its reader (so within a limit), a
    /// failed answer's too; None: the answer has no body.
    reader: Option<ReadableStreamDefaultReader>,
}

impl Streaming {
    /// The next chunk of the body, or None at the end.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, JsError> {
        let Some(reader) = &self.reader else {
            return Ok(None);
        };
        let result = JsFuture::from(reader.read()).await.map_err(js_to_error)?;
        let done = Reflect::get(&result, &JsValue::from_str("done"))
            .ok()
            .and_then(|d| d.as_bool())
            .unwrap_or(true);
        if done {
            return Ok(None);
        }
        let value = Reflect::get(&result, &JsValue::from_str("value")).map_err(js_to_error)?;
        Ok(Some(Uint8Array::new(&value).to_vec()))
    }

    /// Stop reading the body (the rest is not wanted).
    pub fn cancel(&self) {
        if let Some(reader) = &self.reader {
            let _ = reader.cancel();
        }
    }

    /// The whole body as text, of at most `max` bytes: a longer one is an
    /// error (a `RangeError`), and its rest is not read.
    pub async fn text_within(mut self, max: usize) -> Result<String, JsError> {
        let mut bytes = Vec::new();
        while let Some(chunk) = self.next_chunk().await? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > max {
                self.cancel();
                return Err(JsError {
                    name: "RangeError".into(),
                    message: format!("the answer is longer than {max} bytes"),
                });
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).ok().flatten()
    }
}

/// From this size on a request body goes to `fetch` as a `Blob`.
///
/// Measured in the extension's worker (Chromium 156, to a local server, 20
/// requests each): a 1.3 MB body as a `Uint8Array` took 40 ms until the
/// response was read, 12–14 ms of it blocking the worker inside `fetch`
/// (the bytes are streamed to the network service from the worker's own
/// thread); as a `Blob` 17.5 ms, 5 ms blocking. At 150 KB both take ~7 ms;
/// at 25 KB the `Blob` costs ~1 ms more (its registration round trip), so
/// small bodies stay bytes. A long thread without a context window sends
/// its whole history at every step, so this is paid per step.
pub const BLOB_BODY_MIN_BYTES: usize = 128 * 1024;

/// The body of a request: UTF-8 bytes copied once out of wasm memory
/// (rather than a JS string that `fetch` encodes again), wrapped in a
/// `Blob` from [`BLOB_BODY_MIN_BYTES`] on.
pub fn request_body(body: &str) -> Result<JsValue, JsError> {
    let bytes = js_sys::Uint8Array::from(body.as_bytes());
    if body.len() < BLOB_BODY_MIN_BYTES {
        return Ok(bytes.into());
    }
    web_sys::Blob::new_with_u8_array_sequence(&js_sys::Array::of1(&bytes))
        .map(Into::into)
        .map_err(js_to_error)
}

/// A body planned by `BodyCache::plan_with`, as `Blob`s: the new slots,
/// each composed of the `old` ones it names (by reference: a `Blob` made of
/// `Blob`s copies none of their bytes) and text copied out of wasm memory,
/// and the body composed of those. So a step of a long thread copies its
/// new messages, never the history: measured in Chromium, a 1.3 MB body
/// took 17 ms to post as one new `Blob` (6 ms of it blocking the worker)
/// and 8 ms (1.2 ms) composed from a kept one.
pub fn compose(
    plan: &crate::provider::body::BodyPlan,
    old: &[web_sys::Blob],
) -> Result<(Vec<web_sys::Blob>, web_sys::Blob), JsError> {
    use crate::provider::body::Piece;
    let blob = |pieces: &[Piece], from: &[web_sys::Blob]| {
        let parts = js_sys::Array::new();
        for piece in pieces {
            match piece {
                Piece::Text(text) => parts.push(&Uint8Array::from(text.as_bytes())),
                Piece::Slot(i) => match from.get(*i) {
                    Some(slot) => parts.push(slot),
                    None => {
                        return Err(JsError {
                            name: "Error".into(),
                            message: "a request body part is missing".into(),
                        })
                    }
                },
            };
        }
        web_sys::Blob::new_with_blob_sequence(&parts).map_err(js_to_error)
    };
    // A slot that is one kept slot is that `Blob` again, not a new one.
    let slots = plan
        .slots
        .iter()
        .map(|pieces| match pieces.as_slice() {
            [Piece::Slot(i)] if *i < old.len() => Ok(old[*i].clone()),
            _ => blob(pieces, old),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let body = blob(&plan.body, &slots)?;
    Ok((slots, body))
}

/// POST `body` as JSON to `url`; resolves once headers arrived.
pub async fn post_json(
    url: &str,
    headers: &[(&str, &str)],
    body: &JsValue,
    controller: &AbortController,
    redirects: Redirects,
) -> Result<Streaming, JsError> {
    let mut with_type = vec![("content-type", "application/json")];
    with_type.extend_from_slice(headers);
    open("POST", url, &with_type, Some(body), controller, redirects).await
}

/// GET `url` (an event stream a server keeps open); resolves once headers
/// arrived.
pub async fn get(
    url: &str,
    headers: &[(&str, &str)],
    controller: &AbortController,
    redirects: Redirects,
) -> Result<Streaming, JsError> {
    open("GET", url, headers, None, controller, redirects).await
}

/// A request that carries a secret in its body (a sign-in's code and
/// verifier, a refresh token): a redirect is an error, never followed
/// with the body to another address. Resolves once headers arrived.
pub async fn open_without_redirects(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&JsValue>,
    controller: &AbortController,
) -> Result<Streaming, JsError> {
    open(method, url, headers, body, controller, Redirects::Refuse).await
}

async fn open(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&JsValue>,
    controller: &AbortController,
    redirects: Redirects,
) -> Result<Streaming, JsError> {
    let init = RequestInit::new();
    init.set_method(method);
    if redirects == Redirects::Refuse {
        // Not "error": that fails like a lost connection, so the caller
        // could not say what happened.
        init.set_redirect(web_sys::RequestRedirect::Manual);
    }
    let h = Headers::new().map_err(js_to_error)?;
    for (k, v) in headers {
        h.set(k, v).map_err(js_to_error)?;
    }
    init.set_headers(&h);
    if let Some(body) = body {
        init.set_body(body);
    }
    init.set_signal(Some(&controller.signal()));
    let request = Request::new_with_str_and_init(url, &init).map_err(js_to_error)?;
    let response: Response = JsFuture::from(global_fetch(&request))
        .await
        .map_err(js_to_error)?
        .dyn_into()
        .map_err(js_to_error)?;
    if response.type_() == ResponseType::Opaqueredirect {
        return Err(JsError {
            name: REDIRECT_ERROR.into(),
            message: format!(
                "{url} answered with a redirect to another address, which was not followed"
            ),
        });
    }
    // Getting a reader locks the body: from here on it is read through
    // the reader only (`next_chunk`, `text_within`), a failed answer's too.
    let reader = response.body().map(|b| {
        b.get_reader()
            .unchecked_into::<ReadableStreamDefaultReader>()
    });
    Ok(Streaming {
        status: response.status(),
        headers: response.headers(),
        reader,
    })
}
