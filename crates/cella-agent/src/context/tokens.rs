//! Token counting: OpenAI's own BPE vocabularies (o200k_base, cl100k_base; embedded in the
//! binary by `tiktoken-rs`, nothing fetched at run time) for OpenAI-family models, and a
//! deliberately pessimistic estimate for every other model. Counts whole requests the way
//! providers bill them: every message with its role overhead, tool calls (id, name, arguments),
//! tool results (id, content) and the tool schemas.
//!
//! Owns the choice of tokenizer for a model name and the counting rules. Must not know budgets,
//! pruning or the loop.

use std::sync::LazyLock;

use cella_llm::{ChatRequest, Message, ToolSpec};
use tiktoken_rs::CoreBPE;

/// Which tokenizer counts a model's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1/o3/o4, gpt-oss.
    O200kBase,
    /// gpt-4, gpt-3.5-turbo, the older embeddings.
    Cl100kBase,
    /// Any other model: about 3 bytes per token (see [`estimate`]).
    Estimate,
}

impl Tokenizer {
    /// The tokenizer of `model` (a provider prefix such as `openai/` is ignored).
    pub fn for_model(model: &str) -> Self {
        let name = bare_model_name(model);
        let is = |prefix: &str| name.starts_with(prefix);
        if is("gpt-4o")
            || is("chatgpt-4o")
            || is("gpt-4.1")
            || is("gpt-4.5")
            || is("gpt-5")
            || is("gpt-oss")
            || is("o1")
            || is("o3")
            || is("o4")
            || is("codex-")
        {
            Self::O200kBase
        } else if is("gpt-4") || is("gpt-3.5") || is("gpt-35") || is("text-embedding-") {
            Self::Cl100kBase
        } else {
            Self::Estimate
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
            Self::Estimate => "estimate",
        }
    }
}

/// The model name without a provider or router prefix (`openai/gpt-4o` → `gpt-4o`),
/// lower-case.
pub fn bare_model_name(model: &str) -> String {
    model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .trim()
        .to_ascii_lowercase()
}

static O200K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::o200k_base().ok());
static CL100K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::cl100k_base().ok());

/// Tokens every message costs besides its content (role, separators), as OpenAI documents for
/// its chat models; the same overhead is assumed for the estimate.
pub const MESSAGE_OVERHEAD: u32 = 4;
/// Tokens each tool call adds besides its id, name and arguments.
const TOOL_CALL_OVERHEAD: u32 = 4;
/// Tokens priming the reply (`<|start|>assistant<|message|>`).
const REPLY_PRIMING: u32 = 3;
/// Tokens each tool definition adds besides its JSON.
const TOOL_OVERHEAD: u32 = 8;

/// Counts tokens for one model. Cheap to clone; the vocabularies load once per process.
#[derive(Clone, Copy)]
pub struct TokenCounter {
    tokenizer: Tokenizer,
    bpe: Option<&'static CoreBPE>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TokenCounter")
            .field(&self.effective())
            .finish()
    }
}

impl TokenCounter {
    pub fn new(tokenizer: Tokenizer) -> Self {
        let bpe = match tokenizer {
            Tokenizer::O200kBase => O200K.as_ref(),
            Tokenizer::Cl100kBase => CL100K.as_ref(),
            Tokenizer::Estimate => None,
        };
        Self { tokenizer, bpe }
    }

    pub fn for_model(model: &str) -> Self {
        Self::new(Tokenizer::for_model(model))
    }

    /// The tokenizer actually used (the estimate if a vocabulary failed to load).
    pub fn effective(&self) -> Tokenizer {
        if self.bpe.is_some() {
            self.tokenizer
        } else {
            Tokenizer::Estimate
        }
    }

    /// Whether counts are the provider's own (a BPE vocabulary) rather than an estimate.
    pub fn is_exact(&self) -> bool {
        self.bpe.is_some()
    }

