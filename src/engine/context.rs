//! The outbound view: the conversation as the provider sees it, rebuilt from
//! the durable path.
//!
//! Tool calls persist as separate nodes (possibly interleaved with results);
//! here every call is attached back to the assistant message that requested
//! it. Notices and turn contexts are display-only and never sent.

use crate::model::{Node, NodeBody, ToolStatus};
use crate::provider::{ChatMessage, OutboundToolCall};

/// Build the provider messages for a path (root first).
pub fn outbound_messages(path: &[Node]) -> Vec<ChatMessage> {
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
                content: content.clone(),
                is_error: *status != ToolStatus::Ok,
                images: images.clone(),
            }),
            NodeBody::TurnContext { .. } | NodeBody::Notice { .. } => {}
        }
    }
    messages
}
