use serde_json::json;

use super::*;

fn booking() -> Value {
    json!({
        "message": "  Which table shall I book?  ",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "email": { "type": "string", "format": "email", "title": "Email", "description": "For the confirmation" },
                "seats": { "type": "integer", "minimum": 1, "maximum": 8, "default": 2.0 },
                "room": { "type": "string", "enum": ["in", "out"], "enumNames": ["Inside", "Terrace"], "default": "attic" },
                "when": { "type": "string", "format": "date-time" },
                "budget": { "type": "number", "minimum": 0 },
                "quiet": { "type": "boolean", "default": true },
                "note": { "type": "string", "minLength": 2, "maxLength": 5 }
            },
            "required": ["email", "seats"]
        }
    })
}

fn order() -> Vec<String> {
    ["email", "seats", "room", "when", "budget", "quiet", "note"]
        .map(String::from)
        .to_vec()
}

#[test]
fn a_request_becomes_a_form_in_the_servers_order_with_its_bounds() {
    let request = parse_request(&booking(), &order()).unwrap();
    assert_eq!(request.message, "Which table shall I book?");
    let fields = &request.form.fields;
    let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, order());
    assert!(fields[0].required && fields[1].required && !fields[2].required);
    assert_eq!(fields[0].format, Some(StringFormat::Email));
    assert_eq!(fields[0].title.as_deref(), Some("Email"));
    assert_eq!(
        (fields[1].minimum, fields[1].maximum),
        (Some(1.0), Some(8.0))
    );
    // A fitting default is kept (an integer's 2.0 as 2), a wrong one dropped.
    assert_eq!(fields[1].default, Some(json!(2)));
    assert_eq!(fields[2].options, ["in", "out"]);
    assert_eq!(fields[2].option_labels, ["Inside", "Terrace"]);
    assert_eq!(fields[2].default, None);
    assert_eq!(fields[5].default, Some(json!(true)));
    assert_eq!(
        (fields[6].min_length, fields[6].max_length),
        (Some(2), Some(5))
    );
    // Without an order (a batch), the fields come by name.
    let by_name = parse_request(&booking(), &[]).unwrap();
    let names: Vec<&str> = by_name
        .form
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let mut sorted = order();
    crate::sorting::sort(&mut sorted);
    assert_eq!(names, sorted);
}

#[test]
fn a_request_outside_what_the_revision_allows_is_refused_with_the_reason() {
    let with = |path: &str, value: Value| {
        let mut request = booking();
        *request.pointer_mut(path).unwrap() = value;
        parse_request(&request, &order()).unwrap_err()
    };
    assert!(with("/message", json!(" ")).contains("no message"));
    assert!(with("/requestedSchema/type", json!("array")).contains("\"object\""));
    assert!(with(
        "/requestedSchema/properties/note",
        json!({ "type": "object" })
    )
    .contains("\"object\" cannot be asked"));
    assert!(with("/requestedSchema/properties/note", json!({ "title": "x" })).contains("no type"));
    assert!(with("/requestedSchema/properties/email/format", json!("ipv4")).contains("\"ipv4\""));
    assert!(
        with("/requestedSchema/properties/room/enumNames", json!(["One"]))
            .contains("does not name every")
    );
    assert!(with("/requestedSchema/properties/room/enum", json!([])).contains("no values"));
    assert!(with("/requestedSchema/properties/note/minLength", json!(9)).contains("greater than"));
    assert!(with("/requestedSchema/properties/seats/minimum", json!(10)).contains("greater than"));
    assert!(with("/requestedSchema/properties/seats/maximum", json!("8")).contains("not a number"));
    assert!(with("/requestedSchema/required", json!(["email", "phone"])).contains("\"phone\""));
    let many: Map<String, Value> = (0..=MAX_FIELDS)
        .map(|i| (format!("f{i}"), json!({ "type": "boolean" })))
        .collect();
    assert!(with("/requestedSchema/properties", Value::Object(many)).contains("fields"));
    let long = "x".repeat(MAX_MESSAGE_CHARS + 10);
    let mut request = booking();
    request["message"] = json!(long);
    let message = parse_request(&request, &order()).unwrap().message;
    assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
    assert!(message.ends_with('…'));
}

