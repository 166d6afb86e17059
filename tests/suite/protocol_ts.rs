//! TypeScript declarations of the wire protocol, generated from the Rust types.
//!
//! Owns: reading `src/protocol.rs` and `src/model.rs` with `syn`, turning the
//! types reachable from `Op`, `EventEnvelope`, `PageRequest` and
//! `PageMessage` into `www/protocol.d.ts` the way serde puts them on the wire
//! (`tag`, `rename`, `rename_all`, `rename_all_fields`, `flatten`, `default`,
//! `skip_serializing_if`), and checking that the committed file is current.
//! A serde attribute it does not understand is an error, never a guess.
//!
//! It also validates real serde output (every event of simulated turns, a set
//! of ops) against the same type model, so the declarations cannot drift from
//! what serde actually emits.
//!
//! Regenerate: `make protocol-types`
//! (= `UPDATE_PROTOCOL_TS=1 cargo test --test all protocol_ts`).
//!
//! Must not: be compiled into the library (it is a test), or need anything
//! but the two source files.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};
use syn::{Attribute, Expr, Fields, GenericArgument, Item, Lit, Meta, PathArguments, Type};

use sw_agent::model::{ProviderProfile, RunState};
use sw_agent::protocol::{
    ApprovalDecision, ErrorInfo, ErrorKind, Event, Op, PageMessage, PageRequest, UncertainChoice,
    UserInput,
};
use sw_agent::sim::Sim;

use super::support::*;

/// Sources the declarations come from, relative to the crate root.
const SOURCES: [&str; 2] = ["src/protocol.rs", "src/model.rs"];
/// The generated file, relative to the crate root.
const OUTPUT: &str = "www/protocol.d.ts";
/// The types a client sends or receives; everything they reference follows.
const ROOTS: [&str; 4] = ["Op", "EventEnvelope", "PageRequest", "PageMessage"];

// ------------------------------------------------------------ type model ---

/// A field or element type as it appears in JSON.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    String,
    Number,
    Bool,
    /// `serde_json::Value`: any JSON.
    Json,
    Named(String),
    /// `Option<T>`: `null` on the wire when `None` is serialized.
    Option(Box<Ty>),
    Array(Box<Ty>),
    /// A map with string keys.
    Map(Box<Ty>),
}

#[derive(Debug, Clone)]
struct Field {
    /// The key on the wire.
    wire: String,
    ty: Ty,
    /// The key may be absent (serde `default`, `skip_serializing_if`, or an `Option`).
    optional: bool,
    /// `#[serde(flatten)]`: the type's keys sit in the containing object.
    flatten: bool,
    doc: String,
}

#[derive(Debug, Clone)]
struct Variant {
    wire: String,
    doc: String,
    fields: Vec<Field>,
}

#[derive(Debug, Clone)]
enum Shape {
    Struct(Vec<Field>),
    /// An enum of unit variants: a string.
    Strings(Vec<(String, String)>),
    /// An internally tagged enum (`#[serde(tag = "…")]`) of struct variants.
    Tagged {
        tag: String,
        variants: Vec<Variant>,
    },
}

#[derive(Debug, Clone)]
struct Decl {
    name: String,
    doc: String,
    shape: Shape,
}

/// Every serde-derived type of the sources, by Rust name.
struct Model {
    decls: BTreeMap<String, Decl>,
}

