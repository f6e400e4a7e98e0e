//! The reflexion strategy: the model writes a whole program → it runs in the sandbox → success
//! is judged by the exit code and optional checks (expected output, a test command) → on
//! failure a critic call analyses what went wrong → the next attempt gets the failed program,
//! its output and every critique so far; at most `max_attempts` attempts, each reported as
//! events.
//!
//! Owns the prompts, code extraction and checks. Must not know how events are shown or stored.

use std::time::Duration;

use cella_llm::Message;

use crate::agent::{Halt, RunState, StopReason};
use crate::context::TokenCounter;
use crate::context::prune::shorten;
use crate::event::{AgentEvent, TurnPurpose};
use crate::output::{cap, first_line};
use crate::sandbox::{ProcessResult, SandboxSession};
use crate::tools::Language;

/// Settings of the reflexion strategy.
#[derive(Debug, Clone)]
pub struct ReflexionOptions {
    pub max_attempts: u32,
    /// The language asked for (a code fence naming another supported language wins).
    pub language: Language,
    /// Stdout must contain this.
    pub expected_output: Option<String>,
    /// A bash command that must exit 0 after the program ran (e.g. `python3 -m pytest -q`).
    pub test_command: Option<String>,
    /// Timeout of each program run and test command.
    pub timeout: Duration,
    /// Where the program is saved (relative to the working directory); default
    /// `solution.<ext>`.
    pub path: Option<String>,
}

impl Default for ReflexionOptions {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            language: Language::Python,
            expected_output: None,
            test_command: None,
            timeout: Duration::from_secs(60),
            path: None,
        }
    }
}

/// One failed attempt, carried into the next prompt.
struct Failure {
    code: String,
    language: Language,
    report: String,
}

pub(crate) async fn run(
    task: &str,
    sandbox: &SandboxSession,
    options: &ReflexionOptions,
    run: &mut RunState<'_>,
) -> Result<String, Halt> {
    let max = options.max_attempts.max(1);
    let mut last: Option<Failure> = None;
    let mut critiques: Vec<String> = Vec::new();
    for attempt in 1..=max {
        run.sink.emit(&AgentEvent::AttemptStarted {
            attempt,
            max_attempts: max,
        });
        let system = generate_prompt(options);
        let room = prompt_room(run, &system, task);
        let counter = *run.context().counter();
        let user = attempt_prompt(task, last.as_ref(), &critiques, room, &counter);
        let request = run
            .prompt(&[Message::system(system), Message::user(user)], &[])
            .await?;
        let response = run.turn(&request, TurnPurpose::Generate).await?;
        let (code, language) = extract_code(&response.content, options.language);
        let path = options
            .path
            .clone()
            .unwrap_or_else(|| format!("solution.{}", language.extension()));
        let shown = sandbox.resolve(&path);
        run.sink.emit(&AgentEvent::CodeGenerated {
            attempt,
            language: language.name().to_owned(),
            path: shown.clone(),
            code: code.clone(),
        });
        let mut failed: Vec<String> = Vec::new();
        let mut report = String::new();
        let mut stdout = String::new();
        if code.trim().is_empty() {
            failed.push("the answer held no program (expected one fenced code block)".into());
            check(run, attempt, "code", false, &failed[0]);
        } else {
            run.guard(sandbox.write(&path, code.as_bytes()))
                .await?
                .map_err(|e| Halt::Fail(e.to_string()))?;
            let command = format!("{} {shown}", language.interpreter());
            let result = run
                .guard(sandbox.run(
                    language.interpreter(),
                    std::slice::from_ref(&shown),
                    options.timeout,
                ))
                .await?
                .map_err(|e| Halt::Fail(e.to_string()))?;
            report.push_str(&execution(run, attempt, &command, &result, options.timeout));
            stdout = result.stdout.render();
            let exit_ok = result.success();
            let detail = match result.exit_code {
                Some(c) => format!("exit code {c}"),
                None => format!("timed out after {} s", options.timeout.as_secs_f64()),
            };
            check(run, attempt, "exit_code", exit_ok, &detail);
            if !exit_ok {
                failed.push(format!("the program failed: {detail}"));
            }
            if let Some(expected) = &options.expected_output {
                let ok = stdout.contains(expected.as_str());
                let detail = if ok {
                    format!("stdout contains {expected:?}")
                } else {
                    format!("stdout does not contain {expected:?}")
                };
                check(run, attempt, "expected_output", ok, &detail);
                if !ok {
                    failed.push(detail);
                }
            }
            if let Some(test) = options
                .test_command
                .as_deref()
                .filter(|_| failed.is_empty())
            {
                let result = run
                    .guard(sandbox.bash(test, options.timeout))
                    .await?
                    .map_err(|e| Halt::Fail(e.to_string()))?;
                report.push_str("\nTest command:\n");
                report.push_str(&execution(run, attempt, test, &result, options.timeout));
                let ok = result.success();
                let detail = format!(
                    "`{test}` {}",
                    match result.exit_code {
                        Some(c) => format!("exited with {c}"),
                        None => "timed out".to_owned(),
                    }
                );
                check(run, attempt, "test_command", ok, &detail);
                if !ok {
                    failed.push(detail);
                }
            }
        }
        let success = failed.is_empty();
        if success {
            run.sink.emit(&AgentEvent::AttemptFinished {
                attempt,
                success: true,
            });
            let (out, _) = cap(&stdout, 4096);
            return Ok(format!(
                "attempt {attempt} of {max} succeeded; the program is {shown}\n\noutput:\n{out}"
            ));
        }
        report.push_str("\nFailed checks:\n");
        for f in &failed {
            report.push_str(&format!("- {f}\n"));
        }
        let failure = Failure {
            code,
            language,
            report,
        };
        if attempt < max {
            run.check_budget()?;
            let room = prompt_room(run, CRITIC_PROMPT, task);
            let counter = *run.context().counter();
            let user = critic_prompt(task, &failure, room, &counter);
            let request = run
                .prompt(&[Message::system(CRITIC_PROMPT), Message::user(user)], &[])
                .await?;
            let critique = run.turn(&request, TurnPurpose::Critique).await?.content;
            run.sink.emit(&AgentEvent::Critique {
                attempt,
                text: critique.clone(),
            });
            critiques.push(critique);
            run.sink.emit(&AgentEvent::AttemptFinished {
                attempt,
                success: false,
            });
            run.check_budget()?;
        } else {
            run.sink.emit(&AgentEvent::AttemptFinished {
                attempt,
                success: false,
            });
        }
        last = Some(failure);
    }
    Err(Halt::Stop(StopReason::AttemptsExhausted { attempts: max }))
}

