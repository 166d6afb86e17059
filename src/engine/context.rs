//! The outbound view: the conversation as the provider sees it, rebuilt from
//! the durable path.
//!
//! Tool calls persist as separate nodes (possibly interleaved with results);
//! here every call is attached back to the assistant message that requested
//! it. Notices and turn contexts are display-only and never sent. The latest
//! compaction checkpoint starts the view: its summary (with the files of the
//! task in progress sent again, bounded), then the nodes it kept as they
//! are, then the nodes after it.

use crate::model::{Attachment, DocumentData, ImageData, Node, NodeBody, ToolStatus};
use crate::provider::{ChatMessage, OutboundToolCall};

/// An estimate of a request's size in tokens, counted over everything that
/// is sent (system prompt, messages, call ids, tool calls and tool
/// definitions), without tokenizer tables.
///
/// Each text is cut into pieces the way BPE tokenizers pre-split text
/// (words, digit groups, punctuation runs, whitespace) and each piece is
/// priced by class; see [`estimate_text_tokens`]. The result carries a 5%
/// margin. Measured against OpenAI's o200k_base and cl100k_base on realistic
/// requests (`tests/suite/token_estimate.rs`, numbers in BENCHMARKS.md), it
/// under-counts by at most a few percent on any sample and over-counts
/// English, code, JSON, snapshots, URLs and numbers by up to about 20%;
/// non-Latin text is priced for the less efficient tokenizer, so o200k-class
/// models are over-counted there. Providers report the real figure
/// afterwards; the engine scales this estimate by the last reported/estimated
/// ratio of the run.
pub fn estimate_tokens(request: &crate::provider::ProviderRequest) -> u64 {
    let mut tenths = text_tenths(&request.system)
        + messages_tenths(&request.messages, Files::Sent(request.profile.vision));
    for tool in request.tools.iter() {
        tenths += TOOL_TENTHS
            + text_tenths(&tool.name)
            + text_tenths(&tool.description)
            + text_tenths(&tool.parameters.to_string());
    }
    with_margin(tenths)
}

/// The estimate of `messages` alone, with the same rules and margin as
/// [`estimate_tokens`], leaving out the files of the user's messages
/// (images, PDFs: the summary's transcript names them) and counting tool
/// results' images as a model with vision sees them.
pub(super) fn estimate_messages(messages: &[ChatMessage]) -> u64 {
    with_margin(messages_tenths(messages, Files::UserFilesLeftOut))
}

/// How a message's files count.
#[derive(Clone, Copy)]
enum Files {
    /// As the request sends them: the files themselves to a model with
    /// vision (`true`), the line that stands in for them otherwise.
    Sent(bool),
    /// The user's files not at all; tool results' images as sent with vision.
    UserFilesLeftOut,
}

fn messages_tenths(messages: &[ChatMessage], files: Files) -> u64 {
    let vision = !matches!(files, Files::Sent(false));
    let mut tenths = 0;
    for message in messages {
        tenths += MESSAGE_TENTHS
            + match message {
                ChatMessage::User {
                    text,
                    images,
                    documents,
                } => {
                    text_tenths(text)
                        + match files {
                            Files::Sent(true) => {
                                images.len() as u64 * IMAGE_TENTHS
                                    + documents.iter().map(|d| pdf_tenths(&d.data)).sum::<u64>()
                            }
                            Files::Sent(false) => text_tenths(
                                &crate::provider::attachment_placeholder(images.len(), documents),
                            ),
                            Files::UserFilesLeftOut => 0,
                        }
                }
                ChatMessage::Assistant {
                    text, tool_calls, ..
                } => {
                    text_tenths(text)
                        + tool_calls
                            .iter()
                            .map(|c| {
                                CALL_TENTHS
                                    + id_tenths(&c.id)
                                    + text_tenths(&c.name)
                                    + text_tenths(&c.arguments.to_string())
                            })
                            .sum::<u64>()
                }
                ChatMessage::ToolResult {
                    call_id,
                    content,
                    images,
                    ..
                } => {
                    id_tenths(call_id)
                        + text_tenths(content)
                        + match (images.len(), vision) {
                            (0, _) => 0,
                            (n, true) => n as u64 * IMAGE_TENTHS,
                            (n, false) => text_tenths(&crate::provider::image_placeholder(n)),
                        }
                }
            };
    }
    tenths
}

