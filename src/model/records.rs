//! Stored records decoded by hand from their JSON data ([`FromRecord`]).
//!
//! The worker reads every record but nodes through this: the JS object
//! becomes a `serde_json::Value` (the one decoder the module already has for
//! messages) and each record type takes its fields from it one by one. The
//! derived `Deserialize` of the record types stays for native code and
//! tests, but the module no longer holds its instantiation for
//! serde-wasm-bindgen's deserializer, one large visitor per record type
//! (BENCHMARKS.md item 28).
//!
//! Accepts exactly what the derived `Deserialize` accepts: unknown fields
//! are ignored, defaults are as declared on the types (a missing `Option` is
//! None), and a field of the wrong type is an error that names it. The
//! tests check that against the derive, field by field. A decoder takes
//! every field and reports the first problem at the end (`Fields::done`):
//! no early return per field, whose drop code for the fields already taken
//! made each decoder several times larger.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::*;
use crate::protocol::ErrorInfo;

/// A record type the worker decodes from its stored JSON data.
pub trait FromRecord: Sized {
    fn from_record(value: Value) -> Result<Self, String>;
}

/// A record's fields, taken one by one; the first problem is kept and
/// reported by [`Fields::done`] (a field that has one reads as a default).
struct Fields {
    map: Map<String, Value>,
    problem: Option<String>,
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Fields {
    fn of(value: Value) -> Result<Fields, String> {
        match value {
            Value::Object(map) => Ok(Fields { map, problem: None }),
            other => Err(format!(
                "invalid type: {}, expected a record object",
                kind_of(&other)
            )),
        }
    }

    fn done<T>(self, record: T) -> Result<T, String> {
        match self.problem {
            None => Ok(record),
            Some(problem) => Err(problem),
        }
    }

    #[inline(never)]
    fn fail(&mut self, key: &str, problem: String) {
        if self.problem.is_none() {
            self.problem = Some(format!("field `{key}`: {problem}"));
        }
    }

    #[inline(never)]
    fn missing(&mut self, key: &str) {
        if self.problem.is_none() {
            self.problem = Some(format!("missing field `{key}`"));
        }
    }

    /// The field's value, None when absent (a problem unless `optional`).
    #[inline(never)]
    fn take(&mut self, key: &'static str, optional: bool) -> Option<Value> {
        let value = self.map.remove(key);
        if value.is_none() && !optional {
            self.missing(key);
        }
        value
    }

    #[inline(never)]
    fn wrong(&mut self, key: &str, value: &Value, expected: &str) {
        self.fail(
            key,
            format!("invalid type: {}, expected {expected}", kind_of(value)),
        );
    }

    /// A required value of any JSON type (`serde_json::Value` fields).
    fn value(&mut self, key: &'static str) -> Value {
        self.take(key, false).unwrap_or(Value::Null)
    }

    /// A number that may be absent (absent and null are None).
    fn opt_f64(&mut self, key: &'static str) -> Option<f64> {
        match self.take(key, true) {
            Some(Value::Null) | None => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                self.wrong(key, &other, "f64");
                None
            }
        }
    }

    /// A value of any JSON type that may be absent (absent and null are None).
    fn opt_value(&mut self, key: &'static str) -> Option<Value> {
        self.take(key, true).filter(|v| !v.is_null())
    }

    #[inline(never)]
    fn string_in(&mut self, key: &'static str, value: Value) -> String {
        match value {
            Value::String(s) => s,
            other => {
                self.wrong(key, &other, "a string");
                String::new()
            }
        }
    }

    fn string(&mut self, key: &'static str) -> String {
        match self.take(key, false) {
            Some(value) => self.string_in(key, value),
            None => String::new(),
        }
    }

    /// Absent and null are both None.
    #[inline(never)]
    fn opt_string(&mut self, key: &'static str) -> Option<String> {
        match self.take(key, true) {
            Some(Value::Null) | None => None,
            Some(value) => Some(self.string_in(key, value)),
        }
    }

