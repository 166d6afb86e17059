//! An MCP server asking the user for input during one of its tool calls
//! (`elicitation/create`, MCP revision 2025-06-18): the half without IO.
//!
//! Owns: checking the server's request (its message and `requestedSchema`)
//! into an [`ElicitationForm`] with the fields in the server's order,
//! checking the user's answer against that form, and the JSON-RPC messages
//! that answer the server.
//!
//! Must not: show the form (the side panel), keep it (the engine writes it
//! as an `InteractionRecord` before it is shown), or send anything
//! (`platform::mcp`).
//!
//! Decisions:
//! - Only what the revision allows is asked: a flat object whose fields are
//!   strings (optionally an `enum` with `enumNames`, or a `format` of
//!   email, uri, date, date-time), numbers, integers or booleans. Anything
//!   else (nested objects, arrays, an unknown format, a `required` name the
//!   schema does not define, bounds that contradict each other) is refused
//!   to the server as invalid params (-32602) and the user never sees it; a
//!   `default` that does not fit its field is dropped, not refused.
//! - The server's message and texts are cut to bounded lengths
//!   ([`MAX_MESSAGE_CHARS`], [`MAX_TEXT_CHARS`]); at most [`MAX_FIELDS`]
//!   fields, [`MAX_OPTIONS`] options each.
//! - A date-time may leave out seconds and the offset (what a browser's
//!   `datetime-local` gives, `2026-12-05T19:30`); it is passed on as typed.
//! - The answer is checked here, not only in the panel: a field the form
//!   does not have, a wrong type, a value out of bounds, or a required
//!   field left out is refused with the field's name, and nothing is sent.
//!   An integer typed as `4.0` is sent as `4`.

use serde_json::{json, Map, Value};

use crate::model::{ElicitationAction, ElicitationForm, FieldKind, FormField, StringFormat};

/// The JSON-RPC method of the request.
pub const METHOD: &str = "elicitation/create";

/// At most this many fields in one request.
pub const MAX_FIELDS: usize = 32;

/// The server's message, at most (characters; longer is cut with "…").
pub const MAX_MESSAGE_CHARS: usize = 4_000;

/// A field's title or description, at most (characters).
pub const MAX_TEXT_CHARS: usize = 1_000;

/// A field's name, at most (characters).
pub const MAX_NAME_CHARS: usize = 64;

/// At most this many options in one field.
pub const MAX_OPTIONS: usize = 100;

/// A string the user types, at most (characters), when the field sets no
/// smaller `maxLength`.
pub const MAX_VALUE_CHARS: usize = 10_000;

/// The largest whole number a JSON number carries exactly (2^53 − 1).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A server's request for input, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub message: String,
    pub form: ElicitationForm,
}

