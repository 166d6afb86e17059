use super::*;
use crate::model::ProviderProfile;
use crate::provider::{OutboundToolCall, ToolSpec};

/// A stream in the documented Messages SSE format: thinking with a
/// signature, text, two parallel tool_use blocks with fragmented JSON,
/// pings, usage in message_start and message_delta.
const RECORDED: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":321,\"output_tokens\":1,\"cache_read_input_tokens\":100}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Need the page \u{2014} \"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"SIG==\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Reading \u{e9}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"read_page\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"click\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"ref\\\": \\\"e\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"3\\\"}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":3}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":57}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

const ANTHROPIC: &str = "https://api.anthropic.com/v1";

/// The stream of a request sent to Anthropic's own endpoint.
fn run(chunks: &[&[u8]]) -> (Vec<StreamEvent>, Result<ProviderResponse, ProviderError>) {
    run_with(
        AnthropicDecoder::with(AnthropicStream::for_endpoint(&endpoint(ANTHROPIC))),
        chunks,
    )
}

fn run_with(
    mut decoder: AnthropicDecoder,
    chunks: &[&[u8]],
) -> (Vec<StreamEvent>, Result<ProviderResponse, ProviderError>) {
    let mut deltas = Vec::new();
    for c in chunks {
        match decoder.push(c) {
            Ok(d) => deltas.extend(d),
            Err(e) => return (deltas, Err(e)),
        }
    }
    (deltas, decoder.finish())
}

fn expected() -> ProviderResponse {
    ProviderResponse {
        text: "Reading \u{e9}".into(),
        reasoning: "Need the page \u{2014} ".into(),
        tool_calls: vec![
            RawToolCall {
                id: "toolu_a".into(),
                name: "read_page".into(),
                arguments: "{}".into(),
            },
            RawToolCall {
                id: "toolu_b".into(),
                name: "click".into(),
                arguments: "{\"ref\": \"e3\"}".into(),
            },
        ],
        stop_reason: StopReason::ToolUse,
        usage: Some(Usage {
            // The whole prompt: 321 uncached input tokens and 100 read
            // from the cache (Anthropic counts them apart).
            input: 421,
            output: 57,
            cache_read: 100,
            cache_write: 0,
            reasoning: 0,
        }),
        model: "claude-x".into(),
        private: Some(json!({ "anthropic": { "thinking": [
            { "type": "thinking", "thinking": "Need the page \u{2014} ", "signature": "SIG==" }
        ], "endpoint": "api.anthropic.com" } })),
    }
}

#[test]
fn recorded_stream_assembles_thinking_text_and_parallel_tools() {
    let (deltas, r) = run(&[RECORDED.as_bytes()]);
    assert_eq!(r.unwrap(), expected());
    assert_eq!(
        deltas,
        vec![
            StreamEvent::ReasoningDelta("Need the page \u{2014} ".into()),
            StreamEvent::TextDelta("Reading \u{e9}".into())
        ]
    );
}

#[test]
fn recorded_stream_split_at_every_byte_gives_same_response() {
    let bytes = RECORDED.as_bytes();
    for cut in 0..=bytes.len() {
        let (_, r) = run(&[&bytes[..cut], &bytes[cut..]]);
        assert_eq!(r.unwrap(), expected(), "split at {cut}");
    }
}

#[test]
fn overloaded_error_event_mid_stream_is_retryable() {
    let head = &RECORDED[..RECORDED.find("event: content_block_start").unwrap()];
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let (_, r) = run(&[head.as_bytes(), err.as_bytes()]);
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::ProviderUnavailable);
    assert!(e.retryable);
}

#[test]
fn truncated_stream_is_a_retryable_network_error() {
    let cut = RECORDED.find("message_delta").unwrap();
    let (_, r) = run(&[&RECORDED.as_bytes()[..cut]]);
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Network);
    assert!(e.retryable);
}

