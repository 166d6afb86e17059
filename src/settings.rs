//! Provider settings: what the user stored (`chrome.storage.local.settings`,
//! written by the side panel) over the defaults the embedding extension
//! ships (`extension/settings-defaults.js`), read into the profile the
//! engine may see and the API key only `fetch` may see.
//!
//! Owns: checking the extension's defaults (a wrong field is left out and
//! named), the field-by-field merge, and reading the merged settings.
//! Must not: do IO (the driver reads storage and passes the values in).
//!
//! Decisions:
//! - A field the user has not stored (absent, `null`, or an empty text)
//!   takes the extension's default; a stored value always wins. The side
//!   panel stores only the fields that differ from the defaults, so a
//!   default changed by an extension update reaches every user who did not
//!   choose otherwise.
//! - The defaults may not carry an `apiKey`: every file of an extension can
//!   be read by anyone who installs it. An extension with its own backend
//!   puts a proxy that authenticates its users at `baseUrl` instead, or lets
//!   each user enter a key.
//! - Stored settings are read leniently (a value of the wrong type or out of
//!   range is as if unset): the panel validates what it stores, and a
//!   damaged record must not stop the engine; the engine then reports
//!   `not_configured` if what is left is not enough to call a model.

use serde_json::{Map, Value};

use crate::model::ProviderProfile;

/// The settings fields, as stored and as defaults (`apiKey` only stored).
pub const FIELDS: [&str; 10] = [
    "provider",
    "baseUrl",
    "model",
    "apiKey",
    "maxOutputTokens",
    "temperature",
    "toolUse",
    "vision",
    "contextWindow",
    "tokenBudget",
];

/// The extension's defaults with every wrong field left out, and what was
/// wrong with each (for the worker's console). `defaults` is the JSON data of
/// `SETTINGS_DEFAULTS`; absent (`null`) means none.
pub fn check_defaults(defaults: &Value) -> (Map<String, Value>, Vec<String>) {
    let mut kept = Map::new();
    let mut errors = Vec::new();
    let object = match defaults {
        Value::Null => return (kept, errors),
        Value::Object(object) => object,
        _ => {
            errors.push(
                "SETTINGS_DEFAULTS must be an object of settings fields, as JSON data (text, numbers, true or false)"
                    .to_string(),
            );
            return (kept, errors);
        }
    };
    for (key, value) in object {
        if value.is_null() {
            continue;
        }
        match check_field(key, value) {
            Ok(()) => {
                kept.insert(key.clone(), value.clone());
            }
            Err(e) => errors.push(format!("`{key}` {e}")),
        }
    }
    (kept, errors)
}

fn check_field(key: &str, value: &Value) -> Result<(), String> {
    let whole = |min: u64, max: u64| match value.as_u64() {
        Some(n) if (min..=max).contains(&n) => Ok(()),
        _ => Err(format!("must be a whole number from {min} to {max}")),
    };
    match key {
        "provider" => match value.as_str() {
            Some("openai" | "anthropic") => Ok(()),
            _ => Err("must be \"openai\" or \"anthropic\"".to_string()),
        },
        "baseUrl" => match value.as_str().map(str::trim).and_then(|url| {
            url.strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"))
        }) {
            Some(rest) if !rest.is_empty() => Ok(()),
            _ => Err("must be an http(s) address, like https://api.openai.com/v1".to_string()),
        },
        "model" => match value.as_str().map(str::trim) {
            Some(model) if !model.is_empty() => Ok(()),
            _ => Err("must be a model name".to_string()),
        },
        "apiKey" => Err(
            "is not accepted: anyone who installs the extension can read its files; \
             let each user enter a key, or put a proxy that authenticates your users at `baseUrl`"
                .to_string(),
        ),
        "maxOutputTokens" => whole(1, 1_000_000),
        "temperature" => match value.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Ok(()),
            _ => Err("must be a number from 0 to 2".to_string()),
        },
        "toolUse" | "vision" => match value {
            Value::Bool(_) => Ok(()),
            _ => Err("must be true or false".to_string()),
        },
        "contextWindow" => whole(1_000, 100_000_000),
        "tokenBudget" => whole(1, 1_000_000_000_000),
        _ => Err(format!(
            "is not a settings field (known: {})",
            FIELDS.join(", ")
        )),
    }
}

/// Whether a stored value counts as set (see the module's decisions).
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::String(text) => !text.trim().is_empty(),
        _ => true,
    }
}

/// The settings in effect: each field the user stored, else the default.
/// `stored` is `chrome.storage.local.settings` as JSON data (anything that is
/// not an object is as if nothing was stored); `defaults` is checked
/// ([`check_defaults`]).
pub fn effective(stored: &Value, defaults: &Map<String, Value>) -> Value {
    let mut merged = defaults.clone();
    if let Value::Object(stored) = stored {
        for (key, value) in stored {
            if is_set(value) {
                merged.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(merged)
}

/// The profile the engine may see and the API key only `fetch` may see, read
/// from the settings in effect ([`effective`]).
pub fn profile_of(settings: &Value) -> (ProviderProfile, String) {
    let text = |k: &str| {
        settings
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string()
    };
    // A number, or a number written as text (older panels stored text).
    let number = |k: &str| {
        settings.get(k).and_then(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        })
    };
    let flag = |k: &str, default: bool| settings.get(k).and_then(Value::as_bool).unwrap_or(default);
    let kind = match text("provider").as_str() {
        "anthropic" => "anthropic".to_string(),
        _ => "openai".to_string(),
    };
    let profile = ProviderProfile {
        kind,
        base_url: text("baseUrl"),
        model: text("model"),
        max_output_tokens: number("maxOutputTokens")
            .filter(|n| *n >= 1.0 && *n <= 1_000_000.0)
            .map(|n| n as u32),
        temperature_centi: number("temperature")
            .filter(|t| (0.0..=2.0).contains(t))
            .map(|t| (t * 100.0).round() as u32),
        // Safe defaults: no images unless the user says the model sees them.
        vision: flag("vision", false),
        tool_use: flag("toolUse", true),
        token_budget: number("tokenBudget")
            .filter(|n| *n >= 1.0)
            .map(|n| n as u64),
        context_window: number("contextWindow")
            .filter(|n| *n >= 1_000.0)
            .map(|n| n as u64),
    };
    (profile, text("apiKey"))
}
