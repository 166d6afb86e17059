use serde_json::{json, Value};

use super::*;
use crate::tools::Recovery;

fn server() -> ServerConfig {
    let (mut servers, errors) = parse_servers(&json!([{
        "name": "docs",
        "url": "http://127.0.0.1:9000/mcp",
        "headers": { "Authorization": "Bearer secret" },
    }]));
    assert!(errors.is_empty(), "{errors:?}");
    servers.remove(0)
}

#[test]
fn a_server_list_keeps_the_good_entries_and_names_what_to_fix_in_the_others() {
    let (servers, errors) = parse_servers(&json!([
        { "name": "docs", "url": "https://docs.example/mcp", "timeoutMs": 5000 },
        { "name": "Docs!", "url": "https://x.example/mcp" },
        { "name": "a", "url": "ftp://x.example/mcp" },
        { "name": "b", "url": "https://user@x.example/mcp" },
        { "name": "c", "url": "https://x.example/mcp", "header": {} },
        { "name": "d", "url": "https://x.example/mcp", "headers": { "Mcp-Session-Id": "x" } },
        { "name": "e", "url": "https://x.example/mcp", "headers": { "X-Key": "a\nb" } },
        { "name": "f", "url": "https://x.example/mcp", "timeoutMs": 0 },
        { "name": "g", "url": "https://x.example/mcp", "oauth": { "clientSecret": "s" } },
        { "name": "h", "url": "https://x.example/mcp", "oauth": { "clientMetadataUrl": "https://x.example" } },
        { "name": "i", "url": "https://x.example/mcp", "headers": { "authorization": "Bearer t" }, "oauth": { "clientId": "c" } },
        { "name": "docs", "url": "https://other.example/mcp" },
        "not an object",
        { "url": "https://x.example/mcp" },
    ]));
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].name, "docs");
    assert_eq!(servers[0].time_limit_ms, 5000);
    let expected = [
        "`name` must be 1-24 characters",
        "`url` must be an http or https URL",
        "`url` must be an http or https URL",
        "unknown field `header`",
        "is set by the client itself",
        "must be text on one line",
        "`timeoutMs` must be a whole number",
        "unknown field `oauth.clientSecret`",
        "`oauth.clientMetadataUrl` must have a path",
        "this entry sends its own Authorization header",
        "another server has that name",
        "must be an object",
        "needs a string `name`",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (error, wanted) in errors.iter().zip(expected) {
        assert!(error.contains(wanted), "{error:?} should say {wanted:?}");
    }
    assert_eq!(parse_servers(&Value::Null), (Vec::new(), Vec::new()));
    let (given, errors) = parse_servers(&json!([{
        "name": "docs",
        "url": "https://docs.example/mcp",
        "oauth": { "clientId": "ext-1", "clientMetadataUrl": "https://ext.example/client.json" },
    }]));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(given[0].oauth.client_id.as_deref(), Some("ext-1"));
    assert_eq!(
        given[0].oauth.metadata_url.as_deref(),
        Some("https://ext.example/client.json")
    );
    let (none, errors) = parse_servers(&json!({ "name": "docs" }));
    assert!(none.is_empty());
    assert_eq!(errors, ["MCP_SERVERS must be an array of servers"]);
}

#[test]
fn at_most_max_servers_are_connected() {
    let list: Vec<Value> = (0..MAX_SERVERS + 2)
        .map(|i| json!({ "name": format!("s{i}"), "url": "http://127.0.0.1/mcp" }))
        .collect();
    let (servers, errors) = parse_servers(&Value::Array(list));
    assert_eq!(servers.len(), MAX_SERVERS);
    assert_eq!(errors.len(), 2);
}