    /// An integer within `min..=max` (what serde accepts for the type).
    #[inline(never)]
    fn integer_in(&mut self, key: &'static str, value: Value, min: i64, max: u64) -> Option<i128> {
        let n = match &value {
            Value::Number(n) => n
                .as_u64()
                .map(i128::from)
                .or_else(|| n.as_i64().map(i128::from)),
            _ => None,
        };
        match n {
            Some(n) if n >= i128::from(min) && n <= i128::from(max) => Some(n),
            Some(_) => {
                self.fail(key, "invalid value: integer out of range".to_string());
                None
            }
            None => {
                self.wrong(key, &value, "an integer");
                None
            }
        }
    }

    /// `default`: what an absent field reads as (`#[serde(default)]`);
    /// None: the field is required (absent is a problem). None back when
    /// the field has a problem.
    #[inline(never)]
    fn integer(
        &mut self,
        key: &'static str,
        default: Option<i128>,
        min: i64,
        max: u64,
    ) -> Option<i128> {
        match self.take(key, default.is_some()) {
            Some(value) => self.integer_in(key, value, min, max),
            None => default,
        }
    }

    fn u64(&mut self, key: &'static str) -> u64 {
        self.integer(key, None, 0, u64::MAX).unwrap_or(0) as u64
    }

    fn u64_or_default(&mut self, key: &'static str) -> u64 {
        self.integer(key, Some(0), 0, u64::MAX).unwrap_or(0) as u64
    }

    fn u32(&mut self, key: &'static str) -> u32 {
        self.integer(key, None, 0, u64::from(u32::MAX)).unwrap_or(0) as u32
    }

    fn u32_or_default(&mut self, key: &'static str) -> u32 {
        self.integer(key, Some(0), 0, u64::from(u32::MAX))
            .unwrap_or(0) as u32
    }

    fn i64(&mut self, key: &'static str) -> i64 {
        self.integer(key, None, i64::MIN, i64::MAX as u64)
            .unwrap_or(0) as i64
    }

    /// Absent and null are both None.
    #[inline(never)]
    fn opt_integer(&mut self, key: &'static str, min: i64, max: u64) -> Option<i128> {
        match self.take(key, true) {
            Some(Value::Null) | None => None,
            Some(value) => self.integer_in(key, value, min, max),
        }
    }

    fn opt_u64(&mut self, key: &'static str) -> Option<u64> {
        self.opt_integer(key, 0, u64::MAX).map(|n| n as u64)
    }

    fn opt_u32(&mut self, key: &'static str) -> Option<u32> {
        self.opt_integer(key, 0, u64::from(u32::MAX))
            .map(|n| n as u32)
    }

    fn opt_i64(&mut self, key: &'static str) -> Option<i64> {
        self.opt_integer(key, i64::MIN, i64::MAX as u64)
            .map(|n| n as i64)
    }

    /// `default`: what an absent field reads as; None: required.
    #[inline(never)]
    fn bool(&mut self, key: &'static str, default: Option<bool>) -> bool {
        match self.take(key, default.is_some()) {
            Some(Value::Bool(b)) => b,
            Some(other) => {
                self.wrong(key, &other, "a boolean");
                false
            }
            None => default.unwrap_or(false),
        }
    }

