//! Tool descriptors, the registry, parameter validation and catalog digests.
//!
//! Owns: the one normalized, read-only descriptor per tool from which the
//! provider's JSON Schema and the run's tool catalog are generated; parameter
//! validation against that schema (a failure becomes an error tool result the
//! model can correct); the SHA-256 digest of each catalog entry.
//!
//! Must not: execute DOM actions (content scripts do) or do IO.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::provider::ToolSpec;

/// Where a tool runs and how much it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    L0,
    L1,
    L2,
    Mcp,
    Builtin,
}

/// Whether a tool changes anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effects {
    Read,
    Write,
}

/// What recovery may do with a call that was dispatched before a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recovery {
    /// Running it again is harmless.
    RetrySafe,
    /// Look at the world before deciding.
    InspectFirst,
    /// Never dispatch twice for one call id; an unknown outcome asks the user.
    NeverRetry,
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Binding {
    /// Run by the content script in the target tab.
    Page,
    /// Run by the driver with the tabs API on the target tab (navigation).
    Tab,
    /// Run by the driver on the browser as a whole (the tab list).
    Browser,
    /// Run by the engine itself (`ask_user`).
    Engine,
    /// Run by a function the embedding extension registered in its service
    /// worker (`extension/host-tools.js`, [`HostDefinition::parse`]).
    Host,
    /// A tool of an MCP server (`crate::mcp`): the server's name, its
    /// endpoint, and the names of the headers it is sent (not their values).
    Mcp {
        server: String,
        endpoint: String,
        auth: String,
    },
}

impl Binding {
    /// Whether the call acts on one tab that must be resolved and gatekept.
    pub fn targets_tab(&self) -> bool {
        matches!(self, Binding::Page | Binding::Tab)
    }
}

/// The normalized, read-only description of one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDescriptor {
    pub name: String,
    /// Shown in the UI.
    pub label: String,
    /// Shown to the model.
    pub description: String,
    /// JSON Schema of the parameters (an object schema).
    pub parameters: Value,
    pub level: Level,
    pub effects: Effects,
    pub recovery: Recovery,
    pub binding: Binding,
    /// May run together with neighbouring parallel-safe reads.
    #[serde(default)]
    pub parallel_safe: bool,
    /// Only offered to models with vision (it returns images).
    #[serde(default)]
    pub requires_vision: bool,
    /// The UI gets a line diff against this tool's previous successful result
    /// on the same page (`details.diff`, see `crate::diff`); the model still
    /// gets the full content. UI only, so not part of the digest.
    #[serde(default)]
    pub diff_details: bool,
}

impl ToolDescriptor {
    /// A descriptor with the defaults: reads are retry-safe, writes never-retry.
    pub fn new(
        name: &str,
        label: &str,
        description: &str,
        parameters: Value,
        level: Level,
        effects: Effects,
        binding: Binding,
    ) -> Self {
        ToolDescriptor {
            name: name.into(),
            label: label.into(),
            description: description.into(),
            parameters,
            level,
            effects,
            recovery: match effects {
                Effects::Read => Recovery::RetrySafe,
                Effects::Write => Recovery::NeverRetry,
            },
            binding,
            parallel_safe: false,
            requires_vision: false,
            diff_details: false,
        }
    }

    /// Override the recovery default.
    pub fn recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// Offer the tool only to models with vision.
    pub fn requires_vision(mut self) -> Self {
        self.requires_vision = true;
        self
    }

    /// Show the UI what changed since the previous result on the same page.
    pub fn diff_details(mut self) -> Self {
        self.diff_details = true;
        self
    }

    /// Mark a read as safe to run alongside other parallel-safe reads.
    pub fn parallel_safe(mut self) -> Self {
        self.parallel_safe = self.effects == Effects::Read;
        self
    }

    /// The provider-facing schema.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }

    /// SHA-256 over schema, security metadata and binding (hex).
    pub fn digest(&self) -> String {
        let canonical = json!({
            "name": self.name,
            "parameters": self.parameters,
            "level": self.level,
            "effects": self.effects,
            "recovery": self.recovery,
            "binding": self.binding,
            "parallelSafe": self.parallel_safe,
            "requiresVision": self.requires_vision,
        });
        hex(&Sha256::digest(canonical.to_string().as_bytes()))
    }
}

/// How long a tool's call may take when nothing else is said (ms): the page
/// tools' limit, and a host tool's default.
pub const TOOL_TIME_LIMIT_MS: u32 = 60_000;

