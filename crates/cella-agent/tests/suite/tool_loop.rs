//! The tool-calling loop: tools run in order with their results in the history, malformed and
//! unknown calls become tool errors the model sees, skills appear in the prompt and activate.

use std::sync::Arc;

use cella_agent::{Agent, CancellationToken, SandboxSession};
use cella_agent::{AgentEvent, AgentOptions, AttachedSkill, Outcome, Recorder, Toolbox};
use cella_llm::Message;
use cella_llm::testing::{ScriptedClient, ScriptedTurn};

use super::support::{Memo, agent, types};

#[tokio::test]
async fn runs_tool_calls_in_order_and_returns_the_answer() {
    let model = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[
            ("c1", "memo", r#"{"text":"a"}"#),
            ("c2", "memo", r#"{"text":"b"}"#),
        ]),
        ScriptedTurn::tool_calls(&[("c3", "memo", r#"{"text":"c"}"#)]),
        ScriptedTurn::text("all done"),
    ]);
    let memo = Memo::default();
    let events = Recorder::new();
    let report = agent(Arc::new(model.clone()), AgentOptions::default(), &memo)
        .run("remember a, b, c", &events, &CancellationToken::new())
        .await;
    assert_eq!(report.answer(), Some("all done"));
    assert_eq!(*memo.0.lock().expect("lock"), ["a", "b", "c"]);
    assert_eq!(report.steps, 3);
    assert_eq!(report.usage.input_tokens, 30);
    assert_eq!(report.usage.output_tokens, 15);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert!(matches!(&requests[0].messages[0], Message::System { .. }));
    assert_eq!(requests[0].messages[1], Message::user("remember a, b, c"));
    assert_eq!(
        requests[0]
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["memo", "sleep"]
    );
    // History of the second call: assistant turn, then both results in call order.
    let m = &requests[1].messages;
    assert!(matches!(&m[2], Message::Assistant { tool_calls, .. } if tool_calls.len() == 2));
    assert_eq!(m[3], Message::tool_result("c1", "ok: a"));
    assert_eq!(m[4], Message::tool_result("c2", "ok: b"));
    let events = events.events();
    let kinds = types(&events);
    assert_eq!(kinds.first().map(String::as_str), Some("run_started"));
    assert_eq!(kinds.last().map(String::as_str), Some("run_finished"));
    assert_eq!(
        kinds.iter().filter(|k| *k == "tool_call_started").count(),
        3
    );
    assert_eq!(kinds.iter().filter(|k| *k == "tool_result").count(), 3);
    assert_eq!(kinds.iter().filter(|k| *k == "usage").count(), 3);
    assert!(events.contains(&AgentEvent::TextDelta {
        text: "all done".into()
    }));
    assert!(events.contains(&AgentEvent::FinalAnswer {
        text: "all done".into()
    }));
    let Some(AgentEvent::Usage { total, .. }) = events
        .iter()
        .rev()
        .find(|e| matches!(e, AgentEvent::Usage { .. }))
    else {
        panic!("no usage event");
    };
    assert_eq!(total.total_tokens(), 45);
}

#[tokio::test]
async fn malformed_and_unknown_calls_are_tool_errors_the_model_sees() {
    let model = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[
            ("c1", "memo", r#"{"text": "#),
            ("c2", "rm_rf", "{}"),
            ("c3", "memo", r#"{"txt":"x"}"#),
            ("c4", "memo", "[]"),
        ]),
        ScriptedTurn::text("sorry"),
    ]);
    let memo = Memo::default();
    let report = agent(Arc::new(model.clone()), AgentOptions::default(), &memo)
        .run("t", &Recorder::new(), &CancellationToken::new())
        .await;
    assert_eq!(report.answer(), Some("sorry"));
    assert!(memo.0.lock().expect("lock").is_empty());
    let m = &model.requests()[1].messages;
    let errors: Vec<&str> = m
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                content,
                is_error: true,
                ..
            } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 4, "{m:?}");
    assert!(
        errors[0].contains("arguments of memo are not valid JSON"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("unknown tool \"rm_rf\": the tools are memo, sleep"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].contains("missing required argument \"text\""),
        "{}",
        errors[2]
    );
    assert!(errors[3].contains("must be a JSON object"), "{}", errors[3]);
}

