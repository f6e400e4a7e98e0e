//! `cella sandbox rm | pause | resume`: `DELETE /sandboxes/{id}`, `POST …/pause`, and
//! `POST …/connect` (E2B's resume: it also accepts a sandbox that is already running).

use std::time::Duration;

use cella_sandbox::spec;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::api::{ApiError, Server, check_id};

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// Ids of the sandboxes to kill.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct IdArgs {
    /// The sandbox's id.
    id: String,
}

#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The sandbox's id.
    id: String,
    /// New lifetime from now, e.g. 5m (default: the server's default timeout).
    #[arg(long, value_parser = spec::parse_duration)]
    timeout: Option<Duration>,
}

/// Kills each sandbox; one failing does not stop the others, but makes the exit status 1.
pub async fn rm(server: &Server, args: RmArgs, json: bool) -> anyhow::Result<u8> {
    let mut results = Vec::new();
    let mut failed = false;
    for id in &args.ids {
        let outcome = async {
            check_id(id)?;
            server
                .expect(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await
        }
        .await;
        match outcome {
            Ok(_) => {
                if !json {
                    println!("{id}");
                }
                results.push(json!({ "sandboxID": id, "removed": true }));
            }
            Err(e @ ApiError::Unreachable { .. }) | Err(e @ ApiError::Unauthorized { .. }) => {
                // Nothing else can succeed either.
                return Err(e.into());
            }
            Err(e) => {
                failed = true;
                eprintln!("cella: {e}");
                results.push(json!({ "sandboxID": id, "removed": false, "error": e.to_string() }));
            }
        }
    }
    if json {
        super::print_json(&Value::Array(results));
    }
    Ok(u8::from(failed))
}

pub async fn pause(server: &Server, args: IdArgs, json: bool) -> anyhow::Result<u8> {
    let id = &args.id;
    check_id(id)?;
    let answer = server
        .call(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await?;
    if answer.status == StatusCode::CONFLICT {
        anyhow::bail!(
            "sandbox {id} is already paused (resume it with `cella sandbox resume {id}`)"
        );
    }
    if !answer.status.is_success() {
        return Err(server.refusal(answer.status, &answer.body).into());
    }
    if json {
        super::print_json(&json!({ "sandboxID": id, "state": "paused" }));
    } else {
        println!("{id}");
    }
    Ok(0)
}

pub async fn resume(server: &Server, args: ResumeArgs, json: bool) -> anyhow::Result<u8> {
    let id = &args.id;
    check_id(id)?;
    let body = match args.timeout {
        Some(t) if t.is_zero() => anyhow::bail!("--timeout must be longer than 0 s"),
        Some(t) => json!({ "timeout": super::create::whole_seconds(t) }),
        None => json!({}),
    };
    let answer = server
        .expect(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(&body),
        )
        .await?;
    // 201: it was paused and is running again; 200: it was running already.
    let resumed = answer.status == StatusCode::CREATED;
    if json {
        let mut v: Value = answer.json(server)?;
        v["resumed"] = json!(resumed);
        super::print_json(&v);
    } else {
        if !resumed {
            eprintln!("cella: sandbox {id} was not paused; it keeps running");
        }
        println!("{id}");
    }
    Ok(0)
}