// --------------------------------------------------------------- parsing ---

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Model {
    fn load() -> Model {
        let mut decls = BTreeMap::new();
        for source in SOURCES {
            let path = crate_root().join(source);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {source}: {e}"));
            for item in file.items {
                if let Some(decl) = parse_item(&item) {
                    decls.insert(decl.name.clone(), decl);
                }
            }
        }
        Model { decls }
    }

    fn decl(&self, name: &str) -> &Decl {
        self.decls.get(name).unwrap_or_else(|| {
            panic!("type {name} is used on the wire but is not a serde type of {SOURCES:?}")
        })
    }

    /// The declarations reachable from the roots, in a stable order (roots'
    /// dependencies by first use).
    fn reachable(&self) -> Vec<&Decl> {
        let mut seen = BTreeSet::new();
        let mut order = Vec::new();
        let mut stack: Vec<String> = ROOTS.iter().rev().map(|s| s.to_string()).collect();
        while let Some(name) = stack.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let decl = self.decl(&name);
            order.push(decl);
            let mut uses = Vec::new();
            let fields: Vec<&Field> = match &decl.shape {
                Shape::Struct(fields) => fields.iter().collect(),
                Shape::Strings(_) => Vec::new(),
                Shape::Tagged { variants, .. } => {
                    variants.iter().flat_map(|v| v.fields.iter()).collect()
                }
            };
            for field in fields {
                named_types(&field.ty, &mut uses);
            }
            for used in uses.into_iter().rev() {
                if !seen.contains(&used) {
                    stack.push(used);
                }
            }
        }
        order
    }
}

fn named_types(ty: &Ty, out: &mut Vec<String>) {
    match ty {
        Ty::Named(name) => out.push(name.clone()),
        Ty::Option(inner) | Ty::Array(inner) | Ty::Map(inner) => named_types(inner, out),
        Ty::String | Ty::Number | Ty::Bool | Ty::Json => {}
    }
}

/// `key = "value"` and bare `key` items of every `#[serde(...)]` attribute.
fn serde_items(attrs: &[Attribute]) -> Vec<(String, Option<String>)> {
    let mut items = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            if meta.input.peek(syn::Token![=]) {
                let value: Lit = meta.value()?.parse()?;
                match value {
                    Lit::Str(s) => items.push((key, Some(s.value()))),
                    _ => return Err(meta.error("expected a string")),
                }
            } else {
                items.push((key, None));
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("serde attribute: {e}"));
    }
    items
}

fn derives_serde(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("derive")
            && attr.meta.require_list().is_ok_and(|list| {
                let tokens = list.tokens.to_string();
                tokens.contains("Serialize") || tokens.contains("Deserialize")
            })
    })
}

/// The `///` comment of an item, lines joined with `\n`, trimmed.
fn doc_of(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let Meta::NameValue(nv) = &attr.meta {
            if let Expr::Lit(expr) = &nv.value {
                if let Lit::Str(s) = &expr.lit {
                    lines.push(s.value().trim().to_string());
                }
            }
        }
    }
    lines.join("\n").trim().to_string()
}

