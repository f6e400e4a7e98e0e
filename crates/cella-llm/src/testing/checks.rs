//! What a real chat-completions provider checks before it answers, for fake models that must
//! reject what OpenAI would: a prompt plus the requested answer over the context window (400
//! `context_length_exceeded`), a tool result without its call or a call without its result,
//! and — for tests of context management — a prompt that lost the user's task.
//!
//! Owns the request-side rules; the tokenizer is the caller's (a closure counting a text).

use serde_json::{Value, json};

use super::server::Reply;

/// Tokens of an OpenAI chat-completions request body as OpenAI documents the count: per
/// message 3 tokens + role + content (+ each tool call's id, name and arguments, 3 tokens
/// each; + a result's tool call id), 3 tokens priming the reply, and each tool definition's
/// JSON (+ 8).
pub fn openai_prompt_tokens(body: &Value, count: &dyn Fn(&str) -> usize) -> u32 {
    let n = |v: &Value| u32::try_from(count(v.as_str().unwrap_or(""))).unwrap_or(u32::MAX);
    let mut total: u32 = 3;
    for m in body["messages"].as_array().into_iter().flatten() {
        total += 3 + n(&m["role"]) + n(&m["content"]) + n(&m["tool_call_id"]);
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            total += 3 + n(&c["id"]) + n(&c["function"]["name"]) + n(&c["function"]["arguments"]);
        }
    }
    for t in body["tools"].as_array().into_iter().flatten() {
        total += 8 + u32::try_from(count(&t["function"].to_string())).unwrap_or(u32::MAX);
    }
    total
}

/// Checks an OpenAI chat-completions request body the way a provider with a `window`-token
/// context would, and that some user message contains `task`. `Ok(prompt tokens)`, or the
/// provider's error message.
pub fn check_openai_request(
    body: &Value,
    window: u32,
    task: &str,
    count: &dyn Fn(&str) -> usize,
) -> Result<u32, (u32, String)> {
    let tokens = openai_prompt_tokens(body, count);
    let max = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .map_or(0, |m| u32::try_from(m).unwrap_or(u32::MAX));
    if tokens.saturating_add(max) > window {
        return Err((
            tokens,
            format!(
                "This model's maximum context length is {window} tokens. However, you requested \
                 {} tokens ({tokens} in the messages, {max} in the completion). Please reduce \
                 the length of the messages or completion.",
                tokens.saturating_add(max)
            ),
        ));
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if !messages
        .iter()
        .any(|m| m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains(task)))
    {
        return Err((tokens, "the user's task is missing from the prompt".into()));
    }
    let mut open: Vec<String> = Vec::new();
    for m in &messages {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or("");
            let Some(i) = open.iter().position(|o| o == id) else {
                return Err((
                    tokens,
                    format!(
                        "Invalid parameter: messages with role 'tool' must be a response to a \
                         preceding message with 'tool_calls' ({id})"
                    ),
                ));
            };
            open.remove(i);
            continue;
        }
        if !open.is_empty() {
            break;
        }
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            open.push(c["id"].as_str().unwrap_or("").to_owned());
        }
    }
    if !open.is_empty() {
        return Err((
            tokens,
            format!(
                "An assistant message with 'tool_calls' must be followed by tool messages \
                 responding to each 'tool_call_id'. The following tool_call_ids did not have \
                 response messages: {}",
                open.join(", ")
            ),
        ));
    }
    Ok(tokens)
}

/// Tokens of an Anthropic Messages request body, counted like [`openai_prompt_tokens`]: the
/// system text, every content block (text; a tool use's id, name and input JSON; a tool
/// result's id and content), 3 per message and reply, each tool definition's JSON (+ 8).
pub fn anthropic_prompt_tokens(body: &Value, count: &dyn Fn(&str) -> usize) -> u32 {
    let n = |s: &str| u32::try_from(count(s)).unwrap_or(u32::MAX);
    let text = |v: &Value| -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    };
    let mut total: u32 = 3 + n(&text(&body["system"]));
    for m in body["messages"].as_array().into_iter().flatten() {
        total += 3 + n(m["role"].as_str().unwrap_or(""));
        match &m["content"] {
            Value::String(s) => total += n(s),
            Value::Array(blocks) => {
                for b in blocks {
                    total += match b["type"].as_str() {
                        Some("tool_use") => {
                            3 + n(b["id"].as_str().unwrap_or(""))
                                + n(b["name"].as_str().unwrap_or(""))
                                + n(&b["input"].to_string())
                        }
                        Some("tool_result") => {
                            n(b["tool_use_id"].as_str().unwrap_or("")) + n(&text(&b["content"]))
                        }
                        _ => n(b["text"].as_str().unwrap_or("")),
                    };
                }
            }
            _ => {}
        }
    }
    for t in body["tools"].as_array().into_iter().flatten() {
        total += 8 + n(&t.to_string());
    }
    total
}