#[test]
fn a_binding_names_the_endpoint_and_the_header_names_but_not_their_values() {
    let a = server();
    let mut rotated = a.clone();
    rotated.headers[0].1 = "Bearer another".into();
    assert_eq!(a.binding(), rotated.binding());
    let mut moved = a.clone();
    moved.url = "http://127.0.0.1:9001/mcp".into();
    assert_ne!(a.binding(), moved.binding());
    let mut keyed = a.clone();
    keyed.headers = vec![("X-Api-Key".into(), "k".into())];
    assert_ne!(a.binding(), keyed.binding());
    assert_eq!(
        a.binding(),
        Binding::Mcp {
            server: "docs".into(),
            endpoint: "http://127.0.0.1:9000/mcp".into(),
            auth: "authorization".into(),
        }
    );
}

#[test]
fn a_server_s_tools_become_mcp_descriptors_whose_hints_only_make_reads() {
    let s = server();
    let (tools, problems) = remote_tools(
        &s,
        &[
            json!({
                "name": "search",
                "title": "Search the docs",
                "description": "Full-text search.",
                "inputSchema": { "type": "object", "properties": { "q": { "type": "string" } }, "required": ["q"] },
                // The display name: title, then annotations.title, then name.
                "annotations": { "readOnlyHint": true, "title": "Docs search (annotation)" },
            }),
            json!({
                "name": "file.create",
                "description": "Create a file.",
                "inputSchema": { "type": "object" },
                "annotations": { "title": "Create file", "readOnlyHint": false, "idempotentHint": true },
            }),
            json!({ "name": "ping" }),
        ],
    );
    assert!(problems.is_empty(), "{problems:?}");
    let names: Vec<&str> = tools.iter().map(|t| t.descriptor.name.as_str()).collect();
    assert_eq!(names, ["docs__search", "docs__file_create", "docs__ping"]);
    assert_eq!(tools[1].remote, "file.create");
    let search = &tools[0].descriptor;
    assert_eq!(search.level, Level::Mcp);
    assert_eq!(search.effects, Effects::Read);
    assert_eq!(search.recovery, Recovery::RetrySafe);
    assert_eq!(search.label, "Search the docs");
    assert_eq!(
        search.description,
        "[Tool of the MCP server \"docs\"; described by that server, not by the user] Full-text search."
    );
    assert_eq!(search.binding, s.binding());
    assert!(!search.parallel_safe);
    // An idempotent hint from a server is not trusted for recovery.
    let create = &tools[1].descriptor;
    assert_eq!(create.effects, Effects::Write);
    assert_eq!(create.recovery, Recovery::NeverRetry);
    assert_eq!(create.label, "Create file");
    // No description or schema: the label, and no parameters.
    let ping = &tools[2].descriptor;
    assert_eq!(ping.effects, Effects::Write);
    assert_eq!(
        ping.parameters,
        json!({ "type": "object", "properties": {} })
    );
    assert!(ping.description.ends_with("ping"));
    // Every one registers.
    let mut registry = crate::tools::ToolRegistry::page_tools();
    for tool in tools {
        registry.register(tool.descriptor).unwrap();
    }
}

#[test]
fn a_tool_that_cannot_be_offered_is_left_out_with_the_reason() {
    let s = server();
    let deep = (0..40).fold(
        json!({ "type": "string" }),
        |inner, _| json!({ "type": "object", "properties": { "x": inner } }),
    );
    let huge = json!({ "type": "object", "description": "x".repeat(40_000) });
    let (tools, problems) = remote_tools(
        &s,
        &[
            json!({ "name": "a".repeat(70) }),
            json!({ "name": "" }),
            json!({ "name": "list", "inputSchema": { "type": "array" } }),
            json!({ "name": "deep", "inputSchema": deep }),
            json!({ "name": "huge", "inputSchema": huge }),
            json!({ "name": "x.y" }),
            json!({ "name": "x_y" }),
            json!({ "name": "long", "description": "d".repeat(MAX_DESCRIPTION_CHARS + 50) }),
        ],
    );
    let names: Vec<&str> = tools.iter().map(|t| t.descriptor.name.as_str()).collect();
    assert_eq!(names, ["docs__x_y", "docs__long"]);
    assert!(tools[1].descriptor.description.ends_with('…'));
    let expected = [
        "longer than 64 characters",
        "it has no name",
        "not a JSON Schema of type object",
        "nested more than 32 levels",
        "at most 32768 are allowed per tool",
        "another of its tools is also called docs__x_y",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, wanted) in problems.iter().zip(expected) {
        assert!(
            problem.contains(wanted),
            "{problem:?} should say {wanted:?}"
        );
        assert!(problem.starts_with("MCP server \"docs\""), "{problem}");
    }
    let many: Vec<Value> = (0..MAX_TOOLS_PER_SERVER + 3)
        .map(|i| json!({ "name": format!("t{i}") }))
        .collect();
    let (tools, problems) = remote_tools(&s, &many);
    assert_eq!(tools.len(), MAX_TOOLS_PER_SERVER);
    assert_eq!(problems.len(), 3);
}

