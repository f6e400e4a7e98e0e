//! The compaction rules one by one, and a property test over random histories: tool calls and
//! their results are never split, the user's messages and skill content survive verbatim, and
//! every prompt fits the budget.

use cella_llm::{ChatRequest, Message, ToolCall, ToolSpec};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::context::tokens::Tokenizer;

const TASK: &str = "TASK: count the lines of every log file and report the largest";

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec::new(
        "bash",
        "run a command",
        json!({"type": "object", "properties": {"command": {"type": "string"}}}),
    )]
}

fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

/// `n` lines of tool-like output.
fn output(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tag} line {i}: value {}\n", i * 7))
        .collect()
}

fn turn(id: &str, tag: &str, lines: usize) -> Vec<Message> {
    vec![
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![call(
                id,
                "bash",
                &format!(r#"{{"command":"cat {tag}.log"}}"#),
            )],
        },
        Message::tool_result(id, output(tag, lines)),
    ]
}

fn compactor(window: u32) -> Compactor {
    let counter = TokenCounter::new(Tokenizer::O200kBase);
    Compactor::new(
        counter,
        Budget::new(window, window / 4, true, true),
        ContextOptions::default(),
        "gpt-test",
    )
    .with_recall(true)
}

/// Builds a prompt, answering a summary job with `summary`; says whether a summary was asked.
fn fit(
    c: &mut Compactor,
    history: &[Message],
    tools: &[ToolSpec],
    summary: &str,
) -> (Result<Prompt, ContextError>, Option<SummaryJob>) {
    let plan = match c.plan(history, tools) {
        Ok(p) => p,
        Err(e) => return (Err(e), None),
    };
    match plan {
        Plan::Ready(p) => (Ok(p), None),
        Plan::Summarize(job) => {
            c.accept_summary(job.clone(), summary);
            match c.resume(history, tools) {
                Ok(Plan::Ready(p)) => (Ok(p), Some(job)),
                Ok(Plan::Summarize(_)) => panic!("a second summary in one build"),
                Err(e) => (Err(e), Some(job)),
            }
        }
    }
}

fn base() -> Vec<Message> {
    vec![
        Message::system("You are an agent in a sandbox."),
        Message::user(TASK),
    ]
}

fn tool_content(m: &Message) -> Option<&str> {
    match m {
        Message::Tool { content, .. } => Some(content),
        _ => None,
    }
}

#[test]
fn under_budget_the_prompt_is_the_history() {
    let mut c = compactor(8_000);
    let mut h = base();
    h.extend(turn("c1", "a", 20));
    let (p, job) = fit(&mut c, &h, &tools(), "");
    let p = p.expect("fits");
    assert!(job.is_none());
    assert_eq!(p.request.messages, h);
    assert_eq!(p.compaction, None);
    assert_eq!(p.tokens, c.counter().request(&p.request));
}