/// A PDF's estimate, in tenths, from its base64 (`PDF_TENTHS_PER_KIB`).
fn pdf_tenths(base64: &str) -> u64 {
    base64.len() as u64 * PDF_TENTHS_PER_KIB / 1024
}

/// The estimate of one text alone (no message framing), with the same rules
/// and margin as [`estimate_tokens`].
pub fn estimate_text_tokens(text: &str) -> u64 {
    with_margin(text_tenths(text))
}

/// Tenths of a token → tokens, plus 5% (the measured worst under-counts are
/// a few percent) and one for rounding.
fn with_margin(tenths: u64) -> u64 {
    tenths * 105 / 1_000 + 1
}

/// Framing of one message (role and delimiters), in tenths of a token.
const MESSAGE_TENTHS: u64 = 40;
/// Framing of one tool call.
const CALL_TENTHS: u64 = 10;
/// Framing of one tool definition.
const TOOL_TENTHS: u64 = 30;
/// One image: providers count by pixel size; 1,600 tokens covers a
/// full-size screenshot for Anthropic (about width × height / 750 after its
/// downscaling) and OpenAI's high-detail tiles.
const IMAGE_TENTHS: u64 = 16_000;
/// A PDF, per KiB of its base64: providers read each page as text and as
/// an image (about 1,500 to 3,000 tokens a page), and a page of a typical
/// PDF is some 50 to 100 KB, so about 25 tokens per KiB of base64. Rough by
/// nature; the provider's reported usage corrects it after the first request.
const PDF_TENTHS_PER_KIB: u64 = 250;

/// Call ids are random (`call_…`, `toolu_…`): about 1.5 characters a token.
fn id_tenths(id: &str) -> u64 {
    id.len() as u64 * 20 / 3
}

/// Byte classes of the estimate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Start,
    Letter,
    Digit,
    Punct,
    Space,
    /// The first byte of a non-ASCII character.
    Other,
}

/// The class of every byte, looked up once per byte (256 bytes of table).
const CLASSES: [Class; 256] = {
    let mut table = [Class::Punct; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = match byte as u8 {
            b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
            b'0'..=b'9' => Class::Digit,
            b' ' | b'\t' | b'\n' | b'\r' => Class::Space,
            0x80..=0xFF => Class::Other,
            _ => Class::Punct,
        };
        byte += 1;
    }
    table
};

fn class_of(byte: u8) -> Class {
    CLASSES[usize::from(byte)]
}

/// Estimated tokens of a text, in tenths. One pass over the bytes, run by
/// run, no allocation. The rules follow how o200k/cl100k pre-split text:
/// - letters: a word piece (a new one also starts at a lower→upper change,
///   `camelCase`) is 1 token, plus 1 for every 5 letters past the 8th; a
///   piece without a vowel (random ids, hashes) is split by BPE almost letter
///   by letter: 1 per letter;
/// - digits come in groups of at most 3: 1 token per group;
/// - a punctuation run is 1 token plus 0.2 per further character; a single
///   punctuation character between a non-space and a letter joins the word
///   (`_name`, `.map`, `=code`);
/// - whitespace: one space joins the next piece, except before a digit;
///   longer runs are 1 token; line breaks are 1 (free right after
///   punctuation, as in `;\n`), and indentation after them 1 more;
/// - non-ASCII by script: Latin accents 0.8 per character, Cyrillic 0.5,
///   other two-byte scripts (Greek, Hebrew, Arabic, …) 1, CJK, kana and
///   Hangul 1.1, other three-byte characters (symbols, Indic, Thai) 1,
///   four-byte ones (emoji) 2.
fn text_tenths(text: &str) -> u64 {
    let bytes = text.as_bytes();
    let end = bytes.len();
    let mut tenths = 0u64;
    // The class of the previous run.
    let mut prev = Class::Start;
    let mut i = 0;
    while i < end {
        let start = i;
        let class = class_of(bytes[i]);
        match class {
            Class::Letter => {
                let mut len = 0u64;
                let mut vowel = false;
                let mut was_lower = false;
                while i < end && bytes[i].is_ascii_alphabetic() {
                    let lower = bytes[i].is_ascii_lowercase();
                    if !lower && was_lower {
                        tenths += word_piece(len, vowel);
                        len = 0;
                        vowel = false;
                    }
                    len += 1;
                    vowel |= matches!(bytes[i] | 0x20, b'a' | b'e' | b'i' | b'o' | b'u' | b'y');
                    was_lower = lower;
                    i += 1;
                }
                tenths += word_piece(len, vowel);
            }
            Class::Digit => {
                while i < end && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                tenths += 10 * ((i - start) as u64).div_ceil(3);
            }
            Class::Punct => {
                while i < end && class_of(bytes[i]) == Class::Punct {
                    i += 1;
                }
                let len = (i - start) as u64;
                let joins_word =
                    len == 1 && prev != Class::Space && i < end && bytes[i].is_ascii_alphabetic();
                if !joins_word {
                    tenths += 10 + 2 * (len - 1);
                }
            }
            Class::Space => {
                let mut newline = false;
                let mut indent = 0u64;
                while i < end && class_of(bytes[i]) == Class::Space {
                    if bytes[i] == b'\n' || bytes[i] == b'\r' {
                        newline = true;
                        indent = 0;
                    } else {
                        indent += 1;
                    }
                    i += 1;
                }
                let before_digit = i < end && bytes[i].is_ascii_digit();
                tenths += if newline {
                    (if prev == Class::Punct { 0 } else { 10 }) + if indent >= 2 { 10 } else { 0 }
                } else if i - start >= 2 || before_digit {
                    10
                } else {
                    0
                };
            }
            Class::Other | Class::Start => {
                let (width, cost) = non_ascii(bytes, i);
                tenths += cost;
                i += width;
            }
        }
        prev = class;
    }
    tenths
}

