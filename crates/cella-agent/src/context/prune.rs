//! Shortening without a model: the stub an elided tool output leaves behind, tool-call
//! arguments with their long strings elided (still a JSON object with the same keys, as
//! Anthropic requires), and a text cut to a number of tokens from the middle.
//!
//! Owns the wording of what was elided and how to get it back. Must not decide what to elide.

use serde_json::Value;

use super::tokens::TokenCounter;
use crate::output::{cap, first_line};

/// Argument strings longer than this many bytes are elided with their result.
const KEEP_ARGUMENT_BYTES: usize = 200;

/// The text replacing an elided tool output.
pub fn result_stub(tool: &str, id: &str, content: &str, tokens: u32, recall: bool) -> String {
    let lines = content.lines().count();
    let first = first_line(content, 80);
    let back = if recall {
        format!("; recall {{\"id\": \"{id}\"}} shows it again")
    } else {
        String::new()
    };
    format!(
        "[output elided to fit the context window: {tool} returned {tokens} tokens in {lines} \
         line{}, starting {first:?}{back}]",
        if lines == 1 { "" } else { "s" }
    )
}

/// `arguments` with every string value longer than [`KEEP_ARGUMENT_BYTES`] replaced by a
/// note; `None` when nothing is long enough to elide.
pub fn shrink_arguments(arguments: &str, id: &str, recall: bool) -> Option<String> {
    if arguments.len() <= KEEP_ARGUMENT_BYTES {
        return None;
    }
    let note = |len: usize| {
        if recall {
            format!("[{len} bytes elided; recall {{\"id\": \"{id}\"}} shows the call]")
        } else {
            format!("[{len} bytes elided]")
        }
    };
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut map)) => {
            let mut changed = false;
            for value in map.values_mut() {
                if let Value::String(s) = value
                    && s.len() > KEEP_ARGUMENT_BYTES
                {
                    *value = Value::String(note(s.len()));
                    changed = true;
                }
            }
            changed.then(|| Value::Object(map).to_string())
        }
        // Not an object (the call failed with a tool error): keep the shape providers accept.
        _ => Some(serde_json::json!({ "elided": note(arguments.len()) }).to_string()),
    }
}

/// `text` cut from the middle until it has at most `max_tokens` tokens (with the line saying
/// what was cut). Never returns more than `max_tokens` unless `max_tokens` is below the size
/// of the cut marker itself, in which case only the marker remains.
pub fn shorten(text: &str, max_tokens: u32, counter: &TokenCounter) -> String {
    let tokens = counter.text(text);
    if tokens <= max_tokens {
        return text.to_owned();
    }
    let mut bytes = (text.len() as u64 * u64::from(max_tokens) / u64::from(tokens.max(1))) as usize;
    for _ in 0..8 {
        let (cut, _) = cap(text, bytes);
        if counter.text(&cut) <= max_tokens {
            return cut;
        }
        bytes = bytes * 3 / 4;
        if bytes == 0 {
            break;
        }
    }
    let (cut, _) = cap(text, 0);
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tokens::Tokenizer;

    #[test]
    fn stubs_say_what_was_elided_and_how_to_get_it_back() {
        let stub = result_stub("bash", "call_7", "exit 0\nline 2\nline 3\n", 1234, true);
        assert!(
            stub.contains("bash returned 1234 tokens in 3 lines"),
            "{stub}"
        );
        assert!(stub.contains("\"exit 0\""), "{stub}");
        assert!(stub.contains(r#"recall {"id": "call_7"}"#), "{stub}");
        let stub = result_stub("bash", "call_7", "x", 1, false);
        assert!(!stub.contains("recall"), "{stub}");
    }

    #[test]
    fn long_argument_strings_are_elided_and_the_json_stays_an_object() {
        let args = serde_json::json!({"path": "a.py", "content": "x".repeat(5000)}).to_string();
        let short = shrink_arguments(&args, "c1", true).expect("shrunk");
        let v: Value = serde_json::from_str(&short).expect("json");
        assert_eq!(v["path"], "a.py");
        assert!(
            v["content"]
                .as_str()
                .is_some_and(|s| s.starts_with("[5000 bytes elided")),
            "{short}"
        );
        assert_eq!(shrink_arguments(r#"{"command":"ls"}"#, "c1", true), None);
        let broken = format!("{{\"content\": \"{}", "y".repeat(500));
        let fixed = shrink_arguments(&broken, "c1", false).expect("shrunk");
        assert!(serde_json::from_str::<Value>(&fixed).is_ok_and(|v| v.is_object()));
    }

    #[test]
    fn shorten_fits_the_token_count() {
        for tokenizer in [Tokenizer::O200kBase, Tokenizer::Estimate] {
            let c = TokenCounter::new(tokenizer);
            let text: String = (0..3000)
                .map(|i| format!("line {i}: some output\n"))
                .collect();
            for max in [50, 200, 1000] {
                let short = shorten(&text, max, &c);
                assert!(c.text(&short) <= max, "{} > {max}", c.text(&short));
                assert!(short.contains("cut from the middle"), "{short}");
                if max < 200 {
                    continue;
                }
                assert!(short.starts_with("line 0: some output\n"), "{short}");
                assert!(short.ends_with("line 2999: some output\n"), "{short}");
                assert!(short.contains("cut from the middle"), "{short}");
            }
            assert_eq!(shorten("short", 10, &c), "short");
        }
    }
}
