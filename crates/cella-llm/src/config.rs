//! Model configuration: which provider, model, endpoint, key and limits a client uses, resolved
//! from three layers — the `[model]` table of `cella.toml`, the environment, and explicit values
//! (command-line flags) — each overriding the one before.
//!
//! Owns the provider list with its default endpoints and key variables. Must not do any I/O
//! besides reading the `cella.toml` it is pointed at; the environment is read through a lookup
//! function so tests never touch the process environment.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::usage::{Price, PriceTable};

/// A model provider. Every provider except Anthropic speaks the OpenAI-compatible chat
/// completions format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Provider {
    OpenAi,
    Anthropic,
    Groq,
    OpenRouter,
    /// Gemini through its OpenAI-compatible endpoint.
    Gemini,
    Ollama,
    Vllm,
    /// The llama.cpp server (`llama-server`).
    LlamaCpp,
    LmStudio,
    /// Any other OpenAI-compatible server; needs a base URL.
    OpenAiCompatible,
}

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    /// `POST {base}/chat/completions`.
    ChatCompletions,
    /// `POST {base}/v1/messages`.
    AnthropicMessages,
}

impl Provider {
    pub const ALL: [Provider; 10] = [
        Provider::OpenAi,
        Provider::Anthropic,
        Provider::Groq,
        Provider::OpenRouter,
        Provider::Gemini,
        Provider::Ollama,
        Provider::Vllm,
        Provider::LlamaCpp,
        Provider::LmStudio,
        Provider::OpenAiCompatible,
    ];

    /// The name used in `CELLA_MODEL=name/model` and in `cella.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Groq => "groq",
            Self::OpenRouter => "openrouter",
            Self::Gemini => "gemini",
            Self::Ollama => "ollama",
            Self::Vllm => "vllm",
            Self::LlamaCpp => "llamacpp",
            Self::LmStudio => "lmstudio",
            Self::OpenAiCompatible => "openai-compatible",
        }
    }

    pub fn wire_format(self) -> WireFormat {
        match self {
            Self::Anthropic => WireFormat::AnthropicMessages,
            _ => WireFormat::ChatCompletions,
        }
    }

    /// The endpoint used when none is configured. For Anthropic it is the host only (the client
    /// appends `/v1/messages`); for the others it ends in the API version (the client appends
    /// `/chat/completions`).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::OpenAi => Some("https://api.openai.com/v1"),
            Self::Anthropic => Some("https://api.anthropic.com"),
            Self::Groq => Some("https://api.groq.com/openai/v1"),
            Self::OpenRouter => Some("https://openrouter.ai/api/v1"),
            Self::Gemini => Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            Self::Ollama => Some("http://localhost:11434/v1"),
            Self::Vllm => Some("http://localhost:8000/v1"),
            Self::LlamaCpp => Some("http://localhost:8080/v1"),
            Self::LmStudio => Some("http://localhost:1234/v1"),
            Self::OpenAiCompatible => None,
        }
    }

    /// The environment variable holding this provider's key, for hosted providers.
    pub fn api_key_var(self) -> Option<&'static str> {
        match self {
            Self::OpenAi => Some("OPENAI_API_KEY"),
            Self::Anthropic => Some("ANTHROPIC_API_KEY"),
            Self::Groq => Some("GROQ_API_KEY"),
            Self::OpenRouter => Some("OPENROUTER_API_KEY"),
            Self::Gemini => Some("GEMINI_API_KEY"),
            _ => None,
        }
    }

    fn names() -> String {
        Self::ALL
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Provider {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let provider = match s.trim().to_ascii_lowercase().as_str() {
            "openai" => Self::OpenAi,
            "anthropic" | "claude" => Self::Anthropic,
            "groq" => Self::Groq,
            "openrouter" => Self::OpenRouter,
            "gemini" | "google" => Self::Gemini,
            "ollama" => Self::Ollama,
            "vllm" => Self::Vllm,
            "llamacpp" | "llama.cpp" | "llama-cpp" => Self::LlamaCpp,
            "lmstudio" | "lm-studio" => Self::LmStudio,
            "openai-compatible" | "openai_compatible" | "custom" => Self::OpenAiCompatible,
            _ => {
                return Err(ConfigError::UnknownProvider {
                    name: s.to_owned(),
                    known: Self::names(),
                });
            }
        };
        Ok(provider)
    }
}