#[test]
fn stop_reasons_map() {
    for (wire, want) in [
        ("end_turn", StopReason::End),
        ("max_tokens", StopReason::MaxTokens),
        ("refusal", StopReason::ContentFilter),
        ("stop_sequence", StopReason::End),
    ] {
        let s = format!(
            "data: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{wire}\"}},\"usage\":{{\"output_tokens\":1}}}}\n\n"
        );
        assert_eq!(run(&[s.as_bytes()]).1.unwrap().stop_reason, want);
    }
}

#[test]
fn http_errors_are_typed() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"}}"#;
    assert_eq!(
        error_from_http(400, body, None).kind,
        ErrorKind::ContextOverflow
    );
    let body =
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
    assert_eq!(error_from_http(401, body, None).kind, ErrorKind::Auth);
    let e = error_from_http(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        Some(1000),
    );
    assert_eq!(
        (e.kind, e.retryable, e.retry_after_ms),
        (ErrorKind::ProviderUnavailable, true, Some(1000))
    );
}

fn request(messages: Vec<ChatMessage>) -> ProviderRequest {
    ProviderRequest {
        lineage: None,
        profile: ProviderProfile {
            kind: "anthropic".into(),
            base_url: "https://api.anthropic.com/v1".into(),
            model: "claude-x".into(),
            max_output_tokens: None,
            temperature_centi: None,
            vision: false,
            tool_use: true,
            token_budget: None,
            context_window: None,
        },
        system: "be brief".into(),
        messages: messages.into(),
        tools: vec![ToolSpec {
            name: "read_page".into(),
            description: "d".into(),
            parameters: json!({"type":"object","properties":{}}),
        }]
        .into(),
    }
}

#[test]
fn body_alternates_roles_and_puts_tool_results_in_user_turns() {
    let body = build_body(&request(vec![
        ChatMessage::user("go"),
        ChatMessage::Assistant {
            text: "reading".into(),
            tool_calls: vec![OutboundToolCall {
                id: "toolu_a".into(),
                name: "read_page".into(),
                arguments: json!({}),
            }],
            private: expected().private,
        },
        ChatMessage::ToolResult {
            call_id: "toolu_a".into(),
            content: "PAGE".into(),
            is_error: false,
            images: vec![],
        },
        ChatMessage::user("also this (steer)"),
    ]));
    assert_eq!(body["system"], json!("be brief"));
    assert_eq!(body["max_tokens"], json!(DEFAULT_MAX_TOKENS));
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["tools"][0]["input_schema"]["type"], json!("object"));
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["user", "assistant", "user"]);
    let assistant = &messages[1]["content"];
    assert_eq!(assistant[0]["type"], json!("thinking"));
    assert_eq!(assistant[0]["signature"], json!("SIG=="));
    assert_eq!(assistant[1]["type"], json!("text"));
    assert_eq!(assistant[2]["type"], json!("tool_use"));
    let user = &messages[2]["content"];
    assert_eq!(user[0]["type"], json!("tool_result"));
    assert_eq!(user[0]["tool_use_id"], json!("toolu_a"));
    assert_eq!(user[1]["text"], json!("also this (steer)"));
}

#[test]
fn thinking_signatures_are_never_sent_to_openai() {
    let mut r = request(vec![ChatMessage::Assistant {
        text: "x".into(),
        tool_calls: vec![],
        private: expected().private,
    }]);
    r.profile.kind = "openai".into();
    let body = crate::provider::openai::build_body(&r).to_string();
    assert!(!body.contains("SIG=="));
}

#[test]
fn headers_carry_version_browser_access_and_key() {
    let h = headers("sk-ant");
    assert!(h.contains(&("anthropic-version".into(), API_VERSION.into())));
    assert!(h.contains(&(
        "anthropic-dangerous-direct-browser-access".into(),
        "true".into()
    )));
    assert!(h.contains(&("x-api-key".into(), "sk-ant".into())));
    assert_eq!(
        endpoint("https://api.anthropic.com/v1/"),
        "https://api.anthropic.com/v1/messages"
    );
}

