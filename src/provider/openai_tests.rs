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

const GEMINI: &str = "https://generativelanguage.googleapis.com/v1beta/openai/";
const DEEPSEEK: &str = "https://api.deepseek.com/v1";
const OPENAI: &str = "https://api.openai.com/v1";
const OPENROUTER: &str = "https://openrouter.ai/api/v1";

/// The response to `stream` (chunks joined, then finish_reason and
/// [DONE]) of a request sent to `base_url`'s endpoint.
fn decoded_at(base_url: &str, chunks: &[String], finish_reason: &str) -> ProviderResponse {
    let mut decoder = OpenAiDecoder::with(OpenAiStream::for_endpoint(&endpoint(base_url)));
    for c in chunks {
        decoder.push(c.as_bytes()).expect("the stream decodes");
    }
    let end = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{finish_reason}\"}}]}}\n\ndata: [DONE]\n\n"
    );
    decoder.push(end.as_bytes()).expect("the end decodes");
    decoder.finish().expect("a whole response")
}

/// One chunk whose delta is `delta` (JSON).
fn delta_chunk(delta: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n")
}

/// The assistant message the engine replays for `response`, its calls'
/// ids replaced by `ids` (the engine normalizes empty and duplicate ids).
fn replayed(response: &ProviderResponse, ids: &[&str]) -> ChatMessage {
    ChatMessage::Assistant {
        text: response.text.clone(),
        tool_calls: response
            .tool_calls
            .iter()
            .zip(ids)
            .map(|(c, id)| OutboundToolCall {
                id: (*id).into(),
                name: c.name.clone(),
                arguments: serde_json::from_str(&c.arguments).unwrap(),
            })
            .collect(),
        private: response.private.clone(),
    }
}

fn request_to(base_url: &str, kind: &str, messages: Vec<ChatMessage>) -> ProviderRequest {
    ProviderRequest {
        lineage: None,
        profile: ProviderProfile {
            kind: kind.into(),
            base_url: base_url.into(),
            model: "m".into(),
            max_output_tokens: Some(500),
            ..ProviderProfile::default()
        },
        system: "sys".into(),
        messages: messages.into(),
        tools: Default::default(),
    }
}

/// A turn: the user's message, the assistant's, a result for each call.
fn turn(assistant: ChatMessage) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::user("Book it.")];
    let ids: Vec<String> = match &assistant {
        ChatMessage::Assistant { tool_calls, .. } => {
            tool_calls.iter().map(|c| c.id.clone()).collect()
        }
        _ => Vec::new(),
    };
    messages.push(assistant);
    for id in ids {
        messages.push(ChatMessage::ToolResult {
            call_id: id,
            content: "done".into(),
            is_error: false,
            images: vec![],
        });
    }
    messages
}

#[test]
fn gemini_thought_signature_is_kept_and_sent_back_on_its_call_whatever_its_id_became() {
    // Gemini's compatible API: one call per chunk, no index; the signature
    // on the first call of a parallel group only.
    let chunks = [
        delta_chunk(
            r#"{"role":"assistant","tool_calls":[{"extra_content":{"google":{"thought_signature":"Sig/A=="}},"function":{"arguments":"{\"ref\":\"e1\"}","name":"click"},"id":"function-call-1","type":"function"}]}"#,
        ),
        delta_chunk(
            r#"{"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"page_snapshot"},"id":"function-call-2","type":"function"}]}"#,
        ),
    ];
    let response = decoded_at(GEMINI, &chunks, "tool_calls");
    assert_eq!(response.tool_calls.len(), 2);
    // The first id was taken earlier in the thread: the engine replaced it.
    let message = replayed(&response, &["call_9", "function-call-2"]);
    let body = build_body(&request_to(GEMINI, "openai", turn(message)));
    let calls = &body["messages"][2]["tool_calls"];
    assert_eq!(
        calls[0]["extra_content"],
        json!({ "google": { "thought_signature": "Sig/A==" } })
    );
    assert_eq!(calls[0]["id"], json!("call_9"));
    assert!(calls[1].get("extra_content").is_none(), "{calls}");
    assert_eq!(calls[1]["id"], json!("function-call-2"));
    // Gemini sends no reasoning_content: none goes back.
    assert!(body["messages"][2].get("reasoning_content").is_none());
}