    /// A list of strings; absent is empty (`#[serde(default)]`).
    #[inline(never)]
    fn strings_or_default(&mut self, key: &'static str) -> Vec<String> {
        match self.take(key, true) {
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| self.string_in(key, item))
                .collect(),
            Some(other) => {
                self.wrong(key, &other, "a sequence");
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// A unit enum by its serde name (the derive's own names).
    fn name<T: DeserializeOwned>(&mut self, key: &'static str, fallback: T) -> T {
        match self.take(key, false) {
            Some(value) => self.name_in(key, value).unwrap_or(fallback),
            None => fallback,
        }
    }

    /// Absent and null are both None.
    fn opt_name<T: DeserializeOwned>(&mut self, key: &'static str) -> Option<T> {
        match self.take(key, true) {
            Some(Value::Null) | None => None,
            Some(value) => self.name_in(key, value),
        }
    }

    fn name_in<T: DeserializeOwned>(&mut self, key: &'static str, value: Value) -> Option<T> {
        match serde_json::from_value(value) {
            Ok(x) => Some(x),
            Err(e) => {
                self.fail(key, e.to_string());
                None
            }
        }
    }

    /// A value its serde derive reads (absent: the default).
    fn serde_or_default<T: DeserializeOwned + Default>(&mut self, key: &'static str) -> T {
        match self.take(key, true) {
            Some(value) => self.name_in(key, value).unwrap_or_default(),
            None => T::default(),
        }
    }

    /// A nested record (`default`: what an absent field reads as, as
    /// `#[serde(default)]`; None: required).
    fn rec<T: FromRecord + Default>(&mut self, key: &'static str, default: Option<T>) -> T {
        match self.take(key, default.is_some()) {
            Some(value) => self.rec_in(key, value).unwrap_or_default(),
            None => default.unwrap_or_default(),
        }
    }

    /// Absent and null are both None.
    fn opt_rec<T: FromRecord>(&mut self, key: &'static str) -> Option<T> {
        match self.take(key, true) {
            Some(Value::Null) | None => None,
            Some(value) => self.rec_in(key, value),
        }
    }

    fn rec_in<T: FromRecord>(&mut self, key: &'static str, value: Value) -> Option<T> {
        match T::from_record(value) {
            Ok(x) => Some(x),
            Err(e) => {
                self.fail(key, e);
                None
            }
        }
    }

    /// A list of nested records.
    fn recs<T: FromRecord>(&mut self, key: &'static str) -> Vec<T> {
        match self.take(key, false) {
            Some(Value::Array(items)) => items
                .into_iter()
                .filter_map(|item| self.rec_in(key, item))
                .collect(),
            Some(other) => {
                self.wrong(key, &other, "a sequence");
                Vec::new()
            }
            None => Vec::new(),
        }
    }
}

impl FromRecord for Thread {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = Thread {
            id: f.string("id"),
            title: f.string("title"),
            leaf_id: f.opt_string("leafId"),
            created_at: f.u64("createdAt"),
            updated_at: f.u64("updatedAt"),
            revision: f.u64("revision"),
            parent_thread_id: f.opt_string("parentThreadId"),
            usage: f.rec("usage", Some(Usage::default())),
            path_len: f.opt_u64("pathLen"),
        };
        f.done(record)
    }
}

impl FromRecord for Usage {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = Usage {
            input: f.u64("input"),
            output: f.u64("output"),
            cache_read: f.u64_or_default("cacheRead"),
            cache_write: f.u64_or_default("cacheWrite"),
            reasoning: f.u64_or_default("reasoning"),
        };
        f.done(record)
    }
}

impl FromRecord for ProviderProfile {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = ProviderProfile {
            kind: f.string("kind"),
            base_url: f.string("baseUrl"),
            model: f.string("model"),
            max_output_tokens: f.opt_u32("maxOutputTokens"),
            temperature_centi: f.opt_u32("temperatureCenti"),
            vision: f.bool("vision", Some(false)),
            tool_use: f.bool("toolUse", Some(yes())),
            token_budget: f.opt_u64("tokenBudget"),
            context_window: f.opt_u64("contextWindow"),
        };
        f.done(record)
    }
}

impl FromRecord for InFlightTool {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = InFlightTool {
            call_id: f.string("callId"),
            name: f.string("name"),
        };
        f.done(record)
    }
}

impl FromRecord for ErrorInfo {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = ErrorInfo {
            kind: f.name("kind", crate::protocol::ErrorKind::Internal),
            message: f.string("message"),
        };
        f.done(record)
    }
}

impl FromRecord for Run {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = Run {
            id: f.string("id"),
            thread_id: f.string("threadId"),
            state: f.name("state", RunState::Failed),
            created_at: f.u64("createdAt"),
            updated_at: f.u64("updatedAt"),
            revision: f.u64("revision"),
            step: f.u32("step"),
            profile: f.rec("profile", None),
            consecutive_failures: f.u32_or_default("consecutiveFailures"),
            tools_disabled: f.bool("toolsDisabled", Some(false)),
            in_flight_tool: f.opt_rec("inFlightTool"),
            pending_approval: f.opt_string("pendingApproval"),
            pending_interaction: f.opt_string("pendingInteraction"),
            stop_reason: f.opt_name("stopReason"),
            error: f.opt_rec("error"),
            usage: f.rec("usage", Some(Usage::default())),
            // Records written before environments had their own store.
            environment: f.opt_rec("environment"),
        };
        f.done(record)
    }
}

impl FromRecord for CatalogEntry {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = CatalogEntry {
            name: f.string("name"),
            digest: f.string("digest"),
        };
        f.done(record)
    }
}