fn parse_item(item: &Item) -> Option<Decl> {
    match item {
        Item::Struct(s) if derives_serde(&s.attrs) => {
            let mut rename_all = None;
            for (key, value) in serde_items(&s.attrs) {
                match key.as_str() {
                    "rename_all" => rename_all = value,
                    other => panic!("struct {}: serde({other}) is not supported", s.ident),
                }
            }
            let Fields::Named(named) = &s.fields else {
                panic!(
                    "struct {}: only structs with named fields are supported",
                    s.ident
                );
            };
            let fields = named
                .named
                .iter()
                .filter_map(|f| parse_field(f, rename_all.as_deref()))
                .collect();
            Some(Decl {
                name: s.ident.to_string(),
                doc: doc_of(&s.attrs),
                shape: Shape::Struct(fields),
            })
        }
        Item::Enum(e) if derives_serde(&e.attrs) => {
            let (mut rename_all, mut rename_all_fields, mut tag) = (None, None, None);
            for (key, value) in serde_items(&e.attrs) {
                match key.as_str() {
                    "rename_all" => rename_all = value,
                    "rename_all_fields" => rename_all_fields = value,
                    "tag" => tag = value,
                    // Checks what is read through another type; the wire
                    // shape stays the enum's own (tested by the round trips
                    // of `protocol_ts_describes_real_serde_output`).
                    "try_from" => {}
                    other => panic!("enum {}: serde({other}) is not supported", e.ident),
                }
            }
            let mut units = Vec::new();
            let mut variants = Vec::new();
            for variant in &e.variants {
                let mut wire = None;
                for (key, value) in serde_items(&variant.attrs) {
                    match key.as_str() {
                        "rename" => wire = value,
                        other => panic!(
                            "variant {}::{}: serde({other}) is not supported",
                            e.ident, variant.ident
                        ),
                    }
                }
                let wire = wire.unwrap_or_else(|| {
                    rename_variant(&variant.ident.to_string(), rename_all.as_deref())
                });
                let doc = doc_of(&variant.attrs);
                match &variant.fields {
                    Fields::Unit => units.push((wire, doc)),
                    Fields::Named(named) => variants.push(Variant {
                        wire,
                        doc,
                        fields: named
                            .named
                            .iter()
                            .filter_map(|f| parse_field(f, rename_all_fields.as_deref()))
                            .collect(),
                    }),
                    Fields::Unnamed(_) => panic!(
                        "variant {}::{}: tuple variants are not supported",
                        e.ident, variant.ident
                    ),
                }
            }
            let shape = match (tag, units.is_empty(), variants.is_empty()) {
                (None, false, true) => Shape::Strings(units),
                (Some(tag), true, false) => Shape::Tagged { tag, variants },
                _ => panic!(
                    "enum {}: only unit-only enums or internally tagged enums of struct variants are supported",
                    e.ident
                ),
            };
            Some(Decl {
                name: e.ident.to_string(),
                doc: doc_of(&e.attrs),
                shape,
            })
        }
        _ => None,
    }
}

fn parse_field(field: &syn::Field, rename_all: Option<&str>) -> Option<Field> {
    let ident = field.ident.as_ref().expect("named field").to_string();
    let (mut wire, mut flatten, mut has_default, mut skips_none) = (None, false, false, false);
    for (key, value) in serde_items(&field.attrs) {
        match key.as_str() {
            "rename" => wire = value,
            "flatten" => flatten = true,
            "default" => has_default = true,
            "skip_serializing_if" => skips_none = true,
            // Never sent (written only by older versions): not part of the wire shape.
            "skip" | "skip_serializing" => return None,
            other => panic!("field {ident}: serde({other}) is not supported"),
        }
    }
    let ty = rust_type(&field.ty);
    let optional = has_default || skips_none || matches!(ty, Ty::Option(_));
    Some(Field {
        wire: wire.unwrap_or_else(|| rename_field(&ident, rename_all)),
        ty,
        optional: optional && !flatten,
        flatten,
        doc: doc_of(&field.attrs),
    })
}

fn rust_type(ty: &Type) -> Ty {
    let Type::Path(path) = ty else {
        panic!("unsupported type: only named types (paths) are supported");
    };
    let segment = path.path.segments.last().expect("a path has a segment");
    let name = segment.ident.to_string();
    let args: Vec<&Type> = match &segment.arguments {
        PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match (name.as_str(), args.as_slice()) {
        ("String" | "str", []) => Ty::String,
        ("u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" | "isize", [])
        | ("f32" | "f64", []) => Ty::Number,
        ("bool", []) => Ty::Bool,
        ("Value", []) => Ty::Json,
        ("Option", [inner]) => Ty::Option(Box::new(rust_type(inner))),
        ("Vec", [inner]) => Ty::Array(Box::new(rust_type(inner))),
        ("Box", [inner]) => rust_type(inner),
        ("HashMap" | "BTreeMap", [key, value]) => {
            assert_eq!(rust_type(key), Ty::String, "map keys must be strings");
            Ty::Map(Box::new(rust_type(value)))
        }
        (_, []) if name.chars().next().is_some_and(char::is_uppercase) => Ty::Named(name),
        _ => panic!("unsupported type {name} with {} type arguments", args.len()),
    }
}

/// serde's `rename_all` for a variant name (PascalCase in Rust).
fn rename_variant(name: &str, rule: Option<&str>) -> String {
    match rule {
        None => name.to_string(),
        Some("snake_case") => {
            let mut out = String::new();
            for (i, c) in name.chars().enumerate() {
                if c.is_uppercase() && i > 0 {
                    out.push('_');
                }
                out.extend(c.to_lowercase());
            }
            out
        }
        Some("camelCase") => {
            let mut chars = name.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => String::new(),
            }
        }
        Some(other) => panic!("rename_all = {other:?} is not supported"),
    }
}