/// Tenths for one word piece of `len` letters.
fn word_piece(len: u64, vowel: bool) -> u64 {
    let long = if len > 8 { 10 * ((len - 9) / 5 + 1) } else { 0 };
    let vowelless = if vowel || len < 2 { 0 } else { (len - 1) * 10 };
    10 + long + vowelless
}

/// Width in bytes and tenths of the non-ASCII character starting at `i`.
fn non_ascii(bytes: &[u8], i: usize) -> (usize, u64) {
    let lead = u32::from(bytes[i]);
    let tail = |k: usize| bytes.get(i + k).map_or(0, |b| u32::from(*b) & 0x3F);
    if lead >= 0xF0 {
        (4, 20)
    } else if lead >= 0xE0 {
        let cp = ((lead & 0x0F) << 12) | (tail(1) << 6) | tail(2);
        let cjk = (0x2E80..0xA000).contains(&cp)
            || (0xAC00..0xD800).contains(&cp)
            || (0xF900..0xFB00).contains(&cp)
            || (0xFF00..0xFFF0).contains(&cp);
        (3, if cjk { 11 } else { 10 })
    } else if lead >= 0xC0 {
        let cp = ((lead & 0x1F) << 6) | tail(1);
        let cost = if cp < 0x300 {
            8
        } else if (0x400..0x530).contains(&cp) {
            5
        } else {
            10
        };
        (2, cost)
    } else {
        // A continuation byte cannot start a character of a `str`.
        (1, 0)
    }
}

/// Tool results longer than this (in characters) reach the model truncated;
/// the stored node keeps everything for the user.
pub const MAX_TOOL_RESULT_CHARS: usize = 24_000;

/// Cut an over-long tool result for the model, saying how to see more.
fn for_model(content: &str) -> String {
    let total = content.chars().count();
    if total <= MAX_TOOL_RESULT_CHARS {
        return content.to_string();
    }
    let kept: String = content.chars().take(MAX_TOOL_RESULT_CHARS).collect();
    format!(
        "{kept}\n[… {} more characters not shown. Ask for a narrower view (scroll, then page_snapshot; wait_for a specific text) to see other parts.]",
        total - MAX_TOOL_RESULT_CHARS
    )
}

/// How a compaction checkpoint is presented to the model: its summary, then
/// the section the engine copied verbatim (when there is one).
pub fn summary_message(summary: &str, verbatim: &str) -> String {
    let mut text = format!("[Summary of the earlier part of this conversation, written by you when it grew too long]\n{summary}");
    if !verbatim.is_empty() {
        text.push_str("\n\n");
        text.push_str(verbatim);
    }
    text
}

