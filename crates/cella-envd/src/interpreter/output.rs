//! The NDJSON lines of `POST /execute`, as E2B's code-interpreter server writes them and the SDKs
//! parse them (`e2b_code_interpreter/models.py` `parse_output`): `stdout`/`stderr` {text,
//! timestamp}, `result` (a mime bundle spread into text/html/markdown/svg/png/jpeg/pdf/latex/json/
//! javascript/data + extra), `error` {name, value, traceback}, `number_of_executions`,
//! `end_of_execution` and `unexpected_end_of_execution`.

use bytes::Bytes;
use serde_json::{Map, Value, json};

/// Mime types with a field of their own in a result.
const FIELDS: &[(&str, &str)] = &[
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
];

pub fn line(v: &Value) -> Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// Unix time in nanoseconds (what the SDKs document for `timestamp`).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn stream(kind: &str, text: &str) -> Value {
    json!({ "type": kind, "text": text, "timestamp": now_ns() })
}

pub fn error(name: &str, value: &str, traceback: &str) -> Value {
    json!({ "type": "error", "name": name, "value": value, "traceback": traceback })
}

pub fn end() -> Value {
    json!({ "type": "end_of_execution" })
}

/// A `result` line from a mime bundle.
pub fn result(bundle: &Map<String, Value>, is_main_result: bool) -> Value {
    let mut data = bundle.clone();
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    if let Some(Value::String(text)) = data.remove("text/plain") {
        // Like E2B's server: a string's repr loses its quotes.
        let text = match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
            Some(inner) => inner.to_string(),
            None => text,
        };
        out.insert("text".into(), text.into());
    }
    for (mime, field) in FIELDS {
        if let Some(v) = data.remove(*mime) {
            out.insert((*field).into(), v);
        }
    }
    if !data.is_empty() {
        out.insert("extra".into(), Value::Object(data));
    }
    out.insert("is_main_result".into(), is_main_result.into());
    Value::Object(out)
}

/// Turns a driver's structured event into the line the client sees; `None` for events that are
/// the driver's own business (`ready`, `end`).
pub fn from_driver(event: &Value) -> Option<Value> {
    let kind = event["type"].as_str()?;
    match kind {
        "stdout" | "stderr" => Some(stream(kind, event["text"].as_str().unwrap_or_default())),
        "result" => {
            let empty = Map::new();
            let bundle = event["data"].as_object().unwrap_or(&empty);
            Some(result(
                bundle,
                event["is_main_result"].as_bool().unwrap_or(false),
            ))
        }
        "error" => Some(error(
            event["name"].as_str().unwrap_or_default(),
            event["value"].as_str().unwrap_or_default(),
            event["traceback"].as_str().unwrap_or_default(),
        )),
        "number_of_executions" => Some(json!({
            "type": "number_of_executions",
            "execution_count": event["execution_count"],
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_bundles_spread_into_result_fields() {
        let bundle = json!({
            "text/plain": "'hi'",
            "text/html": "<b>hi</b>",
            "image/png": "iVBOR",
            "application/vnd.custom": {"a": 1},
        });
        let r = result(bundle.as_object().expect("object"), true);
        assert_eq!(r["type"], "result");
        assert_eq!(r["text"], "hi");
        assert_eq!(r["html"], "<b>hi</b>");
        assert_eq!(r["png"], "iVBOR");
        assert_eq!(r["extra"]["application/vnd.custom"]["a"], 1);
        assert_eq!(r["is_main_result"], true);
        assert!(from_driver(&json!({"type": "ready"})).is_none());
        assert_eq!(
            from_driver(&json!({"type": "stdout", "text": "x"})).expect("line")["text"],
            "x"
        );
    }
}