/// serde's `rename_all` for a field name (snake_case in Rust).
fn rename_field(name: &str, rule: Option<&str>) -> String {
    match rule {
        None | Some("snake_case") => name.to_string(),
        Some("camelCase") => {
            let mut out = String::new();
            let mut upper = false;
            for c in name.chars() {
                if c == '_' {
                    upper = true;
                } else if upper {
                    out.extend(c.to_uppercase());
                    upper = false;
                } else {
                    out.push(c);
                }
            }
            out
        }
        Some(other) => panic!("rename_all = {other:?} is not supported"),
    }
}

// ------------------------------------------------------------- emitting ---

const HEADER: &str = "\
// Wire protocol of the side panel, the service worker and content scripts
// (docs/protocol.md), as TypeScript declarations.
//
// GENERATED from src/protocol.rs and src/model.rs by tests/suite/protocol_ts.rs:
// do not edit. Regenerate with `make protocol-types`; `cargo test protocol_ts`
// fails when this file is stale.

/** Any JSON value (`serde_json::Value`). */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
";

const FOOTER: &str = "
/** The wire name of every op. */
export type OpType = Op[\"type\"];
/** The op of one `type`. */
export type OpOf<T extends OpType> = Extract<Op, { type: T }>;
/** The wire name of every event. */
export type EventType = Event[\"type\"];
/** The event (with `seq` and `epoch`) of one `type`. */
export type EventOf<T extends EventType> = Extract<EventEnvelope, { type: T }>;
/** One `kind` of node. */
export type NodeOf<K extends Node[\"kind\"]> = Extract<Node, { kind: K }>;
";

fn ts_type(ty: &Ty) -> String {
    match ty {
        Ty::String => "string".into(),
        Ty::Number => "number".into(),
        Ty::Bool => "boolean".into(),
        Ty::Json => "JsonValue".into(),
        Ty::Named(name) => name.clone(),
        Ty::Option(inner) => format!("{} | null", ts_type(inner)),
        Ty::Array(inner) => match **inner {
            Ty::Option(_) => format!("({})[]", ts_type(inner)),
            _ => format!("{}[]", ts_type(inner)),
        },
        Ty::Map(inner) => format!("{{ [key: string]: {} }}", ts_type(inner)),
    }
}

fn js_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

fn write_doc(out: &mut String, doc: &str, indent: &str) {
    if doc.is_empty() {
        return;
    }
    let lines: Vec<&str> = doc.lines().collect();
    if lines.len() == 1 {
        let _ = writeln!(out, "{indent}/** {} */", lines[0].replace("*/", "* /"));
    } else {
        let _ = writeln!(out, "{indent}/**");
        for line in lines {
            let line = line.replace("*/", "* /");
            if line.is_empty() {
                let _ = writeln!(out, "{indent} *");
            } else {
                let _ = writeln!(out, "{indent} * {line}");
            }
        }
        let _ = writeln!(out, "{indent} */");
    }
}

impl Model {
    /// `{ … }` members for `fields`, and the types flattened into the
    /// object (joined with `&`).
    fn object_members(
        &self,
        fields: &[Field],
        indent: &str,
        members: &mut String,
        joined: &mut Vec<String>,
    ) {
        for field in fields {
            if field.flatten {
                let Ty::Named(name) = &field.ty else {
                    panic!("flatten of a non-named type {:?}", field.ty);
                };
                match &self.decl(name).shape {
                    Shape::Struct(_) | Shape::Tagged { .. } => joined.push(name.clone()),
                    Shape::Strings(_) => panic!("flatten of the string enum {name}"),
                }
                continue;
            }
            write_doc(members, &field.doc, indent);
            let _ = writeln!(
                members,
                "{indent}{}{}: {};",
                field.wire,
                if field.optional { "?" } else { "" },
                ts_type(&field.ty)
            );
        }
    }

    fn emit(&self) -> String {
        let mut out = String::from(HEADER);
        for decl in self.reachable() {
            out.push('\n');
            write_doc(&mut out, &decl.doc, "");
            match &decl.shape {
                Shape::Strings(variants) => {
                    let _ = writeln!(out, "export type {} =", decl.name);
                    for (i, (wire, doc)) in variants.iter().enumerate() {
                        write_doc(&mut out, doc, "  ");
                        let end = if i + 1 == variants.len() { ";" } else { "" };
                        let _ = writeln!(out, "  | {}{end}", js_string(wire));
                    }
                }
                Shape::Struct(fields) => {
                    let mut members = String::new();
                    let mut joined = Vec::new();
                    self.object_members(fields, "  ", &mut members, &mut joined);
                    if joined.is_empty() {
                        let _ = write!(out, "export interface {} {{\n{members}}}\n", decl.name);
                    } else {
                        let _ = writeln!(
                            out,
                            "export type {} = {{\n{members}}} & {};",
                            decl.name,
                            joined.join(" & ")
                        );
                    }
                }
                Shape::Tagged { tag, variants } => {
                    let _ = writeln!(out, "export type {} =", decl.name);
                    for (i, variant) in variants.iter().enumerate() {
                        write_doc(&mut out, &variant.doc, "  ");
                        let mut members = String::new();
                        let mut joined = Vec::new();
                        let _ = writeln!(members, "    {tag}: {};", js_string(&variant.wire));
                        self.object_members(&variant.fields, "    ", &mut members, &mut joined);
                        let extra: String = joined.iter().map(|j| format!(" & {j}")).collect();
                        let end = if i + 1 == variants.len() { ";" } else { "" };
                        let _ = writeln!(out, "  | {{\n{members}  }}{extra}{end}");
                    }
                }
            }
        }
        out.push_str(FOOTER);
        out
    }
}

// ------------------------------------------------------------ validation ---

/// One key an object of some type may hold, after flattening.
struct Expected<'a> {
    wire: String,
    /// `None` for the tag key (checked when the variant was chosen).
    ty: Option<&'a Ty>,
    optional: bool,
}

impl Model {
    /// Checks that `value` is what the declarations say a `ty` looks like.
    fn check(&self, value: &Value, ty: &Ty, at: &str) -> Result<(), String> {
        let fail = |what: &str| Err(format!("{at}: expected {what}, got {value}"));
        match ty {
            Ty::String if value.is_string() => Ok(()),
            Ty::String => fail("a string"),
            Ty::Number if value.is_number() => Ok(()),
            Ty::Number => fail("a number"),
            Ty::Bool if value.is_boolean() => Ok(()),
            Ty::Bool => fail("a boolean"),
            Ty::Json => Ok(()),
            Ty::Option(_) if value.is_null() => Ok(()),
            Ty::Option(inner) => self.check(value, inner, at),
            Ty::Array(inner) => match value.as_array() {
                Some(items) => items
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, item)| self.check(item, inner, &format!("{at}[{i}]"))),
                None => fail("an array"),
            },
            Ty::Map(inner) => match value.as_object() {
                Some(map) => map
                    .iter()
                    .try_for_each(|(k, v)| self.check(v, inner, &format!("{at}.{k}"))),
                None => fail("an object"),
            },
            Ty::Named(name) => match &self.decl(name).shape {
                Shape::Strings(variants) => match value.as_str() {
                    Some(s) if variants.iter().any(|(wire, _)| wire == s) => Ok(()),
                    _ => fail(&format!("a {name}")),
                },
                Shape::Struct(_) | Shape::Tagged { .. } => self.check_object(value, name, at),
            },
        }
    }

    fn check_object(&self, value: &Value, name: &str, at: &str) -> Result<(), String> {
        let Some(object) = value.as_object() else {
            return Err(format!("{at}: expected a {name} object, got {value}"));
        };
        let mut expected = Vec::new();
        self.expected_keys(object, name, at, &mut expected)?;
        for key in &expected {
            match (object.get(&key.wire), key.ty) {
                (None, _) if key.optional => {}
                (None, _) => return Err(format!("{at}: {name} lacks required `{}`", key.wire)),
                (Some(_), None) => {}
                (Some(v), Some(ty)) => self.check(v, ty, &format!("{at}.{}", key.wire))?,
            }
        }
        for key in object.keys() {
            if !expected.iter().any(|e| &e.wire == key) {
                return Err(format!("{at}: `{key}` is not declared in {name}"));
            }
        }
        Ok(())
    }

    fn expected_keys<'a>(
        &'a self,
        object: &serde_json::Map<String, Value>,
        name: &str,
        at: &str,
        out: &mut Vec<Expected<'a>>,
    ) -> Result<(), String> {
        let fields: &'a [Field] = match &self.decl(name).shape {
            Shape::Struct(fields) => fields,
            Shape::Tagged { tag, variants } => {
                let Some(found) = object.get(tag).and_then(Value::as_str) else {
                    return Err(format!("{at}: {name} lacks its `{tag}` string"));
                };
                let Some(variant) = variants.iter().find(|v| v.wire == found) else {
                    return Err(format!("{at}: {name} has no variant `{found}`"));
                };
                out.push(Expected {
                    wire: tag.clone(),
                    ty: None,
                    optional: false,
                });
                &variant.fields
            }
            Shape::Strings(_) => return Err(format!("{at}: {name} is not an object type")),
        };
        for field in fields {
            if field.flatten {
                let Ty::Named(inner) = &field.ty else {
                    return Err(format!("{at}: flatten of {:?}", field.ty));
                };
                self.expected_keys(object, inner, at, out)?;
            } else {
                out.push(Expected {
                    wire: field.wire.clone(),
                    ty: Some(&field.ty),
                    optional: field.optional,
                });
            }
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- tests ---

#[test]
fn protocol_ts_is_current() {
    let generated = Model::load().emit();
    let path = crate_root().join(OUTPUT);
    if std::env::var_os("UPDATE_PROTOCOL_TS").is_some() {
        std::fs::write(&path, &generated).expect("write www/protocol.d.ts");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "{OUTPUT} is stale (first difference at line {line}): run `make protocol-types` and commit the file"
        );
    }
}