fn read_all(content_type: &str, body: &[u8], split: usize) -> Result<Vec<Incoming>, McpError> {
    let mut reader = AnswerReader::new(content_type);
    let mut out = Vec::new();
    for chunk in body.chunks(split.max(1)) {
        out.extend(reader.push(chunk)?);
    }
    out.extend(reader.finish()?);
    Ok(out)
}

#[test]
fn an_answer_is_read_as_json_or_as_an_event_stream_split_anywhere() {
    let json_body = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#;
    let expected = vec![Incoming::Response {
        id: json!(7),
        answer: Ok(json!({ "tools": [] })),
    }];
    assert_eq!(
        read_all("application/json", json_body, 5).unwrap(),
        expected
    );
    let sse = "id: 1\ndata:\n\n: keep-alive\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"c1\",\"progress\":1,\"total\":2,\"message\":\"half way\"}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"sampling/createMessage\",\"params\":{}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\r\ndata: \"result\":{\"content\":[{\"type\":\"text\",\"text\":\"é\"}]}}\r\n\r\n";
    for split in 1..sse.len() {
        let messages = read_all("text/event-stream; charset=utf-8", sse.as_bytes(), split).unwrap();
        assert_eq!(messages.len(), 3, "split {split}");
        assert!(
            matches!(&messages[0], Incoming::Notification { method, params }
                if method == "notifications/progress"
                    && progress_text(params, "c1").as_deref() == Some("half way"))
        );
        assert_eq!(
            messages[1],
            Incoming::Request {
                id: json!("s1"),
                method: "sampling/createMessage".into(),
                params: json!({}),
                order: Vec::new(),
            }
        );
        assert!(
            matches!(&messages[2], Incoming::Response { id, answer: Ok(result) }
                if is_ours(id, 7) && result["content"][0]["text"] == "é")
        );
    }
}