fn check(run: &RunState<'_>, attempt: u32, name: &str, passed: bool, detail: &str) {
    run.sink.emit(&AgentEvent::Check {
        attempt,
        check: name.to_owned(),
        passed,
        detail: detail.to_owned(),
    });
}

/// Emits the execution event and returns the text the critic and the next attempt see.
fn execution(
    run: &RunState<'_>,
    attempt: u32,
    command: &str,
    result: &ProcessResult,
    timeout: Duration,
) -> String {
    let output = result.render(timeout);
    let summary = match result.exit_code {
        Some(code) if code != 0 => format!(
            "exit {code} · {}",
            first_line(
                result
                    .stderr
                    .render()
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or(""),
                100
            )
        ),
        Some(code) => format!("exit {code}"),
        None => format!("timed out after {} s", timeout.as_secs_f64()),
    };
    run.sink.emit(&AgentEvent::Execution {
        attempt,
        command: command.to_owned(),
        exit_code: result.exit_code,
        summary,
        truncated: result.truncated(),
        output: output.clone(),
    });
    format!("$ {command}\n{output}")
}

const CRITIC_PROMPT: &str = "You review a program that failed its checks. In a few sentences, \
    explain the cause of the failure from the error output and say exactly what to change. Do \
    not write the whole program.";

fn generate_prompt(options: &ReflexionOptions) -> String {
    let lang = options.language;
    let mut p = format!(
        "You write complete, runnable programs. Answer with exactly one fenced code block \
         (```{}) holding the whole program. It is saved to a file and run with `{}` in a Linux \
         sandbox without network access; it reads no input and prints its result to stdout. \
         It must exit with status 0.",
        lang.name(),
        lang.interpreter()
    );
    if let Some(expected) = &options.expected_output {
        p.push_str(&format!(" Its output must contain {expected:?}."));
    }
    if let Some(test) = &options.test_command {
        p.push_str(&format!(
            " After it runs, the test command `{test}` must succeed."
        ));
    }
    p
}

/// Tokens the user message may have besides the task, under the run's context budget.
fn prompt_room(run: &RunState<'_>, system: &str, task: &str) -> u32 {
    let c = run.context();
    let fixed = c.counter().request(&cella_llm::ChatRequest::new(vec![
        Message::system(system),
        Message::user(format!("Task:\n{task}\n")),
    ]));
    // Headings and fences of the prompt.
    c.budget().limit.saturating_sub(fixed).saturating_sub(64)
}

