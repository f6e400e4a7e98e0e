//! `cella sandbox ls`: `GET /v2/sandboxes`, every page, as a table or a JSON array.

use cella_proto::query::percent_encode;
use hyper::Method;
use serde_json::Value;

use super::api::Server;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum State {
    Running,
    Paused,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only sandboxes in this state (default: running and paused).
    #[arg(long, value_enum)]
    state: Option<State>,
    /// Only sandboxes with this metadata, KEY=VALUE (repeatable: all must match).
    #[arg(long, short = 'm', value_parser = super::parse_metadata)]
    metadata: Vec<(String, String)>,
}

/// The query of the first page. `metadata` is itself a query string (`k=v&k2=v2`, each part
/// encoded), encoded once more as one parameter, as the E2B SDKs send it.
fn query(args: &ListArgs) -> String {
    let mut q = String::from("limit=100");
    if let Some(state) = args.state {
        q.push_str(match state {
            State::Running => "&state=running",
            State::Paused => "&state=paused",
        });
    }
    if !args.metadata.is_empty() {
        let inner = args
            .metadata
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        q.push_str("&metadata=");
        q.push_str(&percent_encode(&inner));
    }
    q
}

pub async fn run(server: &Server, args: ListArgs, json: bool) -> anyhow::Result<u8> {
    let first = query(&args);
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let path = match &next {
            None => format!("/v2/sandboxes?{first}"),
            Some(token) => format!("/v2/sandboxes?{first}&nextToken={}", percent_encode(token)),
        };
        let answer = server.expect(Method::GET, &path, None).await?;
        let page: Vec<Value> = answer.json(server)?;
        all.extend(page);
        next = answer
            .headers
            .get("x-next-token")
            .and_then(|v| v.to_str().ok())
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if next.is_none() {
            break;
        }
    }
    if json {
        super::print_json(&Value::Array(all));
    } else {
        print!("{}", table(&all));
    }
    Ok(0)
}

/// Columns: id, template, state, start and end times, metadata.
fn table(rows: &[Value]) -> String {
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("-").to_string();
    let mut lines = vec![[
        "ID".to_string(),
        "TEMPLATE".into(),
        "STATE".into(),
        "STARTED".into(),
        "ENDS".into(),
        "METADATA".into(),
    ]];
    for r in rows {
        let metadata = r["metadata"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        lines.push([
            text(r, "sandboxID"),
            text(r, "templateID"),
            text(r, "state"),
            text(r, "startedAt"),
            text(r, "endAt"),
            metadata,
        ]);
    }
    let mut widths = [0usize; 6];
    for l in &lines {
        for (w, cell) in widths.iter_mut().zip(l) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for l in &lines {
        let mut line = String::new();
        for (i, cell) in l.iter().enumerate() {
            if i + 1 == l.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_is_encoded_twice() {
        let args = ListArgs {
            state: Some(State::Paused),
            metadata: vec![("team".into(), "a&b".into()), ("n".into(), "1".into())],
        };
        assert_eq!(
            query(&args),
            "limit=100&state=paused&metadata=team%3Da%2526b%26n%3D1"
        );
    }

    #[test]
    fn table_aligns_columns() {
        let rows = vec![serde_json::json!({
            "sandboxID": "abc", "templateID": "base", "state": "running",
            "startedAt": "t0", "endAt": "t1", "metadata": {"k": "v"}
        })];
        assert_eq!(
            table(&rows),
            "ID   TEMPLATE  STATE    STARTED  ENDS  METADATA\nabc  base      running  t0       t1    k=v\n"
        );
    }
}