impl TryFrom<String> for Provider {
    type Error = ConfigError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<Provider> for String {
    fn from(value: Provider) -> Self {
        value.as_str().to_owned()
    }
}

/// An API key; never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the request header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Why no usable model configuration could be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error(
        "no model configured: set CELLA_MODEL (e.g. CELLA_MODEL=anthropic/claude-sonnet-4-5 or \
         openai/gpt-4.1), pass --model, or set `model` in the [model] table of cella.toml"
    )]
    NoModel,

    #[error(
        "model {model:?} names no provider: write it as provider/model (e.g. openai/{model}) in \
         CELLA_MODEL or --model, or set `provider` in [model] of cella.toml; providers: {known}"
    )]
    NoProvider { model: String, known: String },

    #[error("unknown model provider {name:?}; known providers: {known}")]
    UnknownProvider { name: String, known: String },

    #[error(
        "no api key for {provider}: set {var} (or CELLA_MODEL_API_KEY, or `api_key` in [model] of \
         cella.toml)"
    )]
    NoApiKey {
        provider: Provider,
        var: &'static str,
    },

    #[error(
        "provider {provider} has no default endpoint: set CELLA_BASE_URL or `base_url` in \
         [model] of cella.toml"
    )]
    NoBaseUrl { provider: Provider },

    #[error("invalid base url {url:?} for {provider}: {reason}")]
    BadBaseUrl {
        provider: Provider,
        url: String,
        reason: &'static str,
    },

    #[error("could not read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },

    #[error("invalid [model] table in {origin}: {message}")]
    Toml { origin: String, message: String },
}

/// One layer of model settings, every field optional: the `[model]` table of `cella.toml`, the
/// environment, or explicit values (flags).
///
/// In `cella.toml`:
///
/// ```toml
/// [model]
/// model = "anthropic/claude-sonnet-4-5"   # or provider = "anthropic" + model = "claude-sonnet-4-5"
/// # base_url = "https://proxy.example/anthropic"
/// # api_key = "..."                       # better: ANTHROPIC_API_KEY in the environment
/// timeout_secs = 300
/// max_retries = 3
/// max_tokens = 8192
/// [model.headers]
/// "HTTP-Referer" = "https://example.org"
/// [model.prices."claude-sonnet-4-5"]      # USD per million tokens
/// input = 3.0
/// output = 15.0
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub provider: Option<Provider>,
    /// `provider/model` shorthand, or a bare model name when `provider` is set here or in a lower
    /// layer. A first segment that is not a provider name is part of the model name
    /// (`meta-llama/Llama-3.1-8B` for vLLM).
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<ApiKey>,
    /// Extra request headers (OpenRouter's `HTTP-Referer`, a proxy's auth header, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Per-request timeout: for the response headers, for each gap in a stream, and for a whole
    /// non-streamed body.
    pub timeout_secs: Option<u64>,
    /// Retries after the first attempt, on 408/409/429/5xx and connection errors.
    pub max_retries: Option<u32>,
    /// The first backoff; doubled each retry, with jitter.
    pub retry_backoff_ms: Option<u64>,
    /// The longest wait before a retry; a `Retry-After` longer than this fails at once.
    pub max_retry_wait_secs: Option<u64>,
    /// Default cap on output tokens (Anthropic requires one; 8192 when unset).
    pub max_tokens: Option<u32>,
    /// USD per million input/output tokens, by model name (`claude-sonnet-4-5`) or
    /// `provider/model`.
    #[serde(default, skip_serializing_if = "PriceTable::is_empty")]
    pub prices: PriceTable,
}

#[derive(Deserialize)]
struct CellaToml {
    #[serde(default)]
    model: Option<ModelSettings>,
}