#[test]
fn old_outputs_are_elided_oldest_first_and_the_newest_kept_before_any_summary() {
    let mut c = compactor(8_000);
    let mut h = base();
    for i in 0..12 {
        h.extend(turn(&format!("c{i}"), &format!("f{i}"), 150));
    }
    let history_tokens = c
        .counter()
        .request(&ChatRequest::new(h.clone()).with_tools(tools()));
    assert!(history_tokens > 8_000 * 2, "{history_tokens}");
    let (p, job) = fit(&mut c, &h, &tools(), "");
    let p = p.expect("fits");
    assert!(job.is_none(), "eliding was enough: no summary");
    let m = &p.request.messages;
    assert_eq!(m.len(), h.len(), "nothing removed, only shortened");
    assert_eq!(m[1], Message::user(TASK));
    let first = tool_content(&m[3]).expect("tool");
    assert!(
        first.starts_with("[output elided to fit the context window: bash returned"),
        "{first}"
    );
    assert!(first.contains(r#"recall {"id": "c0"}"#), "{first}");
    assert!(first.contains("\"f0 line 0: value 0\""), "{first}");
    assert_eq!(m.last(), h.last(), "the newest output is verbatim");
    let c_report = p.compaction.expect("compacted");
    assert!(c_report.elided >= 1 && c_report.summarized == 0 && c_report.shortened == 0);
    assert_eq!(c_report.history_tokens, history_tokens);
    assert!(p.tokens <= c.budget().limit);
    assert!(
        p.tokens as f64 <= c.budget().limit as f64 * 0.7 + 1.0,
        "compacted to the target"
    );
    assert_eq!(p.tokens, c.counter().request(&p.request));
    // Oldest first: elided outputs form a prefix.
    let elided: Vec<bool> = m
        .iter()
        .filter_map(tool_content)
        .map(|t| t.starts_with("[output elided"))
        .collect();
    let k = elided.iter().take_while(|e| **e).count();
    assert!(k > 0 && elided[k..].iter().all(|e| !e), "{elided:?}");
}

#[test]
fn decisions_persist_so_prompts_stay_stable() {
    let mut c = compactor(8_000);
    let mut h = base();
    for i in 0..12 {
        h.extend(turn(&format!("c{i}"), &format!("f{i}"), 150));
    }
    let (p1, _) = fit(&mut c, &h, &tools(), "");
    let p1 = p1.expect("fits");
    h.extend(turn("c12", "f12", 5));
    let (p2, _) = fit(&mut c, &h, &tools(), "");
    let p2 = p2.expect("fits");
    assert_eq!(
        p2.request.messages[..p1.request.messages.len()],
        p1.request.messages[..],
        "the earlier prompt is a prefix of the next one"
    );
    assert_eq!(
        p2.compaction, None,
        "a small new turn needs no new compaction"
    );
}

#[test]
fn older_turns_are_summarised_when_eliding_is_not_enough() {
    let mut c = compactor(4_000);
    let mut h = base();
    // The model's own long texts cannot be elided, only summarised.
    for i in 0..10 {
        h.push(Message::Assistant {
            content: format!("Step {i}: ")
                + &"I looked at the files and found more work. ".repeat(25),
            tool_calls: vec![call(&format!("c{i}"), "bash", r#"{"command":"ls"}"#)],
        });
        h.push(Message::tool_result(
            format!("c{i}"),
            output(&format!("f{i}"), 30),
        ));
    }
    let (p, job) = fit(&mut c, &h, &tools(), "SUMMARY: steps 0-7 listed files.");
    let p = p.expect("fits");
    let job = job.expect("a summary was asked for");
    let Message::User { content } = &job.request.messages[1] else {
        panic!("summary request without a user message");
    };
    assert!(
        content.starts_with(&format!("The task:\n{TASK}")),
        "{content}"
    );
    assert!(content.contains("Step 0:"), "{content}");
    assert!(c.counter().request(&job.request) <= c.budget().limit);
    let m = &p.request.messages;
    assert_eq!(m[0], h[0]);
    assert_eq!(m[1], Message::user(TASK));
    let Message::User { content } = &m[2] else {
        panic!("no summary after the task: {m:?}");
    };
    assert!(content.starts_with("[Context summary:"), "{content}");
    assert!(
        content.ends_with("SUMMARY: steps 0-7 listed files."),
        "{content}"
    );
    assert_eq!(m.last(), h.last());
    let report = p.compaction.expect("compacted");
    assert!(report.summarized > 0 && report.elided > 0, "{report:?}");
    assert!(p.tokens <= c.budget().limit);
    assert_eq!(p.tokens, c.counter().request(&p.request));
    check_pairs(m);
}

#[test]
fn skill_instructions_survive_eliding_and_summaries() {
    let mut c = compactor(4_000);
    let mut h = base();
    let skill = "<skill_content name=\"csv\">Always use the csv module.</skill_content>";
    h.push(Message::Assistant {
        content: "Loading the skill.".into(),
        tool_calls: vec![call("s1", "activate_skill", r#"{"name":"csv"}"#)],
    });
    h.push(Message::tool_result("s1", skill));
    for i in 0..10 {
        h.push(Message::Assistant {
            content: "Working on it: ".to_owned() + &"checking the data again. ".repeat(30),
            tool_calls: vec![call(&format!("c{i}"), "bash", r#"{"command":"ls"}"#)],
        });
        h.push(Message::tool_result(format!("c{i}"), output("x", 40)));
    }
    let (p, job) = fit(&mut c, &h, &tools(), "SUMMARY");
    let p = p.expect("fits");
    assert!(job.is_some());
    let m = &p.request.messages;
    let i = m
        .iter()
        .position(|m| tool_content(m) == Some(skill))
        .expect("the skill content is verbatim");
    assert!(
        matches!(&m[i - 1], Message::Assistant { tool_calls, .. } if tool_calls[0].id == "s1"),
        "with its call"
    );
    check_pairs(m);
}

#[test]
fn the_newest_output_is_cut_from_the_middle_as_a_last_resort() {
    let mut c = compactor(4_000);
    let mut h = base();
    h.extend(turn("c1", "huge", 2_000));
    let (p, _) = fit(&mut c, &h, &tools(), "");
    let p = p.expect("fits");
    let out = tool_content(&p.request.messages[3]).expect("tool");
    assert!(out.starts_with("huge line 0: value 0\n"), "{out}");
    assert!(out.ends_with("huge line 1999: value 13993\n"), "{out}");
    assert!(out.contains("cut from the middle"), "{out}");
    assert_eq!(p.compaction.map(|c| c.shortened), Some(1));
    assert!(p.tokens <= c.budget().limit);
    // Not remembered: the history is unchanged and the next build starts from it again.
    assert!(matches!(&h[3], Message::Tool { content, .. } if content.len() > 40_000));
}

#[test]
fn a_task_larger_than_the_window_is_a_clear_error() {
    let mut c = compactor(2_000);
    let mut h = base();
    h[1] = Message::user("do this: ".to_owned() + &"and that ".repeat(3_000));
    let (p, _) = fit(&mut c, &h, &tools(), "");
    let e = p.expect_err("cannot fit");
    let text = e.to_string();
    assert!(
        text.contains("does not fit the context window of gpt-test"),
        "{text}"
    );
    assert!(text.contains("--context-window"), "{text}");
}

#[test]
fn a_shorter_history_resets_the_decisions() {
    let mut c = compactor(8_000);
    let mut h = base();
    for i in 0..12 {
        h.extend(turn(&format!("c{i}"), &format!("f{i}"), 150));
    }
    let (p, _) = fit(&mut c, &h, &tools(), "");
    assert!(p.expect("fits").compaction.is_some());
    let short: Vec<Message> = h[..4].to_vec();
    let (p, _) = fit(&mut c, &short, &tools(), "");
    assert_eq!(p.expect("fits").request.messages, short);
}

/// Every assistant message with tool calls is followed by exactly its results; every result
/// follows its call.
fn check_pairs(messages: &[Message]) {
    let mut i = 0;
    while i < messages.len() {
        match &messages[i] {
            Message::Assistant { tool_calls, .. } => {
                let mut ids: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
                let mut j = i + 1;
                while let Some(Message::Tool { tool_call_id, .. }) = messages.get(j) {
                    let pos = ids
                        .iter()
                        .position(|id| *id == tool_call_id)
                        .unwrap_or_else(|| panic!("result {tool_call_id} without its call"));
                    ids.remove(pos);
                    j += 1;
                }
                assert!(ids.is_empty(), "calls without results: {ids:?}");
                i = j;
            }
            Message::Tool { tool_call_id, .. } => panic!("result {tool_call_id} without a call"),
            _ => i += 1,
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// The model's text only.
    Text(usize),
    /// Tool calls: (activates a skill, argument bytes, output lines).
    Calls(Vec<(bool, usize, usize)>),
    /// A follow-up from the user.
    User(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0usize..2_000).prop_map(Step::Text),
        6 => prop::collection::vec((prop::bool::weighted(0.1), 0usize..3_000, 0usize..400), 1..4)
            .prop_map(Step::Calls),
        1 => (1usize..200).prop_map(Step::User),
    ]
}

fn words(n: usize, tag: &str) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < n {
        s.push_str(&format!("{tag}{i} "));
        i += 1;
    }
    s
}

fn history(steps: &[Step]) -> Vec<Message> {
    let mut h = base();
    let mut n = 0;
    for (k, step) in steps.iter().enumerate() {
        match step {
            Step::Text(len) => h.push(Message::assistant(words(*len, "thought"))),
            Step::User(len) => h.push(Message::user(format!(
                "USER-{k}: {}",
                words(*len, "please")
            ))),
            Step::Calls(calls) => {
                let mut results = Vec::new();
                let tool_calls = calls
                    .iter()
                    .map(|(skill, args, lines)| {
                        n += 1;
                        let id = format!("call_{n}");
                        if *skill {
                            results.push(Message::tool_result(
                                &id,
                                format!("SKILL-{n}: use the csv module"),
                            ));
                            call(&id, "activate_skill", r#"{"name":"csv"}"#)
                        } else {
                            results
                                .push(Message::tool_result(&id, output(&format!("o{n}"), *lines)));
                            call(
                                &id,
                                "bash",
                                &json!({ "command": words(*args, "arg") }).to_string(),
                            )
                        }
                    })
                    .collect();
                h.push(Message::Assistant {
                    content: String::new(),
                    tool_calls,
                });
                h.extend(results);
            }
        }
    }
    h
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_compact_without_breaking_the_rules(
        steps in prop::collection::vec(step(), 0..25),
        window in 2_500u32..12_000,
        summary_len in 0usize..6_000,
        exact in any::<bool>(),
    ) {
        let counter = TokenCounter::new(if exact { Tokenizer::O200kBase } else { Tokenizer::Estimate });
        let mut c = Compactor::new(
            counter,
            Budget::new(window, window / 4, exact, true),
            ContextOptions::default(),
            "gpt-test",
        )
        .with_recall(true);
        let h = history(&steps);
        let tools = tools();
        let summary = words(summary_len, "summary");
        // Build as the loop does: a prompt for every prefix that ends a turn.
        for end in (2..=h.len()).filter(|&e| e == h.len() || !matches!(h[e], Message::Tool { .. })) {
            let prefix = &h[..end];
            let (p, job) = fit(&mut c, prefix, &tools, &summary);
            let p = match p {
                Ok(p) => p,
                // Refusing is right only when what may not be shortened (system prompt, tools,
                // the user's messages, skill content) leaves too little room for the rest.
                Err(ContextError::DoesNotFit { protected, limit, .. }) => {
                    prop_assert!(protected > limit / 2, "{protected} of {limit} protected");
                    break;
                }
            };
            let m = &p.request.messages;
            prop_assert!(p.tokens <= c.budget().limit, "{} > {}", p.tokens, c.budget().limit);
            prop_assert_eq!(p.tokens, c.counter().request(&p.request));
            if let Some(job) = &job {
                prop_assert!(c.counter().request(&job.request) <= c.budget().limit);
            }
            check_pairs(m);
            prop_assert_eq!(&m[0], &prefix[0]);
            // The user's messages: all there, verbatim, in order.
            let users = |ms: &[Message]| -> Vec<Message> {
                ms.iter()
                    .filter(|m| matches!(m, Message::User { content } if !content.starts_with("[Context summary")))
                    .cloned()
                    .collect()
            };
            prop_assert_eq!(users(m), users(prefix));
            // Skill content: verbatim, right after its call.
            for (i, msg) in prefix.iter().enumerate() {
                if let Message::Tool { content, .. } = msg
                    && content.starts_with("SKILL-")
                {
                    prop_assert!(m.contains(msg), "skill result {} lost", i);
                }
            }
            // Every message of the prompt stands for history messages in order.
            let mut at = 0;
            for msg in m {
                let found = match msg {
                    Message::Tool { tool_call_id, .. } => prefix[at..].iter().position(|x| matches!(x, Message::Tool { tool_call_id: id, .. } if id == tool_call_id)),
                    Message::Assistant { tool_calls, .. } => prefix[at..].iter().position(|x| matches!(x, Message::Assistant { tool_calls: t, .. } if t.iter().map(|c| &c.id).eq(tool_calls.iter().map(|c| &c.id)))),
                    Message::User { content } if content.starts_with("[Context summary") => Some(0),
                    other => prefix[at..].iter().position(|x| x == other),
                };
                let found = found.ok_or_else(|| TestCaseError::fail(format!("{msg:?} is not from the history (or out of order)")))?;
                at += found + usize::from(!matches!(msg, Message::User { content } if content.starts_with("[Context summary")));
            }
        }
    }
}