/// The attempt's prompt: the task verbatim; the previous program, what happened and the
/// critiques shortened to fit `room` tokens (program up to half, report up to a quarter,
/// critiques newest first in the rest).
fn attempt_prompt(
    task: &str,
    last: Option<&Failure>,
    critiques: &[String],
    room: u32,
    counter: &TokenCounter,
) -> String {
    let mut p = format!("Task:\n{task}\n");
    let mut left = room;
    if let Some(f) = last {
        let code = shorten(f.code.trim_end(), room / 2, counter);
        let report = shorten(&f.report, room / 4, counter);
        left = left
            .saturating_sub(counter.text(&code))
            .saturating_sub(counter.text(&report));
        p.push_str(&format!(
            "\nYour previous program:\n```{}\n{code}\n```\n\nWhat happened:\n{report}\n",
            f.language.name(),
        ));
    }
    if !critiques.is_empty() {
        let mut kept: Vec<String> = Vec::new();
        for (i, c) in critiques.iter().enumerate().rev() {
            let line = shorten(&format!("{}. {}\n", i + 1, c.trim()), left, counter);
            let t = counter.text(&line) + 2;
            if t > left {
                break;
            }
            left -= t;
            kept.push(line);
        }
        p.push_str("\nCritiques of your earlier attempts:\n");
        if kept.len() < critiques.len() {
            p.push_str(&format!(
                "[{} older critiques left out to fit the context window]\n",
                critiques.len() - kept.len()
            ));
        }
        for line in kept.iter().rev() {
            p.push_str(line);
        }
        p.push_str("\nWrite the corrected, complete program.\n");
    }
    p
}

fn critic_prompt(task: &str, f: &Failure, room: u32, counter: &TokenCounter) -> String {
    let code = shorten(f.code.trim_end(), room / 2, counter);
    let report = shorten(&f.report, room.saturating_sub(counter.text(&code)), counter);
    format!(
        "Task:\n{task}\n\nProgram:\n```{}\n{code}\n```\n\nWhat happened:\n{report}",
        f.language.name(),
    )
}

/// The program in a model answer: the first fenced block whose tag is empty or a language,
/// else the whole text. A fence naming a supported language sets the language.
pub fn extract_code(text: &str, default: Language) -> (String, Language) {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let Some(tag) = trimmed.strip_prefix("```") else {
            continue;
        };
        let tag = tag.trim();
        let mut body = Vec::new();
        for inner in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push(inner);
        }
        let language = if tag.is_empty() {
            Some(default)
        } else {
            Language::parse(tag.split_whitespace().next().unwrap_or(""))
        };
        if let Some(language) = language {
            let mut code = body.join("\n");
            code.push('\n');
            return (code, language);
        }
    }
    let trimmed = text.trim();
    if trimmed.is_empty() {
        (String::new(), default)
    } else {
        (format!("{trimmed}\n"), default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Tokenizer;

    #[test]
    fn attempt_prompts_fit_their_room_and_keep_the_task() {
        let counter = TokenCounter::new(Tokenizer::O200kBase);
        let failure = Failure {
            code: "print('x')\n".repeat(2_000),
            language: Language::Python,
            report: "Traceback: boom\n".repeat(2_000),
        };
        let critiques: Vec<String> = (0..20)
            .map(|i| format!("critique {i}: ") + &"fix the loop bound. ".repeat(40))
            .collect();
        let task = "print the first 10 primes";
        let p = attempt_prompt(task, Some(&failure), &critiques, 1_500, &counter);
        assert!(p.starts_with("Task:\nprint the first 10 primes\n"), "{p}");
        let fixed = counter.text(&format!("Task:\n{task}\n"));
        assert!(
            counter.text(&p) <= fixed + 1_500 + 64,
            "{}",
            counter.text(&p)
        );
        assert!(p.contains("critique 19:"), "the newest critique is kept");
        assert!(p.contains("older critiques left out"), "{p}");
        let c = critic_prompt(task, &failure, 800, &counter);
        assert!(c.starts_with("Task:\nprint the first 10 primes\n"));
        assert!(counter.text(&c) <= fixed + 800 + 64, "{}", counter.text(&c));
        // Small inputs are left whole.
        let small = Failure {
            code: "print(1)\n".into(),
            language: Language::Python,
            report: "exit 1\n".into(),
        };
        let p = attempt_prompt(task, Some(&small), &["use range".into()], 1_500, &counter);
        assert!(
            p.contains("print(1)\n```") && p.contains("1. use range\n"),
            "{p}"
        );
    }

    #[test]
    fn code_comes_from_the_first_runnable_fence() {
        let text = "Here:\n```text\nnot code\n```\n```python\nprint(1)\nprint(2)\n```\nbye";
        assert_eq!(
            extract_code(text, Language::Bash),
            ("print(1)\nprint(2)\n".to_owned(), Language::Python)
        );
        let (code, lang) = extract_code("```\necho hi\n```", Language::Bash);
        assert_eq!((code.as_str(), lang), ("echo hi\n", Language::Bash));
        let (code, lang) = extract_code("```js\nconsole.log(1)", Language::Python);
        assert_eq!(
            (code.as_str(), lang),
            ("console.log(1)\n", Language::JavaScript)
        );
        assert_eq!(
            extract_code("print(3)", Language::Python).0,
            "print(3)\n".to_owned()
        );
        assert!(extract_code("  \n", Language::Python).0.is_empty());
    }
}