#[test]
fn protocol_ts_refuses_what_it_does_not_understand() {
    let parse = |source: &str| {
        std::panic::catch_unwind(|| {
            let file = syn::parse_file(source).expect("valid Rust");
            file.items.iter().filter_map(parse_item).count()
        })
    };
    assert!(parse("#[derive(Serialize)] #[serde(untagged)] enum A { B { x: u8 } }").is_err());
    assert!(parse("#[derive(Serialize)] struct A { #[serde(with = \"x\")] b: u8 }").is_err());
    assert!(parse("#[derive(Serialize)] enum A { B(u8) }").is_err());
    assert!(parse("#[derive(Serialize)] struct A { b: (u8, u8) }").is_err());
    assert_eq!(
        parse("#[derive(Serialize)] #[serde(rename_all = \"camelCase\")] struct A { b_c: u8 }")
            .ok(),
        Some(1)
    );
}

#[test]
fn protocol_ts_names_follow_serde() {
    assert_eq!(
        rename_variant("WaitingApproval", Some("snake_case")),
        "waiting_approval"
    );
    assert_eq!(
        rename_variant("AcceptOnce", Some("camelCase")),
        "acceptOnce"
    );
    assert_eq!(
        rename_field("in_flight_tool", Some("camelCase")),
        "inFlightTool"
    );
    // Each rule agrees with what serde writes.
    assert_eq!(
        serde_json::to_value(RunState::WaitingApproval).unwrap(),
        json!("waiting_approval")
    );
    assert_eq!(
        serde_json::to_value(ApprovalDecision::AcceptForSite).unwrap(),
        json!("acceptForSite")
    );
    assert_eq!(
        serde_json::to_value(UncertainChoice::MarkDone).unwrap(),
        json!("mark_done")
    );
}