#[test]
fn a_batch_an_error_and_bad_messages_are_read_as_what_they_are() {
    let batch = br#"[{"jsonrpc":"2.0","method":"notifications/message","params":{}},{"jsonrpc":"2.0","id":"3","error":{"code":-32602,"message":"Unknown tool"}}]"#;
    let messages = read_all("application/json", batch, 4096).unwrap();
    assert_eq!(messages.len(), 2);
    let Incoming::Response { id, answer } = &messages[1] else {
        panic!("{messages:?}")
    };
    assert!(is_ours(id, 3));
    let error = answer.clone().unwrap_err();
    assert_eq!(
        error,
        McpError::Rpc {
            code: -32602,
            message: "Unknown tool".into()
        }
    );
    assert_eq!(
        error.describe("docs"),
        "The MCP server \"docs\" answered with error -32602: Unknown tool"
    );
    for (content_type, body, wanted) in [
        ("application/json", &b"<html>"[..], "the body is not JSON"),
        ("text/html", &b"<html>"[..], "the body is not JSON"),
        (
            "application/json",
            br#"{"id":1,"result":{}}"#,
            "\"jsonrpc\": \"2.0\"",
        ),
        ("application/json", br#"[1]"#, "not a JSON object"),
        (
            "application/json",
            br#"{"jsonrpc":"2.0"}"#,
            "neither a request",
        ),
        (
            "text/event-stream",
            b"data: {oops\n\n",
            "an event's data is not JSON",
        ),
    ] {
        let error = read_all(content_type, body, 3).unwrap_err();
        let McpError::Malformed(why) = &error else {
            panic!("{error:?}")
        };
        assert!(why.contains(wanted), "{why:?} should say {wanted:?}");
        assert!(error.describe("docs").contains("not MCP"));
    }
    let both = br#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}"#;
    let messages = read_all("application/json", both, 64).unwrap();
    assert!(matches!(
        &messages[0],
        Incoming::Response {
            answer: Err(McpError::Malformed(_)),
            ..
        }
    ));
    // An empty body (a 202 to a notification) holds no message.
    assert!(read_all("application/json", b"", 1).unwrap().is_empty());
}

#[test]
fn an_answer_larger_than_the_bound_is_refused_before_it_is_all_held() {
    let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
    let mut reader = AnswerReader::new("application/json");
    assert!(matches!(reader.push(&big), Err(McpError::Malformed(_))));
    let mut reader = AnswerReader::new("text/event-stream");
    let mut line = b"data: ".to_vec();
    line.extend(std::iter::repeat_n(b'x', MAX_MESSAGE_BYTES + 1));
    assert!(matches!(reader.push(&line), Err(McpError::Malformed(_))));
}

#[test]
fn versions_pages_and_progress_are_read_from_results() {
    assert_eq!(
        agreed_version(&json!({ "protocolVersion": "2025-03-26" })).unwrap(),
        "2025-03-26"
    );
    assert_eq!(
        agreed_version(&json!({ "protocolVersion": "2024-11-05" })),
        Err(McpError::Version("2024-11-05".into()))
    );
    assert!(agreed_version(&json!({})).is_err());
    let (tools, next) =
        tools_page(&json!({ "tools": [{ "name": "a" }], "nextCursor": "p2" })).unwrap();
    assert_eq!((tools.len(), next.as_deref()), (1, Some("p2")));
    let (_, next) = tools_page(&json!({ "tools": [], "nextCursor": "" })).unwrap();
    assert_eq!(next, None);
    assert!(tools_page(&json!({ "tools": {} })).is_err());
    assert_eq!(
        progress_text(
            &json!({ "progressToken": "c1", "progress": 2, "total": 5 }),
            "c1"
        )
        .as_deref(),
        Some("2 of 5")
    );
    assert_eq!(
        progress_text(&json!({ "progressToken": "c2", "progress": 2 }), "c1"),
        None
    );
    let params = call_params("file.create", &json!({ "path": "a" }), "c1");
    assert_eq!(params["name"], "file.create");
    assert_eq!(params["_meta"]["progressToken"], "c1");
    let message: Value = serde_json::from_str(&request(4, "tools/call", params)).unwrap();
    assert_eq!(
        (message["jsonrpc"].as_str(), message["id"].as_u64()),
        (Some("2.0"), Some(4))
    );
    let refusal: Value =
        serde_json::from_str(&refusal(&json!("s1"), "sampling/createMessage")).unwrap();
    assert_eq!(refusal["error"]["code"], -32601);
    assert_eq!(refusal["id"], "s1");
    let note: Value =
        serde_json::from_str(&notification("notifications/initialized", None)).unwrap();
    assert!(note.get("id").is_none() && note.get("params").is_none());
}

#[test]
fn a_call_result_becomes_text_images_and_details_for_the_model() {
    let png = crate::model::ATTACHMENT_IMAGE_TYPES[0];
    let outcome = call_outcome(
        "docs",
        "search",
        &json!({
            "content": [
                { "type": "text", "text": "first" },
                { "type": "image", "mimeType": png, "data": "iVBORw0KGgo=" },
                { "type": "image", "mimeType": "image/svg+xml", "data": "PHN2Zz4=" },
                { "type": "resource", "resource": { "uri": "file:///a.txt", "text": "inside" } },
                { "type": "resource", "resource": { "uri": "file:///a.bin", "blob": "AAAA" } },
                { "type": "resource_link", "uri": "file:///b", "name": "b" },
                { "type": "audio", "mimeType": "audio/wav", "data": "AAAA" },
                { "type": "hologram" },
            ],
            "structuredContent": { "hits": 1 },
        }),
    );
    assert!(outcome.ok);
    assert_eq!(outcome.images.len(), 1);
    assert_eq!(outcome.images[0].media_type, png);
    assert_eq!(
        outcome.content,
        "first\n\n[an image of type \"image/svg+xml\" that is not shown]\n\n[resource file:///a.txt]\ninside\n\n[a binary resource file:///a.bin that is not shown]\n\n[link to resource \"b\": file:///b]\n\n[audio that is not shown]\n\n[content of type \"hologram\" that is not shown]"
    );
    assert_eq!(
        outcome.details,
        Some(
            json!({ "mcpServer": "docs", "mcpTool": "search", "structuredContent": { "hits": 1 } })
        )
    );
    let failed = call_outcome(
        "docs",
        "search",
        &json!({ "content": [{ "type": "text", "text": "no index" }], "isError": true }),
    );
    assert!(!failed.ok);
    assert_eq!(failed.content, "no index");
    let silent = call_outcome("docs", "search", &json!({ "content": [], "isError": true }));
    assert_eq!(
        (silent.ok, silent.content.as_str()),
        (false, "search failed and said nothing more.")
    );
    let structured = call_outcome(
        "docs",
        "search",
        &json!({ "content": [], "structuredContent": { "a": 1 } }),
    );
    assert_eq!(structured.content, r#"{"a":1}"#);
    let empty = call_outcome("docs", "search", &json!({ "content": [] }));
    assert_eq!(
        (empty.ok, empty.content.as_str()),
        (true, "(The tool returned nothing.)")
    );
    let malformed = call_outcome("docs", "search", &json!({ "text": "hi" }));
    assert!(!malformed.ok);
    assert!(
        malformed.content.contains("has no content array"),
        "{}",
        malformed.content
    );
    let long = call_outcome(
        "docs",
        "search",
        &json!({ "content": [{ "type": "text", "text": "é".repeat(MAX_RESULT_CHARS + 10) }] }),
    );
    assert!(long.content.starts_with(&"é".repeat(MAX_RESULT_CHARS)));
    assert!(long.content.ends_with(&format!(
        "[The result was cut: {MAX_RESULT_CHARS} of its {} characters are shown.]",
        MAX_RESULT_CHARS + 10
    )));
}

#[test]
fn errors_name_the_server_and_what_to_check() {
    let unauthorized = McpError::Http {
        status: 401,
        body: "no token".into(),
    };
    assert_eq!(
        unauthorized.describe("docs"),
        "The MCP server \"docs\" answered HTTP 401: no token It refused the client's credentials (the headers of MCP_SERVERS)."
    );
    assert!(McpError::Unreachable("Failed to fetch".into())
        .describe("docs")
        .contains("could not be reached (Failed to fetch)"));
    assert!(McpError::Version("1999-01-01".into())
        .describe("docs")
        .contains("2025-06-18 and 2025-03-26"));
    assert_eq!(
        McpError::MorePermissionNeeded(
            r#"Bearer error="insufficient_scope", scope="tools admin""#.into()
        )
        .describe("docs"),
        "The MCP server \"docs\" needs more permission than your sign-in gave (tools admin): open the side panel's Settings, MCP servers, and choose Sign in next to it to grant it."
    );
}

#[test]
fn a_request_given_up_at_its_time_limit_says_the_server_did_not_answer_it_in_time() {
    // The abort of a request past its limit surfaces as a failed fetch or
    // an answer cut short: named for what it is, with the server.
    let aborted = McpError::Unreachable("signal is aborted without reason".into());
    for error in [aborted.clone(), McpError::NoAnswer] {
        let timed_out = within_time_limit::<()>(Err(error), true, "initialize", 30_000);
        assert_eq!(
            timed_out,
            Err(McpError::TimedOut {
                request: "initialize".into(),
                seconds: 30
            })
        );
        assert_eq!(
            timed_out.unwrap_err().describe("slow"),
            "The MCP server \"slow\" did not answer initialize within 30 s."
        );
    }
    // Within the limit, the same errors are what they say.
    assert_eq!(
        within_time_limit::<()>(Err(aborted.clone()), false, "initialize", 30_000),
        Err(aborted)
    );
    // An answer, or an error an abort does not make (a status, a sign-in
    // wanted), stays what it is even when the limit passed meanwhile.
    assert_eq!(within_time_limit(Ok(7), true, "tools/list", 30_000), Ok(7));
    for error in [
        McpError::Http {
            status: 503,
            body: String::new(),
        },
        McpError::SignInNeeded(None),
        McpError::TimedOut {
            request: "initialize".into(),
            seconds: 30,
        },
    ] {
        assert_eq!(
            within_time_limit::<()>(Err(error.clone()), true, "tools/list", 30_000),
            Err(error)
        );
    }
    // A limit that is not whole seconds is rounded up.
    assert_eq!(
        within_time_limit::<()>(Err(McpError::NoAnswer), true, "tools/list", 2_500),
        Err(McpError::TimedOut {
            request: "tools/list".into(),
            seconds: 3
        })
    );
}

#[test]
fn a_request_for_input_keeps_the_order_of_its_fields_as_the_server_wrote_them() {
    let text = r#"{"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{"message":"Who?","requestedSchema":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"boolean"},"mid":{"type":"integer"}}}}}"#;
    let sse = format!("data: {text}\n\n");
    for (content_type, body) in [
        ("text/event-stream", sse.as_bytes()),
        ("application/json", text.as_bytes()),
    ] {
        let messages = read_all(content_type, body, 7).unwrap();
        let [Incoming::Request {
            method,
            params,
            order,
            ..
        }] = messages.as_slice()
        else {
            panic!("one request expected: {messages:?}");
        };
        assert_eq!(method, "elicitation/create");
        assert_eq!(order, &["zeta", "alpha", "mid"]);
        let request = crate::elicitation::parse_request(params, order).unwrap();
        let names: Vec<&str> = request
            .form
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["zeta", "alpha", "mid"]);
    }
    assert_eq!(
        initialize_params()["capabilities"],
        json!({ "elicitation": {} })
    );
}

#[test]
fn the_user_s_servers_are_checked_like_the_extension_s_and_refused_with_the_reason() {
    let entries = json!([
        { "name": "mine", "url": "https://mcp.example/mcp", "headers": { "Authorization": "Bearer t" } },
        { "name": "docs", "url": "https://other.example/mcp" },
        { "name": "mine", "url": "https://third.example/mcp" },
        { "name": "Caps", "url": "https://x.example/mcp" },
        { "name": "ftp", "url": "ftp://x.example/" },
        { "name": "extra", "url": "https://x.example/mcp", "colour": "red" },
        { "name": 7 },
        { "name": "late", "url": "https://late.example/mcp" },
        { "name": "later", "url": "https://later.example/mcp" },
    ]);
    let checked = parse_user_servers(&entries, &["docs"], 2);
    assert_eq!(checked.len(), 9);
    let ok: Vec<&str> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(ok, ["mine", "late"]);
    let mine = checked[0].as_ref().unwrap();
    assert_eq!(
        mine.headers,
        vec![("Authorization".to_string(), "Bearer t".to_string())]
    );
    let problem = |i: usize| checked[i].as_ref().unwrap_err().clone();
    assert!(problem(1)
        .problem
        .contains("the extension has a server of that name"));
    assert_eq!(
        (problem(1).name.as_str(), problem(1).url.as_str()),
        ("docs", "https://other.example/mcp")
    );
    assert!(problem(2)
        .problem
        .contains("another of your servers has that name"));
    assert!(problem(3).problem.contains("`name` must be"));
    assert!(problem(4)
        .problem
        .contains("`url` must be an http or https URL"));
    assert!(problem(5).problem.contains("unknown field `colour`"));
    assert_eq!(problem(6).name, "");
    assert!(problem(8).problem.contains("at most 8 servers"));
    // Not an array: one entry, refused or not; null: none.
    assert!(parse_user_servers(&json!("x"), &[], 8)[0].is_err());
    assert!(parse_user_servers(&Value::Null, &[], 8).is_empty());
}

#[test]
fn a_server_that_lists_changes_is_followed_and_its_pings_answered() {
    assert!(lists_changes(
        &json!({ "capabilities": { "tools": { "listChanged": true } } })
    ));
    for result in [
        json!({ "capabilities": { "tools": { "listChanged": false } } }),
        json!({ "capabilities": { "tools": {} } }),
        json!({ "capabilities": { "tools": { "listChanged": "yes" } } }),
        json!({ "capabilities": null }),
        json!(null),
    ] {
        assert!(!lists_changes(&result), "{result}");
    }
    // Reopening a stream: 1 s after one that was open and ended, doubling
    // with each failure in a row up to a minute, given up after 8.
    let delays: Vec<Option<u32>> = (0..9).map(stream_retry_ms).collect();
    assert_eq!(
        delays,
        [
            Some(1_000),
            Some(2_000),
            Some(4_000),
            Some(8_000),
            Some(16_000),
            Some(32_000),
            Some(60_000),
            Some(60_000),
            None
        ]
    );
    assert_eq!(stream_retry_ms(u32::MAX), None);
    // `ping` gets an empty result with the server's id; anything else this
    // client does not offer is refused as "method not found".
    let pong: Value = serde_json::from_str(&answer_request(&json!(7), "ping")).unwrap();
    assert_eq!(pong, json!({ "jsonrpc": "2.0", "id": 7, "result": {} }));
    let refused: Value = serde_json::from_str(&answer_request(&json!("r"), "roots/list")).unwrap();
    assert_eq!(refused["error"]["code"], -32601);
    assert_eq!(refused["id"], "r");
}

#[test]
fn a_broken_answer_stream_is_resumed_after_the_last_event_the_server_numbered() {
    let mut reader = AnswerReader::new("text/event-stream; charset=utf-8");
    assert_eq!(reader.last_event_id(), None, "nothing read yet");
    // A priming event (an id, no data) counts: it is where to resume from.
    let first = reader
        .push(b"id: s1:1\nretry: 250\ndata:\n\nid: s1:2\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":1}}\n\nid: s1:3\nda")
        .unwrap();
    assert_eq!(first.len(), 1);
    // The half-read event's id does not count: the stream resumes after
    // the last complete event, so the server sends that one again.
    assert_eq!(reader.last_event_id().as_deref(), Some("s1:2"));
    assert_eq!(reader.retry_ms(), Some(250));

    // The resumed stream starts with nothing of its own: the old id and
    // retry carry over; its own events take over.
    let mut resumed = reader.resumed("text/event-stream");
    assert!(resumed.is_stream());
    assert_eq!(resumed.last_event_id().as_deref(), Some("s1:2"));
    assert_eq!(resumed.retry_ms(), Some(250));
    let rest = resumed
        .push(b"id: s1:4\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n")
        .unwrap();
    assert!(matches!(&rest[..], [Incoming::Response { .. }]));
    assert_eq!(resumed.last_event_id().as_deref(), Some("s1:4"));

    // A JSON answer, or a stream without ids, cannot be resumed.
    let mut json = AnswerReader::new("application/json");
    json.push(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}")
        .unwrap();
    assert_eq!(json.last_event_id(), None);
    let mut plain = AnswerReader::new("text/event-stream");
    plain
        .push(b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n")
        .unwrap();
    assert_eq!(plain.last_event_id(), None);
    // An empty id resets it (the SSE rule): nothing to resume after.
    let mut reset = AnswerReader::new("text/event-stream");
    reset.push(b"id: a\ndata:\n\n").unwrap();
    assert_eq!(reset.stream_event_id(), Some("a"));
    reset.push(b"id\ndata:\n\n").unwrap();
    assert_eq!(reset.last_event_id(), None);
    assert_eq!(reset.stream_event_id(), Some(""), "a reset, not no id");
    // A resumed stream's reset drops the id it was resumed after too.
    let mut resumed = reader.resumed("text/event-stream");
    assert_eq!(resumed.stream_event_id(), None);
    resumed.push(b"id:\ndata:\n\n").unwrap();
    assert_eq!(resumed.last_event_id(), None);
}

#[test]
fn resumptions_wait_as_the_server_asked_double_and_stop_after_three() {
    assert_eq!(resume_delay_ms(0, None), Some(500));
    assert_eq!(resume_delay_ms(1, None), Some(1_000));
    assert_eq!(resume_delay_ms(2, None), Some(2_000));
    assert_eq!(resume_delay_ms(3, None), None);
    assert_eq!(resume_delay_ms(0, Some(250)), Some(250));
    assert_eq!(resume_delay_ms(0, Some(0)), Some(100), "not at once");
    assert_eq!(
        resume_delay_ms(2, Some(60_000)),
        Some(10_000),
        "not for ever"
    );
}

#[test]
fn a_call_that_changes_something_whose_answer_was_lost_after_the_server_had_it_says_the_outcome_is_unknown(
) {
    let lost = [
        McpError::NoAnswer,
        McpError::AnswerBroke("network error".into()),
        McpError::TimedOut {
            request: "tools/call".into(),
            seconds: 60,
        },
    ];
    for error in &lost {
        let text = call_error(error, "crm", true);
        assert!(text.starts_with(&error.describe("crm")), "{text}");
        assert!(text.ends_with(OUTCOME_UNKNOWN), "{text}");
        // A read may simply be called again.
        assert_eq!(call_error(error, "crm", false), error.describe("crm"));
    }
    assert!(call_error(&lost[1], "crm", true)
        .contains("accepted the request, then its answer broke off (network error)"));
    // Never sent, or refused: nothing happened, nothing to hedge.
    for error in [
        McpError::Unreachable("connection refused".into()),
        McpError::Http {
            status: 500,
            body: "boom".into(),
        },
        McpError::Rpc {
            code: -32602,
            message: "bad params".into(),
        },
        McpError::TimedOut {
            request: "initialize".into(),
            seconds: 30,
        },
    ] {
        assert_eq!(call_error(&error, "crm", true), error.describe("crm"));
    }
    // An abort by the time limit reads as the limit, a broken answer too.
    assert!(matches!(
        within_time_limit::<()>(
            Err(McpError::AnswerBroke("aborted".into())),
            true,
            "tools/call",
            5_000
        ),
        Err(McpError::TimedOut { seconds: 5, .. })
    ));
}

#[test]
fn a_call_meant_for_a_server_now_at_another_address_names_both_and_says_nothing_was_sent() {
    let text = moved_server_message("docs", "https://a.example/mcp", "https://b.example/mcp");
    assert!(
        text.contains("\"docs\" is now at https://b.example/mcp, not at https://a.example/mcp"),
        "{text}"
    );
    assert!(text.contains("nothing was sent"), "{text}");
}

#[test]
fn a_retry_in_a_block_without_data_sets_the_time_to_wait_before_asking_again() {
    // A server that primes a stream and closes it (polling): `id:` and
    // `retry:` alone, no data line, so no event is dispatched; the spec
    // sets the reconnection time when the field is parsed.
    let mut reader = AnswerReader::new("text/event-stream");
    assert!(reader
        .push(b"id: s1:7\nretry: 30000\n\n")
        .unwrap()
        .is_empty());
    assert_eq!(reader.retry_ms(), Some(30_000));
    assert_eq!(reader.last_event_id().as_deref(), Some("s1:7"));
    // Also when the body ends right after it (no blank line).
    let mut ended = AnswerReader::new("text/event-stream");
    assert!(ended.push(b"retry: 1500").unwrap().is_empty());
    assert!(ended.finish().unwrap().is_empty());
    assert_eq!(ended.retry_ms(), Some(1_500));
    // A later valid value wins; an invalid one changes nothing.
    let mut later = AnswerReader::new("text/event-stream");
    later
        .push(b"retry: 100\n\nretry: 2x\n\nretry: 900\n\n")
        .unwrap();
    assert_eq!(later.retry_ms(), Some(900));
}