fn screenshot_request(vision: bool) -> ProviderRequest {
    let mut r = request(vec![
        ChatMessage::user("look"),
        ChatMessage::Assistant {
            text: String::new(),
            tool_calls: vec![OutboundToolCall {
                id: "s1".into(),
                name: "screenshot".into(),
                arguments: json!({}),
            }],
            private: None,
        },
        ChatMessage::ToolResult {
            call_id: "s1".into(),
            content: "Screenshot of the page".into(),
            is_error: false,
            images: vec![crate::model::ImageData {
                media_type: "image/jpeg".into(),
                data: "QUJD".into(),
            }],
        },
    ]);
    r.profile.vision = vision;
    r
}

#[test]
fn images_go_into_tool_results_for_vision_models_and_become_placeholders_otherwise() {
    let body = build_body(&screenshot_request(true));
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["type"], json!("tool_result"));
    assert_eq!(result["content"][1]["type"], json!("image"));
    assert_eq!(result["content"][1]["source"]["data"], json!("QUJD"));
    let body = build_body(&screenshot_request(false));
    let text = body["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("image(s) omitted"), "{text}");
    assert!(!body.to_string().contains("QUJD"));
}

#[test]
fn openai_images_follow_the_tool_results_in_a_user_message() {
    let mut r = screenshot_request(true);
    r.profile.kind = "openai".into();
    let body = crate::provider::openai::build_body(&r);
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["system", "user", "assistant", "tool", "user"]);
    assert_eq!(
        messages[4]["content"][2]["image_url"]["url"],
        json!("data:image/jpeg;base64,QUJD")
    );
    r.profile.vision = false;
    let body = crate::provider::openai::build_body(&r);
    assert_eq!(body["messages"].as_array().unwrap().len(), 4);
    assert!(!body.to_string().contains("QUJD"));
}

fn event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

#[test]
fn tool_use_blocks_come_out_in_the_order_they_started_and_a_restarted_block_is_replaced() {
    let start = |index: u64, id: &str, name: &str| {
        event(
            "content_block_start",
            &format!("{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"tool_use\",\"id\":\"{id}\",\"name\":\"{name}\",\"input\":{{}}}}}}"),
        )
    };
    let json = |index: u64, part: &str| {
        event(
            "content_block_delta",
            &format!("{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":{}}}}}", serde_json::to_string(part).unwrap()),
        )
    };
    let stream = [
        start(5, "toolu_first", "read_page"),
        start(2, "toolu_second", "click"),
        json(2, "{\"ref\":"),
        json(5, "{}"),
        json(2, "\"e1\"}"),
        start(7, "toolu_stale", "type"),
        start(7, "toolu_third", "select"),
        event(
            "message_delta",
            "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"}}",
        ),
        event("message_stop", "{\"type\":\"message_stop\"}"),
    ]
    .concat();
    let (_, response) = run(&[stream.as_bytes()]);
    let calls = crate::provider::call_triples(response);
    assert_eq!(
        calls,
        vec![
            ("toolu_first".into(), "read_page".into(), "{}".into()),
            (
                "toolu_second".into(),
                "click".into(),
                "{\"ref\":\"e1\"}".into()
            ),
            ("toolu_third".into(), "select".into(), "{}".into()),
        ]
    );
}

#[test]
fn a_delta_for_a_block_that_never_started_is_a_protocol_error() {
    let stream = event(
        "content_block_delta",
        "{\"type\":\"content_block_delta\",\"index\":4,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}",
    );
    let (_, response) = run(&[stream.as_bytes()]);
    let err = response.unwrap_err();
    assert!(
        err.message.contains("unknown content block 4"),
        "{}",
        err.message
    );
}

/// Every text block of a body, wherever it sits (messages, tool results).
fn text_blocks(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if map.get("type") == Some(&json!("text")) {
                    out.push(
                        map.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    );
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&body["messages"], &mut out);
    out
}