impl ModelSettings {
    /// The `[model]` table of a `cella.toml` text (other tables are ignored; no table gives the
    /// empty layer). `origin` names the text in errors (its path).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let parsed: CellaToml = toml::from_str(text).map_err(|e| ConfigError::Toml {
            origin: origin.to_owned(),
            message: e.to_string().trim().to_owned(),
        })?;
        Ok(parsed.model.unwrap_or_default())
    }

    /// The `[model]` table of the `cella.toml` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// The environment layer: `CELLA_MODEL`, `CELLA_BASE_URL`, `CELLA_MODEL_API_KEY`. Provider keys
    /// (`OPENAI_API_KEY`, …) and `OLLAMA_HOST` depend on the resolved provider and are read by
    /// [`ModelConfig::resolve`]. Empty values count as unset.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            model: non_empty(env, "CELLA_MODEL"),
            base_url: non_empty(env, "CELLA_BASE_URL"),
            api_key: non_empty(env, "CELLA_MODEL_API_KEY").map(ApiKey),
            ..Self::default()
        }
    }

    /// `(provider, model)` this layer sets, after splitting the shorthand.
    fn provider_and_model(&self) -> Result<(Option<Provider>, Option<String>), ConfigError> {
        let Some(model) = self.model.as_deref().map(str::trim) else {
            return Ok((self.provider, None));
        };
        if model.is_empty() {
            return Ok((self.provider, None));
        }
        if self.provider.is_some() {
            return Ok((self.provider, Some(model.to_owned())));
        }
        if let Some((prefix, rest)) = model.split_once('/')
            && let Ok(provider) = prefix.parse::<Provider>()
        {
            let rest = rest.trim();
            if rest.is_empty() {
                return Err(ConfigError::NoModel);
            }
            return Ok((Some(provider), Some(rest.to_owned())));
        }
        Ok((None, Some(model.to_owned())))
    }
}

