//! The token budget of a prompt: the model's context window (known for common models,
//! configurable for any), less what is reserved for the answer, less a safety margin when counts
//! are estimates.
//!
//! Owns the table of context windows and the arithmetic. Must not know messages or pruning.

use cella_llm::{ModelConfig, WireFormat};
use serde::{Deserialize, Serialize};

use super::tokens::{TokenCounter, bare_model_name};

/// Context settings of a run (`cella run --context-window …`, a job's limits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextOptions {
    /// The model's context window in tokens; `None` looks the model up in [`known_window`].
    pub window: Option<u32>,
    /// Tokens kept free for the answer; `None`: the configured `max_tokens`, else 8192
    /// (Anthropic's default), at most a quarter of the window.
    pub reserve: Option<u32>,
    /// When a prompt goes over budget, compaction brings it down to this share of the budget,
    /// so that the next turns fit without compacting again (0.5–1.0).
    pub compact_to: f64,
    /// Share of the budget the newest turns may take and still be kept verbatim (they are
    /// shortened only as a last resort).
    pub recent_share: f64,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            window: None,
            reserve: None,
            compact_to: 0.7,
            recent_share: 0.5,
        }
    }
}

/// The window of a model cella does not know.
pub const FALLBACK_WINDOW: u32 = 32_768;
/// The answer reserve when nothing is configured.
pub const DEFAULT_RESERVE: u32 = 8_192;

/// The budget of one model's prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// The context window (prompt + answer).
    pub window: u32,
    /// Tokens kept for the answer; the request's `max_tokens` is set to at most this.
    pub reserve: u32,
    /// Most tokens a prompt may have (window − reserve − margin).
    pub limit: u32,
    /// Whether the window came from the table or the options (false: [`FALLBACK_WINDOW`]).
    pub known: bool,
}

impl Budget {
    /// The budget for `config`'s model under `options`, counted by `counter`.
    pub fn for_model(
        config: &ModelConfig,
        options: &ContextOptions,
        counter: &TokenCounter,
    ) -> Self {
        let (window, known) = match options.window.or_else(|| known_window(&config.model)) {
            Some(w) => (w, true),
            None => (FALLBACK_WINDOW, false),
        };
        let configured =
            options
                .reserve
                .or(config.max_tokens)
                .or(match config.provider.wire_format() {
                    WireFormat::AnthropicMessages => {
                        Some(ModelConfig::DEFAULT_ANTHROPIC_MAX_TOKENS)
                    }
                    WireFormat::ChatCompletions => None,
                });
        let reserve = configured.unwrap_or(DEFAULT_RESERVE).min(window / 4).max(1);
        Self::new(window, reserve, counter.is_exact(), known)
    }

    /// `window − reserve − margin`: 2 % for exact counts (providers add a few tokens of their
    /// own framing), 10 % for estimates.
    pub fn new(window: u32, reserve: u32, exact: bool, known: bool) -> Self {
        let usable = window.saturating_sub(reserve);
        let margin = if exact { usable / 50 } else { usable / 10 };
        Self {
            window,
            reserve,
            limit: usable.saturating_sub(margin),
            known,
        }
    }
}

/// The context window of well-known models (prompt + answer, in tokens), by the model's bare
/// name (provider prefixes and `:tag`s of local servers ignored). Sources: the providers'
/// model pages.
pub fn known_window(model: &str) -> Option<u32> {
    let name = bare_model_name(model);
    let is = |prefix: &str| name.starts_with(prefix);
    Some(if is("gpt-4.1") {
        1_047_576
    } else if is("gpt-5") {
        400_000
    } else if is("gpt-4o") || is("chatgpt-4o") || is("gpt-4.5") || is("gpt-4-turbo") {
        128_000
    } else if is("gpt-4-32k") {
        32_768
    } else if is("gpt-4-1106") || is("gpt-4-0125") {
        128_000
    } else if is("gpt-4") {
        8_192
    } else if is("gpt-3.5-turbo") {
        16_385
    } else if is("o1-mini") {
        128_000
    } else if is("o1") || is("o3") || is("o4") {
        200_000
    } else if is("gpt-oss") {
        131_072
    } else if is("claude") {
        200_000
    } else if is("gemini-1.5-pro") {
        2_097_152
    } else if is("gemini") {
        1_048_576
    } else if [
        "llama3.1",
        "llama-3.1",
        "llama3.2",
        "llama-3.2",
        "llama3.3",
        "llama-3.3",
        "llama-4",
    ]
    .iter()
    .any(|p| is(p))
    {
        131_072
    } else if is("qwen3") {
        40_960
    } else if is("qwen2.5") || is("mistral") || is("mixtral") {
        32_768
    } else if is("deepseek") {
        128_000
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tokens::Tokenizer;
    use cella_llm::Provider;

    #[test]
    fn common_models_have_known_windows() {
        assert_eq!(known_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(known_window("openai/gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(known_window("gpt-5"), Some(400_000));
        assert_eq!(known_window("gpt-4"), Some(8_192));
        assert_eq!(known_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known_window("o3-mini"), Some(200_000));
        assert_eq!(known_window("qwen3:8b"), Some(40_960));
        assert_eq!(known_window("my-finetune"), None);
    }

    #[test]
    fn the_budget_leaves_room_for_the_answer_and_a_margin() {
        let exact = TokenCounter::new(Tokenizer::O200kBase);
        let config = ModelConfig::new(Provider::OpenAi, "gpt-4o");
        let b = Budget::for_model(&config, &ContextOptions::default(), &exact);
        assert_eq!((b.window, b.reserve, b.known), (128_000, 8_192, true));
        assert_eq!(b.limit, 128_000 - 8_192 - (128_000 - 8_192) / 50);

        // A configured window and max_tokens win; the reserve never exceeds a quarter.
        let mut config = ModelConfig::new(Provider::OpenAiCompatible, "local");
        config.max_tokens = Some(512);
        let options = ContextOptions {
            window: Some(4096),
            ..ContextOptions::default()
        };
        let estimate = TokenCounter::new(Tokenizer::Estimate);
        let b = Budget::for_model(&config, &options, &estimate);
        assert_eq!((b.window, b.reserve), (4096, 512));
        assert_eq!(b.limit, 3584 - 358);
        let anthropic = ModelConfig::new(Provider::Anthropic, "claude-x");
        let b = Budget::for_model(&anthropic, &options, &estimate);
        assert_eq!(b.reserve, 1024);

        // Unknown models fall back, and say so.
        let b = Budget::for_model(
            &ModelConfig::new(Provider::OpenAiCompatible, "mystery"),
            &ContextOptions::default(),
            &estimate,
        );
        assert_eq!((b.window, b.known), (FALLBACK_WINDOW, false));
    }
}
