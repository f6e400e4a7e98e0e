//! Agent overhead per step, excluding model time: a zero-latency scripted model and a trivial
//! tool, 200 steps; the target is a median under 5 ms.

use std::sync::Arc;

use cella_agent::bench::agent_overhead;
use cella_llm::testing::{ScriptedClient, ScriptedTurn};

#[tokio::test]
async fn overhead_per_step_is_under_5_ms_median() {
    let steps = 200;
    let mut turns: Vec<ScriptedTurn> = (0..steps)
        .map(|i| {
            let args = format!(r#"{{"text":"step {i}"}}"#);
            ScriptedTurn::tool_calls(&[(&format!("c{i}"), "noop", &args)])
        })
        .collect();
    turns.push(ScriptedTurn::text("done"));
    let scripted = agent_overhead(steps, Some(Arc::new(ScriptedClient::new(turns))))
        .await
        .expect("bench runs");
    eprintln!("scripted client: {scripted:?}");
    assert_eq!(scripted.steps, steps);
    assert!(scripted.median_us < 5000.0, "{scripted:?}");
    let instant = agent_overhead(steps, None).await.expect("bench runs");
    eprintln!("instant model: {instant:?}");
    assert!(instant.median_us < 5000.0, "{instant:?}");
}
