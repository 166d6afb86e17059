use super::*;
use crate::model::ProviderProfile;
use crate::provider::{OutboundToolCall, ToolSpec};

/// A stream in the documented chat-completions format: text, two parallel
/// tool calls with fragmented arguments, finish_reason, usage chunk, [DONE].
const RECORDED: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Let me \u{e9}\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"thinking\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"read_page\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"click\",\"arguments\":\"{\\\"re\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"f\\\":\\\"e3\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":30,\"total_tokens\":150}}\n\n",
    "data: [DONE]\n\n",
);

fn run(chunks: &[&[u8]]) -> (Vec<StreamEvent>, Result<ProviderResponse, ProviderError>) {
    let mut decoder = OpenAiDecoder::new();
    let mut deltas = Vec::new();
    for c in chunks {
        match decoder.push(c) {
            Ok(d) => deltas.extend(d),
            Err(err) => return (deltas, Err(err)),
        }
    }
    (deltas, decoder.finish())
}

fn expected_response() -> ProviderResponse {
    ProviderResponse {
        text: "Let me \u{e9}".into(),
        reasoning: "thinking".into(),
        tool_calls: vec![
            RawToolCall {
                id: "call_a".into(),
                name: "read_page".into(),
                arguments: "{}".into(),
            },
            RawToolCall {
                id: "call_b".into(),
                name: "click".into(),
                arguments: "{\"ref\":\"e3\"}".into(),
            },
        ],
        stop_reason: StopReason::ToolUse,
        usage: Some(Usage {
            input: 120,
            output: 30,
            ..Usage::default()
        }),
        model: "gpt-x".into(),
        private: None,
    }
}

#[test]
fn recorded_stream_assembles_parallel_tool_calls_and_usage() {
    let (deltas, response) = run(&[RECORDED.as_bytes()]);
    assert_eq!(response.unwrap(), expected_response());
    assert_eq!(
        deltas,
        vec![
            StreamEvent::TextDelta("Let me \u{e9}".into()),
            StreamEvent::ReasoningDelta("thinking".into())
        ]
    );
}

#[test]
fn recorded_stream_split_at_every_byte_gives_same_response() {
    let bytes = RECORDED.as_bytes();
    for cut in 0..=bytes.len() {
        let (_, response) = run(&[&bytes[..cut], &bytes[cut..]]);
        assert_eq!(response.unwrap(), expected_response(), "split at {cut}");
    }
}

#[test]
fn finish_reasons_map_to_stop_reasons() {
    for (wire, expected) in [
        ("stop", StopReason::End),
        ("tool_calls", StopReason::ToolUse),
        ("length", StopReason::MaxTokens),
        ("content_filter", StopReason::ContentFilter),
    ] {
        let s = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{wire}\"}}]}}\n\n");
        let (_, r) = run(&[s.as_bytes()]);
        assert_eq!(r.unwrap().stop_reason, expected);
    }
}

#[test]
fn truncated_stream_is_a_retryable_error() {
    let cut = RECORDED.find("finish_reason\":\"tool_calls").unwrap() - 60;
    let (_, r) = run(&[&RECORDED.as_bytes()[..cut]]);
    let err = r.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Network);
    assert!(err.retryable);
}

#[test]
fn error_event_mid_stream_is_typed() {
    let a = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let b = "data: {\"error\":{\"message\":\"Overloaded\",\"code\":529}}\n\n";
    let (deltas, r) = run(&[a.as_bytes(), b.as_bytes()]);
    assert_eq!(deltas.len(), 1);
    let err = r.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ProviderUnavailable);
    assert!(err.retryable);
}

#[test]
fn non_json_chunk_is_a_protocol_error() {
    let (_, r) = run(&[b"data: {not json\n\n"]);
    assert_eq!(r.unwrap_err().kind, ErrorKind::ProviderProtocol);
}