#[tokio::test]
async fn attached_skills_are_cataloged_and_activated_with_their_sandbox_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let skill_dir = dir.path().join("csv-report");
    std::fs::create_dir_all(skill_dir.join("scripts")).expect("mkdir");
    std::fs::write(
        skill_dir.join("SKILL.md"),
        "---\nname: csv-report\ndescription: Summarise CSV files into a report. Use for CSV input.\n---\n# CSV report\n\nRun scripts/report.py on the file.\n",
    )
    .expect("write");
    std::fs::write(skill_dir.join("scripts/report.py"), "print('report')\n").expect("write");
    let (skill, _) = cella_skills::validate::load_lenient(&skill_dir).expect("loads");
    let model = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[
            ("c1", "activate_skill", r#"{"name":"csv-report"}"#),
            ("c2", "activate_skill", r#"{"name":"nope"}"#),
            ("c3", "activate_skill", r#"{"name":"csv-report"}"#),
        ]),
        ScriptedTurn::text("ok"),
    ]);
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent"));
    let agent = Agent::new(Arc::new(model.clone()), sandbox, AgentOptions::default())
        .with_skills(vec![AttachedSkill::new(skill)]);
    let tools: Toolbox = agent.toolbox();
    assert_eq!(
        tools.names(),
        [
            "bash",
            "run_code",
            "read_file",
            "write_file",
            "edit_file",
            "list_files",
            "activate_skill"
        ]
    );
    let spec = &tools.specs()[6];
    assert_eq!(
        spec.parameters["properties"]["name"]["enum"],
        serde_json::json!(["csv-report"])
    );
    let report = agent
        .run("make a report", &Recorder::new(), &CancellationToken::new())
        .await;
    assert_eq!(report.answer(), Some("ok"));
    let requests = model.requests();
    let Message::System { content: prompt } = &requests[0].messages[0] else {
        panic!("no system prompt");
    };
    assert!(prompt.contains("<available_skills>"), "{prompt}");
    assert!(
        prompt.contains("<location>\n/skills/csv-report/SKILL.md\n</location>"),
        "{prompt}"
    );
    assert!(
        !prompt.contains(&dir.path().display().to_string()),
        "host path leaked: {prompt}"
    );
    let results: Vec<(&str, bool)> = requests[1]
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                content, is_error, ..
            } => Some((content.as_str(), *is_error)),
            _ => None,
        })
        .collect();
    assert!(
        results[0]
            .0
            .starts_with("<skill_content name=\"csv-report\">"),
        "{}",
        results[0].0
    );
    assert!(results[0].0.contains("Run scripts/report.py"));
    assert!(
        results[0]
            .0
            .contains("Skill directory: /skills/csv-report\n"),
        "{}",
        results[0].0
    );
    assert!(
        results[0].0.contains("<file>scripts/report.py</file>"),
        "{}",
        results[0].0
    );
    assert!(
        results[1].1 && results[1].0.contains("no skill named \"nope\""),
        "{results:?}"
    );
    assert!(results[2].0.contains("already active"), "{results:?}");
}

#[tokio::test]
async fn no_skills_means_no_catalog_and_no_activate_tool() {
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent"));
    let model = ScriptedClient::new([]);
    let agent = Agent::new(Arc::new(model), sandbox, AgentOptions::default());
    assert!(
        !agent
            .toolbox()
            .names()
            .contains(&"activate_skill".to_owned())
    );
    assert!(!agent.system_prompt().contains("available_skills"));
}

