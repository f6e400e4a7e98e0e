//! Limits stop a run with a stated reason: steps, tokens, cost, wall time, cancellation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cella_agent::{
    AgentEvent, AgentOptions, CancellationToken, Limits, Outcome, Recorder, StopReason,
};
use cella_llm::testing::{ScriptedClient, ScriptedTurn};
use cella_llm::{ModelConfig, Price, Provider};

use super::support::{Memo, agent};

fn memo_turns(n: usize) -> Vec<ScriptedTurn> {
    (0..n)
        .map(|i| {
            let args = format!(r#"{{"text":"{i}"}}"#);
            ScriptedTurn::tool_calls(&[(&format!("c{i}"), "memo", &args)])
        })
        .collect()
}

fn with_limits(limits: Limits) -> AgentOptions {
    AgentOptions {
        limits,
        ..AgentOptions::default()
    }
}

fn stopped(events: &Recorder) -> (String, String) {
    events
        .events()
        .into_iter()
        .find_map(|e| match e {
            AgentEvent::Stopped { kind, reason } => Some((kind, reason)),
            _ => None,
        })
        .expect("a stopped event")
}

#[tokio::test]
async fn max_steps() {
    let memo = Memo::default();
    let events = Recorder::new();
    let report = agent(
        Arc::new(ScriptedClient::new(memo_turns(10))),
        with_limits(Limits {
            max_steps: 3,
            ..Limits::default()
        }),
        &memo,
    )
    .run("t", &events, &CancellationToken::new())
    .await;
    assert_eq!(
        report.outcome,
        Outcome::Stopped {
            reason: StopReason::MaxSteps { limit: 3 }
        }
    );
    assert_eq!(report.steps, 3);
    assert_eq!(memo.0.lock().expect("lock").len(), 3);
    let (kind, reason) = stopped(&events);
    assert_eq!(kind, "max_steps");
    assert_eq!(
        reason,
        "step limit reached: 3 model calls without a final answer"
    );
}

#[tokio::test]
async fn max_tokens() {
    let memo = Memo::default();
    let events = Recorder::new();
    // Every scripted turn uses 15 tokens.
    let report = agent(
        Arc::new(ScriptedClient::new(memo_turns(10))),
        with_limits(Limits {
            max_tokens: Some(40),
            ..Limits::default()
        }),
        &memo,
    )
    .run("t", &events, &CancellationToken::new())
    .await;
    assert_eq!(
        report.outcome,
        Outcome::Stopped {
            reason: StopReason::MaxTokens {
                limit: 40,
                used: 45
            }
        }
    );
    // The third turn's tool call is not run: the budget was spent.
    assert_eq!(memo.0.lock().expect("lock").len(), 2);
    assert_eq!(
        stopped(&events).1,
        "token limit reached: used 45 of 40 tokens"
    );
}

#[tokio::test]
async fn max_cost() {
    let config = ModelConfig::new(Provider::OpenAiCompatible, "scripted").with_price(
        "scripted",
        Price {
            input: 1000.0,
            output: 1000.0,
        },
    );
    let model = ScriptedClient::new(memo_turns(10)).with_config(config);
    let events = Recorder::new();
    let report = agent(
        Arc::new(model),
        with_limits(Limits {
            max_cost_usd: Some(0.02),
            ..Limits::default()
        }),
        &Memo::default(),
    )
    .run("t", &events, &CancellationToken::new())
    .await;
    // 15 tokens at $1000 per million = $0.015 per turn.
    let Outcome::Stopped {
        reason: StopReason::MaxCost { spent_usd, .. },
    } = report.outcome
    else {
        panic!("{:?}", report.outcome);
    };
    assert!((spent_usd - 0.03).abs() < 1e-9, "{spent_usd}");
    assert_eq!(report.steps, 2);
    assert_eq!(
        stopped(&events).1,
        "cost limit reached: spent $0.0300 of $0.0200"
    );
    assert!(report.cost_usd.is_some_and(|c| (c - 0.03).abs() < 1e-9));
}

#[tokio::test]
async fn unpriced_cost_limit_is_a_warning() {
    let events = Recorder::new();
    let report = agent(
        Arc::new(ScriptedClient::new([ScriptedTurn::text("hi")])),
        with_limits(Limits {
            max_cost_usd: Some(1.0),
            ..Limits::default()
        }),
        &Memo::default(),
    )
    .run("t", &events, &CancellationToken::new())
    .await;
    assert_eq!(report.answer(), Some("hi"));
    assert!(events.events().iter().any(|e| matches!(e, AgentEvent::Warning { message } if message.contains("no price is configured for scripted"))));
}

#[tokio::test]
async fn wall_time() {
    let model = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[("c1", "sleep", r#"{"secs": 30}"#)]),
        ScriptedTurn::text("never"),
    ]);
    let events = Recorder::new();
    let started = Instant::now();
    let report = agent(
        Arc::new(model),
        with_limits(Limits {
            max_duration: Some(Duration::from_millis(300)),
            ..Limits::default()
        }),
        &Memo::default(),
    )
    .run("t", &events, &CancellationToken::new())
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        report.outcome,
        Outcome::Stopped {
            reason: StopReason::WallTime { limit_ms: 300 }
        }
    );
    assert_eq!(
        stopped(&events).1,
        "time limit reached: the run took longer than 0.3 s"
    );
}

#[tokio::test]
async fn cancellation() {
    let model = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[("c1", "sleep", r#"{"secs": 30}"#)]),
        ScriptedTurn::text("never"),
    ]);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    let events = Recorder::new();
    let report = agent(Arc::new(model), AgentOptions::default(), &Memo::default())
        .run("t", &events, &cancel)
        .await;
    assert_eq!(
        report.outcome,
        Outcome::Stopped {
            reason: StopReason::Cancelled
        }
    );
    let last = events.events().pop().expect("events");
    assert!(
        matches!(last, AgentEvent::RunFinished { ref status, .. } if status == "stopped"),
        "{last:?}"
    );
}