#[test]
fn no_text_block_is_blank_an_image_only_result_or_a_whitespace_reply() {
    // An MCP tool that returned only an image, and a reply interrupted
    // after two line breaks: Anthropic refuses a blank text block, and the
    // refusal would stay in every later request of the thread.
    let mut r = screenshot_request(true);
    let mut messages = (*r.messages).clone();
    if let ChatMessage::ToolResult { content, .. } = &mut messages[2] {
        *content = "".into();
    }
    if let ChatMessage::Assistant { text, .. } = &mut messages[1] {
        *text = "\n\n ".into();
    }
    r.messages = messages.into();
    let body = build_body(&r);
    let blank: Vec<String> = text_blocks(&body)
        .into_iter()
        .filter(|t| t.trim().is_empty())
        .collect();
    assert!(blank.is_empty(), "blank text blocks in {body}");
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["content"][0]["type"], json!("image"), "{body}");
}

#[test]
fn error_types_say_what_the_status_does_not() {
    let e = error_from_http(
        402,
        r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}"#,
        None,
    );
    assert_eq!((e.kind, e.retryable), (ErrorKind::QuotaExceeded, false));
    let e = error_from_http(
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-x"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::InvalidCommand, "{}", e.message);
    let e = error_from_http(
        413,
        r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::ContextOverflow);
    for (kind, expected, retryable) in [
        ("rate_limit_error", ErrorKind::RateLimited, true),
        ("timeout_error", ErrorKind::ProviderUnavailable, true),
        ("billing_error", ErrorKind::QuotaExceeded, false),
        ("permission_error", ErrorKind::Auth, false),
    ] {
        let s = event(
            "error",
            &format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"m"}}}}"#),
        );
        let (_, r) = run(&[s.as_bytes()]);
        let e = r.unwrap_err();
        assert_eq!((e.kind, e.retryable), (expected, retryable), "{kind}");
    }
}

#[test]
fn tool_call_ids_another_provider_chose_are_sent_in_anthropic_s_alphabet() {
    // Kimi's ids, then a switch to Anthropic: the call and its result must
    // still pair, and every id must match ^[a-zA-Z0-9_-]+$.
    let call = |id: &str| ChatMessage::Assistant {
        text: String::new(),
        tool_calls: vec![OutboundToolCall {
            id: id.into(),
            name: "read_page".into(),
            arguments: json!({}),
        }],
        private: None,
    };
    let result = |id: &str| ChatMessage::ToolResult {
        call_id: id.into(),
        content: "ok".into(),
        is_error: false,
        images: vec![],
    };
    let body = build_body(&request(vec![
        ChatMessage::user("go"),
        call("functions.read_page:0"),
        result("functions.read_page:0"),
        call("functions.read_page:1"),
        result("functions.read_page:1"),
        call("toolu_01A-b_c"),
        result("toolu_01A-b_c"),
    ]));
    let messages = body["messages"].as_array().unwrap();
    let uses: Vec<&str> = messages
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    let results: Vec<&str> = messages
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(uses, results, "each result names its call");
    assert_eq!(uses[2], "toolu_01A-b_c", "an id that fits is sent as it is");
    assert_ne!(uses[0], uses[1], "different ids stay different");
    for id in &uses {
        assert!(
            !id.is_empty()
                && id.len() <= 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{id}"
        );
    }
}

#[test]
fn a_run_s_steps_ask_anthropic_to_cache_their_prompt_others_do_not() {
    let step = request(vec![ChatMessage::user("go")]);
    let body = build_body(&step);
    assert_eq!(body["cache_control"], json!({ "type": "ephemeral" }));
    // A request without tools (a title, a compaction's summary) is not
    // extended by a next step: no cache write to pay for.
    let mut summary = step.clone();
    summary.tools = Default::default();
    assert!(build_body(&summary).get("cache_control").is_none());
    // A server that only speaks the format never gets the field.
    for base_url in [
        "http://127.0.0.1:8080/v1",
        "https://api.deepseek.com/anthropic",
        "https://api.anthropic.com.evil.example/v1",
    ] {
        let mut other = step.clone();
        other.profile.base_url = base_url.into();
        assert!(
            build_body(&other).get("cache_control").is_none(),
            "{base_url}"
        );
    }
    // Anthropic's own host, however written.
    let mut own = step;
    own.profile.base_url = "https://API.anthropic.com:443/v1/".into();
    assert!(build_body(&own).get("cache_control").is_some());
}