#[test]
fn an_answer_is_checked_against_the_form_and_names_the_field_it_fails() {
    let form = parse_request(&booking(), &order()).unwrap().form;
    let accept = |content: Value| check_answer(&form, ElicitationAction::Accept, Some(&content));
    let sent = accept(json!({ "email": "ada@example.com", "seats": 4.0, "room": "out", "when": "2026-12-05T19:30", "quiet": false, "budget": 12.5 }))
        .unwrap()
        .unwrap();
    assert_eq!(
        sent,
        json!({ "email": "ada@example.com", "seats": 4, "room": "out", "when": "2026-12-05T19:30", "quiet": false, "budget": 12.5 })
    );
    let fails = |content: Value, expected: &str| {
        let error = accept(content.clone()).unwrap_err();
        assert_eq!(error, expected, "{content}");
    };
    let ok = json!({ "email": "a@b.co", "seats": 2 });
    let with = |key: &str, value: Value| {
        let mut content = ok.clone();
        content[key] = value;
        content
    };
    fails(json!({ "seats": 2 }), "Field \"email\" is required.");
    fails(with("email", Value::Null), "Field \"email\" is required.");
    fails(
        with("email", json!("ada")),
        "Field \"email\": not an email address.",
    );
    fails(
        with("email", json!("a b@c.d")),
        "Field \"email\": not an email address.",
    );
    fails(with("email", json!("")), "Field \"email\": empty.");
    fails(
        with("seats", json!(2.5)),
        "Field \"seats\": not a whole number.",
    );
    fails(with("seats", json!(0)), "Field \"seats\": less than 1.");
    fails(with("seats", json!(9)), "Field \"seats\": more than 8.");
    fails(with("seats", json!("2")), "Field \"seats\": not a number.");
    fails(
        with("room", json!("attic")),
        "Field \"room\": not one of the choices.",
    );
    fails(
        with("quiet", json!("yes")),
        "Field \"quiet\": not true or false.",
    );
    fails(with("budget", json!(-1)), "Field \"budget\": less than 0.");
    fails(
        with("note", json!("x")),
        "Field \"note\": shorter than 2 characters.",
    );
    fails(
        with("note", json!("ééééé!")),
        "Field \"note\": longer than 5 characters.",
    );
    fails(
        with("when", json!("2026-02-30T10:00")),
        "Field \"when\": not a date and time (YYYY-MM-DDTHH:MM).",
    );
    fails(
        with("phone", json!("1")),
        "Field \"phone\" is not in the form.",
    );
    assert_eq!(
        check_answer(&form, ElicitationAction::Accept, Some(&json!([1]))).unwrap_err(),
        "The answer's content is not an object."
    );
    // Declining or cancelling sends no content, whatever came with it.
    for action in [ElicitationAction::Decline, ElicitationAction::Cancel] {
        assert_eq!(
            check_answer(&form, action, Some(&json!({ "x": 1 }))),
            Ok(None)
        );
    }
}

#[test]
fn formats_are_checked_as_their_standards_say() {
    for (s, ok) in [
        ("2024-02-29", true),
        ("2023-02-29", false),
        ("2026-13-01", false),
        ("26-12-01", false),
        ("2026-12-5", false),
    ] {
        assert_eq!(is_date(s), ok, "{s}");
    }
    for (s, ok) in [
        ("2026-12-05T19:30", true),
        ("2026-12-05T19:30:15", true),
        ("2026-12-05T19:30:15.250Z", true),
        ("2026-12-05t19:30:15+01:00", true),
        ("2026-12-05T19:30-05:30", true),
        ("2026-12-05T24:00", false),
        ("2026-12-05T19:30.5", false),
        ("2026-12-05T19:30+1", false),
        ("2026-12-05", false),
    ] {
        assert_eq!(is_date_time(s), ok, "{s}");
    }
    for (s, ok) in [
        ("https://example.com/a?b", true),
        ("mailto:ada@example.com", true),
        ("urn:isbn:0451450523", true),
        ("example.com", false),
        ("https://exa mple.com", false),
        ("1http://x", false),
        ("http:", false),
    ] {
        assert_eq!(is_uri(s), ok, "{s}");
    }
    for (s, ok) in [
        ("ada@example.com", true),
        ("ada@localhost", false),
        ("@example.com", false),
        ("ada@@example.com", false),
        ("ada@example..com", false),
    ] {
        assert_eq!(is_email(s), ok, "{s}");
    }
}