#[test]
fn http_errors_are_typed_with_user_words() {
    let e = error_from_http(
        401,
        r#"{"error":{"message":"Incorrect API key provided"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(e.message.contains("API key"));
    assert!(!e.retryable);
    let e = error_from_http(
        404,
        r#"{"error":{"message":"The model `x` does not exist"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::ModelNotFound);
    let e = error_from_http(
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::ContextOverflow);
    let e = error_from_http(429, "rate limited", Some(2000));
    assert_eq!(
        (e.kind, e.retryable, e.retry_after_ms),
        (ErrorKind::RateLimited, true, Some(2000))
    );
    let e = error_from_http(503, "<html>bad gateway</html>", None);
    assert_eq!(e.kind, ErrorKind::ProviderUnavailable);
}

#[test]
fn body_has_stream_usage_tools_and_tool_results() {
    let request = ProviderRequest {
        lineage: None,
        profile: ProviderProfile {
            kind: "openai".into(),
            base_url: "http://x/v1".into(),
            model: "m".into(),
            max_output_tokens: Some(100),
            temperature_centi: Some(20),
            vision: false,
            tool_use: true,
            token_budget: None,
            context_window: None,
        },
        system: "sys".into(),
        messages: vec![
            ChatMessage::user("hi"),
            ChatMessage::Assistant {
                text: String::new(),
                tool_calls: vec![OutboundToolCall {
                    id: "c1".into(),
                    name: "read_page".into(),
                    arguments: json!({}),
                }],
                private: None,
            },
            ChatMessage::ToolResult {
                call_id: "c1".into(),
                content: "page".into(),
                is_error: false,
                images: vec![],
            },
        ]
        .into(),
        tools: vec![ToolSpec {
            name: "read_page".into(),
            description: "d".into(),
            parameters: json!({"type":"object","properties":{}}),
        }]
        .into(),
    };
    let body = build_body(&request);
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"]["include_usage"], json!(true));
    assert_eq!(body["messages"][0]["role"], json!("system"));
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["arguments"],
        json!("{}")
    );
    assert_eq!(body["messages"][2]["content"], Value::Null);
    assert_eq!(body["messages"][3]["tool_call_id"], json!("c1"));
    assert_eq!(body["tools"][0]["function"]["name"], json!("read_page"));
    assert_eq!(body["max_tokens"], json!(100));
    assert_eq!(body["temperature"], json!(0.2));
    assert_eq!(endpoint("http://h/v1/"), "http://h/v1/chat/completions");
}

#[test]
fn tool_calls_come_out_in_index_order_whatever_order_their_deltas_arrive_in() {
    let chunk = |tool_call: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{tool_call}]}}}}]}}\n\n")
    };
    let stream = [
        chunk(r#"{"index":2,"id":"call_c","function":{"name":"type","arguments":"{}"}}"#),
        chunk(r#"{"index":0,"id":"call_a","function":{"name":"read_page","arguments":""}}"#),
        chunk(r#"{"index":1,"id":"call_b","function":{"name":"click","arguments":"{\"ref\""}}"#),
        chunk(r#"{"index":0,"function":{"arguments":"{}"}}"#),
        chunk(r#"{"index":1,"function":{"arguments":":\"e3\"}"}}"#),
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n".to_string(),
    ]
    .concat();
    let (_, response) = run(&[stream.as_bytes()]);
    let calls = crate::provider::call_triples(response);
    assert_eq!(
        calls,
        vec![
            ("call_a".into(), "read_page".into(), "{}".into()),
            ("call_b".into(), "click".into(), "{\"ref\":\"e3\"}".into()),
            ("call_c".into(), "type".into(), "{}".into()),
        ]
    );
}

/// One chunk carrying one `tool_calls[]` fragment (given as JSON).
fn call_chunk(fragment: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{fragment}]}}}}]}}\n\n")
}

fn finished(chunks: &[String], finish_reason: &str) -> ProviderResponse {
    let mut all: Vec<&[u8]> = chunks.iter().map(|c| c.as_bytes()).collect();
    let end = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{finish_reason}\"}}]}}\n\ndata: [DONE]\n\n"
    );
    all.push(end.as_bytes());
    run(&all).1.expect("a whole response")
}

fn names_and_arguments(response: &ProviderResponse) -> Vec<(&str, &str, &str)> {
    response
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect()
}