/// The request's `params` checked into a form; `order` is the order of the
/// schema's properties as the server wrote them ([`property_order`]); a
/// field missing from it comes after the others, by name.
pub fn parse_request(params: &Value, order: &[String]) -> Result<Request, String> {
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .ok_or("the request has no message")?;
    let schema = params
        .get("requestedSchema")
        .and_then(Value::as_object)
        .ok_or("the request has no requestedSchema object")?;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err("requestedSchema is not of type \"object\"".into());
    }
    let empty = Map::new();
    let properties = match schema.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err("requestedSchema.properties is not an object".into()),
    };
    if properties.len() > MAX_FIELDS {
        return Err(format!(
            "the request asks for {} fields, more than {MAX_FIELDS}",
            properties.len()
        ));
    }
    let required: Vec<&str> = match schema.get("required") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| {
                n.as_str()
                    .ok_or("requestedSchema.required holds a non-string")
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("requestedSchema.required is not an array".into()),
    };
    if let Some(unknown) = required.iter().find(|n| !properties.contains_key(**n)) {
        return Err(format!(
            "requestedSchema.required names {unknown:?}, which it does not define"
        ));
    }
    // A name the text repeats counts once (its last schema is the one read).
    let mut names: Vec<&String> = Vec::with_capacity(properties.len());
    let listed = order
        .iter()
        .filter_map(|n| properties.get_key_value(n).map(|(k, _)| k));
    for name in listed.chain(properties.keys()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let fields = names
        .into_iter()
        .map(|name| {
            field(name, &properties[name], required.contains(&name.as_str()))
                .map_err(|e| format!("field {name:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Request {
        message: cut(message, MAX_MESSAGE_CHARS),
        form: ElicitationForm { fields },
    })
}

fn field(name: &str, schema: &Value, required: bool) -> Result<FormField, String> {
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("a name must have 1 to {MAX_NAME_CHARS} characters"));
    }
    let schema = schema.as_object().ok_or("its schema is not an object")?;
    let kind = match schema.get("type").and_then(Value::as_str) {
        Some("string") => FieldKind::String,
        Some("number") => FieldKind::Number,
        Some("integer") => FieldKind::Integer,
        Some("boolean") => FieldKind::Boolean,
        Some(other) => {
            return Err(format!(
                "type {other:?} cannot be asked (only string, number, integer, boolean)"
            ))
        }
        None => return Err("it has no type".into()),
    };
    let text = |key: &str| -> Result<Option<String>, String> {
        match schema.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(cut(s.trim(), MAX_TEXT_CHARS))),
            Some(_) => Err(format!("{key} is not a string")),
        }
    };
    let count = |key: &str| -> Result<Option<u64>, String> {
        match schema.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or(format!("{key} is not a whole number ≥ 0")),
        }
    };
    let bound = |key: &str| -> Result<Option<f64>, String> {
        match schema.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|n| n.is_finite())
                .map(Some)
                .ok_or(format!("{key} is not a number")),
        }
    };
    let mut field = FormField {
        name: name.to_string(),
        kind,
        title: text("title")?,
        description: text("description")?,
        required,
        options: Vec::new(),
        option_labels: Vec::new(),
        format: None,
        min_length: None,
        max_length: None,
        minimum: None,
        maximum: None,
        default: None,
    };
    match kind {
        FieldKind::String => {
            field.options = strings(schema.get("enum"), "enum")?;
            field.option_labels = strings(schema.get("enumNames"), "enumNames")?;
            if schema.contains_key("enum") && field.options.is_empty() {
                return Err("enum has no values".into());
            }
            if field.options.len() > MAX_OPTIONS {
                return Err(format!("enum has more than {MAX_OPTIONS} values"));
            }
            if !field.option_labels.is_empty() && field.option_labels.len() != field.options.len() {
                return Err("enumNames does not name every enum value".into());
            }
            field.format = match schema.get("format") {
                None | Some(Value::Null) => None,
                Some(Value::String(f)) => Some(match f.as_str() {
                    "email" => StringFormat::Email,
                    "uri" => StringFormat::Uri,
                    "date" => StringFormat::Date,
                    "date-time" => StringFormat::DateTime,
                    other => return Err(format!("format {other:?} is not one this client checks")),
                }),
                Some(_) => return Err("format is not a string".into()),
            };
            field.min_length = count("minLength")?;
            // What a user may type is bounded here whatever the server allows.
            field.max_length = count("maxLength")?.map(|n| n.min(MAX_VALUE_CHARS as u64));
            if field.min_length.is_some_and(|n| n > MAX_VALUE_CHARS as u64) {
                return Err(format!("minLength is more than {MAX_VALUE_CHARS}"));
            }
            if let (Some(min), Some(max)) = (field.min_length, field.max_length) {
                if min > max {
                    return Err("minLength is greater than maxLength".into());
                }
            }
        }
        FieldKind::Number | FieldKind::Integer => {
            field.minimum = bound("minimum")?;
            field.maximum = bound("maximum")?;
            if let (Some(min), Some(max)) = (field.minimum, field.maximum) {
                if min > max {
                    return Err("minimum is greater than maximum".into());
                }
            }
        }
        FieldKind::Boolean => {}
    }
    // A default that does not fit is only left out.
    field.default = schema
        .get("default")
        .filter(|d| check_value(&field, d).is_ok())
        .map(|d| normalize(&field, d));
    Ok(field)
}