/// The longest `timeoutMs` a host tool may ask for (ms). Decision: five
/// minutes, Chrome's own limit on one piece of a service worker's work; a
/// worker stopped during a longer call is recovered like a crash (the
/// tool's `recovery` says what happens), so a longer limit would promise
/// what the browser does not keep.
pub const HOST_TOOL_MAX_TIME_LIMIT_MS: u32 = 300_000;

/// A tool the embedding extension defines in its service worker
/// (`extension/host-tools.js`), read from its definition without the
/// `execute` function, as JSON data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDefinition {
    pub descriptor: ToolDescriptor,
    /// How long a call may take before it is given up (and its `signal`
    /// aborted), ms: `timeoutMs`, or [`TOOL_TIME_LIMIT_MS`]. The driver's
    /// business only: not in the descriptor, so not in the digest (a new
    /// limit is not a different tool for a run that resumes).
    pub time_limit_ms: u32,
}

impl HostDefinition {
    /// Errors name the tool and what to fix; the registry still checks the
    /// name and the schema ([`ToolRegistry::register`]).
    ///
    /// Decisions: `effects` has no default (it decides whether the user is
    /// asked, so it must be said); the recovery follows it unless given; a
    /// missing label is the name and missing parameters are none; unknown
    /// fields are refused (a misspelt `effect` must not pass as a read);
    /// `timeoutMs` is a whole number of ms from 1 to
    /// [`HOST_TOOL_MAX_TIME_LIMIT_MS`]; `parallelSafe` only for retry-safe
    /// reads. Such tools run without a page, one at a time in the model's
    /// order, except neighbouring parallel-safe reads (theirs and the page
    /// reads), which run together: the gatekeeper lets reads run and asks
    /// before every write, and their approvals cannot become site rules.
    pub fn parse(definition: &Value) -> Result<HostDefinition, RegistryError> {
        const FIELDS: [&str; 9] = [
            "name",
            "label",
            "description",
            "parameters",
            "effects",
            "recovery",
            "parallelSafe",
            "timeoutMs",
            "execute",
        ];
        let object = definition
            .as_object()
            .ok_or_else(|| RegistryError("a host tool definition must be an object".to_string()))?;
        let name = match object.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => {
                return Err(RegistryError(
                    "a host tool needs a string `name`".to_string(),
                ))
            }
        };
        let fail = |what: String| RegistryError(format!("host tool {name:?}: {what}"));
        if let Some(key) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(fail(format!(
                "unknown field `{key}` (known: {})",
                FIELDS.join(", ")
            )));
        }
        let text = |key: &str| match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(fail(format!("`{key}` must be a string"))),
        };
        let description = text("description")?
            .ok_or_else(|| fail("needs a `description` (what the model reads)".to_string()))?;
        let label = text("label")?.unwrap_or_else(|| name.clone());
        let effects = match text("effects")?.as_deref() {
            Some("read") => Effects::Read,
            Some("write") => Effects::Write,
            _ => return Err(fail("`effects` must be \"read\" or \"write\"".to_string())),
        };
        let parameters = match object.get("parameters") {
            None | Some(Value::Null) => schema(NO_PARAMETERS),
            Some(schema) => schema.clone(),
        };
        let mut descriptor = ToolDescriptor::new(
            &name,
            &label,
            &description,
            parameters,
            Level::Builtin,
            effects,
            Binding::Host,
        );
        match text("recovery")?.as_deref() {
            None => {}
            Some("retry-safe") => descriptor.recovery = Recovery::RetrySafe,
            Some("inspect-first") => descriptor.recovery = Recovery::InspectFirst,
            Some("never-retry") => descriptor.recovery = Recovery::NeverRetry,
            Some(_) => {
                return Err(fail(
                    "`recovery` must be \"retry-safe\", \"inspect-first\" or \"never-retry\""
                        .to_string(),
                ))
            }
        }
        match object.get("parallelSafe") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true))
                if effects == Effects::Read && descriptor.recovery == Recovery::RetrySafe =>
            {
                descriptor.parallel_safe = true;
            }
            Some(Value::Bool(true)) => {
                return Err(fail(
                    "`parallelSafe` is for reads that are safe to run again (effects \"read\", recovery \"retry-safe\")"
                        .to_string(),
                ))
            }
            Some(_) => return Err(fail("`parallelSafe` must be true or false".to_string())),
        }
        let time_limit_ms = match object.get("timeoutMs") {
            None | Some(Value::Null) => TOOL_TIME_LIMIT_MS,
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|ms| (1..=u64::from(HOST_TOOL_MAX_TIME_LIMIT_MS)).contains(ms))
                .map(|ms| ms as u32)
                .ok_or_else(|| {
                    fail(format!(
                        "`timeoutMs` must be a whole number of milliseconds from 1 to {HOST_TOOL_MAX_TIME_LIMIT_MS}, not {n}"
                    ))
                })?,
            Some(_) => return Err(fail("`timeoutMs` must be a number".to_string())),
        };
        Ok(HostDefinition {
            descriptor,
            time_limit_ms,
        })
    }
}