#[test]
fn the_server_gets_the_action_and_only_an_accepted_answer_s_content() {
    let id = json!("e-1");
    let content = json!({ "seats": 4 });
    let accepted: Value =
        serde_json::from_str(&answer(&id, ElicitationAction::Accept, Some(&content))).unwrap();
    assert_eq!(
        accepted,
        json!({ "jsonrpc": "2.0", "id": "e-1", "result": { "action": "accept", "content": { "seats": 4 } } })
    );
    let declined: Value =
        serde_json::from_str(&answer(&id, ElicitationAction::Decline, Some(&content))).unwrap();
    assert_eq!(declined["result"], json!({ "action": "decline" }));
    let refused: Value = serde_json::from_str(&invalid(&json!(3), "no message")).unwrap();
    assert_eq!(refused["error"]["code"], -32602);
    assert_eq!(refused["id"], 3);
    assert_eq!(property_order("not json"), Vec::<String>::new());
}

#[test]
fn the_fields_order_is_read_from_the_text_past_anything_before_it() {
    let text = r#" { "jsonrpc" : "2.0", "id": 7, "method": "elicitation/create",
        "params": { "_meta": {"a": [1, {"properties": {"x": 1}}], "b": "}\"{"}, "message": "Hi",
          "requestedSchema": { "type": "object", "required": ["b"], "properties": {
            "z\u00e9": {"type": "string", "title": "properties"},
            "title": {"type": "number", "minimum": -1.5e3},
            "a": {"type": "boolean", "default": true},
            "e": {"type": "string", "enum": ["}", "]"]} } } } } "#;
    assert_eq!(property_order(text), ["zé", "title", "a", "e"]);
    assert!(property_order(r#"{"params":{"requestedSchema":{"properties":{}}}}"#).is_empty());
    assert!(property_order(r#"{"params":{"requestedSchema":{"properties":{"a":"#).is_empty());
    assert!(property_order(r#"{"params":{"requestedSchema":{"type":"object"}}}"#).is_empty());
    assert!(property_order("[1,2]").is_empty());
}

#[test]
fn a_name_the_text_repeats_counts_once_and_lengths_are_bounded() {
    let mut text = String::from(
        r#"{"params":{"message":"m","requestedSchema":{"type":"object","properties":{"#,
    );
    for _ in 0..2_000 {
        text.push_str(r#""a":0,"b":0,"#);
    }
    text.push_str(r#""a":{"type":"string","maxLength":3000000000},"b":{"type":"integer"}}}}}"#);
    let order = property_order(&text);
    assert_eq!(order, ["a", "b"]);
    let message: Value = serde_json::from_str(&text).unwrap();
    let request = parse_request(&message["params"], &order).unwrap();
    let names: Vec<&str> = request
        .form
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        request.form.fields[0].max_length,
        Some(MAX_VALUE_CHARS as u64)
    );
    let too_long = json!({
        "message": "m",
        "requestedSchema": { "type": "object", "properties": { "a": { "type": "string", "minLength": 20_000 } } }
    });
    assert!(parse_request(&too_long, &[])
        .unwrap_err()
        .contains("minLength is more than"));
    let form = request.form;
    let accept =
        |v: Value| check_answer(&form, ElicitationAction::Accept, Some(&json!({ "b": v })));
    assert_eq!(accept(json!(1e300)).unwrap_err(), "Field \"b\": too large.");
    assert_eq!(
        accept(json!(u64::MAX)).unwrap_err(),
        "Field \"b\": too large."
    );
    assert_eq!(
        accept(json!(9_007_199_254_740_991u64)).unwrap().unwrap(),
        json!({ "b": 9_007_199_254_740_991u64 })
    );
    assert_eq!(accept(json!(-4.0)).unwrap().unwrap(), json!({ "b": -4 }));
}
