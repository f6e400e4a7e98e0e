//! Token usage of a model call and its cost from a price table.
//!
//! Owns the arithmetic only; where prices come from is `config.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Tokens counted by the provider for one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// All prompt tokens, including those served from a prompt cache.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` read from a prompt cache (information only; billed at the
    /// input price by `Price::cost`, so cost is an upper bound when caching is on).
    #[serde(default)]
    pub cached_input_tokens: u64,
}

impl Usage {
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another response's usage (for totals over a run).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
    }
}

/// USD per million tokens for one model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// USD per million input tokens.
    pub input: f64,
    /// USD per million output tokens.
    pub output: f64,
}

impl Price {
    /// The cost of `usage` in USD.
    pub fn cost(&self, usage: &Usage) -> f64 {
        // u64 → f64 loses precision only above 2^53 tokens.
        let (input, output) = (usage.input_tokens as f64, usage.output_tokens as f64);
        (input * self.input + output * self.output) / 1_000_000.0
    }
}

/// Prices by model name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable(pub BTreeMap<String, Price>);

impl PriceTable {
    /// The price of `model`, looked up as `provider/model` first, then as `model`.
    pub fn get(&self, provider: &str, model: &str) -> Option<Price> {
        self.0
            .get(&format!("{provider}/{model}"))
            .or_else(|| self.0.get(model))
            .copied()
    }

    pub fn insert(&mut self, model: impl Into<String>, price: Price) {
        self.0.insert(model.into(), price);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_per_million_tokens() {
        let price = Price {
            input: 3.0,
            output: 15.0,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 200_000,
            cached_input_tokens: 0,
        };
        assert!((price.cost(&usage) - 6.0).abs() < 1e-9);
        let small = Usage {
            input_tokens: 1234,
            output_tokens: 56,
            cached_input_tokens: 0,
        };
        // 1234 * 3 / 1e6 + 56 * 15 / 1e6 = 0.003702 + 0.00084
        assert!((price.cost(&small) - 0.004542).abs() < 1e-12);
        assert!(price.cost(&Usage::default()).abs() < f64::EPSILON);
    }

    #[test]
    fn lookup_prefers_provider_qualified_name() {
        let mut table = PriceTable::default();
        table.insert(
            "gpt-4.1",
            Price {
                input: 2.0,
                output: 8.0,
            },
        );
        table.insert(
            "openrouter/gpt-4.1",
            Price {
                input: 2.5,
                output: 9.0,
            },
        );
        assert_eq!(table.get("openai", "gpt-4.1").map(|p| p.input), Some(2.0));
        assert_eq!(
            table.get("openrouter", "gpt-4.1").map(|p| p.input),
            Some(2.5)
        );
        assert_eq!(table.get("openai", "gpt-5"), None);
    }

    #[test]
    fn usage_adds_saturating() {
        let mut total = Usage {
            input_tokens: u64::MAX - 1,
            output_tokens: 1,
            cached_input_tokens: 0,
        };
        total.add(&Usage {
            input_tokens: 5,
            output_tokens: 2,
            cached_input_tokens: 1,
        });
        assert_eq!(total.input_tokens, u64::MAX);
        assert_eq!(total.output_tokens, 3);
        assert_eq!(total.total_tokens(), u64::MAX);
    }
}