/// The files of the task in progress that a checkpoint's message sends
/// again (`checkpoint_message`) hold at most this many estimated tokens
/// (four images at 1,681 each, or a PDF of about 300 KiB of base64): files
/// are taken in the order they were attached, and from the first that does
/// not fit on they are only named.
pub const REATTACHED_FILES_MAX_TOKENS: u64 = 8_000;

/// A file's estimate (the rules of [`estimate_tokens`]).
fn file_tokens(file: &Attachment) -> u64 {
    match file {
        Attachment::Image { .. } => with_margin(IMAGE_TENTHS),
        Attachment::Pdf { data, .. } => with_margin(pdf_tenths(data)),
        Attachment::Text { text, .. } => estimate_text_tokens(text),
        Attachment::Omitted { .. } => 0,
    }
}

/// The first node of the tail a checkpoint at `at` keeps (`kept_nodes`
/// nodes right before it, sent as they are after its summary). A tail never
/// reaches back past an earlier checkpoint (a count that says otherwise, in
/// a record written by hand, would send that summary again).
pub(super) fn kept_tail_start(path: &[Node], at: usize, kept_nodes: u64) -> usize {
    let from = at.saturating_sub(usize::try_from(kept_nodes).unwrap_or(usize::MAX));
    path[from..at]
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::Compaction { .. }))
        .map_or(from, |i| from + i + 1)
}

/// The message a checkpoint becomes (the last node of `path`): its summary
/// and verbatim section, with the files of the task in progress sent again
/// (bounded, [`REATTACHED_FILES_MAX_TOKENS`]). The task's messages in the
/// checkpoint's kept tail are sent whole, their files with them; the others
/// went into the summary, which names their files but cannot show them.
fn checkpoint_message(path: &[Node]) -> ChatMessage {
    let at = path.len() - 1;
    let NodeBody::Compaction {
        summary,
        verbatim,
        kept_nodes,
        ..
    } = &path[at].body
    else {
        return ChatMessage::user("");
    };
    let mut text = summary_message(summary, verbatim);
    let tail = kept_tail_start(path, at, *kept_nodes);
    let mut left = REATTACHED_FILES_MAX_TOKENS;
    let mut sent: Vec<Attachment> = Vec::new();
    let mut named: Vec<&str> = Vec::new();
    let task = super::compaction::task_messages(&path[..at]);
    for message in task.iter().filter(|m| m.index < tail) {
        for file in message.files {
            let cost = file_tokens(file);
            if named.is_empty() && cost <= left {
                left -= cost;
                sent.push(file.clone());
            } else {
                named.push(file.name());
            }
        }
    }
    if !sent.is_empty() {
        let names: Vec<&str> = sent.iter().map(Attachment::name).collect();
        text.push_str(&format!(
            "\n\n[Sent again with this summary: the files attached to the task in progress ({})]",
            names.join(", ")
        ));
    }
    if !named.is_empty() {
        text.push_str(&format!(
            "\n\n[Not sent again (size limit; the summary covers them): {}]",
            named.join(", ")
        ));
    }
    user_message(&text, &sent)
}

/// Build the provider messages for a path (root first). The view starts at
/// the latest compaction checkpoint (its summary leads, then the tail it
/// kept), so the stored history is never rewritten but the model sees a
/// bounded context.
pub fn outbound_messages(path: &[Node]) -> Vec<ChatMessage> {
    let mut view = OutboundView::default();
    view.update(path, &mut 0);
    std::rc::Rc::unwrap_or_clone(view.messages)
}

/// The outbound view of one thread, kept between steps: the history only
/// grows at its end, so a step folds in the nodes added since the last one
/// instead of rebuilding the view from the whole path. Any other change (a
/// new checkpoint, another branch) rebuilds it.
#[derive(Debug, Clone, Default)]
pub struct OutboundView {
    /// The node the view starts at (the latest checkpoint, or the root),
    /// and its index in the path.
    start: Option<String>,
    start_index: usize,
    /// How many nodes of the path are folded in, and the last one's id
    /// (a path is determined by its last node, so this pins the prefix).
    covered: usize,
    last: Option<String>,
    /// Shared with the requests made from it; folding copies it only while
    /// an earlier request still holds it (the engine drops its own first).
    messages: std::rc::Rc<Vec<ChatMessage>>,
    /// Index in `messages` of each assistant node, so calls find their message.
    assistant_index: Vec<(String, usize)>,
    /// Unique per view and per rebuild (0: never built): with the length,
    /// the lineage of the requests made from it.
    id: u64,
}