/// A conversation whose assistant turn (text, a call) carries `private`.
fn with_private(private: Option<Value>) -> Vec<ChatMessage> {
    vec![
        ChatMessage::user("go"),
        ChatMessage::Assistant {
            text: "reading".into(),
            tool_calls: vec![OutboundToolCall {
                id: "toolu_a".into(),
                name: "read_page".into(),
                arguments: json!({}),
            }],
            private,
        },
        ChatMessage::ToolResult {
            call_id: "toolu_a".into(),
            content: "PAGE".into(),
            is_error: false,
            images: vec![],
        },
    ]
}

fn body_to(base_url: &str, messages: Vec<ChatMessage>) -> String {
    let mut r = request(messages);
    r.profile.base_url = base_url.into();
    build_body(&r).to_string()
}

#[test]
fn thinking_goes_back_to_the_host_that_streamed_it_only() {
    const GATEWAY: &str = "http://127.0.0.1:8080/v1";
    const OTHER: &str = "https://anthropic-proxy.example/v1";
    for origin in [ANTHROPIC, GATEWAY, OTHER] {
        let decoder = AnthropicDecoder::with(AnthropicStream::for_endpoint(&endpoint(origin)));
        let response = run_with(decoder, &[RECORDED.as_bytes()]).1.unwrap();
        assert_eq!(
            response.private.as_ref().unwrap()["anthropic"]["endpoint"],
            json!(crate::provider::endpoint_host(origin)),
            "{origin}"
        );
        let with = with_private(response.private);
        let without = with_private(None);
        for other in [ANTHROPIC, GATEWAY, OTHER] {
            let sent = body_to(other, with.clone());
            // To another host: byte for byte the body of a history without
            // the thinking (as a turn another provider wrote), valid as
            // that is.
            assert_eq!(
                sent == body_to(other, without.clone()),
                other != origin,
                "{origin} to {other}: {sent}"
            );
            assert_eq!(
                sent.contains("SIG=="),
                other == origin,
                "{origin} to {other}"
            );
        }
        // The same host however the base URL ends.
        let slashed = body_to(&format!("{origin}/"), with.clone());
        assert!(slashed.contains("SIG=="), "{origin}/");
        let messages: Value = serde_json::from_str(&body_to(origin, with)).unwrap();
        let assistant = &messages["messages"][1]["content"];
        let kinds: Vec<&str> = assistant
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"], "{origin}");
    }
}

#[test]
fn thinking_kept_without_a_host_is_replayed_nowhere_and_a_stream_of_unknown_host_keeps_none() {
    // Kept before the host was recorded: where it came from is unknown.
    let old = json!({ "anthropic": { "thinking": [
        { "type": "thinking", "thinking": "hm", "signature": "OLD==" },
        { "type": "redacted_thinking", "data": "REDACTED" }
    ] } });
    for base_url in [ANTHROPIC, "http://127.0.0.1:8080/v1"] {
        let sent = body_to(base_url, with_private(Some(old.clone())));
        assert_eq!(sent, body_to(base_url, with_private(None)), "{base_url}");
        assert!(!sent.contains("OLD==") && !sent.contains("REDACTED"));
    }
    // A decoder that does not know where the request went keeps nothing
    // (it could never be replayed), the rest of the response unchanged.
    let response = run_with(AnthropicDecoder::new(), &[RECORDED.as_bytes()])
        .1
        .unwrap();
    assert_eq!(
        response,
        ProviderResponse {
            private: None,
            ..expected()
        }
    );
    // An endpoint bound to a host the request does not name (empty:
    // a base URL without one) is not replayed either.
    let bound = json!({ "anthropic": { "endpoint": "", "thinking": [
        { "type": "thinking", "thinking": "hm", "signature": "EMPTY==" }
    ] } });
    assert!(!body_to("", with_private(Some(bound))).contains("EMPTY=="));
}