/// A time limit as the model and the user read it: "1 second", "90
/// seconds", "1500 ms".
pub fn time_limit_text(ms: u32) -> String {
    match ms {
        1000 => "1 second".to_string(),
        ms if ms % 1000 == 0 => format!("{} seconds", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError(pub String);

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RegistryError {}

/// The parameters' schema of a built-in tool that takes none.
const NO_PARAMETERS: &str =
    r#"{"type": "object", "properties": {}, "required": [], "additionalProperties": false}"#;

/// The schema of a built-in tool's `ref` parameter (a JSON text literal, for
/// `concat!`).
macro_rules! element_ref {
    () => {
        r#"{"type": "string", "description": "Element ref from page_snapshot or read_page, e.g. e12, or f3:e12 for an element inside a frame from another site."}"#
    };
}

/// A built-in tool's parameters' schema, written as JSON text and parsed when
/// the registry is built: `json!` builds a value with code for every key and
/// string (6 KB of the module for the thirteen tools; BENCHMARKS.md item 22),
/// the text is data, and the parser is in the module anyway. The digests are
/// those of the same values (`built_in_digests_are_unchanged`).
fn schema(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| {
        // Caught by the tests: a tool with this schema fails to register.
        debug_assert!(false, "a built-in schema is not JSON: {e}");
        Value::Null
    })
}

/// The set of tools a run may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolRegistry {
    tools: Vec<ToolDescriptor>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in browser tools of the extension.
    ///
    /// Classification decisions: scrolling, waiting and switching tabs change
    /// what is shown, not the site's data, so they are reads (no approval);
    /// navigation and going back are writes (they ask), but repeating them is
    /// harmless or checkable, so their recovery is retry-safe / inspect-first.
    pub fn page_tools() -> Self {
        let mut registry = Self::new();
        for descriptor in [
            ToolDescriptor::new(
                "page_snapshot",
                "Page outline",
                "A compact outline of the visible page: headings, landmarks, text, and every interactive element with a ref (e.g. e12), its role, name, value and state. Frames from other sites are included under their iframe line, with refs like f3:e12. Refs stay valid until the page changes. Prefer this over read_page to decide what to click or type.",
                schema(NO_PARAMETERS),
                Level::L0,
                Effects::Read,
                Binding::Page,
            )
            .parallel_safe()
            .diff_details(),
            ToolDescriptor::new(
                "read_page",
                "Read page",
                "Read the current tab: title, URL, visible main text, and a list of interactive elements, each with a ref like e12 that other tools accept. Call this first, and again after the page changed.",
                schema(NO_PARAMETERS),
                Level::L0,
                Effects::Read,
                Binding::Page,
            )
            .parallel_safe(),
            ToolDescriptor::new(
                "click",
                "Click",
                "Click an element of the current tab. Pass the ref from page_snapshot/read_page (preferred), or the element's visible text.",
                schema(concat!(
                    r#"{"type": "object", "additionalProperties": false, "properties": {"ref": "#,
                    element_ref!(),
                    r#", "text": {"type": "string", "description": "Visible text or accessible name of the element, used when no ref is known."}}}"#
                )),
                Level::L1,
                Effects::Write,
                Binding::Page,
            ),
            ToolDescriptor::new(
                "type",
                "Type text",
                "Type text into an input, textarea or editable element (replacing its content). Set submit to true to press Enter afterwards.",
                schema(concat!(
                    r#"{"type": "object", "additionalProperties": false, "required": ["ref", "text"], "properties": {"ref": "#,
                    element_ref!(),
                    r#", "text": {"type": "string", "description": "The text to type."}, "submit": {"type": "boolean", "description": "Press Enter after typing."}}}"#
                )),
                Level::L1,
                Effects::Write,
                Binding::Page,
            ),
            ToolDescriptor::new(
                "select",
                "Choose option",
                "Choose an option of a select element by its visible label or value.",
                schema(concat!(
                    r#"{"type": "object", "additionalProperties": false, "required": ["ref", "option"], "properties": {"ref": "#,
                    element_ref!(),
                    r#", "option": {"type": "string", "description": "Visible label or value of the option."}}}"#
                )),
                Level::L1,
                Effects::Write,
                Binding::Page,
            ),
            ToolDescriptor::new(
                "scroll",
                "Scroll",
                "Scroll an element into view (ref), or the page in a direction.",
                schema(concat!(
                    r#"{"type": "object", "additionalProperties": false, "properties": {"ref": "#,
                    element_ref!(),
                    r#", "direction": {"type": "string", "enum": ["up", "down", "top", "bottom"]}}}"#
                )),
                Level::L0,
                Effects::Read,
                Binding::Page,
            ),
            ToolDescriptor::new(
                "wait_for",
                "Wait",
                "Wait until a text appears on the page or an element (ref) is visible, up to timeout_ms (default 5000, at most 30000).",
                schema(concat!(
                    r#"{"type": "object", "additionalProperties": false, "properties": {"ref": "#,
                    element_ref!(),
                    r#", "text": {"type": "string", "description": "Text to wait for."}, "timeout_ms": {"type": "integer", "description": "How long to wait at most."}}}"#
                )),
                Level::L0,
                Effects::Read,
                Binding::Page,
            ),
            ToolDescriptor::new(
                "navigate",
                "Open URL",
                "Load a URL (http or https) in the current tab and wait until it has loaded.",
                schema(
                    r#"{"type": "object", "additionalProperties": false, "required": ["url"], "properties": {"url": {"type": "string", "description": "Absolute http(s) URL."}}}"#,
                ),
                Level::L1,
                Effects::Write,
                Binding::Tab,
            )
            .recovery(Recovery::RetrySafe),
            ToolDescriptor::new(
                "go_back",
                "Go back",
                "Go back one page in the current tab's history.",
                schema(NO_PARAMETERS),
                Level::L1,
                Effects::Write,
                Binding::Tab,
            )
            .recovery(Recovery::InspectFirst),
            ToolDescriptor::new(
                "screenshot",
                "Screenshot",
                "Capture what is visible in the current tab as an image. Use it when the layout or visual state matters; page_snapshot is cheaper for text and elements.",
                schema(NO_PARAMETERS),
                Level::L0,
                Effects::Read,
                Binding::Tab,
            )
            .requires_vision(),
            ToolDescriptor::new(
                "ask_user",
                "Ask the user",
                "Ask the user a question and wait for the answer. Use it when the task is ambiguous or needs a decision or information only the user has (never for passwords or payment details). Offer short options when you can.",
                schema(
                    r#"{"type": "object", "additionalProperties": false, "required": ["question"], "properties": {"question": {"type": "string", "description": "The question, in one or two sentences."}, "options": {"type": "array", "items": {"type": "string"}, "description": "Suggested answers."}}}"#,
                ),
                Level::Builtin,
                Effects::Read,
                Binding::Engine,
            ),
            ToolDescriptor::new(
                "list_tabs",
                "List tabs",
                "List the open tabs (id, title, URL, which one is active).",
                schema(NO_PARAMETERS),
                Level::L0,
                Effects::Read,
                Binding::Browser,
            ),
            ToolDescriptor::new(
                "switch_tab",
                "Switch tab",
                "Make a tab (by id from list_tabs) the active tab; later page tools act on it.",
                schema(
                    r#"{"type": "object", "additionalProperties": false, "required": ["tab_id"], "properties": {"tab_id": {"type": "integer", "description": "Tab id from list_tabs."}}}"#,
                ),
                Level::L0,
                Effects::Read,
                Binding::Browser,
            ),
        ] {
            // Built-in descriptors are valid by construction; a failure here is a programming error caught by tests.
            if let Err(e) = registry.register(descriptor) {
                debug_assert!(false, "built-in tool rejected: {e}");
            }
        }
        registry
    }

    /// Add a tool after validating its name and schema.
    pub fn register(&mut self, descriptor: ToolDescriptor) -> Result<(), RegistryError> {
        let name_ok = !descriptor.name.is_empty()
            && descriptor.name.len() <= 64
            && descriptor
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(RegistryError(format!(
                "tool name {:?} must be 1-64 characters of a-z, A-Z, 0-9, _ or -",
                descriptor.name
            )));
        }
        if descriptor.label.trim().is_empty() || descriptor.description.trim().is_empty() {
            return Err(RegistryError(format!(
                "tool {:?} needs a label and a description",
                descriptor.name
            )));
        }
        if descriptor.parameters.get("type").and_then(Value::as_str) != Some("object") {
            return Err(RegistryError(format!(
                "tool {:?}: parameters must be a JSON Schema of type object",
                descriptor.name
            )));
        }
        if let Some(existing) = self.get(&descriptor.name) {
            return Err(RegistryError(format!(
                "tool {:?} is already registered (existing: {:?}/{:?}/{:?}, new: {:?}/{:?}/{:?})",
                descriptor.name,
                existing.level,
                existing.effects,
                existing.recovery,
                descriptor.level,
                descriptor.effects,
                descriptor.recovery
            )));
        }
        self.tools.push(descriptor);
        Ok(())
    }

    /// The registered tool of that name.
    pub fn get(&self, name: &str) -> Option<&ToolDescriptor> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Keep only the tools named in `names` (the embedding extension's
    /// `BUILT_IN_TOOLS`, applied before its own tools are registered). A
    /// name that is not registered is returned, for the console: it offers
    /// nothing, and the names that are registered still apply.
    ///
    /// Decision: a name given up this way may be taken by one of the
    /// extension's own tools (its own `click`): the run's frozen catalog
    /// tells them apart, so a run started with the other is not resumed.
    pub fn retain_named(&mut self, names: &[String]) -> Vec<String> {
        let unknown = names
            .iter()
            .filter(|n| self.get(n).is_none())
            .cloned()
            .collect();
        self.tools.retain(|t| names.contains(&t.name));
        unknown
    }

    /// Take out every tool of MCP server `server`.
    pub fn remove_mcp_server(&mut self, server: &str) {
        self.tools
            .retain(|t| !matches!(&t.binding, Binding::Mcp { server: s, .. } if s == server));
    }

    /// Every registered tool, in registration order.
    pub fn descriptors(&self) -> &[ToolDescriptor] {
        &self.tools
    }

    /// Provider-facing schemas, in registration order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(ToolDescriptor::spec).collect()
    }

    /// The tools a model with these capabilities is offered: none without
    /// tool use, no image tools without vision.
    pub fn for_model(&self, tool_use: bool, vision: bool) -> Vec<&ToolDescriptor> {
        if !tool_use {
            return Vec::new();
        }
        self.tools
            .iter()
            .filter(|t| vision || !t.requires_vision)
            .collect()
    }

    /// Parse and validate raw model arguments for a tool.
    ///
    /// The error text is written for the model: it says what to fix.
    pub fn validate(
        &self,
        name: &str,
        raw_arguments: &str,
    ) -> Result<(&ToolDescriptor, Value), String> {
        let Some(tool) = self.get(name) else {
            let known: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
            return Err(format!(
                "Unknown tool {name:?}. Available tools: {}.",
                known.join(", ")
            ));
        };
        let trimmed = raw_arguments.trim();
        let value: Value = if trimmed.is_empty() {
            json!({})
        } else {
            serde_json::from_str(trimmed).map_err(|e| {
                format!("The arguments for {name} are not valid JSON ({e}). Send a JSON object.")
            })?
        };
        validate_value(&tool.parameters, &value, "arguments")
            .map_err(|e| format!("Invalid arguments for {name}: {e}"))?;
        Ok((tool, value))
    }
}

