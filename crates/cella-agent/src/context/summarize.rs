//! Summaries of older turns written by the model: the request asking for one (the task, the
//! previous summary, a transcript of the turns to fold in, all fitted to the budget) and the
//! message that stands for those turns in later prompts.
//!
//! Owns the summariser's instructions and the transcript rendering. Must not choose which turns
//! are summarised nor call the model.

use cella_llm::{ChatRequest, Message, ToolChoice};

use super::prune::shorten;
use super::tokens::TokenCounter;

const INSTRUCTIONS: &str = "You compress the history of an agent working on a task in a Linux \
    sandbox, so that it can go on with less context. Write a concise summary of the transcript \
    (and of the previous summary, if any): what has been done, what was found (file names, \
    commands, errors, numbers, decisions), what is in progress and what remains to do. Keep \
    exact names, paths and values that later steps may need. Do not address the user, do not \
    invent anything, and do not call tools. Answer with the summary only.";

/// Least tokens a transcript message keeps when messages share the space.
const MIN_PER_MESSAGE: u32 = 48;

/// The request asking the model to summarise `messages` (the turns to fold in, in order),
/// given the user's `task` and the `previous` summary, with at most `limit` prompt tokens and
/// an answer of at most `max_answer` tokens.
pub fn request(
    task: &str,
    previous: Option<&str>,
    messages: &[Message],
    limit: u32,
    max_answer: u32,
    counter: &TokenCounter,
) -> ChatRequest {
    let head = match previous {
        Some(p) => format!(
            "The task:\n{task}\n\nThe previous summary:\n{p}\n\nThe transcript since then:\n"
        ),
        None => format!("The task:\n{task}\n\nThe transcript:\n"),
    };
    let fixed = counter.request(&ChatRequest::new(vec![
        Message::system(INSTRUCTIONS),
        Message::user(head.clone()),
    ]));
    // Joining texts can merge a few tokens differently at the seams: keep a little slack.
    let room = limit.saturating_sub(fixed).saturating_sub(32);
    let transcript = transcript(messages, room, counter);
    let mut request = ChatRequest::new(vec![
        Message::system(INSTRUCTIONS),
        Message::user(format!("{head}{transcript}")),
    ]);
    request.tool_choice = ToolChoice::None;
    request.max_tokens = Some(max_answer);
    request
}

/// The messages rendered as text, each shortened to a fair share of `room` tokens; the oldest
/// are left out (and counted) if even that does not fit.
fn transcript(messages: &[Message], room: u32, counter: &TokenCounter) -> String {
    let n = u32::try_from(messages.len().max(1)).unwrap_or(u32::MAX);
    let share = (room / n).max(MIN_PER_MESSAGE);
    let mut rendered: Vec<(String, u32)> = messages
        .iter()
        .map(|m| {
            let text = render(m, share, counter) + "\n\n";
            let tokens = counter.text(&text);
            (text, tokens)
        })
        .collect();
    let mut total: u32 = rendered.iter().map(|(_, t)| *t).sum();
    let mut dropped = 0usize;
    while total > room && !rendered.is_empty() {
        let (_, t) = rendered.remove(0);
        total -= t;
        dropped += 1;
    }
    let mut out = String::new();
    if dropped > 0 {
        out.push_str(&format!(
            "[{dropped} older message{} left out]\n\n",
            if dropped == 1 { "" } else { "s" }
        ));
    }
    for (text, _) in rendered {
        out.push_str(&text);
    }
    out
}

fn render(message: &Message, share: u32, counter: &TokenCounter) -> String {
    let short = |s: &str| shorten(s, share, counter);
    match message {
        Message::System { content } => format!("[system]\n{}", short(content)),
        Message::User { content } => format!("[user]\n{}", short(content)),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut text = String::from("[assistant]");
            if !content.is_empty() {
                text.push('\n');
                text.push_str(content);
            }
            for call in tool_calls {
                text.push_str(&format!("\n→ {} {}", call.name, call.arguments));
            }
            short(&text)
        }
        Message::Tool {
            content, is_error, ..
        } => format!(
            "[tool {}]\n{}",
            if *is_error { "error" } else { "result" },
            short(content)
        ),
    }
}

/// The message standing for `folded` earlier messages in later prompts.
pub fn message(summary: &str, folded: usize, recall: bool) -> Message {
    let back = if recall {
        " The recall tool searches the full history."
    } else {
        ""
    };
    Message::user(format!(
        "[Context summary: {folded} earlier messages of this task were folded into this summary \
         to fit the model's context window.{back}]\n\n{summary}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tokens::Tokenizer;

    #[test]
    fn the_summary_request_fits_its_budget_and_keeps_the_task() {
        let c = TokenCounter::new(Tokenizer::O200kBase);
        let messages: Vec<Message> = (0..40)
            .flat_map(|i| {
                [
                    Message::assistant(format!("step {i}: running the build")),
                    Message::tool_result(format!("c{i}"), "error: x\n".repeat(300)),
                ]
            })
            .collect();
        let r = request(
            "make the tests pass",
            Some("earlier: cloned"),
            &messages,
            2000,
            300,
            &c,
        );
        assert!(c.request(&r) <= 2000, "{}", c.request(&r));
        assert_eq!(r.max_tokens, Some(300));
        assert_eq!(r.tool_choice, ToolChoice::None);
        let Message::User { content } = &r.messages[1] else {
            panic!("no user message")
        };
        assert!(
            content.starts_with("The task:\nmake the tests pass\n"),
            "{content}"
        );
        assert!(content.contains("earlier: cloned"));
        assert!(content.contains("step 39: running the build"), "{content}");
        assert!(content.contains("older messages left out"), "{content}");
    }
}