impl OutboundView {
    /// The messages for `path`, updated incrementally when possible.
    /// `last_id` is the last view id the caller gave out (the engine's, so
    /// the ids of all its threads' views differ); a rebuild takes the next.
    pub fn update(&mut self, path: &[Node], last_id: &mut u64) -> std::rc::Rc<Vec<ChatMessage>> {
        let compaction = |n: &Node| matches!(n.body, NodeBody::Compaction { .. });
        // The folded nodes are still the path's first ones: only the new
        // nodes can hold a later checkpoint, so a step looks at those alone
        // (O(new nodes), not O(path)).
        let prefix_kept = self.covered <= path.len()
            && match self.covered.checked_sub(1) {
                Some(last) => self.last.as_deref() == Some(path[last].id.as_str()),
                None => self.last.is_none(),
            };
        let start = if prefix_kept {
            path[self.covered..]
                .iter()
                .rposition(compaction)
                .map_or(self.start_index, |i| self.covered + i)
        } else {
            path.iter().rposition(compaction).unwrap_or(0)
        };
        let start_id = path.get(start).map(|n| n.id.clone());
        let extends = prefix_kept && self.start == start_id && self.covered >= start;
        if !extends {
            *self = OutboundView {
                start: start_id,
                start_index: start,
                covered: start,
                last: None,
                messages: std::rc::Rc::new(Vec::with_capacity(path.len() - start)),
                assistant_index: Vec::new(),
                id: {
                    *last_id += 1;
                    *last_id
                },
            };
        }
        if !extends && path.get(start).is_some_and(compaction) {
            // A checkpoint leads: its message, then the tail it kept (the
            // nodes before it the model had not answered yet).
            let message = checkpoint_message(&path[..=start]);
            std::rc::Rc::make_mut(&mut self.messages).push(message);
            if let NodeBody::Compaction { kept_nodes, .. } = &path[start].body {
                for node in &path[kept_tail_start(path, start, *kept_nodes)..start] {
                    self.fold(node);
                }
            }
            self.covered = start + 1;
        }
        for node in &path[self.covered..] {
            self.fold(node);
        }
        self.covered = path.len();
        self.last = path.last().map(|n| n.id.clone());
        self.messages.clone()
    }

    /// What a request of the messages `update` last returned shares with
    /// the requests made from this view before: the view only appends, so
    /// their messages agree up to the shorter one's last (which may still
    /// gain tool calls).
    pub fn lineage(&self) -> crate::provider::Lineage {
        crate::provider::Lineage {
            view: self.id,
            len: self.messages.len(),
        }
    }