#[tokio::test]
async fn failed_model_call_fails_the_run_with_the_reason() {
    let model = ScriptedClient::new([]);
    let events = Recorder::new();
    let report = agent(Arc::new(model), AgentOptions::default(), &Memo::default())
        .run("t", &events, &CancellationToken::new())
        .await;
    let Outcome::Failed { message } = &report.outcome else {
        panic!("{:?}", report.outcome);
    };
    assert!(message.starts_with("model call failed: "), "{message}");
    assert!(message.contains("no scripted turn left"), "{message}");
    assert!(
        events
            .events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Error { .. }))
    );
}

#[tokio::test]
async fn transient_model_errors_repeat_the_turn() {
    let model = ScriptedClient::new([
        ScriptedTurn::Fail(cella_llm::LlmError::Server {
            provider: "scripted",
            status: 503,
            message: "busy".into(),
            attempts: 3,
        }),
        ScriptedTurn::text("fine"),
    ]);
    let events = Recorder::new();
    let report = agent(Arc::new(model), AgentOptions::default(), &Memo::default())
        .run("t", &events, &CancellationToken::new())
        .await;
    assert_eq!(report.answer(), Some("fine"));
    assert!(
        events
            .events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Warning { message } if message.contains("busy")))
    );
}

#[tokio::test]
async fn builtin_tools_turn_any_arguments_into_tool_errors() {
    // The sandbox is unreachable: every call that gets past its argument checks fails to reach
    // it, which must also be a tool error, never a panic.
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent/envd.sock"));
    let tools = Agent::new(
        Arc::new(ScriptedClient::new([])),
        sandbox,
        AgentOptions::default(),
    )
    .toolbox();
    let nested = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let weird = [
        ("bash", r#"{"command": null}"#.to_owned()),
        (
            "bash",
            r#"{"command": "true", "timeout_secs": 1e308}"#.to_owned(),
        ),
        (
            "bash",
            r#"{"command": "true", "timeout_secs": -3}"#.to_owned(),
        ),
        (
            "run_code",
            r#"{"language": "cobol", "code": "x"}"#.to_owned(),
        ),
        ("run_code", r#"{"language": "python"}"#.to_owned()),
        ("read_file", r#"{"path": 5}"#.to_owned()),
        ("read_file", r#"{"path": "a", "start_line": -1}"#.to_owned()),
        (
            "read_file",
            r#"{"path": "a", "start_line": 18446744073709551615}"#.to_owned(),
        ),
        ("write_file", r#"{"path": "a"}"#.to_owned()),
        (
            "edit_file",
            r#"{"path": "a", "old_string": "", "new_string": "b"}"#.to_owned(),
        ),
        ("list_files", r#"{"depth": 1e9}"#.to_owned()),
        ("list_files", r#"{"path": ["x"]}"#.to_owned()),
        ("activate_skill", r#"{"name": "x"}"#.to_owned()),
        ("bash", nested),
        ("bash", "\u{0}\u{ffff}".to_owned()),
        (
            "write_file",
            format!(r#"{{"path": "{}", "content": "x"}}"#, "é".repeat(100_000)),
        ),
    ];
    for (name, args) in &weird {
        let out = tools.call(name, args).await;
        assert!(out.is_error, "{name} {:.80}: {out:?}", args);
        assert!(!out.content.is_empty());
    }
}

#[tokio::test]
async fn a_run_can_be_spawned_by_a_job_runner() {
    // A job runner spawns runs on a multi-threaded runtime and cancels them from elsewhere.
    let model = ScriptedClient::new([ScriptedTurn::text("spawned")]);
    let agent = agent(Arc::new(model), AgentOptions::default(), &Memo::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(async move { agent.run("t", &tx, &cancel).await });
    let report = handle.await.expect("joined");
    assert_eq!(report.answer(), Some("spawned"));
    let mut kinds = Vec::new();
    while let Ok(e) = rx.try_recv() {
        kinds.push(e);
    }
    assert!(matches!(kinds.last(), Some(AgentEvent::RunFinished { .. })));
}