#[test]
fn reasoning_content_of_a_tool_calling_reply_goes_back_to_the_server_that_sent_it() {
    // DeepSeek's thinking mode: reasoning_content, then a call.
    let chunks = [
        delta_chunk(r#"{"role":"assistant","content":null,"reasoning_content":"The user wants "}"#),
        delta_chunk(r#"{"content":null,"reasoning_content":"a click."}"#),
        call_chunk(
            r#"{"index":0,"id":"call_0","type":"function","function":{"name":"click","arguments":"{\"ref\":\"e1\"}"}}"#,
        ),
    ];
    let response = decoded_at(DEEPSEEK, &chunks, "tool_calls");
    assert_eq!(response.reasoning, "The user wants a click.");
    let message = replayed(&response, &["call_0"]);
    let body = build_body(&request_to(DEEPSEEK, "openai", turn(message)));
    let assistant = &body["messages"][2];
    assert_eq!(
        assistant["reasoning_content"],
        json!("The user wants a click.")
    );
    assert!(assistant["tool_calls"][0].get("extra_content").is_none());

    // A tool-calling reply whose reasoning was empty (null deltas) still
    // carries the field: DeepSeek refuses the message without it.
    let chunks = [
        delta_chunk(r#"{"role":"assistant","content":"","reasoning_content":null}"#),
        call_chunk(
            r#"{"index":0,"id":"call_1","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    let response = decoded_at(DEEPSEEK, &chunks, "tool_calls");
    let body = build_body(&request_to(
        DEEPSEEK,
        "openai",
        turn(replayed(&response, &["call_1"])),
    ));
    assert_eq!(body["messages"][2]["reasoning_content"], json!(""));

    // Reasoning streamed as `reasoning` (Ollama, OpenRouter, Groq) is
    // not sent back: Groq refuses it.
    let chunks = [
        delta_chunk(r#"{"reasoning":"hm"}"#),
        call_chunk(
            r#"{"index":0,"id":"c","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    assert_eq!(
        decoded_at("http://localhost:11434/v1", &chunks, "tool_calls").private,
        None
    );
}

#[test]
fn an_answer_gets_its_reasoning_back_when_its_user_turn_called_tools_and_not_otherwise() {
    // DeepSeek: every assistant message between two user messages gets its
    // reasoning_content back when tools were called between them.
    let call = [
        delta_chunk(r#"{"reasoning_content":"Click first."}"#),
        call_chunk(
            r#"{"index":0,"id":"call_0","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    let answer = [
        delta_chunk(r#"{"reasoning_content":"It worked."}"#),
        delta_chunk(r#"{"content":"Done."}"#),
    ];
    let chat = [
        delta_chunk(r#"{"reasoning_content":"Just greet."}"#),
        delta_chunk(r#"{"content":"Hello!"}"#),
    ];
    let called = replayed(&decoded_at(DEEPSEEK, &call, "tool_calls"), &["call_0"]);
    let answered = replayed(&decoded_at(DEEPSEEK, &answer, "stop"), &[]);
    let chatted = replayed(&decoded_at(DEEPSEEK, &chat, "stop"), &[]);
    let mut messages = turn(called);
    messages.push(answered.clone());
    messages.push(ChatMessage::user("Hi."));
    messages.push(chatted);
    messages.push(ChatMessage::user("Thanks."));
    let body = build_body(&request_to(DEEPSEEK, "openai", messages.clone()));
    let sent = &body["messages"];
    assert_eq!(sent[2]["reasoning_content"], json!("Click first."));
    assert_eq!(sent[4]["content"], json!("Done."));
    assert_eq!(
        sent[4]["reasoning_content"],
        json!("It worked."),
        "the answer of the tool-using turn"
    );
    assert_eq!(sent[6]["content"], json!("Hello!"));
    assert!(
        sent[6].get("reasoning_content").is_none(),
        "a turn without tools goes without"
    );
    // Another host gets none of it.
    let body = build_body(&request_to(OPENAI, "openai", messages));
    assert!(body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m.get("reasoning_content").is_none()));
}

#[test]
fn an_ordinary_openai_reply_keeps_nothing_and_its_replay_is_unchanged() {
    let chunks = [RECORDED.replace(r#"{"reasoning_content":"thinking"}"#, r#"{"content":""}"#)];
    let response = decoded_at(OPENAI, &chunks, "tool_calls");
    assert_eq!(response.tool_calls.len(), 2);
    assert_eq!(response.private, None);
    // Without a known endpoint nothing is kept either (RECORDED streams
    // reasoning_content with its calls).
    assert_eq!(run(&[RECORDED.as_bytes()]).1.unwrap().private, None);
}

#[test]
fn private_data_goes_back_to_its_own_host_only_never_to_another_provider() {
    let gemini_call = [delta_chunk(
        r#"{"tool_calls":[{"extra_content":{"google":{"thought_signature":"Sig"}},"function":{"arguments":"{}","name":"click"},"id":"a","type":"function"}]}"#,
    )];
    let from_gemini = decoded_at(GEMINI, &gemini_call, "tool_calls");
    let deepseek_call = [
        delta_chunk(r#"{"reasoning_content":"think"}"#),
        call_chunk(
            r#"{"index":0,"id":"a","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    let from_deepseek = decoded_at(DEEPSEEK, &deepseek_call, "tool_calls");
    let openrouter_call = [
        delta_chunk(
            r#"{"reasoning":"think","reasoning_details":[{"type":"reasoning.text","text":"think","signature":"sig","index":0}]}"#,
        ),
        call_chunk(
            r#"{"index":0,"id":"a","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    let from_openrouter = decoded_at(OPENROUTER, &openrouter_call, "tool_calls");
    let anthropic_private = json!({ "anthropic": { "thinking": [{ "type": "thinking", "thinking": "hm", "signature": "s" }] } });
    let stripped = |response: &ProviderResponse| {
        let mut m = replayed(response, &["a"]);
        if let ChatMessage::Assistant { private, .. } = &mut m {
            *private = None;
        }
        m
    };
    for (origin, response) in [
        (GEMINI, &from_gemini),
        (DEEPSEEK, &from_deepseek),
        (OPENROUTER, &from_openrouter),
    ] {
        assert!(response.private.is_some(), "{origin}");
        let with = turn(replayed(response, &["a"]));
        let without = turn(stripped(response));
        // The user switched endpoint (OpenAI's own API, a local server,
        // the other compatible provider): byte for byte the body of a
        // history without the private data.
        for other in [
            OPENAI,
            "http://localhost:11434/v1",
            GEMINI,
            DEEPSEEK,
            OPENROUTER,
        ] {
            let sent = build_body(&request_to(other, "openai", with.clone())).to_string();
            let plain = build_body(&request_to(other, "openai", without.clone())).to_string();
            assert_eq!(
                sent == plain,
                other != origin,
                "{origin} to {other}: {sent}"
            );
        }
        // Anthropic never reads this adapter's key.
        let sent = crate::provider::anthropic::build_body(&request_to(GEMINI, "anthropic", with));
        let plain =
            crate::provider::anthropic::build_body(&request_to(GEMINI, "anthropic", without));
        assert_eq!(sent, plain);
    }
    // And this adapter never sends Anthropic's thinking blocks.
    let mut with = turn(stripped(&from_gemini));
    if let ChatMessage::Assistant { private, .. } = &mut with[1] {
        *private = Some(anthropic_private);
    }
    let plain = turn(stripped(&from_gemini));
    assert_eq!(
        build_body(&request_to(GEMINI, "openai", with)).to_string(),
        build_body(&request_to(GEMINI, "openai", plain)).to_string()
    );
}

/// An OpenRouter reply with reasoning blocks, in fragments as OpenRouter
/// streams them: Claude-style text whose signature comes last, on its
/// own; a summary at another index whose fragments come between the
/// text's; Gemini's encrypted block at the text's index. `reasoning` is
/// the plain copy the panel shows.
fn openrouter_reasoning_chunks() -> Vec<String> {
    vec![
        delta_chunk(
            r#"{"role":"assistant","content":"","reasoning":"Check ","reasoning_details":[{"type":"reasoning.text","text":"Check ","signature":null,"id":null,"format":"anthropic-claude-v1","index":0}]}"#,
        ),
        delta_chunk(
            r#"{"reasoning_details":[{"type":"reasoning.summary","summary":"Short","format":"anthropic-claude-v1","index":1}]}"#,
        ),
        delta_chunk(
            r#"{"reasoning":"the page.","reasoning_details":[{"type":"reasoning.text","text":"the page.","format":"anthropic-claude-v1","index":0}]}"#,
        ),
        delta_chunk(
            r#"{"reasoning_details":[{"type":"reasoning.summary","summary":"er.","index":1},{"type":"reasoning.text","text":"","signature":"EqQB/sig==","index":0}]}"#,
        ),
        delta_chunk(
            r#"{"reasoning_details":[{"type":"reasoning.encrypted","data":"ZW5jcnlwdGVk","id":"call_0","format":"google-gemini-v1","index":0}]}"#,
        ),
    ]
}

/// The blocks [`openrouter_reasoning_chunks`] make, whole.
fn openrouter_reasoning_blocks() -> Value {
    json!([
        { "type": "reasoning.text", "text": "Check the page.", "signature": "EqQB/sig==", "id": null, "format": "anthropic-claude-v1", "index": 0 },
        { "type": "reasoning.summary", "summary": "Shorter.", "format": "anthropic-claude-v1", "index": 1 },
        { "type": "reasoning.encrypted", "data": "ZW5jcnlwdGVk", "id": "call_0", "format": "google-gemini-v1", "index": 0 },
    ])
}

#[test]
fn reasoning_details_fragments_merge_into_whole_blocks_by_type_and_index() {
    let mut chunks = openrouter_reasoning_chunks();
    chunks.push(call_chunk(
        r#"{"index":0,"id":"call_0","type":"function","function":{"name":"click","arguments":"{}"}}"#,
    ));
    let mut decoder = OpenAiDecoder::with(OpenAiStream::for_endpoint(&endpoint(OPENROUTER)));
    let mut deltas = Vec::new();
    for c in &chunks {
        deltas.extend(decoder.push(c.as_bytes()).expect("the stream decodes"));
    }
    decoder
        .push(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n")
        .expect("the end decodes");
    let response = decoder.finish().expect("a whole response");
    assert_eq!(
        response
            .private
            .as_ref()
            .map(|p| &p["openai"]["reasoning_details"]),
        Some(&openrouter_reasoning_blocks())
    );
    assert_eq!(
        response.private.as_ref().unwrap()["openai"]["endpoint"],
        json!("openrouter.ai")
    );
    // What the panel shows is the plain `reasoning`, as before.
    assert_eq!(response.reasoning, "Check the page.");
    assert_eq!(
        deltas,
        vec![
            StreamEvent::ReasoningDelta("Check ".into()),
            StreamEvent::ReasoningDelta("the page.".into()),
        ]
    );
    // No blocks, nothing kept for a reply without calls.
    let plain = decoded_at(
        OPENROUTER,
        &[delta_chunk(r#"{"reasoning":"hm","reasoning_details":[]}"#)],
        "stop",
    );
    assert_eq!(plain.private, None);
}

#[test]
fn reasoning_details_go_back_unchanged_to_the_host_that_streamed_them_and_to_no_other() {
    let mut call = openrouter_reasoning_chunks();
    call.push(call_chunk(
        r#"{"index":0,"id":"call_0","type":"function","function":{"name":"click","arguments":"{}"}}"#,
    ));
    let answer = [
        delta_chunk(
            r#"{"reasoning":"Done.","reasoning_details":[{"type":"reasoning.encrypted","data":"QUJD","format":"google-gemini-v1","index":0}]}"#,
        ),
        delta_chunk(r#"{"content":"Clicked."}"#),
    ];
    // The engine replaced the call's id: the blocks go back all the same.
    let mut messages = turn(replayed(
        &decoded_at(OPENROUTER, &call, "tool_calls"),
        &["call_7"],
    ));
    messages.push(replayed(&decoded_at(OPENROUTER, &answer, "stop"), &[]));
    messages.push(ChatMessage::user("Thanks."));
    let body = build_body(&request_to(OPENROUTER, "openai", messages.clone()));
    let sent = &body["messages"];
    assert_eq!(sent[2]["tool_calls"][0]["id"], json!("call_7"));
    assert_eq!(sent[2]["reasoning_details"], openrouter_reasoning_blocks());
    // A plain answer gets its own back too (REPLAYED_DETAILS).
    assert_eq!(sent[4]["content"], json!("Clicked."));
    assert_eq!(
        sent[4]["reasoning_details"],
        json!([{ "type": "reasoning.encrypted", "data": "QUJD", "format": "google-gemini-v1", "index": 0 }])
    );
    // Neither `reasoning` nor `reasoning_content` goes back with them.
    assert!(sent[2].get("reasoning").is_none() && sent[2].get("reasoning_content").is_none());
    // The same host by another spelling of the URL gets them; another
    // host gets none of it.
    let body = build_body(&request_to(
        "https://OpenRouter.ai/api/v1/",
        "openai",
        messages.clone(),
    ));
    assert_eq!(
        body["messages"][2]["reasoning_details"],
        openrouter_reasoning_blocks()
    );
    for other in [
        OPENAI,
        GEMINI,
        "http://localhost:11434/v1",
        "https://openrouter.ai.example.com/api/v1",
    ] {
        let body = build_body(&request_to(other, "openai", messages.clone()));
        assert!(
            !body.to_string().contains("reasoning_details"),
            "{other}: {body}"
        );
    }
}

#[test]
fn reasoning_details_stay_off_a_message_whose_calls_became_text() {
    // A request without tools writes the calls as text: the blocks are no
    // longer what the model sent with them (Gemini's name the call).
    let mut call = openrouter_reasoning_chunks();
    call.push(call_chunk(
        r#"{"index":0,"id":"call_0","type":"function","function":{"name":"click","arguments":"{}"}}"#,
    ));
    let answer = [
        delta_chunk(
            r#"{"reasoning_details":[{"type":"reasoning.text","text":"Done.","index":0}]}"#,
        ),
        delta_chunk(r#"{"content":"Clicked."}"#),
    ];
    let mut messages = turn(replayed(
        &decoded_at(OPENROUTER, &call, "tool_calls"),
        &["call_0"],
    ));
    messages.push(replayed(&decoded_at(OPENROUTER, &answer, "stop"), &[]));
    let as_text = crate::provider::tool_history_as_text(&messages);
    let body = build_body(&request_to(OPENROUTER, "openai", as_text));
    let sent = &body["messages"];
    assert!(sent[2]["content"]
        .as_str()
        .unwrap()
        .contains("[Called the tool click"));
    assert!(sent[2].get("reasoning_details").is_none(), "{}", sent[2]);
    assert_eq!(sent[4]["content"], json!("Clicked."));
    assert_eq!(
        sent[4]["reasoning_details"],
        json!([{ "type": "reasoning.text", "text": "Done.", "index": 0 }])
    );
}

#[test]
fn bad_reasoning_details_are_skipped_and_the_stream_goes_on() {
    let chunks = [
        delta_chunk(r#"{"reasoning_details":"not an array"}"#),
        delta_chunk(r#"{"reasoning_details":null}"#),
        delta_chunk(r#"{"reasoning_details":{"type":"reasoning.text","text":"an object"}}"#),
        delta_chunk(
            r#"{"reasoning_details":[1,"x",null,[],{"type":"reasoning.text","text":"no index"},{"type":"reasoning.text","text":"again"},{"type":"reasoning.text","text":"text index","index":"0"}]}"#,
        ),
        delta_chunk(r#"{"reasoning_details":[{"type":"reasoning.text","text":7,"index":0}]}"#),
        delta_chunk(
            r#"{"content":"Hi.","reasoning_details":[{"type":"reasoning.text","text":"then words","index":0},{"type":"reasoning.text","text":null,"signature":{"odd":true},"index":0}]}"#,
        ),
        call_chunk(
            r#"{"index":0,"id":"c","type":"function","function":{"name":"click","arguments":"{}"}}"#,
        ),
    ];
    let response = decoded_at(OPENROUTER, &chunks, "tool_calls");
    assert_eq!(response.text, "Hi.");
    assert_eq!(names_and_arguments(&response), vec![("c", "click", "{}")]);
    // What is an object is kept as it came; a field that was not text
    // takes the next value.
    assert_eq!(
        response.private.unwrap()["openai"]["reasoning_details"],
        json!([
            { "type": "reasoning.text", "text": "no index" },
            { "type": "reasoning.text", "text": "again" },
            { "type": "reasoning.text", "text": "text index", "index": "0" },
            { "type": "reasoning.text", "text": "then words", "signature": { "odd": true }, "index": 0 },
        ])
    );
}

#[test]
fn openai_own_api_gets_max_completion_tokens_other_servers_max_tokens() {
    for (base_url, field) in [
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("https://API.openai.com/v1/", "max_completion_tokens"),
        ("https://eu.api.openai.com/v1", "max_completion_tokens"),
        ("https://openrouter.ai/api/v1", "max_tokens"),
        ("http://localhost:11434/v1", "max_tokens"),
        ("https://api.deepseek.com", "max_tokens"),
        ("https://api.openai.com.example.net/v1", "max_tokens"),
    ] {
        let body = build_body(&request_to(
            base_url,
            "openai",
            vec![ChatMessage::user("hi")],
        ));
        let other = if field == "max_tokens" {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        assert_eq!(body[field], json!(500), "{base_url}");
        assert!(body.get(other).is_none(), "{base_url}");
    }
    let mut r = request_to(OPENAI, "openai", vec![ChatMessage::user("hi")]);
    r.profile.max_output_tokens = None;
    let body = build_body(&r);
    assert!(body.get("max_tokens").is_none() && body.get("max_completion_tokens").is_none());
}

#[test]
fn endpoint_host_is_the_lowercased_authority() {
    use crate::provider::{endpoint_host, endpoint_hostname};
    assert_eq!(
        endpoint_host(" https://API.OpenAI.com/v1/ "),
        "api.openai.com"
    );
    assert_eq!(
        endpoint_host("http://localhost:11434/v1"),
        "localhost:11434"
    );
    assert_eq!(endpoint_host("http://user:pw@h:8/x?y"), "h:8");
    assert_eq!(endpoint_host("h.example/v1"), "h.example");
    assert_eq!(endpoint_host(""), "");
    assert_eq!(endpoint_hostname("http://[::1]:8080/v1"), "[::1]");
    assert_eq!(
        endpoint_hostname("https://API.anthropic.com/v1"),
        "api.anthropic.com"
    );
}
