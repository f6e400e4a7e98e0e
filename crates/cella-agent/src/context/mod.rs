//! Context management: every prompt a run sends fits the model's context window, however long
//! the run's history grows.
//!
//! - [`tokens`]: token counts — OpenAI's BPE vocabularies for OpenAI-family models, a
//!   pessimistic estimate otherwise; messages, tool calls, tool results and tool schemas.
//! - [`budget`]: the model's window (known for common models, configurable), the answer's
//!   reserve, the prompt limit.
//! - [`turns`]: the history cut into units that are never split (a tool call with its result).
//! - [`prune`], [`summarize`]: eliding old tool outputs, summaries of older turns.
//! - [`compactor`]: the rules and their order (elide old outputs → summarise older turns →
//!   shorten the newest), with the user's messages and skill instructions never touched.
//! - [`recall`]: the `recall` tool and its [`Recall`] backend (in memory here; a job store
//!   provides a full-text one), so nothing elided is lost to the model.
//!
//! The history itself is never changed: only the prompt view is compacted; the caller keeps
//! the full history (the loop's message list, a job store's events).
//!
//! Must not know HTTP, stores or how events are shown.

pub mod budget;
pub mod compactor;
pub mod prune;
pub mod recall;
pub mod summarize;
pub mod tokens;
pub mod turns;

pub use budget::{Budget, ContextOptions, known_window};
pub use compactor::{Compaction, Compactor, ContextError, Plan, Prompt, SummaryJob};
pub use recall::{HistoryEntry, Hit, HitSource, MemoryRecall, Recall, RecallError, RecallTool};
pub use tokens::{TokenCounter, Tokenizer};

use cella_llm::{ModelConfig, WireFormat};

/// The compactor for `config`'s model under `options`; `recall` says whether the run offers the
/// `recall` tool.
pub fn compactor_for(config: &ModelConfig, options: &ContextOptions, recall: bool) -> Compactor {
    let counter = TokenCounter::for_model(&config.model);
    let budget = Budget::for_model(config, options, &counter);
    Compactor::new(counter, budget, options.clone(), config.model.clone())
        .with_recall(recall)
        .with_output_cap(output_cap(config, &budget))
}

/// `max_tokens` to put on prompts: the reserve, when the client would otherwise ask for more
/// (a configured `max_tokens`, Anthropic's default) than the window leaves.
fn output_cap(config: &ModelConfig, budget: &Budget) -> Option<u32> {
    let asked = config.max_tokens.or(match config.provider.wire_format() {
        WireFormat::AnthropicMessages => Some(ModelConfig::DEFAULT_ANTHROPIC_MAX_TOKENS),
        WireFormat::ChatCompletions => None,
    })?;
    (asked > budget.reserve).then_some(budget.reserve)
}

/// Bytes of one `recall` answer for a budget: about a quarter of the prompt budget, 1–16 KiB.
pub fn recall_answer_bytes(budget: &Budget) -> usize {
    (budget.limit as usize * 3 / 4).clamp(1024, 16 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cella_llm::Provider;

    #[test]
    fn answers_are_capped_only_when_the_client_would_ask_for_more_than_the_reserve() {
        let small = ContextOptions {
            window: Some(4096),
            ..ContextOptions::default()
        };
        // Anthropic always sends max_tokens (8192 by default): capped to the reserve.
        let c = compactor_for(
            &ModelConfig::new(Provider::Anthropic, "claude-x"),
            &small,
            true,
        );
        assert_eq!(c.budget().reserve, 1024);
        let p = match c.clone().plan(&[cella_llm::Message::user("hi")], &[]) {
            Ok(Plan::Ready(p)) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(p.request.max_tokens, Some(1024));
        // OpenAI-compatible without max_tokens: nothing is sent, nothing to cap.
        let c = compactor_for(
            &ModelConfig::new(Provider::OpenAi, "gpt-4o"),
            &ContextOptions::default(),
            true,
        );
        assert_eq!(
            output_cap(&ModelConfig::new(Provider::OpenAi, "gpt-4o"), &c.budget()),
            None
        );
        let mut config = ModelConfig::new(Provider::OpenAiCompatible, "m");
        config.max_tokens = Some(300);
        let c = compactor_for(&config, &small, true);
        assert_eq!(
            (c.budget().reserve, output_cap(&config, &c.budget())),
            (300, None)
        );
        assert_eq!(
            recall_answer_bytes(&c.budget()),
            c.budget().limit as usize * 3 / 4
        );
    }
}
