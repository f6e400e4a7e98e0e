//! `cella sandbox inspect` (`GET /sandboxes/{id}`) and `cella sandbox logs`
//! (`GET /v2/sandboxes/{id}/logs`).

use hyper::Method;
use serde_json::Value;

use super::api::{Server, check_id};

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The sandbox's id.
    id: String,
}

pub async fn show(server: &Server, args: InspectArgs, json: bool) -> anyhow::Result<u8> {
    let detail = server.sandbox(&args.id).await?;
    if json {
        super::print_json(&detail);
        return Ok(0);
    }
    for (label, key) in [
        ("id", "sandboxID"),
        ("template", "templateID"),
        ("state", "state"),
        ("started", "startedAt"),
        ("ends", "endAt"),
    ] {
        println!("{label:<9} {}", detail[key].as_str().unwrap_or("-"));
    }
    for (label, key, unit) in [
        ("cpus", "cpuCount", ""),
        ("memory", "memoryMB", " MiB"),
        ("disk", "diskSizeMB", " MiB"),
    ] {
        println!("{label:<9} {}{unit}", detail[key]);
    }
    if let Some(m) = detail["metadata"].as_object() {
        for (k, v) in m {
            println!("{:<9} {k}={}", "metadata", v.as_str().unwrap_or_default());
        }
    }
    Ok(0)
}

pub async fn logs(server: &Server, args: InspectArgs, json: bool) -> anyhow::Result<u8> {
    let id = &args.id;
    check_id(id)?;
    let answer: Value = server
        .expect(
            Method::GET,
            &format!("/v2/sandboxes/{id}/logs?limit=1000"),
            None,
        )
        .await?
        .json(server)?;
    let entries = answer["logs"].as_array().cloned().unwrap_or_default();
    if json {
        super::print_json(&Value::Array(entries));
        return Ok(0);
    }
    for e in &entries {
        println!(
            "{} {:<5} {}",
            e["timestamp"].as_str().unwrap_or("-"),
            e["level"].as_str().unwrap_or("-"),
            e["message"].as_str().unwrap_or_default()
        );
    }
    Ok(0)
}