    fn fold(&mut self, node: &Node) {
        let messages = std::rc::Rc::make_mut(&mut self.messages);
        match &node.body {
            NodeBody::UserMessage {
                text, attachments, ..
            } => messages.push(user_message(text, attachments)),
            NodeBody::AssistantMessage {
                text,
                provider_private,
                ..
            } => {
                self.assistant_index.push((node.id.clone(), messages.len()));
                messages.push(ChatMessage::Assistant {
                    text: text.clone(),
                    tool_calls: Vec::new(),
                    private: provider_private.clone(),
                });
            }
            NodeBody::ToolCall {
                call_id,
                assistant_id,
                name,
                arguments,
                ..
            } => {
                // A call follows its assistant message on the path. Forks
                // made before 2026-12-01 copied calls still naming the source
                // thread's message: those go to the message they follow.
                let slot = self
                    .assistant_index
                    .iter()
                    .rev()
                    .find(|(id, _)| id == assistant_id)
                    .or(self.assistant_index.last())
                    .map(|(_, i)| *i);
                if let Some(ChatMessage::Assistant { tool_calls, .. }) =
                    slot.and_then(|i| messages.get_mut(i))
                {
                    tool_calls.push(OutboundToolCall {
                        id: call_id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            NodeBody::ToolResult {
                call_id,
                status,
                content,
                images,
                ..
            } => messages.push(ChatMessage::ToolResult {
                call_id: call_id.clone(),
                content: for_model(content).into(),
                is_error: *status != ToolStatus::Ok,
                images: images.clone(),
            }),
            // Folded where the view starts (`update`): a later checkpoint
            // starts a new view.
            NodeBody::Compaction { .. }
            | NodeBody::TurnContext { .. }
            | NodeBody::Notice { .. } => {}
        }
    }
}

/// The tag around an attached text file in the outbound view.
const FILE_TAG: &str = "attached_file";

/// A user message as the model gets it: the text, then each attached text
/// file as an `<attached_file>` block (its content cannot close the block
/// early); the images and PDFs go alongside.
fn user_message(text: &str, attachments: &[Attachment]) -> ChatMessage {
    if attachments.is_empty() {
        return ChatMessage::user(text);
    }
    let mut out = text.to_string();
    let mut images = Vec::new();
    let mut documents = Vec::new();
    for attachment in attachments {
        match attachment {
            Attachment::Image {
                media_type, data, ..
            } => images.push(ImageData {
                media_type: media_type.clone(),
                data: data.clone(),
            }),
            Attachment::Pdf { name, data, .. } => documents.push(DocumentData {
                name: name.clone(),
                data: data.clone(),
            }),
            Attachment::Text {
                name,
                media_type,
                text,
            } => {
                let quote = |s: &str| s.replace(['"', '<', '>', '\n'], "'");
                if !out.is_empty() {
                    out.push_str("\n\n");
                }
                out.push_str(&format!(
                    "<{FILE_TAG} name=\"{}\" type=\"{}\">\n{}\n</{FILE_TAG}>",
                    quote(name),
                    quote(media_type),
                    text.replace(&format!("</{FILE_TAG}>"), &format!("</{FILE_TAG}_>"))
                ));
            }
            // Never stored (inputs refuse one); a record that holds one
            // anyway says so rather than dropping the file silently.
            Attachment::Omitted { name, .. } => {
                if !out.is_empty() {
                    out.push_str("\n\n");
                }
                out.push_str(&format!("[The attached file {name:?} is not available.]"));
            }
        }
    }
    ChatMessage::User {
        text: out,
        images,
        documents,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Node;

    fn node(id: &str, body: NodeBody) -> Node {
        Node {
            id: id.into(),
            thread_id: "t".into(),
            parent_id: None,
            created_at: 0,
            body,
        }
    }

    #[test]
    fn token_estimate_prices_pieces_not_bytes() {
        // Empty text: only the rounding token.
        assert_eq!(estimate_text_tokens(""), 1);
        // A multi-byte character at the very end is read safely.
        for text in ["é", "中", "🚀", "a\u{0301}", "x\n"] {
            assert!(estimate_text_tokens(text) >= 1);
        }
        // Same length, very different token counts: a word vs a random id.
        assert!(
            estimate_text_tokens("characterization") < estimate_text_tokens("xQ7vK2pZ9wR4mN8t")
        );
        // Digits come in groups of at most three.
        assert!(estimate_text_tokens("1234567890") >= 4);
        // CJK costs about a token per character; Cyrillic about half.
        assert!(estimate_text_tokens(&"中".repeat(100)) >= 100);
        let cyrillic = estimate_text_tokens(&"д".repeat(100));
        assert!((45..=60).contains(&cyrillic), "{cyrillic}");
        // Message framing and call ids count too.
        let request = crate::provider::ProviderRequest {
            lineage: None,
            profile: crate::model::ProviderProfile::default(),
            system: Default::default(),
            messages: vec![ChatMessage::ToolResult {
                call_id: "call_Y2TNfXEJLhPygZNX5DU0Hzch".into(),
                content: "".into(),
                is_error: false,
                images: vec![],
            }]
            .into(),
            tools: Default::default(),
        };
        assert!(estimate_tokens(&request) >= 20);
    }

    #[test]
    fn token_estimate_counts_files_as_the_model_gets_them() {
        let image = || crate::model::ImageData {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo".into(),
        };
        let request = |vision: bool| crate::provider::ProviderRequest {
            lineage: None,
            profile: crate::model::ProviderProfile {
                vision,
                ..Default::default()
            },
            system: Default::default(),
            messages: vec![
                ChatMessage::User {
                    text: "compare these".into(),
                    images: vec![image(), image()],
                    documents: vec![],
                },
                ChatMessage::ToolResult {
                    call_id: "c1".into(),
                    content: "Screenshot taken.".into(),
                    is_error: false,
                    images: vec![image()],
                },
            ]
            .into(),
            tools: Default::default(),
        };
        // With vision, three images at full price.
        let seen = estimate_tokens(&request(true));
        assert!(seen >= 3 * IMAGE_TENTHS / 10, "{seen}");
        // Without, the model gets two lines of text in their place.
        let blind = estimate_tokens(&request(false));
        assert!((30..300).contains(&blind), "{blind}");
    }

    #[test]
    fn large_tool_results_are_truncated_for_the_model_only() {
        let big = "x".repeat(MAX_TOOL_RESULT_CHARS + 500);
        let path = vec![
            node(
                "u",
                NodeBody::UserMessage {
                    text: "go".into(),
                    steered: false,
                    attachments: vec![],
                },
            ),
            node(
                "a",
                NodeBody::AssistantMessage {
                    text: String::new(),
                    reasoning: None,
                    stop_reason: crate::model::StopReason::ToolUse,
                    usage: None,
                    interrupted: false,
                    model: "m".into(),
                    provider_private: None,
                },
            ),
            node(
                "c",
                NodeBody::ToolCall {
                    call_id: "c1".into(),
                    assistant_id: "a".into(),
                    name: "read_page".into(),
                    label: "Read".into(),
                    arguments: serde_json::json!({}),
                },
            ),
            node(
                "r",
                NodeBody::ToolResult {
                    call_id: "c1".into(),
                    name: "read_page".into(),
                    status: ToolStatus::Ok,
                    content: big.clone(),
                    details: None,
                    images: vec![],
                    approval: None,
                },
            ),
        ];
        let messages = outbound_messages(&path);
        match &messages[2] {
            ChatMessage::ToolResult { content, .. } => {
                assert!(content.len() < big.len());
                assert!(content.contains("500 more characters not shown"));
            }
            other => panic!("{other:?}"),
        }
        // The stored node is untouched.
        assert!(
            matches!(&path[3].body, NodeBody::ToolResult { content, .. } if content.len() == big.len())
        );
        // Calls stay attached to their assistant message.
        assert!(
            matches!(&messages[1], ChatMessage::Assistant { tool_calls, .. } if tool_calls.len() == 1)
        );
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;
    use crate::model::ToolStatus;

    fn node(id: &str, parent: Option<&str>, body: NodeBody) -> Node {
        Node {
            id: id.into(),
            thread_id: "t".into(),
            parent_id: parent.map(str::to_string),
            created_at: 0,
            body,
        }
    }

    fn chain(bodies: Vec<(&str, NodeBody)>) -> Vec<Node> {
        let mut parent: Option<String> = None;
        bodies
            .into_iter()
            .map(|(id, body)| {
                let n = node(id, parent.as_deref(), body);
                parent = Some(id.to_string());
                n
            })
            .collect()
    }

    fn user(text: &str) -> NodeBody {
        NodeBody::UserMessage {
            text: text.into(),
            steered: false,
            attachments: vec![],
        }
    }

    #[test]
    fn outbound_view_updated_step_by_step_equals_a_rebuild() {
        let mut bodies: Vec<(String, NodeBody)> = vec![("u0".into(), user("go"))];
        for step in 0..5 {
            let a = format!("a{step}");
            bodies.push((
                a.clone(),
                NodeBody::AssistantMessage {
                    text: format!("step {step}"),
                    reasoning: None,
                    stop_reason: crate::model::StopReason::ToolUse,
                    usage: None,
                    interrupted: false,
                    model: "m".into(),
                    provider_private: None,
                },
            ));
            bodies.push((
                format!("c{step}"),
                NodeBody::ToolCall {
                    call_id: format!("call{step}"),
                    assistant_id: a,
                    name: "click".into(),
                    label: "Click".into(),
                    arguments: serde_json::json!({ "ref": "e1" }),
                },
            ));
            bodies.push((
                format!("r{step}"),
                NodeBody::ToolResult {
                    call_id: format!("call{step}"),
                    name: "click".into(),
                    status: ToolStatus::Ok,
                    content: "x".repeat(MAX_TOOL_RESULT_CHARS + step),
                    details: None,
                    images: Vec::new(),
                    approval: None,
                },
            ));
            if step == 2 {
                // A checkpoint written before checkpoints kept a tail.
                bodies.push((
                    "k".into(),
                    NodeBody::Compaction {
                        summary: "so far".into(),
                        compacted_nodes: 9,
                        verbatim: "<message>go</message>".into(),
                        kept_nodes: 0,
                    },
                ));
            }
            if step == 3 {
                // A steer, then a checkpoint that keeps the model's latest
                // message, its call, the result and the steer.
                bodies.push((
                    "s3".into(),
                    NodeBody::UserMessage {
                        text: "steer".into(),
                        steered: true,
                        attachments: vec![],
                    },
                ));
                bodies.push((
                    "k2".into(),
                    NodeBody::Compaction {
                        summary: "later".into(),
                        compacted_nodes: 4,
                        verbatim: String::new(),
                        kept_nodes: 4,
                    },
                ));
            }
        }
        let path = chain(
            bodies
                .iter()
                .map(|(id, b)| (id.as_str(), b.clone()))
                .collect(),
        );
        let mut view = OutboundView::default();
        let mut last_id = 0;
        // The lineage: while the id stays, the messages a request shares
        // with the view's previous one (up to the shorter one's `len - 1`)
        // are the same; a rebuild takes a new id.
        let mut last: Option<(crate::provider::Lineage, Vec<ChatMessage>)> = None;
        let mut ids = Vec::new();
        for end in 0..=path.len() {
            let messages = view.update(&path[..end], &mut last_id);
            assert_eq!(*messages, outbound_messages(&path[..end]), "end={end}");
            let lineage = view.lineage();
            assert_eq!(lineage.len, messages.len());
            if let Some((before, old)) = &last {
                if before.view == lineage.view {
                    let shared = before.len.min(lineage.len).saturating_sub(1);
                    assert_eq!(old[..shared], messages[..shared], "end={end}");
                }
            }
            if !ids.contains(&lineage.view) {
                ids.push(lineage.view);
            }
            last = Some((lineage, messages.to_vec()));
        }
        // Built once, rebuilt at each compaction: three ids (0 for the empty path).
        assert_eq!(ids.iter().filter(|id| **id != 0).count(), 3, "{ids:?}");
        // After the second checkpoint: its summary, then the tail it kept
        // as it was (the call with its result, the steer), then what follows.
        let messages = outbound_messages(&path);
        assert!(
            matches!(&messages[0], ChatMessage::User { text, .. } if text.ends_with("]\nlater"))
        );
        assert!(
            matches!(&messages[1], ChatMessage::Assistant { text, tool_calls, .. }
                if text == "step 3" && tool_calls.len() == 1 && tool_calls[0].id == "call3")
        );
        assert!(
            matches!(&messages[2], ChatMessage::ToolResult { call_id, .. } if call_id == "call3")
        );
        assert!(matches!(&messages[3], ChatMessage::User { text, .. } if text == "steer"));
        assert!(matches!(&messages[4], ChatMessage::Assistant { text, .. } if text == "step 4"));
        assert_eq!(messages.len(), 6);
        // Another branch of the same length, then a shorter path: rebuilt.
        let mut other = path.clone();
        other[3] = node("r0b", Some("c0"), user("changed"));
        let before = view.lineage();
        assert_eq!(
            *view.update(&other[..6], &mut last_id),
            outbound_messages(&other[..6])
        );
        assert_ne!(
            view.lineage().view,
            before.view,
            "another branch: a new lineage"
        );
        let before = view.lineage();
        assert_eq!(
            *view.update(&path[..2], &mut last_id),
            outbound_messages(&path[..2])
        );
        assert_ne!(
            view.lineage().view,
            before.view,
            "a shorter path: a new lineage"
        );
        // Many nodes at once, the checkpoint among them (not last): a step
        // looks only at the new nodes, and finds it there.
        let before = view.lineage();
        assert_eq!(*view.update(&path, &mut last_id), outbound_messages(&path));
        assert_ne!(view.lineage().view, before.view, "past a checkpoint");
        let before = view.lineage();
        let longer: Vec<Node> = path
            .iter()
            .cloned()
            .chain([node("u9", path.last().map(|n| n.id.as_str()), user("more"))])
            .collect();
        assert_eq!(
            *view.update(&longer, &mut last_id),
            outbound_messages(&longer)
        );
        assert_eq!(
            view.lineage().view,
            before.view,
            "extended: the same lineage"
        );
    }
}