/// Check a value against the subset of JSON Schema the registry uses
/// (type, properties, required, additionalProperties, enum, items).
fn validate_value(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let ok = match expected {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "number" => value.is_number(),
            "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
            "null" => value.is_null(),
            _ => true,
        };
        if !ok {
            return Err(format!("{at} must be of type {expected}"));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            return Err(format!(
                "{at} must be one of {}",
                Value::Array(options.clone())
            ));
        }
    }
    if let (Some(object), Some(properties)) = (
        value.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) {
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for key in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(key) {
                    return Err(format!("{at}.{key} is required"));
                }
            }
        }
        let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
        for (key, item) in object {
            match properties.get(key) {
                Some(sub) => validate_value(sub, item, &format!("{at}.{key}"))?,
                None if closed => {
                    let known: Vec<&String> = properties.keys().collect();
                    return Err(format!(
                        "{at}.{key} is not a known parameter (known: {known:?})"
                    ));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            validate_value(items, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tools_register_and_have_stable_digests() {
        let a = ToolRegistry::page_tools();
        let b = ToolRegistry::page_tools();
        assert_eq!(a.descriptors().len(), 13);
        for (x, y) in a.descriptors().iter().zip(b.descriptors()) {
            assert_eq!(x.digest(), y.digest());
            assert_eq!(x.digest().len(), 64);
        }
        let read = a.get("read_page").unwrap();
        let click = a.get("click").unwrap();
        assert_ne!(read.digest(), click.digest());
        assert_eq!(click.recovery, Recovery::NeverRetry);
    }

    /// Stored runs keep the digests of the tools they were offered; the
    /// built-in tools' digests, recorded from the registry before its schemas
    /// were written as JSON text, must not move when the code that builds
    /// them changes.
    #[test]
    fn built_in_digests_are_unchanged() {
        let registry = ToolRegistry::page_tools();
        let got: Vec<(&str, String)> = registry
            .descriptors()
            .iter()
            .map(|d| (d.name.as_str(), d.digest()))
            .collect();
        let want: Vec<(&str, String)> = [
            (
                "page_snapshot",
                "11634c21adae78f2459d13017f38a01b7182ebaa9d8f99d21f9806b6b39f529e",
            ),
            (
                "read_page",
                "c37ea849ea83aaeb7c67d9e54f7806e0e3f77e3ea6da905facaf00c03de73f5f",
            ),
            (
                "click",
                "79dd3c41b692c77e440b4ce4284b6348e74779d69377d55340748dce140651e4",
            ),
            (
                "type",
                "b96d7012e4aefb510914e43a589a915d1d0e2a1f8fc0727c162236a5b070545f",
            ),
            (
                "select",
                "ff5fea8af5f49ab8c859e891d9bd8ea56e0b7bdb4f756d3036a3ee6eab79dd98",
            ),
            (
                "scroll",
                "00d6d838fd6c6d5f810cd5b04b62a2c3d8504f3045dc1975b60d79071f28d58e",
            ),
            (
                "wait_for",
                "6c1e795d3f0906153ddb7ac58ef5d02e6b12c0f78bff19a4c4af8e9a3f447a5b",
            ),
            (
                "navigate",
                "ac7ea36c8ba3724e62e8ebd1f221ebb57894340942544a235e769c2d727c6c29",
            ),
            (
                "go_back",
                "52674597e90e781ce59b2dbee046f65a2d413063e23c369f3aec86f7e5e7db36",
            ),
            (
                "screenshot",
                "7f485a876ce9d3ab7445196f71556a32d9ef26588aa1f8704804e82c7476463f",
            ),
            (
                "ask_user",
                "d10d151b4fddf4147fb110ab5c89147c15263fce39efa85cda75c0fb11dabe9e",
            ),
            (
                "list_tabs",
                "57a187e4f328d81826de89aa29bf46836459effcb06a3ddfa70df329283ad497",
            ),
            (
                "switch_tab",
                "ce685affc2eb9ce89f5c39aa975e1eaf400ccad208fe5ea5508ba4d753acee52",
            ),
        ]
        .into_iter()
        .map(|(name, digest)| (name, digest.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn digest_changes_with_security_metadata() {
        let registry = ToolRegistry::page_tools();
        let mut click = registry.get("click").unwrap().clone();
        let before = click.digest();
        click.recovery = Recovery::RetrySafe;
        assert_ne!(before, click.digest());
    }

    #[test]
    fn validation_errors_are_for_the_model() {
        let r = ToolRegistry::page_tools();
        assert!(r.validate("click", r#"{"ref":"e1"}"#).is_ok());
        assert!(r.validate("read_page", "").is_ok());
        assert!(r
            .validate("click", "{bad")
            .unwrap_err()
            .contains("not valid JSON"));
        assert!(r
            .validate("click", r#"{"ref":5}"#)
            .unwrap_err()
            .contains("type string"));
        assert!(r
            .validate("click", r#"{"selector":"x"}"#)
            .unwrap_err()
            .contains("not a known parameter"));
        assert!(r
            .validate("nope", "{}")
            .unwrap_err()
            .contains("Unknown tool"));
        assert!(r
            .validate("click", "[1]")
            .unwrap_err()
            .contains("type object"));
    }

    #[test]
    fn duplicate_and_bad_registrations_are_refused() {
        let mut r = ToolRegistry::page_tools();
        let mut dup = r.get("click").unwrap().clone();
        dup.effects = Effects::Read;
        let err = r.register(dup).unwrap_err();
        assert!(err.0.contains("already registered") && err.0.contains("Read"));
        let mut bad = r.get("click").unwrap().clone();
        bad.name = "has space".into();
        assert!(r.register(bad).is_err());
    }
}