#[test]
fn tool_call_ids_normalized_a_name_sent_again_with_every_fragment_is_not_doubled() {
    // NVIDIA NIM, Fireworks: the whole name in every fragment of a call.
    let r = finished(
        &[
            call_chunk(r#"{"index":0,"id":"c1","function":{"name":"click","arguments":""}}"#),
            call_chunk(r#"{"index":0,"function":{"name":"click","arguments":"{\"ref\":"}}"#),
            call_chunk(r#"{"index":0,"function":{"name":"click","arguments":"\"e1\"}"}}"#),
        ],
        "tool_calls",
    );
    assert_eq!(
        names_and_arguments(&r),
        vec![("c1", "click", "{\"ref\":\"e1\"}")]
    );
}

#[test]
fn tool_call_ids_normalized_calls_without_index_or_all_at_index_0_stay_apart() {
    // Gemini's compatible API: one whole call per chunk, no index (or 0).
    for index in ["", "\"index\":0,"] {
        let r = finished(
            &[
                call_chunk(&format!(
                    r#"{{{index}"id":"a","function":{{"name":"read_page","arguments":"{{}}"}}}}"#
                )),
                call_chunk(&format!(
                    r#"{{{index}"id":"b","function":{{"name":"click","arguments":"{{\"ref\":\"e1\"}}"}}}}"#
                )),
            ],
            "tool_calls",
        );
        assert_eq!(
            names_and_arguments(&r),
            vec![("a", "read_page", "{}"), ("b", "click", "{\"ref\":\"e1\"}")],
            "index part {index:?}"
        );
    }
    // Without an index, a fragment without an id continues the last call.
    let r = finished(
        &[
            call_chunk(r#"{"id":"a","function":{"name":"type","arguments":"{\"text\":"}}"#),
            call_chunk(r#"{"function":{"arguments":"\"hi\"}"}}"#),
        ],
        "tool_calls",
    );
    assert_eq!(
        names_and_arguments(&r),
        vec![("a", "type", "{\"text\":\"hi\"}")]
    );
}

#[test]
fn tool_call_ids_normalized_whole_calls_ended_with_stop_are_tool_use_cut_ones_are_not() {
    // Gemini's compatible API and older Ollama end tool calls with "stop".
    let whole = [call_chunk(
        r#"{"index":0,"id":"a","function":{"name":"click","arguments":"{\"ref\":\"e1\"}"}}"#,
    )];
    assert_eq!(finished(&whole, "stop").stop_reason, StopReason::ToolUse);
    // Arguments that do not parse, or no name: not what the model meant to
    // call whole; the engine fails them closed.
    for cut in [
        r#"{"index":0,"id":"a","function":{"name":"click","arguments":"{\"ref\":"}}"#,
        r#"{"index":0,"id":"a","function":{"arguments":"{}"}}"#,
        r#"{"index":0,"id":"a","function":{"name":"click","arguments":"[1]"}}"#,
    ] {
        let r = finished(&[call_chunk(cut)], "stop");
        assert_eq!(r.stop_reason, StopReason::End, "{cut}");
    }
    // Still: "length" with whole calls is MaxTokens (fail closed).
    assert_eq!(
        finished(&whole, "length").stop_reason,
        StopReason::MaxTokens
    );
}

#[test]
fn a_refusal_is_shown_as_text_and_ends_as_filtered() {
    let chunks = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"I can't help \"}}]}\n\n"
            .to_string(),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"with that.\"}}]}\n\n"
            .to_string(),
    ];
    let mut all: Vec<&[u8]> = chunks.iter().map(|c| c.as_bytes()).collect();
    all.push(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    let (deltas, r) = run(&all);
    let r = r.unwrap();
    assert_eq!(r.text, "I can't help with that.");
    assert_eq!(r.stop_reason, StopReason::ContentFilter);
    assert_eq!(deltas.len(), 2);
}

#[test]
fn reasoning_sent_under_both_names_is_shown_once() {
    let a = "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\",\"reasoning\":\"hm\"}}]}\n\n";
    let b = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    let (deltas, r) = run(&[a.as_bytes(), b.as_bytes()]);
    assert_eq!(r.unwrap().reasoning, "hm");
    assert_eq!(deltas.len(), 1);
}

#[test]
fn error_words_tell_apart_what_one_status_covers() {
    // An empty account is not retried, whatever the status says.
    let e = error_from_http(
        429,
        r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        None,
    );
    assert_eq!((e.kind, e.retryable), (ErrorKind::QuotaExceeded, false));
    let e = error_from_http(
        429,
        r#"{"error":{"message":"slow down","type":"requests"}}"#,
        None,
    );
    assert_eq!((e.kind, e.retryable), (ErrorKind::RateLimited, true));
    // A refusal of the output limit is not a context overflow.
    let e = error_from_http(
        400,
        r#"{"error":{"message":"max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::InvalidCommand);
    let e = error_from_http(
        400,
        r#"{"error":{"message":"Too many tokens in the input","code":"context_length_exceeded"}}"#,
        None,
    );
    assert_eq!(e.kind, ErrorKind::ContextOverflow);
    let e = error_from_http(413, "Request Entity Too Large", None);
    assert_eq!((e.kind, e.retryable), (ErrorKind::ContextOverflow, false));
    // Mid-stream: a string code and a type say what no status does.
    for (error, kind, retryable) in [
        (
            r#"{"message":"slow","type":"rate_limit_error"}"#,
            ErrorKind::RateLimited,
            true,
        ),
        (
            r#"{"message":"no quota","code":"insufficient_quota"}"#,
            ErrorKind::QuotaExceeded,
            false,
        ),
        (
            r#"{"message":"too long","code":"context_length_exceeded"}"#,
            ErrorKind::ContextOverflow,
            false,
        ),
        (
            r#"{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}"#,
            ErrorKind::Auth,
            false,
        ),
        (
            r#"{"message":"oops","code":"something_else"}"#,
            ErrorKind::ProviderUnavailable,
            true,
        ),
    ] {
        let s = format!("data: {{\"error\":{error}}}\n\n");
        let (_, r) = run(&[s.as_bytes()]);
        let e = r.unwrap_err();
        assert_eq!((e.kind, e.retryable), (kind, retryable), "{error}");
    }
}

#[test]
fn a_json_document_instead_of_a_stream_is_typed_not_retried_as_cut() {
    use crate::provider::{json_instead_of_stream, Transport};
    let e = json_instead_of_stream(
        Transport::OpenAi,
        r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
    );
    assert_eq!((e.kind, e.retryable), (ErrorKind::ProviderProtocol, false));
    assert!(e.message.contains("streaming"), "{}", e.message);
    let e = json_instead_of_stream(
        Transport::OpenAi,
        r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#,
    );
    assert_eq!(e.kind, ErrorKind::Auth);
    let e = json_instead_of_stream(
        Transport::Anthropic,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    assert_eq!(
        (e.kind, e.retryable),
        (ErrorKind::ProviderUnavailable, true)
    );
}