fn non_empty(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<String> {
    env(var)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A resolved, usable model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub provider: Provider,
    /// The model name as the provider knows it (no provider prefix).
    pub model: String,
    /// No trailing slash. See [`Provider::default_base_url`] for what the client appends.
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    pub headers: BTreeMap<String, String>,
    pub timeout: Duration,
    pub max_retries: u32,
    pub retry_backoff: Duration,
    pub max_retry_wait: Duration,
    pub max_tokens: Option<u32>,
    pub prices: PriceTable,
}

impl ModelConfig {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
    pub const DEFAULT_MAX_RETRIES: u32 = 3;
    pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(500);
    pub const DEFAULT_MAX_RETRY_WAIT: Duration = Duration::from_secs(60);
    /// Output cap sent to Anthropic when neither the request nor the config sets one.
    pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 8192;

    /// A configuration with the provider's default endpoint, no key and default limits; for
    /// programmatic use and tests (`with_base_url`, `with_api_key`, … adjust it).
    pub fn new(provider: Provider, model: impl Into<String>) -> Self {
        Self {
            provider,
            model: model.into(),
            base_url: provider
                .default_base_url()
                .unwrap_or("http://localhost:8000/v1")
                .to_owned(),
            api_key: None,
            headers: BTreeMap::new(),
            timeout: Self::DEFAULT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            retry_backoff: Self::DEFAULT_RETRY_BACKOFF,
            max_retry_wait: Self::DEFAULT_MAX_RETRY_WAIT,
            max_tokens: None,
            prices: PriceTable::default(),
        }
    }

    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into().trim_end_matches('/').to_owned();
        self
    }

    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn with_retries(mut self, max_retries: u32, backoff: Duration) -> Self {
        self.max_retries = max_retries;
        self.retry_backoff = backoff;
        self
    }

    pub fn with_max_retry_wait(mut self, wait: Duration) -> Self {
        self.max_retry_wait = wait;
        self
    }

    pub fn with_price(mut self, model: impl Into<String>, price: Price) -> Self {
        self.prices.insert(model, price);
        self
    }

    /// The price of the configured model, if the table has one.
    pub fn price(&self) -> Option<Price> {
        self.prices.get(self.provider.as_str(), &self.model)
    }

    /// Reads `cella_toml` (when given) and the process environment, and applies `explicit`
    /// (flags) on top.
    pub fn load(cella_toml: Option<&Path>, explicit: ModelSettings) -> Result<Self, ConfigError> {
        let file = match cella_toml {
            Some(path) => ModelSettings::from_file(path)?,
            None => ModelSettings::default(),
        };
        Self::resolve(file, &|var| std::env::var(var).ok(), explicit)
    }

    /// Resolves the three layers: `explicit` over the environment (read through `env`) over
    /// `file`, then defaults.
    pub fn resolve(
        file: ModelSettings,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: ModelSettings,
    ) -> Result<Self, ConfigError> {
        let env_layer = ModelSettings::from_env(env);
        let layers = [&file, &env_layer, &explicit];

        let mut provider = None;
        let mut model = None;
        let mut unknown_prefix = false;
        for layer in layers {
            let (p, m) = layer.provider_and_model()?;
            if p.is_some() {
                provider = p;
            }
            if m.is_some() {
                unknown_prefix = p.is_none() && m.as_deref().is_some_and(|m| m.contains('/'));
                model = m;
            }
        }
        let model = model.ok_or(ConfigError::NoModel)?;
        let provider = match provider {
            Some(p) => p,
            None if unknown_prefix => {
                let name = model.split('/').next().unwrap_or_default().to_owned();
                return Err(ConfigError::UnknownProvider {
                    name,
                    known: Provider::names(),
                });
            }
            None => {
                return Err(ConfigError::NoProvider {
                    model,
                    known: Provider::names(),
                });
            }
        };

        let ollama_host = (provider == Provider::Ollama)
            .then(|| non_empty(env, "OLLAMA_HOST").map(|h| ollama_base_url(&h)))
            .flatten();
        let configured_base = explicit
            .base_url
            .clone()
            .or(env_layer.base_url.clone())
            .or(ollama_host)
            .or(file.base_url.clone());
        let is_default_endpoint = configured_base.is_none();
        let base_url = match configured_base {
            Some(url) => url,
            None => provider
                .default_base_url()
                .ok_or(ConfigError::NoBaseUrl { provider })?
                .to_owned(),
        };
        let mut base_url = base_url.trim().trim_end_matches('/').to_owned();
        // Ollama's OpenAI-compatible API lives under /v1; people often give just the host.
        if provider == Provider::Ollama && !base_url.ends_with("/v1") {
            base_url.push_str("/v1");
        }
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ConfigError::BadBaseUrl {
                provider,
                url: base_url,
                reason: "it must start with http:// or https://",
            });
        }

        let provider_key = provider
            .api_key_var()
            .and_then(|var| non_empty(env, var))
            .map(ApiKey);
        let api_key = explicit
            .api_key
            .clone()
            .or(env_layer.api_key.clone())
            .or(provider_key)
            .or(file.api_key.clone())
            .filter(|k| !k.expose().trim().is_empty());
        if api_key.is_none()
            && is_default_endpoint
            && let Some(var) = provider.api_key_var()
        {
            return Err(ConfigError::NoApiKey { provider, var });
        }

        let mut headers = file.headers.clone();
        headers.extend(explicit.headers.clone());
        let mut prices = file.prices.clone();
        prices.0.extend(explicit.prices.0.clone());

        let pick_u64 = |f: fn(&ModelSettings) -> Option<u64>| f(&explicit).or(f(&file));
        Ok(Self {
            provider,
            model,
            base_url,
            api_key,
            headers,
            timeout: pick_u64(|s| s.timeout_secs)
                .map_or(Self::DEFAULT_TIMEOUT, Duration::from_secs),
            max_retries: explicit
                .max_retries
                .or(file.max_retries)
                .unwrap_or(Self::DEFAULT_MAX_RETRIES),
            retry_backoff: pick_u64(|s| s.retry_backoff_ms)
                .map_or(Self::DEFAULT_RETRY_BACKOFF, Duration::from_millis),
            max_retry_wait: pick_u64(|s| s.max_retry_wait_secs)
                .map_or(Self::DEFAULT_MAX_RETRY_WAIT, Duration::from_secs),
            max_tokens: explicit.max_tokens.or(file.max_tokens),
            prices,
        })
    }
}

