//! A long job against a model with a small context window: the history grows to more than five
//! times the window and the job still completes. The fake provider behaves like a real one —
//! it answers 400 `context_length_exceeded` when a prompt (counted with OpenAI's o200k_base
//! vocabulary, as OpenAI counts it) plus the requested answer exceeds 4096 tokens, and 400 when
//! the user's task is missing or a tool call is split from its result — so any violation fails
//! the run.

use std::sync::{Arc, Mutex};

use cella_agent::context::RecallTool;
use cella_agent::{
    Agent, AgentEvent, AgentOptions, CancellationToken, ContextOptions, Limits, MemoryRecall,
    Recorder, SandboxSession, Tool, ToolOutput, Toolbox,
};
use cella_llm::testing::{
    FakeProvider, RecordedRequest, Reply, check_anthropic_request, check_openai_request,
};
use cella_llm::{BoxFuture, ToolSpec, build_client};
use serde_json::{Value, json};
use tiktoken_rs::CoreBPE;

const WINDOW: u32 = 4096;
const MAX_OUTPUT: u32 = 512;
const PARTS: u32 = 30;
const TASK: &str = "Audit the 30 parts of the inventory one by one with the produce tool, then \
    tell me the status code recorded for part 3.";

/// Produces part `n` of an inventory: about 800 tokens of rows.
struct Produce;

fn part(n: u64) -> String {
    (0..56)
        .map(|row| {
            format!(
                "part {n} row {row}: sku-{n}-{row} qty {} status ok\n",
                row * 13 % 97
            )
        })
        .collect::<String>()
        + &format!("part {n} checksum: CODE-{n}-{}\n", n * 7919 % 10007)
}

impl Tool for Produce {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "produce",
            "produce one part of the inventory",
            json!({"type": "object", "properties": {"part": {"type": "integer"}}, "required": ["part"]}),
        )
    }
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let n = args.get("part").and_then(Value::as_u64).unwrap_or(0);
            ToolOutput::ok(part(n), format!("part {n}"))
        })
    }
}

/// What the fake model saw.
#[derive(Debug, Default)]
struct Seen {
    acts: u32,
    summaries: u32,
    max_prompt: u32,
    violations: Vec<String>,
    recalled: Option<String>,
}

/// The wire format the fake provider speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    OpenAi,
    Anthropic,
}

