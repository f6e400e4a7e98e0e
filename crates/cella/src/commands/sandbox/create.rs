//! `cella sandbox create`: `POST /sandboxes`, secured (the server mints an envd access token).

use std::collections::BTreeMap;
use std::time::Duration;

use cella_sandbox::spec;
use hyper::Method;
use serde_json::{Value, json};

use super::api::Server;

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Template the sandbox is made from.
    #[arg(long, default_value = "base")]
    template: String,
    /// How long the sandbox lives before the server kills it, e.g. 30s, 5m, 1h.
    #[arg(long, default_value = "5m", value_parser = spec::parse_duration)]
    timeout: Duration,
    /// Metadata KEY=VALUE (repeatable); `cella sandbox ls --metadata KEY=VALUE` filters on it.
    #[arg(long, short = 'm', value_parser = super::parse_metadata)]
    metadata: Vec<(String, String)>,
    /// Environment variable for every process in the sandbox, NAME=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = crate::commands::exec::parse_env)]
    env: Vec<(String, String)>,
}

/// Whole seconds for the E2B API, rounded up so a short timeout never becomes 0 (the default).
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub async fn run(server: &Server, args: CreateArgs, json: bool) -> anyhow::Result<u8> {
    if args.timeout.is_zero() {
        anyhow::bail!("--timeout must be longer than 0 s");
    }
    let body = json!({
        "templateID": args.template,
        "timeout": whole_seconds(args.timeout),
        "secure": true,
        "metadata": args.metadata.into_iter().collect::<BTreeMap<_, _>>(),
        "envVars": args.env.into_iter().collect::<BTreeMap<_, _>>(),
    });
    let created: Value = server
        .expect(Method::POST, "/sandboxes", Some(&body))
        .await?
        .json(server)?;
    if json {
        super::print_json(&created);
    } else {
        println!("{}", created["sandboxID"].as_str().unwrap_or_default());
    }
    Ok(0)
}
