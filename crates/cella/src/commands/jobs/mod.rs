//! `cella jobs …`: agent jobs on a `cella serve` (submit, list, inspect, watch live, cancel,
//! download artifacts), and the job runner's `cella serve` options.
//!
//! Human output on stdout by default, `--json` for scripts (one JSON document; `watch --json`
//! prints one JSON line per event). Exit status: 0 on success (`watch`: the job completed),
//! 1 when a watched job ended in error or was cancelled, 2 on usage or server errors.

mod serve_args;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use cella_agent::{AgentEvent, EventSink};
use cella_sandbox::spec;
use http_body_util::BodyExt;
use hyper::Method;
use serde_json::{Value, json};

pub use serve_args::ServeJobsArgs;

use super::sandbox::api::{Server as Client, ServerOptions as ServerArgs};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The server comes from --url or CELLA_URL (default http://127.0.0.1:3000), the key from --api-key or CELLA_API_KEY.\n\nExample: cella jobs submit --watch \"write fizzbuzz.py and run it\""
)]
pub struct JobsArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    command: JobsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum JobsCommand {
    /// Queue a job: an agent does TASK in a sandbox on the server. Prints the job's id.
    Submit(SubmitArgs),
    /// List your jobs, newest first.
    Ls {
        /// Only jobs in this status (pending, running, complete, error, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Most jobs to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Continue after a previous page (its next_cursor).
        #[arg(long)]
        cursor: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one job: status, timestamps, usage, answer or error.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Follow a job's events live until it ends (reconnects and resumes if the stream drops).
    Watch {
        id: String,
        /// Start after this event (its seq); 0 replays everything.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// One JSON line per event.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job (a running job's sandbox is killed).
    Cancel {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Download a job's workspace as a zip archive.
    Artifacts {
        id: String,
        /// Where to write it (default: ./<id>-artifacts.zip; - for stdout).
        #[arg(long, short)]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
struct SubmitArgs {
    /// What the agent should do.
    task: String,
    /// `loop` or `reflexion`.
    #[arg(long)]
    strategy: Option<String>,
    /// provider/model (default: the server's configured model).
    #[arg(long)]
    model: Option<String>,
    /// Sandbox template.
    #[arg(long)]
    template: Option<String>,
    /// Skills from your skill registry on the server (`POST /v1/skills`), NAME or NAME@VERSION,
    /// comma-separated.
    #[arg(long, value_delimiter = ',')]
    skills: Vec<String>,
    /// Most model calls.
    #[arg(long)]
    max_steps: Option<u32>,
    /// Most tokens (input + output).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Most USD.
    #[arg(long)]
    max_cost: Option<f64>,
    /// Wall-clock limit, e.g. 10m.
    #[arg(long, value_parser = spec::parse_duration)]
    timeout: Option<Duration>,
    /// Metadata K=V (repeatable).
    #[arg(long = "metadata", short = 'm', value_parser = parse_pair)]
    metadata: Vec<(String, String)>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0)]
    priority: i64,
    /// Follow the job until it ends (like `cella jobs watch`).
    #[arg(long)]
    watch: bool,
    #[arg(long)]
    json: bool,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("invalid metadata {s:?}: expected KEY=VALUE")),
    }
}

pub fn run(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&args.server)?;
    let rt = super::local::runtime()?;
    rt.block_on(async move {
        match args.command {
            JobsCommand::Submit(s) => submit(&client, s).await,
            JobsCommand::Ls {
                status,
                limit,
                cursor,
                json,
            } => list(&client, status, limit, cursor, json).await,
            JobsCommand::Get { id, json } => {
                let job = client.json(Method::GET, &job_path(&id, ""), None).await?;
                print_job(&job, json);
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::Watch { id, after, json } => watch(&client, &id, after, json).await,
            JobsCommand::Cancel { id, json } => {
                let job = client
                    .json(Method::POST, &job_path(&id, "/cancel"), None)
                    .await?;
                print_job(&job, json);
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::Artifacts { id, output, json } => {
                artifacts(&client, &id, output, json).await
            }
        }
    })
}

fn job_path(id: &str, rest: &str) -> String {
    let safe: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    format!("/v1/jobs/{safe}{rest}")
}

async fn submit(client: &Client, s: SubmitArgs) -> anyhow::Result<ExitCode> {
    let mut limits = serde_json::Map::new();
    if let Some(v) = s.max_steps {
        limits.insert("max_steps".into(), json!(v));
    }
    if let Some(v) = s.max_tokens {
        limits.insert("max_tokens".into(), json!(v));
    }
    if let Some(v) = s.max_cost {
        limits.insert("max_cost_usd".into(), json!(v));
    }
    if let Some(t) = s.timeout {
        limits.insert("timeout_secs".into(), json!(t.as_secs().max(1)));
    }
    let mut body = json!({
        "task": s.task,
        "limits": limits,
        "metadata": s.metadata.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "priority": s.priority,
        "skills": s.skills,
    });
    for (key, value) in [
        ("strategy", s.strategy),
        ("model", s.model),
        ("template", s.template),
    ] {
        if let Some(v) = value {
            body[key] = json!(v);
        }
    }
    let created = client.json(Method::POST, "/v1/jobs", Some(&body)).await?;
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    if s.json && !s.watch {
        println!("{created}");
    } else if !s.json {
        println!("{id}");
    }
    if s.watch {
        return watch(client, &id, 0, s.json).await;
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(
    client: &Client,
    status: Option<String>,
    limit: u32,
    cursor: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut query = format!("/v1/jobs?limit={limit}");
    if let Some(s) = status {
        query.push_str(&format!("&status={}", encode(&s)));
    }
    if let Some(c) = cursor {
        query.push_str(&format!("&cursor={}", encode(&c)));
    }
    let page = client.json(Method::GET, &query, None).await?;
    if json {
        println!("{page}");
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        println!("no jobs");
    } else {
        println!("{:<28} {:<10} {:<24} TASK", "ID", "STATUS", "CREATED");
        for j in &jobs {
            let task: String = j["task"].as_str().unwrap_or("").replace('\n', " ");
            let short: String = task.chars().take(60).collect();
            println!(
                "{:<28} {:<10} {:<24} {}{}",
                j["id"].as_str().unwrap_or(""),
                j["status"].as_str().unwrap_or(""),
                j["created_at"].as_str().unwrap_or(""),
                short,
                if task.chars().count() > 60 { "…" } else { "" }
            );
        }
    }
    if let Some(next) = page["next_cursor"].as_str() {
        println!("more: cella jobs ls --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn print_job(job: &Value, json: bool) {
    if json {
        println!("{job}");
        return;
    }
    let field = |k: &str| job[k].as_str().unwrap_or("-").to_owned();
    println!("{}  {}", field("id"), field("status"));
    println!("  task:     {}", field("task"));
    println!(
        "  created:  {}   started: {}   finished: {}",
        field("created_at"),
        field("started_at"),
        field("finished_at")
    );
    if let Some(u) = job["usage"].as_object() {
        println!(
            "  usage:    {} model calls · {} in / {} out tokens",
            u.get("steps").and_then(Value::as_u64).unwrap_or(0),
            u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
            u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0)
        );
    }
    if let Some(a) = job["final_answer"].as_str() {
        println!("  answer:   {a}");
    }
    if let Some(e) = job["error"].as_str() {
        println!("  error:    {e}");
    }
}

/// One parsed Server-Sent Event.
struct SseEvent {
    id: Option<String>,
    event: String,
    data: String,
}

/// Splits `buffer` into complete events, leaving a partial one in it.
fn parse_sse(buffer: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut ev = SseEvent {
            id: None,
            event: "message".into(),
            data: String::new(),
        };
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                ev.id = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("event:") {
                ev.event = v.trim().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                if !ev.data.is_empty() {
                    ev.data.push('\n');
                }
                ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !ev.data.is_empty() || ev.id.is_some() {
            out.push(ev);
        }
    }
    out
}

async fn watch(client: &Client, id: &str, after: i64, json: bool) -> anyhow::Result<ExitCode> {
    let progress = super::run::Progress::new();
    let mut last = after.max(0);
    let mut failures = 0;
    loop {
        let resp = client
            .send(
                Method::GET,
                &job_path(id, "/events"),
                None,
                &[
                    ("last-event-id", last.to_string()),
                    ("accept", "text/event-stream".into()),
                ],
            )
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) if failures < 5 && last > after => {
                failures += 1;
                eprintln!("cella: lost the event stream ({e}); reconnecting");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if !resp.status().is_success() {
            return Err(client.refused(resp).await.into());
        }
        let mut body = resp.into_body();
        let mut buffer = String::new();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            for ev in parse_sse(&mut buffer) {
                let value: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
                if let Some(seq) = ev.id.as_deref().and_then(|s| s.parse::<i64>().ok()) {
                    last = seq;
                }
                if json {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(
                        out,
                        "{}",
                        if value.is_null() {
                            json!({"type": ev.event, "raw": ev.data})
                        } else {
                            value.clone()
                        }
                    );
                    let _ = out.flush();
                } else {
                    show(&progress, &ev.event, &value["data"]);
                }
                if ev.event == "job_finished" {
                    let status = value["data"]["status"].as_str().unwrap_or("");
                    if !json && let Some(a) = value["data"]["final_answer"].as_str() {
                        println!("{}", a.trim_end());
                    }
                    return Ok(ExitCode::from(if status == "complete" { 0 } else { 1 }));
                }
                if ev.event == "error" && ev.id.is_none() {
                    bail!(
                        "the server stopped the event stream: {}",
                        value["message"].as_str().unwrap_or(&ev.data)
                    );
                }
            }
        }
        // The stream ended without the job's last event: resume after what we saw.
        failures += 1;
        if failures > 5 {
            bail!(
                "the event stream of job {id} keeps breaking; try `cella jobs watch {id} --after {last}`"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Human progress: agent events as `cella run` shows them, job events as one line each.
fn show(progress: &super::run::Progress, kind: &str, data: &Value) {
    match kind {
        "job_started" => eprintln!(
            "cella: job started (attempt {}) on {}",
            data["attempt"],
            data["node"].as_str().unwrap_or("?")
        ),
        "sandbox_created" => eprintln!(
            "cella: sandbox {}",
            data["sandbox_id"].as_str().unwrap_or("?")
        ),
        "job_retry" => eprintln!("cella: retrying: {}", data["reason"].as_str().unwrap_or("")),
        "job_finished" => {
            let status = data["status"].as_str().unwrap_or("?");
            match data["error"].as_str() {
                Some(e) => eprintln!("cella: job {status}: {e}"),
                None => eprintln!("cella: job {status}"),
            }
        }
        _ => {
            if let Ok(event) = serde_json::from_value::<AgentEvent>(data.clone()) {
                progress.emit(&event);
            }
        }
    }
}

async fn artifacts(
    client: &Client,
    id: &str,
    output: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let resp = client
        .send(Method::GET, &job_path(id, "/artifacts.zip"), None, &[])
        .await?;
    if !resp.status().is_success() {
        return Err(client.refused(resp).await.into());
    }
    let to_stdout = output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let path = output.unwrap_or_else(|| PathBuf::from(format!("{id}-artifacts.zip")));
    // Written next to the target and renamed at the end: no partial archive under its name.
    let partial = path.with_extension("zip.partial");
    let mut sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?,
        )
    };
    let mut body = resp.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                drop(sink);
                let _ = std::fs::remove_file(&partial);
                bail!("the download of job {id}'s artifacts broke off: {e}");
            }
        };
        if let Ok(chunk) = frame.into_data() {
            bytes += chunk.len() as u64;
            sink.write_all(&chunk).context("writing the archive")?;
        }
    }
    sink.flush().context("writing the archive")?;
    drop(sink);
    if !to_stdout {
        std::fs::rename(&partial, &path)
            .with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
        if json {
            println!("{}", json!({ "path": path, "bytes": bytes }));
        } else {
            eprintln!("cella: wrote {} ({bytes} bytes)", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_are_parsed_and_partial_ones_kept() {
        let mut buf = "id: 1\nevent: text_delta\ndata: {\"a\":1}\n\nid: 2\nevent: x\nda".to_owned();
        let events = parse_sse(&mut buf);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id.as_deref(), Some("1"));
        assert_eq!(events[0].event, "text_delta");
        assert_eq!(events[0].data, "{\"a\":1}");
        assert_eq!(buf, "id: 2\nevent: x\nda");
        buf.push_str("ta: y\n\n");
        assert_eq!(parse_sse(&mut buf)[0].data, "y");
    }
}
