//! Tools the embedding extension defines in its service worker
//! (`extension/host-tools.js`, passed to `Engine.start` as `tools`).
//!
//! Owns: reading their definitions (each checked by
//! [`HostDefinition::parse`] and the registry; a wrong one is left
//! out, with a message naming the tool and what to fix), and calling their `execute`
//! function: `execute(params, { callId, signal, progress })`, returning (or
//! resolving to) the text for the model or `{ content, details }`; a throw or
//! a rejection is an error result the model sees.
//!
//! Must not: decide anything about the call (the engine gatekept it before
//! it got here).

use js_sys::{Function, Promise, Reflect};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::AbortSignal;

use super::boundary;
use super::error::js_to_error;
use crate::engine::ToolOutcome;
use crate::tools::{HostDefinition, ToolRegistry};
use crate::vecmap::VecMap;

/// The `execute` function of each tool the extension defined, and its time
/// limit (ms), by name.
#[derive(Default)]
pub struct HostTools {
    functions: VecMap<String, (Function, u32)>,
}

impl HostTools {
    /// Register the definitions in `tools` (a JS array, or undefined/null
    /// for none) into `registry`. A wrong definition is left out and named
    /// in the returned errors (what to fix); the others are registered.
    ///
    /// Decision: a wrong tool does not stop the engine. The side panel keeps
    /// working with every other tool, and the worker's console says which
    /// definition was refused and why (sw.js logs the errors).
    pub fn register(tools: &JsValue, registry: &mut ToolRegistry) -> (HostTools, Vec<String>) {
        let mut host = HostTools::default();
        let mut errors = Vec::new();
        if tools.is_undefined() || tools.is_null() {
            return (host, errors);
        }
        let Some(list) = tools.dyn_ref::<js_sys::Array>() else {
            errors.push("`tools` must be an array of tool definitions".to_string());
            return (host, errors);
        };
        for (i, tool) in list.iter().enumerate() {
            match Self::one(i, &tool, registry) {
                Ok((name, execute, time_limit_ms)) => {
                    host.functions.insert(name, (execute, time_limit_ms));
                }
                Err(e) => errors.push(e),
            }
        }
        (host, errors)
    }

    fn one(
        i: usize,
        tool: &JsValue,
        registry: &mut ToolRegistry,
    ) -> Result<(String, Function, u32), String> {
        let name = Reflect::get(tool, &JsValue::from_str("name"))
            .ok()
            .and_then(|n| n.as_string())
            .unwrap_or_else(|| format!("#{i}"));
        let definition = definition_of(tool).map_err(|e| format!("host tool {name:?}: {e}"))?;
        let HostDefinition {
            descriptor,
            time_limit_ms,
        } = HostDefinition::parse(&definition).map_err(|e| e.0)?;
        let execute = Reflect::get(tool, &JsValue::from_str("execute"))
            .ok()
            .and_then(|f| f.dyn_into::<Function>().ok())
            .ok_or_else(|| format!("host tool {name:?}: `execute` must be a function"))?;
        registry.register(descriptor).map_err(|e| e.0)?;
        Ok((name, execute, time_limit_ms))
    }

    /// How long a call of tool `name` may take (ms), if it is one of them.
    pub fn time_limit_ms(&self, name: &str) -> Option<u32> {
        self.functions.get(name).map(|(_, ms)| *ms)
    }

    /// Run tool `name` with `params`. `progress` is called with each text the
    /// tool reports; `signal` is aborted when the engine or the time limit
    /// gives up on the call.
    pub async fn call(
        &self,
        name: &str,
        call_id: &str,
        params: &Value,
        signal: &AbortSignal,
        progress: &Function,
    ) -> Result<ToolOutcome, String> {
        let execute = self
            .functions
            .get(name)
            .map(|(execute, _)| execute.clone())
            .ok_or_else(|| format!("{name} is not defined in this extension's worker."))?;
        let context = js_sys::Object::new();
        for (key, value) in [
            ("callId", JsValue::from_str(call_id)),
            ("signal", signal.into()),
            ("progress", progress.into()),
        ] {
            Reflect::set(&context, &JsValue::from_str(key), &value).map_err(|e| failed(name, e))?;
        }
        let params = boundary::to_js(params).map_err(|e| format!("{name}: {e}"))?;
        let returned = execute
            .call2(&JsValue::UNDEFINED, &params, &context)
            .map_err(|e| failed(name, e))?;
        let value = JsFuture::from(Promise::resolve(&returned))
            .await
            .map_err(|e| failed(name, e))?;
        outcome(name, value)
    }
}

/// The definition as JSON data, without its function (`JSON.stringify`
/// drops functions).
fn definition_of(tool: &JsValue) -> Result<Value, String> {
    if !tool.is_object() {
        return Err("a tool definition must be an object".to_string());
    }
    let text = js_sys::JSON::stringify(tool).map_err(|e| {
        format!(
            "its definition is not JSON data ({})",
            js_to_error(e).message
        )
    })?;
    serde_json::from_str(&String::from(text)).map_err(|e| e.to_string())
}

/// What the tool's function gave back, for the model (and the UI).
fn outcome(name: &str, value: JsValue) -> Result<ToolOutcome, String> {
    if let Some(text) = value.as_string() {
        return Ok(ToolOutcome::text(true, text));
    }
    let field = |key: &str| {
        Reflect::get(&value, &JsValue::from_str(key))
            .ok()
            .filter(|v| !v.is_undefined())
    };
    let content = value
        .is_object()
        .then(|| field("content").and_then(|c| c.as_string()))
        .flatten()
        .ok_or_else(|| {
            format!("{name} returned neither text nor an object with a text `content`.")
        })?;
    let details = field("details").map(boundary::from_js_value);
    Ok(ToolOutcome {
        ok: true,
        content,
        details,
        images: Vec::new(),
    })
}

fn failed(name: &str, error: JsValue) -> String {
    let error = js_to_error(error);
    if error.message.is_empty() {
        format!("{name} failed.")
    } else {
        format!("{name} failed: {}", error.message)
    }
}