/// The OpenAI-compatible endpoint for an `OLLAMA_HOST` value (`host`, `host:port`, or a URL).
fn ollama_base_url(host: &str) -> String {
    let host = host.trim().trim_end_matches('/');
    // Like Ollama's own client: no scheme means http on port 11434; an explicit scheme keeps
    // that scheme's default port.
    let (scheme, rest, default_port) = match host.split_once("://") {
        Some((scheme, rest)) => (scheme.to_owned(), rest.to_owned(), None),
        None => ("http".to_owned(), host.to_owned(), Some(11434)),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a.to_owned(), format!("/{p}")),
        None => (rest, String::new()),
    };
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` has colons but no port; `[::1]:11434` has one.
        Some((left, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!left.contains(':') || left.ends_with(']'))
        }
        None => false,
    };
    let authority = match default_port {
        Some(port) if !has_port => format!("{authority}:{port}"),
        _ => authority,
    };
    let path = path.trim_end_matches("/v1").to_owned();
    format!("{scheme}://{authority}{path}/v1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn resolve(
        file: ModelSettings,
        env: &[(&str, &str)],
        explicit: ModelSettings,
    ) -> Result<ModelConfig, ConfigError> {
        ModelConfig::resolve(file, &env_of(env), explicit)
    }

    fn model_flag(model: &str) -> ModelSettings {
        ModelSettings {
            model: Some(model.to_owned()),
            ..ModelSettings::default()
        }
    }

    #[test]
    fn shorthand_from_env_picks_provider_key_and_default_endpoint() {
        let cfg = resolve(
            ModelSettings::default(),
            &[
                ("CELLA_MODEL", "anthropic/claude-sonnet-4-5"),
                ("ANTHROPIC_API_KEY", "sk-ant"),
                ("OPENAI_API_KEY", "sk-openai"),
            ],
            ModelSettings::default(),
        )
        .expect("config");
        assert_eq!(cfg.provider, Provider::Anthropic);
        assert_eq!(cfg.model, "claude-sonnet-4-5");
        assert_eq!(cfg.base_url, "https://api.anthropic.com");
        assert_eq!(cfg.api_key.as_ref().map(ApiKey::expose), Some("sk-ant"));
        assert_eq!(cfg.timeout, ModelConfig::DEFAULT_TIMEOUT);
        assert_eq!(cfg.max_retries, ModelConfig::DEFAULT_MAX_RETRIES);
        assert!(
            !format!("{cfg:?}").contains("sk-ant"),
            "key must be redacted"
        );
    }

    #[test]
    fn each_hosted_provider_has_its_endpoint_and_key_variable() {
        let cases = [
            (
                "openai/gpt-4.1",
                "OPENAI_API_KEY",
                "https://api.openai.com/v1",
                "gpt-4.1",
            ),
            (
                "groq/llama-3.3-70b-versatile",
                "GROQ_API_KEY",
                "https://api.groq.com/openai/v1",
                "llama-3.3-70b-versatile",
            ),
            (
                "openrouter/anthropic/claude-sonnet-4.5",
                "OPENROUTER_API_KEY",
                "https://openrouter.ai/api/v1",
                "anthropic/claude-sonnet-4.5",
            ),
            (
                "gemini/gemini-2.5-flash",
                "GEMINI_API_KEY",
                "https://generativelanguage.googleapis.com/v1beta/openai",
                "gemini-2.5-flash",
            ),
        ];
        for (shorthand, var, base, model) in cases {
            let cfg = resolve(
                ModelSettings::default(),
                &[("CELLA_MODEL", shorthand), (var, "k")],
                ModelSettings::default(),
            )
            .expect(shorthand);
            assert_eq!(cfg.base_url, base, "{shorthand}");
            assert_eq!(cfg.model, model, "{shorthand}");
            assert_eq!(cfg.provider.wire_format(), WireFormat::ChatCompletions);
            // Without the key it fails naming the variable.
            let err = resolve(
                ModelSettings::default(),
                &[("CELLA_MODEL", shorthand)],
                ModelSettings::default(),
            )
            .expect_err("no key");
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn ollama_needs_no_key_and_honours_ollama_host() {
        let cfg = resolve(
            ModelSettings::default(),
            &[("CELLA_MODEL", "ollama/qwen3:8b")],
            ModelSettings::default(),
        )
        .expect("config");
        assert_eq!(cfg.model, "qwen3:8b");
        assert_eq!(cfg.base_url, "http://localhost:11434/v1");
        assert_eq!(cfg.api_key, None);

        for (host, want) in [
            ("gpu-box:11500", "http://gpu-box:11500/v1"),
            ("10.1.2.3", "http://10.1.2.3:11434/v1"),
            ("https://ollama.example/", "https://ollama.example/v1"),
            ("http://h:1/v1", "http://h:1/v1"),
            ("[::1]", "http://[::1]:11434/v1"),
            ("[::1]:9", "http://[::1]:9/v1"),
        ] {
            let cfg = resolve(
                ModelSettings::default(),
                &[("CELLA_MODEL", "ollama/qwen3:8b"), ("OLLAMA_HOST", host)],
                ModelSettings::default(),
            )
            .expect("config");
            assert_eq!(cfg.base_url, want, "OLLAMA_HOST={host}");
        }
    }

    #[test]
    fn ollama_base_url_gets_its_v1() {
        let cfg = resolve(
            ModelSettings::default(),
            &[
                ("CELLA_MODEL", "ollama/llama3.2"),
                ("CELLA_BASE_URL", "http://gpu:11434/"),
            ],
            ModelSettings::default(),
        )
        .expect("config");
        assert_eq!(cfg.base_url, "http://gpu:11434/v1");
    }

    #[test]
    fn no_model_names_the_variable_and_the_flag() {
        let err =
            resolve(ModelSettings::default(), &[], ModelSettings::default()).expect_err("no model");
        let msg = err.to_string();
        assert!(
            msg.contains("CELLA_MODEL") && msg.contains("--model"),
            "{msg}"
        );
    }

    #[test]
    fn bare_or_misspelt_model_names_are_clear_errors() {
        let err = resolve(
            ModelSettings::default(),
            &[("CELLA_MODEL", "gpt-4.1")],
            model_flag(""),
        )
        .expect_err("no provider");
        assert!(matches!(err, ConfigError::NoProvider { .. }), "{err}");
        assert!(err.to_string().contains("openai/gpt-4.1"), "{err}");

        let err = resolve(
            ModelSettings::default(),
            &[("CELLA_MODEL", "antropic/claude-sonnet-4-5")],
            ModelSettings::default(),
        )
        .expect_err("typo");
        assert!(err.to_string().contains("\"antropic\""), "{err}");

        let err = resolve(
            ModelSettings::default(),
            &[("CELLA_MODEL", "anthropic/")],
            ModelSettings::default(),
        )
        .expect_err("empty model");
        assert!(matches!(err, ConfigError::NoModel));
    }

    #[test]
    fn flags_override_env_which_overrides_file() {
        let file = ModelSettings::from_toml_str(
            r#"
            [server]
            listen = "0.0.0.0:3000"

            [model]
            model = "openai/gpt-4.1-mini"
            base_url = "https://file.example/v1/"
            api_key = "file-key"
            timeout_secs = 30
            max_retries = 7
            retry_backoff_ms = 10
            max_retry_wait_secs = 5
            max_tokens = 1000

            [model.headers]
            "HTTP-Referer" = "https://cella.example"
            "X-Title" = "cella"

            [model.prices."gpt-4.1"]
            input = 2.0
            output = 8.0
            "#,
            "cella.toml",
        )
        .expect("toml");

        // File alone.
        let cfg = resolve(file.clone(), &[], ModelSettings::default()).expect("file");
        assert_eq!(
            (cfg.provider, cfg.model.as_str()),
            (Provider::OpenAi, "gpt-4.1-mini")
        );
        assert_eq!(cfg.base_url, "https://file.example/v1");
        assert_eq!(cfg.api_key.as_ref().map(ApiKey::expose), Some("file-key"));
        assert_eq!(cfg.timeout, Duration::from_secs(30));
        assert_eq!(cfg.max_retries, 7);
        assert_eq!(cfg.retry_backoff, Duration::from_millis(10));
        assert_eq!(cfg.max_retry_wait, Duration::from_secs(5));
        assert_eq!(cfg.max_tokens, Some(1000));
        assert_eq!(cfg.headers.len(), 2);
        assert_eq!(cfg.price(), None, "gpt-4.1-mini has no price");

        // Env over file.
        let env = [
            ("CELLA_MODEL", "openai/gpt-4.1"),
            ("CELLA_BASE_URL", "https://env.example/v1"),
            ("OPENAI_API_KEY", "env-key"),
        ];
        let cfg = resolve(file.clone(), &env, ModelSettings::default()).expect("env");
        assert_eq!(cfg.model, "gpt-4.1");
        assert_eq!(cfg.base_url, "https://env.example/v1");
        assert_eq!(cfg.api_key.as_ref().map(ApiKey::expose), Some("env-key"));
        assert_eq!(
            cfg.price(),
            Some(Price {
                input: 2.0,
                output: 8.0
            })
        );

        // Flags over env.
        let flags = ModelSettings {
            model: Some("anthropic/claude-haiku-4-5".to_owned()),
            base_url: Some("http://127.0.0.1:9/".to_owned()),
            api_key: Some(ApiKey::new("flag-key")),
            max_retries: Some(0),
            ..ModelSettings::default()
        };
        let cfg = resolve(file, &env, flags).expect("flags");
        assert_eq!(cfg.provider, Provider::Anthropic);
        assert_eq!(cfg.model, "claude-haiku-4-5");
        assert_eq!(cfg.base_url, "http://127.0.0.1:9");
        assert_eq!(cfg.api_key.as_ref().map(ApiKey::expose), Some("flag-key"));
        assert_eq!(cfg.max_retries, 0);
    }

    #[test]
    fn provider_in_one_layer_and_bare_model_in_another() {
        let file = ModelSettings::from_toml_str(
            "[model]\nprovider = \"vllm\"\nmodel = \"meta-llama/Llama-3.1-8B-Instruct\"\n",
            "cella.toml",
        )
        .expect("toml");
        let cfg = resolve(file.clone(), &[], ModelSettings::default()).expect("vllm");
        assert_eq!(cfg.provider, Provider::Vllm);
        assert_eq!(cfg.model, "meta-llama/Llama-3.1-8B-Instruct");
        assert_eq!(cfg.base_url, "http://localhost:8000/v1");

        // A flag with a bare (or unknown-prefixed) model keeps the file's provider.
        let cfg = resolve(file, &[], model_flag("Qwen/Qwen3-8B")).expect("flag");
        assert_eq!(cfg.provider, Provider::Vllm);
        assert_eq!(cfg.model, "Qwen/Qwen3-8B");
    }

    #[test]
    fn custom_endpoint_needs_base_url_but_no_key() {
        let err = resolve(
            ModelSettings::default(),
            &[("CELLA_MODEL", "openai-compatible/my-model")],
            ModelSettings::default(),
        )
        .expect_err("no base url");
        assert!(err.to_string().contains("CELLA_BASE_URL"), "{err}");

        // A hosted provider behind a custom endpoint (proxy, fake server) needs no key either.
        let cfg = resolve(
            ModelSettings::default(),
            &[
                ("CELLA_MODEL", "openai/gpt-4.1"),
                ("CELLA_BASE_URL", "http://127.0.0.1:4000/v1"),
            ],
            ModelSettings::default(),
        )
        .expect("proxy");
        assert_eq!(cfg.api_key, None);

        let err = resolve(
            ModelSettings::default(),
            &[
                ("CELLA_MODEL", "openai/gpt-4.1"),
                ("CELLA_BASE_URL", "api.openai.com"),
            ],
            ModelSettings::default(),
        )
        .expect_err("no scheme");
        assert!(matches!(err, ConfigError::BadBaseUrl { .. }), "{err}");
    }

    #[test]
    fn bad_toml_is_reported_with_its_origin() {
        let err = ModelSettings::from_toml_str("[model]\nmodle = \"x\"\n", "/etc/cella.toml")
            .expect_err("unknown field");
        let msg = err.to_string();
        assert!(
            msg.contains("/etc/cella.toml") && msg.contains("modle"),
            "{msg}"
        );

        let err = ModelSettings::from_toml_str("[model]\nprovider = \"skynet\"\n", "cella.toml")
            .expect_err("unknown provider");
        assert!(err.to_string().contains("skynet"), "{err}");

        let err = ModelSettings::from_toml_str(
            "[model.prices.x]\ninput = \"cheap\"\noutput = 1.0\n",
            "cella.toml",
        )
        .expect_err("bad price");
        assert!(err.to_string().contains("cella.toml"), "{err}");

        assert_eq!(
            ModelSettings::from_toml_str("[server]\nport = 1\n", "cella.toml").expect("no table"),
            ModelSettings::default()
        );
        let err = ModelSettings::from_file(Path::new("/nonexistent/cella.toml"))
            .expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/cella.toml"), "{err}");
    }

    #[test]
    fn provider_names_and_aliases_parse() {
        for p in Provider::ALL {
            assert_eq!(p.as_str().parse::<Provider>().ok(), Some(p));
        }
        assert_eq!(
            "llama.cpp".parse::<Provider>().ok(),
            Some(Provider::LlamaCpp)
        );
        assert_eq!(
            "Anthropic".parse::<Provider>().ok(),
            Some(Provider::Anthropic)
        );
    }
}