    /// Tokens of a text.
    pub fn text(&self, text: &str) -> u32 {
        let Some(bpe) = self.bpe else {
            return estimate(text);
        };
        let n: usize = bpe_segments(text)
            .map(|segment| bpe.encode_ordinary(segment).len())
            .sum();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Tokens of one message as sent: overhead, content, tool calls, tool call id.
    pub fn message(&self, message: &Message) -> u32 {
        let body = match message {
            Message::System { content } | Message::User { content } => self.text(content),
            Message::Assistant {
                content,
                tool_calls,
            } => tool_calls.iter().fold(self.text(content), |sum, call| {
                sum.saturating_add(TOOL_CALL_OVERHEAD)
                    .saturating_add(self.text(&call.id))
                    .saturating_add(self.text(&call.name))
                    .saturating_add(self.text(&call.arguments))
            }),
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => self.text(tool_call_id).saturating_add(self.text(content)),
        };
        MESSAGE_OVERHEAD.saturating_add(body)
    }

    /// Tokens of the tool definitions (their JSON: name, description, schema).
    pub fn tools(&self, tools: &[ToolSpec]) -> u32 {
        tools.iter().fold(0u32, |sum, tool| {
            let json = serde_json::to_string(tool).unwrap_or_default();
            sum.saturating_add(TOOL_OVERHEAD)
                .saturating_add(self.text(&json))
        })
    }

    /// Tokens of a whole request's prompt (messages, tools, reply priming).
    pub fn request(&self, request: &ChatRequest) -> u32 {
        request
            .messages
            .iter()
            .fold(REPLY_PRIMING, |sum, m| sum.saturating_add(self.message(m)))
            .saturating_add(self.tools(&request.tools))
    }
}

/// A pessimistic estimate for tokenizers we do not have, following how BPE tokenizers cut
/// text: a run of letters costs one token per 4 bytes (rounded up) or one per change of case
/// if that is more (identifiers, base64), digits one per 3, every punctuation mark or symbol
/// one, a line break or an indentation one, a character outside Latin, Greek and Cyrillic
/// scripts (CJK…) one; plus a fifth. Calibrated by a test against
/// o200k_base on prose, code, JSON, logs and non-Latin text: never below it there, and at most
/// about twice it (Anthropic's and open models' vocabularies are less compact than o200k_base,
/// so the slack is meant).
pub fn estimate(text: &str) -> u32 {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Digit,
        Space,
        Other,
    }
    let mut tokens = 0u64;
    /// A run of one class: its bytes, and line breaks (spaces) or case changes (letters).
    struct Run {
        class: Class,
        bytes: usize,
        marks: usize,
        last: char,
    }
    let mut run: Option<Run> = None;
    let close = |run: Option<Run>, tokens: &mut u64| match run {
        Some(Run {
            class: Class::Letter,
            bytes,
            marks,
            ..
        }) => *tokens += bytes.div_ceil(4).max(marks + 1) as u64,
        Some(Run {
            class: Class::Digit,
            bytes,
            ..
        }) => *tokens += bytes.div_ceil(3) as u64,
        Some(Run {
            class: Class::Space,
            bytes,
            marks,
            ..
        }) if marks > 0 || bytes > 1 => *tokens += 1,
        _ => {}
    };
    for c in text.chars() {
        let class = if c.is_ascii_digit() {
            Class::Digit
        } else if c.is_whitespace() {
            Class::Space
        } else if c.is_alphabetic() && (c.is_ascii() || u32::from(c) < 0x0530) {
            // Latin, Greek, Cyrillic (multi-byte letters count by their bytes).
            Class::Letter
        } else {
            Class::Other
        };
        if class == Class::Other {
            close(run.take(), &mut tokens);
            tokens += 1;
            continue;
        }
        match &mut run {
            Some(r) if r.class == class => {
                r.bytes += c.len_utf8();
                let mark = match class {
                    Class::Space => c == '\n',
                    _ => c.is_uppercase() != r.last.is_uppercase(),
                };
                r.marks += usize::from(mark);
                r.last = c;
            }
            _ => {
                close(run.take(), &mut tokens);
                run = Some(Run {
                    class,
                    bytes: c.len_utf8(),
                    marks: usize::from(c == '\n'),
                    last: c,
                });
            }
        }
    }
    close(run, &mut tokens);
    u32::try_from(tokens + tokens.div_ceil(5)).unwrap_or(u32::MAX)
}

