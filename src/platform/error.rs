//! The one place a `JsValue` error becomes a typed Rust error.

use wasm_bindgen::{JsCast, JsValue};

/// A failure reported by a browser API, with its JS name (`AbortError`, `QuotaExceededError`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsError {
    pub name: String,
    pub message: String,
}

impl std::fmt::Display for JsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.name, self.message)
        }
    }
}

impl std::error::Error for JsError {}

/// Convert any thrown JS value into a [`JsError`].
pub fn js_to_error(value: JsValue) -> JsError {
    if let Some(error) = value.dyn_ref::<js_sys::Error>() {
        return JsError {
            name: String::from(error.name()),
            message: String::from(error.message()),
        };
    }
    let get = |key: &str| {
        js_sys::Reflect::get(&value, &JsValue::from_str(key))
            .ok()
            .and_then(|v| v.as_string())
    };
    if let Some(message) = get("message") {
        return JsError {
            name: get("name").unwrap_or_default(),
            message,
        };
    }
    JsError {
        name: String::new(),
        message: value.as_string().unwrap_or_else(|| format!("{value:?}")),
    }
}

impl JsError {
    pub fn is_abort(&self) -> bool {
        self.name == "AbortError"
    }

    /// A redirect that was not followed (`fetch::Redirects::Refuse`).
    pub fn is_redirect(&self) -> bool {
        self.name == super::fetch::REDIRECT_ERROR
    }
}
