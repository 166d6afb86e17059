//! Streaming `fetch` for provider requests, with abort.

use js_sys::{Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, Headers, ReadableStreamDefaultReader, Request, RequestInit, Response,
};

use super::error::{js_to_error, JsError};

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (works in a service worker, which has no `window`).
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(request: &Request) -> Promise;
}

/// An HTTP response whose body is read incrementally.
pub struct Streaming {
    pub status: u16,
    pub headers: Headers,
    reader: Option<ReadableStreamDefaultReader>,
    response: Response,
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

    /// The whole body as text (for error responses).
    pub async fn text(self) -> Result<String, JsError> {
        drop(self.reader);
        let promise = self.response.text().map_err(js_to_error)?;
        let text = JsFuture::from(promise).await.map_err(js_to_error)?;
        Ok(text.as_string().unwrap_or_default())
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).ok().flatten()
    }
}

/// POST `body` as JSON to `url`; resolves once headers arrived.
pub async fn post_json(
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
    controller: &AbortController,
) -> Result<Streaming, JsError> {
    let init = RequestInit::new();
    init.set_method("POST");
    let h = Headers::new().map_err(js_to_error)?;
    h.set("content-type", "application/json")
        .map_err(js_to_error)?;
    for (k, v) in headers {
        h.set(k, v).map_err(js_to_error)?;
    }
    init.set_headers(&h);
    // As bytes: one copy out of wasm memory, instead of decoding a (often
    // megabyte-sized) UTF-8 text into a JS string that fetch encodes again.
    init.set_body(&js_sys::Uint8Array::from(body.as_bytes()));
    init.set_signal(Some(&controller.signal()));
    let request = Request::new_with_str_and_init(url, &init).map_err(js_to_error)?;
    let response: Response = JsFuture::from(global_fetch(&request))
        .await
        .map_err(js_to_error)?
        .dyn_into()
        .map_err(js_to_error)?;
    // Only a successful body is read incrementally. Getting a reader locks
    // the body, so an error response must not get one: `text()` reads it.
    let reader = if response.ok() {
        response.body().map(|b| {
            b.get_reader()
                .unchecked_into::<ReadableStreamDefaultReader>()
        })
    } else {
        None
    };
    Ok(Streaming {
        status: response.status(),
        headers: response.headers(),
        reader,
        response,
    })
}