impl FromRecord for EnvironmentSnapshot {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = EnvironmentSnapshot {
            version: f.u32("version"),
            system_prompt: f.string("systemPrompt"),
            transport: f.string("transport"),
            credential_ref: f.string("credentialRef"),
            tools: f.recs("tools"),
        };
        f.done(record)
    }
}

impl FromRecord for EnvironmentRecord {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = EnvironmentRecord {
            run_id: f.string("runId"),
            thread_id: f.string("threadId"),
            environment: f.rec("environment", None),
        };
        f.done(record)
    }
}

impl FromRecord for PendingSteer {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = PendingSteer {
            id: f.string("id"),
            thread_id: f.string("threadId"),
            run_id: f.string("runId"),
            admission_seq: f.u64("admissionSeq"),
            text: f.string("text"),
            attachments: f.serde_or_default("attachments"),
            created_at: f.u64("createdAt"),
        };
        f.done(record)
    }
}

impl FromRecord for QueueItem {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = QueueItem {
            id: f.string("id"),
            thread_id: f.string("threadId"),
            position: f.u64("position"),
            text: f.string("text"),
            attachments: f.serde_or_default("attachments"),
            created_at: f.u64("createdAt"),
        };
        f.done(record)
    }
}

impl FromRecord for Receipt {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = Receipt {
            key: f.string("key"),
            op_type: f.string("opType"),
            fingerprint: f.string("fingerprint"),
            result: f.value("result"),
            created_at: f.u64("createdAt"),
        };
        f.done(record)
    }
}

impl FromRecord for ApprovalRecord {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = ApprovalRecord {
            id: f.string("id"),
            thread_id: f.string("threadId"),
            run_id: f.string("runId"),
            call_id: f.string("callId"),
            tool_name: f.string("toolName"),
            label: f.string("label"),
            params: f.value("params"),
            origin: f.string("origin"),
            url: f.string("url"),
            tab_id: f.i64("tabId"),
            frame_id: f.opt_i64("frameId"),
            page_url: f.opt_string("pageUrl"),
            document_id: f.opt_string("documentId"),
            element: f.opt_rec("element"),
            server: f.opt_string("server"),
            server_url: f.opt_string("serverUrl"),
            status: f.name("status", ApprovalStatus::Cancelled),
            created_at: f.u64("createdAt"),
            decided_at: f.opt_u64("decidedAt"),
        };
        f.done(record)
    }
}

impl FromRecord for crate::model::TargetElement {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = crate::model::TargetElement {
            reference: f.string("ref"),
            role: f.string("role"),
            name: f.string("name"),
            state: f.opt_string("state").unwrap_or_default(),
        };
        f.done(record)
    }
}

impl FromRecord for InteractionRecord {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = InteractionRecord {
            id: f.string("id"),
            thread_id: f.string("threadId"),
            run_id: f.string("runId"),
            call_id: f.string("callId"),
            question: f.string("question"),
            options: f.strings_or_default("options"),
            status: f.name("status", InteractionStatus::Cancelled),
            answer: f.opt_string("answer"),
            created_at: f.u64("createdAt"),
            answered_at: f.opt_u64("answeredAt"),
            server: f.opt_string("server"),
            server_url: f.opt_string("serverUrl"),
            form: f.opt_rec("form"),
            action: f.opt_name("action"),
            content: f.opt_value("content"),
        };
        f.done(record)
    }
}

impl FromRecord for ElicitationForm {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = ElicitationForm {
            fields: f.recs("fields"),
        };
        f.done(record)
    }
}

impl FromRecord for FormField {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = FormField {
            name: f.string("name"),
            kind: f.name("type", FieldKind::String),
            title: f.opt_string("title"),
            description: f.opt_string("description"),
            required: f.bool("required", Some(false)),
            options: f.strings_or_default("options"),
            option_labels: f.strings_or_default("optionLabels"),
            format: f.opt_name("format"),
            min_length: f.opt_u64("minLength"),
            max_length: f.opt_u64("maxLength"),
            minimum: f.opt_f64("minimum"),
            maximum: f.opt_f64("maximum"),
            default: f.opt_value("default"),
        };
        f.done(record)
    }
}