fn strings(value: Option<&Value>, key: &str) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(|s| cut(s, MAX_TEXT_CHARS))
                    .ok_or(format!("{key} holds a non-string"))
            })
            .collect(),
        Some(_) => Err(format!("{key} is not an array")),
    }
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Check the user's answer against `form`: for `accept`, the values to
/// send (`content`, an object keyed by field name); for `decline` and
/// `cancel`, nothing (any content is dropped).
pub fn check_answer(
    form: &ElicitationForm,
    action: ElicitationAction,
    content: Option<&Value>,
) -> Result<Option<Value>, String> {
    if action != ElicitationAction::Accept {
        return Ok(None);
    }
    let empty = Map::new();
    let content = match content {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(c)) => c,
        Some(_) => return Err("The answer's content is not an object.".into()),
    };
    if let Some(unknown) = content
        .keys()
        .find(|k| !form.fields.iter().any(|f| &f.name == *k))
    {
        return Err(format!("Field {unknown:?} is not in the form."));
    }
    let mut out = Map::new();
    for field in &form.fields {
        match content.get(&field.name) {
            None | Some(Value::Null) if field.required => {
                return Err(format!("Field {:?} is required.", field.name));
            }
            None | Some(Value::Null) => {}
            Some(value) => {
                check_value(field, value).map_err(|e| format!("Field {:?}: {e}.", field.name))?;
                out.insert(field.name.clone(), normalize(field, value));
            }
        }
    }
    Ok(Some(Value::Object(out)))
}

/// Whether `value` fits `field` (the reason if not, without a full stop).
fn check_value(field: &FormField, value: &Value) -> Result<(), String> {
    match field.kind {
        FieldKind::Boolean => value
            .as_bool()
            .map(|_| ())
            .ok_or("not true or false".into()),
        FieldKind::Number | FieldKind::Integer => {
            let n = value
                .as_f64()
                .filter(|n| n.is_finite())
                .ok_or("not a number")?;
            if field.kind == FieldKind::Integer && n.fract() != 0.0 {
                return Err("not a whole number".into());
            }
            // Beyond this a JSON number loses whole units on the way.
            if field.kind == FieldKind::Integer && n.abs() > MAX_SAFE_INTEGER {
                return Err("too large".into());
            }
            if let Some(min) = field.minimum.filter(|min| n < *min) {
                return Err(format!("less than {min}"));
            }
            if let Some(max) = field.maximum.filter(|max| n > *max) {
                return Err(format!("more than {max}"));
            }
            Ok(())
        }
        FieldKind::String => {
            let s = value.as_str().ok_or("not a string")?;
            if field.required && s.is_empty() {
                return Err("empty".into());
            }
            if !field.options.is_empty() {
                return if field.options.iter().any(|o| o == s) {
                    Ok(())
                } else {
                    Err("not one of the choices".into())
                };
            }
            let chars = s.chars().count() as u64;
            if let Some(min) = field.min_length.filter(|min| chars < *min) {
                return Err(format!("shorter than {min} characters"));
            }
            let max = field
                .max_length
                .unwrap_or(MAX_VALUE_CHARS as u64)
                .min(MAX_VALUE_CHARS as u64);
            if chars > max {
                return Err(format!("longer than {max} characters"));
            }
            match field.format {
                Some(StringFormat::Email) if !is_email(s) => Err("not an email address".into()),
                Some(StringFormat::Uri) if !is_uri(s) => Err("not a URI".into()),
                Some(StringFormat::Date) if !is_date(s) => Err("not a date (YYYY-MM-DD)".into()),
                Some(StringFormat::DateTime) if !is_date_time(s) => {
                    Err("not a date and time (YYYY-MM-DDTHH:MM)".into())
                }
                _ => Ok(()),
            }
        }
    }
}

/// A checked value as sent: an integer field's `4.0` becomes `4`.
fn normalize(field: &FormField, value: &Value) -> Value {
    match (field.kind, value.as_f64()) {
        (FieldKind::Integer, Some(n)) if !value.is_i64() && !value.is_u64() => {
            if n.abs() <= MAX_SAFE_INTEGER {
                json!(n as i64)
            } else {
                value.clone()
            }
        }
        _ => value.clone(),
    }
}

fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
        && !s.chars().any(char::is_whitespace)
        && domain.split('.').count() >= 2
        && domain.split('.').all(|label| !label.is_empty())
}

