use super::*;

fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.push(c));
    }
    out.extend(p.finish());
    out
}

fn data(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.data.as_str()).collect()
}

const RECORDED: &str = "\u{feff}: keep-alive\r\n\
event: message\r\n\
id: 7\r\n\
retry: 1500\r\n\
data: {\"a\":\"h\u{e9}llo \u{1f600}\"}\r\n\
\r\n\
data: line one\n\
data: line two\n\
\n\
data:no-space\r\
\r\
event: ping\n\
\n\
data: [DONE]";

fn expected() -> Vec<SseEvent> {
    vec![
        SseEvent {
            event: "message".into(),
            data: "{\"a\":\"h\u{e9}llo \u{1f600}\"}".into(),
            id: Some("7".into()),
            retry_ms: Some(1500),
        },
        SseEvent {
            event: String::new(),
            data: "line one\nline two".into(),
            id: Some("7".into()),
            retry_ms: None,
        },
        SseEvent {
            event: String::new(),
            data: "no-space".into(),
            id: Some("7".into()),
            retry_ms: None,
        },
        SseEvent {
            event: String::new(),
            data: "[DONE]".into(),
            id: Some("7".into()),
            retry_ms: None,
        },
    ]
}

#[test]
fn whole_stream_parses() {
    assert_eq!(parse_all(&[RECORDED.as_bytes()]), expected());
}

#[test]
fn split_at_every_byte_offset_gives_same_events() {
    let bytes = RECORDED.as_bytes();
    for cut in 0..=bytes.len() {
        let got = parse_all(&[&bytes[..cut], &bytes[cut..]]);
        assert_eq!(got, expected(), "split at byte {cut}");
    }
}

#[test]
fn split_at_every_pair_of_offsets_gives_same_events() {
    let bytes = RECORDED.as_bytes();
    for a in 0..=bytes.len() {
        for b in a..=bytes.len() {
            let got = parse_all(&[&bytes[..a], &bytes[a..b], &bytes[b..]]);
            assert_eq!(got, expected(), "split at bytes {a} and {b}");
        }
    }
}

#[test]
fn one_byte_at_a_time() {
    let chunks: Vec<&[u8]> = RECORDED.as_bytes().chunks(1).collect();
    assert_eq!(parse_all(&chunks), expected());
}

#[test]
fn crlf_split_between_cr_and_lf_is_one_line_end() {
    let got = parse_all(&[b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]);
    assert_eq!(data(&got), vec!["a", "b"]);
}

#[test]
fn event_without_data_is_not_dispatched_and_resets_type() {
    let got = parse_all(&[b"event: ping\n\ndata: x\n\n"]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event, "");
    assert_eq!(got[0].data, "x");
}

#[test]
fn empty_data_line_dispatches_empty_string() {
    let got = parse_all(&[b"data\n\n"]);
    assert_eq!(data(&got), vec![""]);
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    let got = parse_all(&[b"data: a\xffb\n\n"]);
    assert_eq!(data(&got), vec!["a\u{fffd}b"]);
}

#[test]
fn bom_only_at_start() {
    let got = parse_all(&[b"\xEF\xBB", b"\xBFdata: x\n\n"]);
    assert_eq!(data(&got), vec!["x"]);
    // A BOM later in the stream is data, not stripped.
    let got = parse_all(&[b"data: x\n\n\xEF\xBB\xBFdata: y\n\n"]);
    assert_eq!(got.len(), 1);
}

#[test]
fn retry_with_non_digits_is_ignored() {
    let got = parse_all(&[b"retry: 10s\ndata: x\n\n"]);
    assert_eq!(got[0].retry_ms, None);
}