/// Splits `text` so that no run without whitespace is longer than [`MAX_RUN`] bytes: BPE
/// merges within such a run cost more than linear time, and a megabyte of base64 in a tool
/// output must not stall the loop. Cutting a run adds at most one token per cut.
fn bpe_segments(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut run = 0usize;
        let mut cut = rest.len();
        for (i, c) in rest.char_indices() {
            if c.is_whitespace() {
                run = 0;
            } else {
                run += c.len_utf8();
                if run > MAX_RUN {
                    cut = i;
                    break;
                }
            }
        }
        let (segment, tail) = rest.split_at(cut);
        rest = tail;
        Some(segment)
    })
}

const MAX_RUN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use cella_llm::ToolCall;

    #[test]
    fn models_get_their_own_vocabulary() {
        for m in [
            "gpt-4o",
            "gpt-4o-mini-2024-07-18",
            "openai/gpt-4.1",
            "gpt-5-mini",
            "o3-mini",
            "o4-mini",
            "GPT-4O",
            "openrouter/openai/gpt-oss-120b",
        ] {
            assert_eq!(Tokenizer::for_model(m), Tokenizer::O200kBase, "{m}");
        }
        for m in ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo-0125"] {
            assert_eq!(Tokenizer::for_model(m), Tokenizer::Cl100kBase, "{m}");
        }
        for m in [
            "claude-sonnet-4-5",
            "qwen3:8b",
            "llama-3.3-70b",
            "fake-model",
        ] {
            assert_eq!(Tokenizer::for_model(m), Tokenizer::Estimate, "{m}");
        }
    }

    /// The token ids OpenAI's tiktoken gives (`enc.encode(text)`, as in OpenAI's cookbook "How to
    /// count tokens with tiktoken"): the embedded vocabularies are the real ones.
    #[test]
    fn bpe_tokens_match_tiktoken() {
        let o200k = TokenCounter::new(Tokenizer::O200kBase);
        let cl100k = TokenCounter::new(Tokenizer::Cl100kBase);
        assert!(o200k.is_exact() && cl100k.is_exact());
        let ids =
            |c: &TokenCounter, s: &str| c.bpe.map(|b| b.encode_ordinary(s)).unwrap_or_default();
        let cases: [(&str, &[u32], &[u32]); 5] = [
            ("hello world", &[24912, 2375], &[15339, 1917]),
            (
                "tiktoken is great!",
                &[83, 8251, 2488, 382, 2212, 0],
                &[83, 1609, 5963, 374, 2294, 0],
            ),
            (
                "antidisestablishmentarianism",
                &[493, 129901, 376, 160388, 21203, 2367],
                &[519, 85342, 34500, 479, 8997, 2191],
            ),
            (
                "2 + 2 = 4",
                &[17, 659, 220, 17, 314, 220, 19],
                &[17, 489, 220, 17, 284, 220, 19],
            ),
            (
                "お誕生日おめでとう",
                &[8930, 9697, 243, 128225, 8930, 17693, 4344, 48669],
                &[33334, 45918, 243, 21990, 9080, 33334, 62004, 16556, 78699],
            ),
        ];
        for (text, o, c) in cases {
            assert_eq!(ids(&o200k, text), o, "o200k_base {text:?}");
            assert_eq!(ids(&cl100k, text), c, "cl100k_base {text:?}");
            assert_eq!(o200k.text(text) as usize, o.len());
            assert_eq!(cl100k.text(text) as usize, c.len());
        }
        assert_eq!(o200k.text(""), 0);
    }

    #[test]
    fn messages_count_content_calls_ids_and_overhead() {
        let c = TokenCounter::new(Tokenizer::O200kBase);
        assert_eq!(
            c.message(&Message::user("hello world")),
            MESSAGE_OVERHEAD + 2
        );
        let call = Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "bash".into(),
                arguments: r#"{"command":"ls -la"}"#.into(),
            }],
        };
        let expected = MESSAGE_OVERHEAD
            + TOOL_CALL_OVERHEAD
            + c.text("call_1")
            + c.text("bash")
            + c.text(r#"{"command":"ls -la"}"#);
        assert_eq!(c.message(&call), expected);
        let result = Message::tool_result("call_1", "total 0\n");
        assert_eq!(
            c.message(&result),
            MESSAGE_OVERHEAD + c.text("call_1") + c.text("total 0\n")
        );
        let tools = [ToolSpec::new(
            "bash",
            "run a command",
            serde_json::json!({"type": "object"}),
        )];
        assert!(c.tools(&tools) > c.text("run a command"));
        let request = ChatRequest::new(vec![Message::user("hello world"), result.clone()])
            .with_tools(tools.to_vec());
        assert_eq!(
            c.request(&request),
            REPLY_PRIMING + MESSAGE_OVERHEAD + 2 + c.message(&result) + c.tools(&tools)
        );
    }

    /// The estimate must not undercount: checked against o200k_base on the kinds of text an agent
    /// sees.
    #[test]
    fn the_estimate_is_calibrated_to_never_undercount_typical_text() {
        let o200k = TokenCounter::new(Tokenizer::O200kBase);
        let samples = [
            "The quick brown fox jumps over the lazy dog. Sandboxes isolate untrusted code \
             from the host, and the agent works inside one through its tools.",
            "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(20)])\n",
            r#"{"id": "sbx_01", "state": "running", "metadata": {"team": "a", "cpu": 2}, "ports": [8080, 49983]}"#,
            "2026-11-22T02:36:00Z INFO cella_server::lifecycle: sandbox created id=sbx_9f3 template=base elapsed_ms=12\n\
             2026-11-22T02:36:01Z WARN cella_server::gateway: upstream closed early status=502\n",
            "Traceback (most recent call last):\n  File \"/home/user/app.py\", line 3, in <module>\n    main()\nZeroDivisionError: division by zero\n",
            "Über die Brücke gehen viele Menschen. Ça coûte très cher, n'est-ce pas?",
            "沙箱把不可信的代码与主机隔离开来。代理通过工具在沙箱内工作。",
            "ПЕСОЧНИЦА изолирует недоверенный код от хоста.",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3Y2VsbGEgc2FuZGJveCBhZ2VudCB0b2tlbiBlc3RpbWF0ZQ==",
            "602275de9c07bd5cfb2f9c8626ba2d0932f467b18242a1cd2622628d3153d71b 11f6ad8ec52a2984abaafd7c3b516503785c2072",
            "total 48\ndrwxr-xr-x 2 user user 4096 Nov 22 02:36 .\n-rw-r--r-- 1 user user  220 Nov 22 02:36 .bashrc\n",
        ];
        for s in samples {
            let exact = o200k.text(s);
            let est = estimate(s);
            assert!(est >= exact, "estimate {est} < o200k {exact} for {s:?}");
            assert!(
                est <= exact * 2 + 3,
                "estimate {est} wastes too much (o200k {exact}) for {s:?}"
            );
        }
    }

    #[test]
    fn long_runs_without_spaces_count_quickly_and_nearly_exactly() {
        let c = TokenCounter::new(Tokenizer::O200kBase);
        let blob = "QUJDRA".repeat(200_000); // 1.2 MB of base64-like text, no whitespace
        let started = std::time::Instant::now();
        let n = c.text(&blob);
        assert!(n > 100_000, "{n}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        // Cutting runs changes a count by at most one token per cut.
        let text = "word ".repeat(100) + &"ab".repeat(1000);
        let whole = c.bpe.map(|b| b.encode_ordinary(&text).len()).unwrap_or(0) as u32;
        let cut = c.text(&text);
        let cuts = (2000 / MAX_RUN) as u32 + 1;
        assert!(cut >= whole && cut <= whole + cuts, "{cut} vs {whole}");
        let pieces: String = bpe_segments(&text).collect();
        assert_eq!(pieces, text);
        let mixed = "é".repeat(1000);
        assert_eq!(bpe_segments(&mixed).collect::<String>(), mixed);
    }
}