fn respond(format: Format, bpe: &CoreBPE, seen: &Mutex<Seen>, request: &RecordedRequest) -> Reply {
    let body = request.json();
    let mut seen = seen.lock().expect("lock");
    let count = |s: &str| bpe.encode_ordinary(s).len();
    let checked = match format {
        Format::OpenAi => check_openai_request(&body, WINDOW, TASK, &count),
        Format::Anthropic => check_anthropic_request(&body, WINDOW, TASK, &count),
    };
    match checked {
        Ok(tokens) => seen.max_prompt = seen.max_prompt.max(tokens),
        Err((tokens, message)) => {
            seen.violations.push(message.clone());
            seen.max_prompt = seen.max_prompt.max(tokens);
            return match format {
                Format::OpenAi => Reply::openai_context_length_exceeded(&message),
                Format::Anthropic => Reply::anthropic_prompt_too_long(&message),
            };
        }
    }
    let text = |t: &str| match format {
        Format::OpenAi => Reply::openai_text(t),
        Format::Anthropic => Reply::anthropic_text(t),
    };
    let calls = |c: &[(&str, &str, &str)]| match format {
        Format::OpenAi => Reply::openai_tool_calls(c),
        Format::Anthropic => Reply::anthropic_tool_calls(c),
    };
    let system = match format {
        Format::OpenAi => body["messages"][0]["content"].as_str(),
        Format::Anthropic => body["system"].as_str(),
    };
    if system.is_some_and(|s| s.starts_with("You compress the history")) {
        seen.summaries += 1;
        return text(
            "Parts audited so far were produced with the produce tool; all rows had status ok.",
        );
    }
    seen.acts += 1;
    let act = seen.acts;
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    if act <= PARTS {
        let args = json!({ "part": act }).to_string();
        calls(&[(&format!("call_{act}"), "produce", &args)])
    } else if act == PARTS + 1 {
        // Part 3's output is long gone from the prompt: ask recall for it.
        calls(&[("call_recall", "recall", r#"{"query":"part 3 checksum"}"#)])
    } else {
        let content = match format {
            Format::OpenAi => last["content"].as_str().unwrap_or("").to_owned(),
            Format::Anthropic => last["content"][0]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        };
        let answer = content
            .lines()
            .find(|l| l.starts_with("part 3 checksum:"))
            .map(|l| l.trim_start_matches("part 3 checksum: ").to_owned());
        seen.recalled = Some(content);
        text(&format!(
            "All {PARTS} parts audited; part 3's code is {}",
            answer.unwrap_or_else(|| "unknown".into())
        ))
    }
}

/// OpenAI format, model gpt-4o: counted with the real o200k_base vocabulary.
#[tokio::test]
async fn a_job_five_times_the_context_window_completes_under_budget() {
    long_job(Format::OpenAi).await;
}

/// Anthropic format, a Claude model: the agent only has its estimate; the fake counts with
/// o200k_base as a stand-in for the provider's tokenizer.
#[tokio::test]
async fn a_long_anthropic_job_with_estimated_counts_completes_under_budget() {
    long_job(Format::Anthropic).await;
}

async fn long_job(format: Format) {
    let bpe = Arc::new(tiktoken_rs::o200k_base().expect("o200k_base"));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let fake = FakeProvider::start().await.expect("fake provider");
    {
        let (bpe, seen) = (Arc::clone(&bpe), Arc::clone(&seen));
        fake.respond_with(move |r| respond(format, &bpe, &seen, r));
    }
    let mut config = match format {
        Format::OpenAi => fake.openai_config("gpt-4o"),
        Format::Anthropic => fake.anthropic_config("claude-test"),
    };
    config.max_tokens = Some(MAX_OUTPUT);
    let model = build_client(config).expect("client");
    let recall = Arc::new(MemoryRecall::new());
    let options = AgentOptions {
        limits: Limits {
            max_steps: 60,
            ..Limits::default()
        },
        context: ContextOptions {
            window: Some(WINDOW),
            ..ContextOptions::default()
        },
        ..AgentOptions::default()
    };
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent/envd.sock"));
    let toolbox = Toolbox::new(vec![
        Arc::new(Produce),
        Arc::new(RecallTool::new(recall.clone(), 3000)),
    ]);
    let agent = Agent::new(model, sandbox, options)
        .with_toolbox(toolbox)
        .with_recall(recall.clone());
    let events = Recorder::new();
    let report = agent.run(TASK, &events, &CancellationToken::new()).await;
    let seen = seen.lock().expect("lock");
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let code = format!("CODE-3-{}", 3 * 7919 % 10007);
    assert_eq!(
        report.answer(),
        Some(format!("All {PARTS} parts audited; part 3's code is {code}").as_str()),
        "{report:?}"
    );

    // The history really was more than five times the window.
    let events = events.events();
    let outputs: u32 = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolResult { output, .. } => Some(bpe.encode_ordinary(output).len() as u32),
            _ => None,
        })
        .sum();
    assert!(outputs >= 5 * WINDOW, "tool outputs: {outputs} tokens");
    assert!(
        seen.max_prompt + MAX_OUTPUT <= WINDOW,
        "{}",
        seen.max_prompt
    );
    // Both rules were needed: old outputs elided, then older turns summarised.
    let compactions: Vec<(u32, u32, u32, u32)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ContextCompacted {
                tokens_before,
                tokens_after,
                elided,
                summarized,
                ..
            } => Some((*tokens_before, *tokens_after, *elided, *summarized)),
            _ => None,
        })
        .collect();
    assert!(compactions.iter().any(|c| c.2 > 0), "{compactions:?}");
    assert!(compactions.iter().any(|c| c.3 > 0), "{compactions:?}");
    assert!(compactions.iter().all(|c| c.1 < c.0), "{compactions:?}");
    assert!(seen.summaries >= 1);
    let history: u32 = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ContextCompacted { history_tokens, .. } => Some(*history_tokens),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    assert!(history >= 5 * WINDOW, "history {history} tokens");
    // Recall found part 3's output although no prompt had held it for many turns.
    let recalled = seen.recalled.clone().unwrap_or_default();
    assert!(
        recalled.contains(&format!("part 3 checksum: {code}")),
        "{recalled}"
    );
    assert_eq!(
        recall.entries().len() as u32,
        PARTS + 1 + 1,
        "every call and the final text remembered"
    );
}
