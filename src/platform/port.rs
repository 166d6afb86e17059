//! chrome.runtime.Port, used dynamically (a Port is a plain JS object).

use js_sys::{Function, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use super::chrome::get;
use super::error::{js_to_error, JsError};

/// A Port object and the operations the engine needs on it.
#[derive(Debug, Clone)]
pub struct Port(pub JsValue);

impl Port {
    fn call(&self, path: &[&str], args: &[&JsValue]) -> Result<JsValue, JsError> {
        let mut this = self.0.clone();
        for key in &path[..path.len() - 1] {
            this = get(&this, key);
        }
        let f: Function = get(&this, path[path.len() - 1])
            .dyn_into()
            .map_err(|_| JsError {
                name: "TypeError".into(),
                message: format!("port.{} is not a function", path.join(".")),
            })?;
        let args: js_sys::Array = args.iter().map(|a| (*a).clone()).collect();
        Reflect::apply(&f, &this, &args).map_err(js_to_error)
    }

    /// Post a message; fails if the other side is gone.
    pub fn post(&self, message: &JsValue) -> Result<(), JsError> {
        self.call(&["postMessage"], &[message]).map(|_| ())
    }

    pub fn disconnect(&self) {
        let _ = self.call(&["disconnect"], &[]);
    }

    pub fn on_message(&self, f: &Closure<dyn FnMut(JsValue)>) -> Result<(), JsError> {
        self.call(&["onMessage", "addListener"], &[f.as_ref()])
            .map(|_| ())
    }

    pub fn on_disconnect(&self, f: &Closure<dyn FnMut(JsValue)>) -> Result<(), JsError> {
        self.call(&["onDisconnect", "addListener"], &[f.as_ref()])
            .map(|_| ())
    }

    /// `(sender.url, sender.origin)` as Chrome reports them.
    pub fn sender(&self) -> (Option<String>, Option<String>) {
        let sender = get(&self.0, "sender");
        (
            get(&sender, "url").as_string(),
            get(&sender, "origin").as_string(),
        )
    }
}
