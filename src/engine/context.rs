//! The outbound view: the conversation as the provider sees it, rebuilt from
//! the durable path.
//!
//! Tool calls persist as separate nodes (possibly interleaved with results);
//! here every call is attached back to the assistant message that requested
//! it. Notices and turn contexts are display-only and never sent.

use crate::model::{Node, NodeBody, ToolStatus};
use crate::provider::{ChatMessage, OutboundToolCall};

/// A rough token count of a request: about four characters per token for
/// English and code, counted over everything that is sent. Providers report
/// the real figure afterwards; the engine scales this estimate by the last
/// reported/estimated ratio of the run.
pub fn estimate_tokens(request: &crate::provider::ProviderRequest) -> u64 {
    let mut chars = request.system.len();
    for message in &request.messages {
        chars += match message {
            ChatMessage::User { text } => text.len(),
            ChatMessage::Assistant {
                text, tool_calls, ..
            } => {
                text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            }
            ChatMessage::ToolResult {
                content, images, ..
            } => content.len() + images.len() * 4_000,
        } + 16;
    }
    for tool in &request.tools {
        chars += tool.name.len() + tool.description.len() + tool.parameters.to_string().len();
    }
    (chars / 4) as u64 + 1
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

/// How the summary of a compaction checkpoint is presented to the model.
pub fn summary_message(summary: &str) -> String {
    format!("[Summary of the earlier part of this conversation, written by you when it grew too long]\n{summary}")
}

/// Build the provider messages for a path (root first). The view starts at
/// the latest compaction checkpoint (its summary leads), so the stored
/// history is never rewritten but the model sees a bounded context.
pub fn outbound_messages(path: &[Node]) -> Vec<ChatMessage> {
    let start = path
        .iter()
        .rposition(|n| matches!(n.body, NodeBody::Compaction { .. }))
        .unwrap_or(0);
    let path = &path[start..];
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(path.len());
    // Index in `messages` of each assistant node, so calls find their message.
    let mut assistant_index: Vec<(&str, usize)> = Vec::new();
    for node in path {
        match &node.body {
            NodeBody::UserMessage { text, .. } => {
                messages.push(ChatMessage::User { text: text.clone() })
            }
            NodeBody::AssistantMessage {
                text,
                provider_private,
                ..
            } => {
                assistant_index.push((node.id.as_str(), messages.len()));
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
                let slot = assistant_index
                    .iter()
                    .rev()
                    .find(|(id, _)| *id == assistant_id.as_str())
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
                content: for_model(content),
                is_error: *status != ToolStatus::Ok,
                images: images.clone(),
            }),
            NodeBody::Compaction { summary, .. } => messages.push(ChatMessage::User {
                text: summary_message(summary),
            }),
            NodeBody::TurnContext { .. } | NodeBody::Notice { .. } => {}
        }
    }
    messages
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
    fn large_tool_results_are_truncated_for_the_model_only() {
        let big = "x".repeat(MAX_TOOL_RESULT_CHARS + 500);
        let path = vec![
            node(
                "u",
                NodeBody::UserMessage {
                    text: "go".into(),
                    steered: false,
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