/// Every event the engine sent in simulated turns (text, tools, a steer,
/// queue changes, a rejected op, an edit that branches, a fork) is what the
/// declarations describe; so is every op of a representative set.
#[test]
fn protocol_ts_describes_real_serde_output() {
    let model = Model::load();
    let policy = read_then_answer("Done.");
    let mut sim = Sim::new(3, policy, page_tools());
    let conn = sim.connect();
    sim.send(conn, initialize("i0", None));
    sim.send(conn, submit("s1", None, "Read the page"));
    sim.run(10_000);
    let (thread, _) = current_ids(&sim);
    let thread = thread.expect("a thread");
    sim.send(conn, enqueue("q1", &thread, "later"));
    sim.send(conn, interrupt("x1", &thread));
    sim.send(conn, initialize("i1", Some(&thread)));
    sim.send(conn, submit("s2", Some("no-such-thread"), "hi"));
    sim.run(10_000);
    let path = paths(&sim).into_iter().next().expect("a path");
    let first_user = path
        .iter()
        .find(|n| n.kind_name() == "user_message")
        .expect("a user message")
        .id
        .clone();
    let edit = Op::TurnSubmit {
        submission: submission("e1"),
        thread_id: Some(thread.clone()),
        input: UserInput::text("Read it again"),
        replaces: Some(first_user.clone()),
    };
    sim.send(conn, edit);
    sim.run(10_000);
    sim.send(
        conn,
        Op::ThreadFork {
            submission: submission("f1"),
            thread_id: thread.clone(),
            node_id: None,
        },
    );
    sim.run(10_000);

    let events = sim.events_for(conn);
    let kinds: BTreeSet<String> = events
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for needed in [
        "initialized",
        "command.ack",
        "command.reject",
        "turn.start",
        "item.start",
        "item.delta",
        "item.complete",
        "token.usage",
        "queue.updated",
        "run.status",
        "turn.complete",
    ] {
        assert!(
            kinds.contains(needed),
            "the scenario sends {needed}: {kinds:?}"
        );
    }
    let branched = events.iter().any(|e| {
        matches!(e, Event::Initialized { snapshot } if snapshot.thread.as_ref().is_some_and(|t| !t.branches.is_empty()))
    });
    assert!(branched, "a snapshot lists the edited message's branches");
    // The envelopes exactly as the engine put them on the wire.
    for (_, envelope) in sim.events.iter().filter(|(c, _)| *c == conn) {
        let wire = serde_json::to_value(envelope).unwrap();
        model
            .check(&wire, &Ty::Named("EventEnvelope".into()), "event")
            .unwrap_or_else(|e| panic!("{e}\n{wire}"));
    }
    // A value that is not what the declarations say is caught.
    let mut wrong = serde_json::to_value(Event::TurnStart {
        thread_id: "t".into(),
        turn_id: "r".into(),
    })
    .unwrap();
    wrong["extra"] = json!(1);
    assert!(model
        .check(&wrong, &Ty::Named("Event".into()), "e")
        .is_err());
    wrong = json!({ "type": "turn.start", "threadId": "t" });
    assert!(model
        .check(&wrong, &Ty::Named("Event".into()), "e")
        .is_err());

    let ops = vec![
        initialize("a", None),
        submit("b", Some("t"), "hi"),
        steer("c", "t", "r", "more"),
        enqueue("d", "t", "later"),
        interrupt("e", "t"),
        resume("f", "t"),
        resolve("g", "t", UncertainChoice::Fail),
        Op::ThreadSelectBranch {
            submission: submission("h"),
            thread_id: "t".into(),
            node_id: "n".into(),
        },
        Op::QueueUpdate {
            submission: submission("i"),
            thread_id: "t".into(),
            item_id: "q".into(),
            input: UserInput::text("x"),
        },
        Op::ApprovalResponse {
            submission: submission("j"),
            thread_id: "t".into(),
            approval_id: "a".into(),
            decision: ApprovalDecision::AcceptOnce,
        },
        Op::InteractionResponse {
            submission: submission("k"),
            thread_id: "t".into(),
            interaction_id: "i".into(),
            answer: "yes".into(),
        },
        Op::ProviderTest {
            submission: submission("l"),
            profile: ProviderProfile {
                kind: "openai".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "m".into(),
                max_output_tokens: Some(16),
                ..ProviderProfile::default()
            },
        },
    ];
    for op in ops {
        let wire = serde_json::to_value(&op).unwrap();
        model
            .check(&wire, &Ty::Named("Op".into()), "op")
            .unwrap_or_else(|e| panic!("{e}\n{wire}"));
    }
    // Ops as a client writes them: optional keys left out still decode.
    let minimal = json!({ "type": "turn.submit", "clientId": "c", "submissionId": "s", "input": { "text": "x" } });
    model
        .check(&minimal, &Ty::Named("Op".into()), "op")
        .unwrap();
    assert!(serde_json::from_value::<Op>(minimal).is_ok());

    for message in [
        serde_json::to_value(PageRequest::ToolExecute {
            call_id: "c".into(),
            name: "click".into(),
            params: json!({ "ref": "e1" }),
            frame_id: 0,
            expect: None,
        })
        .unwrap(),
        serde_json::to_value(PageRequest::ToolExecute {
            call_id: "c".into(),
            name: "click".into(),
            params: json!({ "ref": "e1" }),
            frame_id: 0,
            expect: Some(sw_agent::model::TargetElement {
                reference: "e1".into(),
                role: "button".into(),
                name: "Archive".into(),
                state: String::new(),
            }),
        })
        .unwrap(),
        serde_json::to_value(PageMessage::ToolResult {
            call_id: "c".into(),
            ok: false,
            content: "gone".into(),
            details: None,
        })
        .unwrap(),
    ] {
        let root = if message["type"] == "tool.execute" {
            "PageRequest"
        } else {
            "PageMessage"
        };
        model
            .check(&message, &Ty::Named(root.into()), "page")
            .unwrap();
    }
    let error = serde_json::to_value(ErrorInfo::new(ErrorKind::RateLimited, "slow down")).unwrap();
    model
        .check(&error, &Ty::Named("ErrorInfo".into()), "error")
        .unwrap();
}

/// docs/protocol.md is what a client author reads: every op and every
/// event the engine speaks has its row there (an op or event added without
/// one fails here).
#[test]
fn the_protocol_document_names_every_op_and_event() {
    let root = crate_root();
    let docs = std::fs::read_to_string(root.join("docs/protocol.md")).expect("docs/protocol.md");
    let declarations =
        std::fs::read_to_string(root.join("www/protocol.d.ts")).expect("www/protocol.d.ts");
    let events_start = declarations
        .find("export type Event =")
        .expect("the Event union");
    let events_block = &declarations[events_start..];
    let events_block = &events_block[..events_block[1..]
        .find("\nexport ")
        .unwrap_or(events_block.len() - 1)
        + 1];
    let events: Vec<&str> = events_block
        .lines()
        .filter_map(|line| line.trim().strip_prefix("type: \""))
        .filter_map(|rest| rest.strip_suffix("\";"))
        .collect();
    assert!(events.len() >= 15, "events read from the union: {events:?}");
    let missing: Vec<&str> = sw_agent::protocol::OP_TYPES
        .iter()
        .copied()
        .chain(events.iter().copied())
        .filter(|name| !docs.contains(&format!("| `{name}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "no row in docs/protocol.md for {missing:?}"
    );
}