fn is_uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !rest.is_empty()
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn digits(s: &str, n: usize) -> Option<u32> {
    (s.len() == n && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

fn is_date(s: &str) -> bool {
    let mut parts = s.split('-');
    let (Some(y), Some(m), Some(d), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(y), Some(m), Some(d)) = (digits(y, 4), digits(m, 2), digits(d, 2)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

fn is_time(s: &str) -> bool {
    let (clock, fraction) = match s.split_once('.') {
        Some((clock, fraction)) => (clock, Some(fraction)),
        None => (s, None),
    };
    if fraction.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    let parts: Vec<&str> = clock.split(':').collect();
    let ok = |part: &str, max: u32| digits(part, 2).is_some_and(|n| n <= max);
    match parts.as_slice() {
        [h, m] => fraction.is_none() && ok(h, 23) && ok(m, 59),
        [h, m, sec] => ok(h, 23) && ok(m, 59) && ok(sec, 60),
        _ => false,
    }
}

fn is_date_time(s: &str) -> bool {
    let Some((date, rest)) = s.split_once(['T', 't', ' ']) else {
        return false;
    };
    if !is_date(date) {
        return false;
    }
    let time = if let Some(time) = rest.strip_suffix(['Z', 'z']) {
        time
    } else if let Some(at) = rest.rfind(['+', '-']) {
        let offset = &rest[at + 1..];
        let valid = offset.split_once(':').is_some_and(|(h, m)| {
            digits(h, 2).is_some_and(|h| h <= 23) && digits(m, 2).is_some_and(|m| m <= 59)
        });
        if !valid {
            return false;
        }
        &rest[..at]
    } else {
        rest
    };
    is_time(time)
}

/// The JSON-RPC answer to the server's request `id`.
pub fn answer(id: &Value, action: ElicitationAction, content: Option<&Value>) -> String {
    let mut result = json!({ "action": action.as_str() });
    if let (ElicitationAction::Accept, Some(content)) = (action, content) {
        result["content"] = content.clone();
    }
    json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
}

/// The JSON-RPC error answering a request this client refuses to show.
pub fn invalid(id: &Value, reason: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32602, "message": format!("Invalid params: {reason}") },
    })
    .to_string()
}

/// The names of `params.requestedSchema.properties` in the order the
/// message's text has them (a JSON object read into a `Value` loses it);
/// empty when the text is not such a message. A small scan of the text
/// rather than a typed parse: one more serde instantiation would cost the
/// module more than this.
pub fn property_order(text: &str) -> Vec<String> {
    let mut scan = Scan {
        text: text.as_bytes(),
        at: 0,
    };
    scan.keys_at(&["params", "requestedSchema", "properties"])
        .unwrap_or_default()
}

/// A cursor over JSON text, for [`property_order`].
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn skip_space(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// Expect `byte` (after any space).
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.skip_space();
        (self.text.get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    /// A string at the cursor, decoded.
    fn string(&mut self) -> Option<String> {
        self.skip_space();
        let start = self.at;
        self.skip_string()?;
        let raw = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        if !raw.contains('\\') {
            return Some(raw[1..raw.len() - 1].to_string());
        }
        match serde_json::from_str::<Value>(raw).ok()? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    fn skip_string(&mut self) -> Option<()> {
        (self.text.get(self.at) == Some(&b'"')).then_some(())?;
        self.at += 1;
        loop {
            match self.text.get(self.at)? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    /// Past one value of any kind.
    fn skip_value(&mut self) -> Option<()> {
        self.skip_space();
        match self.text.get(self.at)? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.text.get(self.at)? {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while self
                    .text
                    .get(self.at)
                    .is_some_and(|b| !b.is_ascii_whitespace() && !b",}]".contains(b))
                {
                    self.at += 1;
                }
                Some(())
            }
        }
    }

    /// The keys of the object at `path` (keys, object in object) from
    /// the object at the cursor.
    fn keys_at(&mut self, path: &[&str]) -> Option<Vec<String>> {
        self.eat(b'{')?;
        let mut keys = Vec::new();
        if self.eat(b'}').is_some() {
            return path.is_empty().then_some(keys);
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            match path.split_first() {
                Some((first, rest)) if key == *first => {
                    self.skip_space();
                    return self.keys_at(rest);
                }
                _ => self.skip_value()?,
            }
            // Each name once; past MAX_FIELDS the request is refused anyway.
            if path.is_empty() && !keys.contains(&key) {
                if keys.len() > MAX_FIELDS {
                    return Some(keys);
                }
                keys.push(key);
            }
            if self.eat(b',').is_none() {
                self.eat(b'}')?;
                return path.is_empty().then_some(keys);
            }
        }
    }
}

#[cfg(test)]
#[path = "elicitation_tests.rs"]
mod tests;