/// [`check_openai_request`] for an Anthropic Messages body: over the window with `max_tokens`,
/// the task in no user text, a `tool_result` not answering a `tool_use` of the assistant turn
/// right before it, or a `tool_use` whose result is not in the next user turn.
pub fn check_anthropic_request(
    body: &Value,
    window: u32,
    task: &str,
    count: &dyn Fn(&str) -> usize,
) -> Result<u32, (u32, String)> {
    let tokens = anthropic_prompt_tokens(body, count);
    let max = body["max_tokens"]
        .as_u64()
        .map_or(0, |m| u32::try_from(m).unwrap_or(u32::MAX));
    if tokens.saturating_add(max) > window {
        return Err((
            tokens,
            format!("prompt is too long: {tokens} tokens + max_tokens {max} > {window} maximum"),
        ));
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
    let has_task = messages.iter().any(|m| {
        m["role"] == "user"
            && (m["content"].as_str().is_some_and(|c| c.contains(task))
                || blocks(m)
                    .iter()
                    .any(|b| b["text"].as_str().is_some_and(|t| t.contains(task))))
    });
    if !has_task {
        return Err((tokens, "the user's task is missing from the prompt".into()));
    }
    let mut open: Vec<String> = Vec::new();
    for m in &messages {
        let results: Vec<String> = blocks(m)
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["tool_use_id"].as_str().unwrap_or("").to_owned())
            .collect();
        for id in &results {
            if !open.contains(id) {
                return Err((
                    tokens,
                    format!(
                        "messages: unexpected `tool_use_id` found in `tool_result` blocks: {id}. \
                         Each `tool_result` block must have a corresponding `tool_use` block in \
                         the previous message."
                    ),
                ));
            }
        }
        open.retain(|id| !results.contains(id));
        if !open.is_empty() {
            return Err((
                tokens,
                format!(
                    "messages: `tool_use` ids were found without `tool_result` blocks \
                     immediately after: {}",
                    open.join(", ")
                ),
            ));
        }
        open = blocks(m)
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap_or("").to_owned())
            .collect();
    }
    if !open.is_empty() {
        return Err((
            tokens,
            format!("`tool_use` ids without results: {}", open.join(", ")),
        ));
    }
    Ok(tokens)
}

impl Reply {
    /// Anthropic's 400 for a prompt over the context window.
    pub fn anthropic_prompt_too_long(message: &str) -> Self {
        Self::anthropic_error(400, "invalid_request_error", message)
    }

    /// OpenAI's 400 for a prompt over the context window.
    pub fn openai_context_length_exceeded(message: &str) -> Self {
        Self::json(
            400,
            &json!({"error": {"message": message, "type": "invalid_request_error",
                              "param": "messages", "code": "context_length_exceeded"}}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn requests_are_checked_like_a_provider() {
        let ok = json!({"max_tokens": 10, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "the task here"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "one two three"}
        ]});
        let tokens = check_openai_request(&ok, 100, "the task", &words).expect("ok");
        assert_eq!(tokens, openai_prompt_tokens(&ok, &words));
        let e = check_openai_request(&ok, tokens + 9, "the task", &words).expect_err("too long");
        assert!(e.1.contains("maximum context length"), "{}", e.1);
        let e = check_openai_request(&ok, 100, "another task", &words).expect_err("no task");
        assert!(e.1.contains("task is missing"), "{}", e.1);
        let mut split = ok.clone();
        split["messages"].as_array_mut().expect("array").remove(3);
        let e = check_openai_request(&split, 100, "the task", &words).expect_err("split");
        assert!(
            e.1.contains("did not have response messages: c1"),
            "{}",
            e.1
        );
        let mut orphan = ok.clone();
        orphan["messages"].as_array_mut().expect("array").remove(2);
        let e = check_openai_request(&orphan, 100, "the task", &words).expect_err("orphan");
        assert!(e.1.contains("must be a response"), "{}", e.1);
    }

    #[test]
    fn anthropic_requests_are_checked_like_a_provider() {
        let ok = json!({"max_tokens": 10, "system": "be brief", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "the task here"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "one two"}]}
        ]});
        let tokens = check_anthropic_request(&ok, 100, "the task", &words).expect("ok");
        assert!(check_anthropic_request(&ok, tokens + 9, "the task", &words).is_err());
        assert!(check_anthropic_request(&ok, 100, "other", &words).is_err());
        let mut split = ok.clone();
        split["messages"].as_array_mut().expect("array").remove(2);
        let e = check_anthropic_request(&split, 100, "the task", &words).expect_err("split");
        assert!(e.1.contains("without results: t1"), "{}", e.1);
        let mut orphan = ok.clone();
        orphan["messages"].as_array_mut().expect("array").remove(1);
        let e = check_anthropic_request(&orphan, 100, "the task", &words).expect_err("orphan");
        assert!(e.1.contains("unexpected `tool_use_id`"), "{}", e.1);
    }
}
