//! A pure Server-Sent Events parser (WHATWG `text/event-stream`).
//!
//! Owns: turning arbitrary byte chunks into events. Chunks may split anywhere:
//! inside a line, inside a UTF-8 character, between the CR and LF of a CRLF.
//! Handles LF, CR and CRLF line ends, comments, multi-line `data:`, `event:`,
//! `id:`, `retry:`, a leading BOM, and a stream that ends without a final
//! blank line (the pending event is flushed by [`SseParser::finish`]; the spec
//! would drop it, but real servers end with a bare `data: [DONE]`).
//!
//! Must not: interpret event payloads (the provider adapters do).

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; empty means the default type `message`.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen (sticky across events, per the spec).
    pub id: Option<String>,
    /// A `retry:` value in milliseconds, if this event carried one.
    pub retry_ms: Option<u64>,
}

/// Incremental parser state.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended with CR: a leading LF now belongs to it.
    after_cr: bool,
    /// The stream start was checked for a BOM.
    bom_checked: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    /// `last_id` as of the last blank line.
    dispatched_id: Option<String>,
    retry_ms: Option<u64>,
    /// The last `retry:` of the stream, whether or not an event with data
    /// followed it (the spec sets the reconnection time as it is parsed).
    reconnection_ms: Option<u64>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the stream asked a client to wait before reconnecting: its
    /// last valid `retry:` field so far, even in a block without data (a
    /// server priming a stream it is about to close sends `id:` and
    /// `retry:` alone).
    pub fn reconnection_time(&self) -> Option<u64> {
        self.reconnection_ms
    }

    /// The stream's last event id as of its last complete event (the
    /// HTML spec's "last event ID string": set at every blank line, an
    /// event without data included, not by an event still arriving):
    /// where a stream that broke is resumed from (`Last-Event-ID`).
    pub fn last_event_id(&self) -> Option<&str> {
        self.dispatched_id.as_deref()
    }

    /// Bytes held for the event not yet complete (its line and its data).
    pub fn pending_len(&self) -> usize {
        self.line.len() + self.data.len()
    }

    /// Feed bytes; returns the events completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let out = Vec::new();
        if self.bom_checked {
            return self.push_bytes(bytes, out);
        }
        // A UTF-8 BOM may only appear at the very start, and may itself be split.
        self.line.extend_from_slice(bytes);
        if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
            return out;
        }
        self.bom_checked = true;
        let buffered = std::mem::take(&mut self.line);
        let start = if buffered.starts_with(BOM) {
            BOM.len()
        } else {
            0
        };
        self.push_bytes(&buffered[start..], out)
    }

    fn push_bytes(&mut self, bytes: &[u8], mut out: Vec<SseEvent>) -> Vec<SseEvent> {
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut out);
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    /// End of stream: flush a last line without newline and a pending event.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.bom_checked && BOM.starts_with(&self.line) {
            self.line.clear(); // only part of a BOM arrived
        }
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        // Lines end at ASCII bytes, so a complete line never splits a UTF-8
        // character; invalid bytes become U+FFFD as the spec requires.
        let line = String::from_utf8_lossy(&line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return; // comment / keep-alive
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            // An id containing NUL is ignored, per the spec.
            "id" if !value.contains('\0') => self.last_id = Some(value.to_string()),
            "retry" if !value.is_empty() && value.bytes().all(|c| c.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
                if self.retry_ms.is_some() {
                    self.reconnection_ms = self.retry_ms;
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.dispatched_id.clone_from(&self.last_id);
        if !self.has_data {
            // Per the spec an event without data is not dispatched; its type resets.
            self.event.clear();
            return;
        }
        out.push(SseEvent {
            event: std::mem::take(&mut self.event),
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
            retry_ms: self.retry_ms.take(),
        });
        self.has_data = false;
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