impl FromRecord for SiteRule {
    fn from_record(value: Value) -> Result<Self, String> {
        let mut f = Fields::of(value)?;
        let record = SiteRule {
            origin: f.string("origin"),
            allow_writes: f.bool("allowWrites", None),
            version: f.u64("version"),
            created_at: f.u64("createdAt"),
        };
        f.done(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;
    use std::fmt::Debug;

    /// `sample` round-trips, and for every field of its stored form, absent,
    /// null, or of every other JSON type, and with an unknown field added,
    /// the hand decoder accepts what the derive accepts and gives the same
    /// record.
    fn agrees_with_the_derive<T>(sample: &T, extra: &[(&str, Value)])
    where
        T: FromRecord + DeserializeOwned + Serialize + PartialEq + Debug,
    {
        let Value::Object(mut stored) = serde_json::to_value(sample).expect("serializes") else {
            panic!("a record is an object");
        };
        for (key, value) in extra {
            stored.insert((*key).to_string(), value.clone());
        }
        let stored = Value::Object(stored);
        assert_eq!(
            &T::from_record(stored.clone()).expect("decodes"),
            &serde_json::from_value::<T>(stored.clone()).expect("the derive decodes"),
        );
        let others = [
            Value::Null,
            json!(true),
            json!(7),
            json!(-3),
            json!(1.5),
            json!("x"),
            json!([]),
            json!([{}]),
            json!({}),
        ];
        let mut variants = vec![stored.clone(), json!("not a record"), json!(null)];
        let keys: Vec<String> = stored
            .as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect();
        for key in keys.iter().chain([&"unknown".to_string()]) {
            let mut without = stored.clone();
            without.as_object_mut().expect("object").remove(key);
            variants.push(without);
            for other in &others {
                let mut changed = stored.clone();
                changed[key.as_str()] = other.clone();
                variants.push(changed);
            }
        }
        for variant in variants {
            let by_hand = T::from_record(variant.clone());
            let derived = serde_json::from_value::<T>(variant.clone());
            match (&by_hand, &derived) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{variant}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{variant}: by hand {by_hand:?}, derived {derived:?}"),
            }
        }
    }

    fn profile() -> ProviderProfile {
        ProviderProfile {
            kind: "openai".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
            max_output_tokens: Some(512),
            temperature_centi: Some(30),
            vision: true,
            tool_use: false,
            token_budget: Some(10_000),
            context_window: Some(128_000),
        }
    }

    fn environment() -> EnvironmentSnapshot {
        EnvironmentSnapshot {
            version: 1,
            system_prompt: "You drive web pages.".into(),
            transport: "openai".into(),
            credential_ref: "chrome.storage.local:settings.apiKey".into(),
            tools: vec![CatalogEntry {
                name: "click".into(),
                digest: "ab".repeat(32),
            }],
        }
    }

    #[test]
    fn stored_records_decode_by_hand_exactly_as_the_derive_decodes_them() {
        let usage = Usage {
            input: 10,
            output: 20,
            cache_read: 3,
            cache_write: 4,
            reasoning: 5,
        };
        agrees_with_the_derive(
            &Thread {
                id: "t1".into(),
                title: "Shop".into(),
                leaf_id: Some("n9".into()),
                created_at: 1,
                updated_at: 2,
                revision: 3,
                parent_thread_id: Some("t0".into()),
                usage,
                path_len: Some(9),
            },
            &[],
        );
        agrees_with_the_derive(
            &Thread {
                id: "t1".into(),
                title: String::new(),
                leaf_id: None,
                created_at: 1,
                updated_at: 2,
                revision: 0,
                parent_thread_id: None,
                usage: Usage::default(),
                path_len: None,
            },
            &[],
        );
        agrees_with_the_derive(&usage, &[]);
        agrees_with_the_derive(&profile(), &[]);
        agrees_with_the_derive(&ProviderProfile::default(), &[]);
        let run = Run {
            id: "r1".into(),
            thread_id: "t1".into(),
            state: RunState::PausedUncertain,
            created_at: 1,
            updated_at: 2,
            revision: 3,
            step: 4,
            profile: profile(),
            consecutive_failures: 2,
            tools_disabled: true,
            in_flight_tool: Some(InFlightTool {
                call_id: "c1".into(),
                name: "click".into(),
            }),
            pending_approval: Some("a1".into()),
            pending_interaction: Some("i1".into()),
            stop_reason: Some(StopReason::MaxTokens),
            error: Some(ErrorInfo::new(
                crate::protocol::ErrorKind::RateLimited,
                "Slow down.",
            )),
            usage,
            environment: None,
        };
        agrees_with_the_derive(&run, &[]);
        // A record written before environments had their own store.
        agrees_with_the_derive(
            &run,
            &[(
                "environment",
                serde_json::to_value(environment()).expect("serializes"),
            )],
        );
        let legacy = {
            let mut stored = serde_json::to_value(&run).expect("serializes");
            stored["environment"] = serde_json::to_value(environment()).expect("serializes");
            Run::from_record(stored).expect("decodes")
        };
        assert_eq!(legacy.environment, Some(environment()));
        agrees_with_the_derive(
            &Run {
                state: RunState::StreamingModel,
                in_flight_tool: None,
                pending_approval: None,
                pending_interaction: None,
                stop_reason: None,
                error: None,
                ..run.clone()
            },
            &[],
        );
        agrees_with_the_derive(&environment(), &[]);
        agrees_with_the_derive(
            &EnvironmentRecord {
                run_id: "r1".into(),
                thread_id: "t1".into(),
                environment: environment(),
            },
            &[],
        );
        agrees_with_the_derive(
            &PendingSteer {
                id: "s1".into(),
                thread_id: "t1".into(),
                run_id: "r1".into(),
                admission_seq: 5,
                text: "also the shoes".into(),
                attachments: vec![crate::model::Attachment::Image {
                    name: "shoes.jpg".into(),
                    media_type: "image/jpeg".into(),
                    data: "aGk=".into(),
                }],
                created_at: 9,
            },
            &[],
        );
        agrees_with_the_derive(
            &QueueItem {
                id: "q1".into(),
                thread_id: "t1".into(),
                position: 2,
                text: "then the hats".into(),
                attachments: vec![crate::model::Attachment::Text {
                    name: "hats.txt".into(),
                    media_type: "text/plain".into(),
                    text: "red, blue".into(),
                }],
                created_at: 9,
            },
            &[],
        );
        agrees_with_the_derive(
            &Receipt {
                key: "c\u{1f}s".into(),
                op_type: "turn.submit".into(),
                fingerprint: "ff".repeat(32),
                result: json!({ "threadId": "t1", "turnId": "r1" }),
                created_at: 9,
            },
            &[],
        );
        let approval = ApprovalRecord {
            id: "a1".into(),
            thread_id: "t1".into(),
            run_id: "r1".into(),
            call_id: "c1".into(),
            tool_name: "click".into(),
            label: "Click Subscribe".into(),
            params: json!({ "ref": "e1" }),
            origin: "https://shop.example".into(),
            url: "https://shop.example/a".into(),
            tab_id: 12,
            frame_id: Some(3),
            page_url: Some("https://outer.example/".into()),
            document_id: Some("8F1C0A".into()),
            element: Some(crate::model::TargetElement {
                reference: "f3:e1".into(),
                role: "button".into(),
                name: "Subscribe".into(),
                state: "(disabled)".into(),
            }),
            server: None,
            server_url: None,
            status: ApprovalStatus::AcceptedForSite,
            created_at: 1,
            decided_at: Some(2),
        };
        agrees_with_the_derive(&approval, &[]);
        agrees_with_the_derive(
            &ApprovalRecord {
                tool_name: "docs__search".into(),
                origin: String::new(),
                url: String::new(),
                tab_id: -1,
                frame_id: None,
                page_url: None,
                document_id: None,
                element: None,
                server: Some("docs".into()),
                server_url: Some("https://mcp.example/mcp".into()),
                ..approval.clone()
            },
            &[],
        );
        agrees_with_the_derive(
            &ApprovalRecord {
                frame_id: None,
                page_url: None,
                status: ApprovalStatus::Pending,
                decided_at: None,
                ..approval
            },
            &[],
        );
        let interaction = InteractionRecord {
            id: "i1".into(),
            thread_id: "t1".into(),
            run_id: "r1".into(),
            call_id: "c1".into(),
            question: "Which size?".into(),
            options: vec!["S".into(), "M".into()],
            status: InteractionStatus::Answered,
            answer: Some("M".into()),
            created_at: 1,
            answered_at: Some(2),
            server: None,
            server_url: None,
            form: None,
            action: None,
            content: None,
        };
        agrees_with_the_derive(&interaction, &[]);
        agrees_with_the_derive(
            &InteractionRecord {
                question: "Where shall the table be?".into(),
                options: Vec::new(),
                answer: None,
                server: Some("bookings".into()),
                server_url: Some("https://mcp.example/mcp".into()),
                form: Some(ElicitationForm {
                    fields: vec![
                        FormField {
                            name: "email".into(),
                            kind: FieldKind::String,
                            title: Some("Email".into()),
                            description: Some("For the confirmation".into()),
                            required: true,
                            options: Vec::new(),
                            option_labels: Vec::new(),
                            format: Some(StringFormat::Email),
                            min_length: Some(3),
                            max_length: Some(200),
                            minimum: None,
                            maximum: None,
                            default: None,
                        },
                        FormField {
                            name: "seats".into(),
                            kind: FieldKind::Integer,
                            title: None,
                            description: None,
                            required: false,
                            options: Vec::new(),
                            option_labels: Vec::new(),
                            format: None,
                            min_length: None,
                            max_length: None,
                            minimum: Some(1.0),
                            maximum: Some(12.5),
                            default: Some(json!(2)),
                        },
                        FormField {
                            name: "room".into(),
                            kind: FieldKind::String,
                            title: None,
                            description: None,
                            required: false,
                            options: vec!["in".into(), "out".into()],
                            option_labels: vec!["Inside".into(), "Terrace".into()],
                            format: None,
                            min_length: None,
                            max_length: None,
                            minimum: None,
                            maximum: None,
                            default: None,
                        },
                    ],
                }),
                action: Some(ElicitationAction::Accept),
                content: Some(json!({ "email": "ada@example.com", "seats": 4 })),
                ..interaction.clone()
            },
            &[],
        );
        agrees_with_the_derive(
            &InteractionRecord {
                options: Vec::new(),
                status: InteractionStatus::Pending,
                answer: None,
                answered_at: None,
                ..interaction
            },
            &[],
        );
        let field = FormField {
            name: "seats".into(),
            kind: FieldKind::Integer,
            title: Some("Seats".into()),
            description: Some("How many".into()),
            required: true,
            options: vec!["1".into()],
            option_labels: vec!["One".into()],
            format: Some(StringFormat::Date),
            min_length: Some(1),
            max_length: Some(3),
            minimum: Some(1.5),
            maximum: Some(12.0),
            default: Some(json!(2)),
        };
        agrees_with_the_derive(&field, &[]);
        agrees_with_the_derive(
            &ElicitationForm {
                fields: vec![field],
            },
            &[],
        );
        agrees_with_the_derive(
            &SiteRule {
                origin: "https://shop.example".into(),
                allow_writes: true,
                version: 2,
                created_at: 1,
            },
            &[],
        );
    }

    #[test]
    fn a_record_that_does_not_decode_names_the_field() {
        let mut stored = serde_json::to_value(PendingSteer {
            id: "s1".into(),
            thread_id: "t1".into(),
            run_id: "r1".into(),
            admission_seq: 5,
            text: "x".into(),
            attachments: vec![],
            created_at: 9,
        })
        .expect("serializes");
        stored["admissionSeq"] = json!("five");
        let error = PendingSteer::from_record(stored.clone()).expect_err("a string");
        assert!(
            error.starts_with("field `admissionSeq`: invalid type"),
            "{error}"
        );
        stored.as_object_mut().expect("object").remove("text");
        stored["admissionSeq"] = json!(5);
        assert_eq!(
            PendingSteer::from_record(stored).expect_err("missing"),
            "missing field `text`"
        );
        let error = QueueItem::from_record(json!({
            "id": "q", "threadId": "t", "position": 1, "text": "x", "createdAt": 1,
            "attachments": [{ "kind": "audio", "name": "a.mp3" }],
        }))
        .expect_err("an unknown kind of file");
        assert!(
            error.starts_with("field `attachments`: unknown variant `audio`"),
            "{error}"
        );
        let error = Run::from_record(json!({ "id": "r", "threadId": "t", "state": "resting" }))
            .expect_err("an unknown state");
        assert!(
            error.starts_with("field `state`: unknown variant `resting`"),
            "{error}"
        );
    }
}
