//! The code interpreter served in-process on a loopback TCP port, its drivers running as the
//! current user: contexts, persistent state, errors, and a cell interrupted when its client
//! leaves (the context then answers again, state intact). The built-in Python driver is forced
//! (`CELLA_PYTHON_KERNEL=builtin`) so this runs without Jupyter; the Jupyter path and the other
//! languages are covered through the real SDK (tests/python/test_code_interpreter.py).

use std::time::Duration;

use bytes::Bytes;
use cella_envd::interpreter::Interpreter;
use cella_envd::{Envd, EnvdConfig};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::support::current_user;

async fn start() -> std::net::SocketAddr {
    let (user, _, _) = current_user();
    let mut config = EnvdConfig {
        default_user: user,
        ..EnvdConfig::default()
    };
    config
        .envs
        .insert("CELLA_PYTHON_KERNEL".into(), "builtin".into());
    let router = Interpreter::new(Envd::new(config)).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

async fn send(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Value,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "interp")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    sender.send_request(req).await.expect("response")
}

async fn json_of(resp: hyper::Response<hyper::body::Incoming>) -> (u16, String) {
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs a cell and returns its NDJSON lines.
async fn run(addr: std::net::SocketAddr, body: Value) -> Vec<Value> {
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(60),
        json_of(send(addr, "POST", "/execute", body).await),
    )
    .await
    .expect("cell ended in time");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == kind).collect()
}

#[tokio::test]
async fn python_builtin_driver_keeps_state_and_reports_errors() {
    let addr = start().await;
    let lines = run(addr, json!({"code": "x = 20\nprint('hi')\nx * 2 + 2"})).await;
    assert_eq!(of_type(&lines, "stdout")[0]["text"], "hi\n");
    let result = of_type(&lines, "result");
    assert_eq!(result[0]["text"], "42");
    assert_eq!(result[0]["is_main_result"], true);
    assert_eq!(
        of_type(&lines, "number_of_executions")[0]["execution_count"],
        1
    );
    assert_eq!(lines.last().expect("lines")["type"], "end_of_execution");

    let lines = run(
        addr,
        json!({"code": "def f():\n    raise ValueError('bad')\nf()"}),
    )
    .await;
    let err = of_type(&lines, "error");
    assert_eq!(err[0]["name"], "ValueError");
    assert_eq!(err[0]["value"], "bad");
    let tb = err[0]["traceback"].as_str().expect("traceback");
    assert!(
        tb.contains("raise ValueError('bad')") && !tb.contains("cella"),
        "{tb}"
    );

    let lines = run(addr, json!({"code": "x"})).await;
    assert_eq!(of_type(&lines, "result")[0]["text"], "20");
}

/// Reads a streamed answer until `needle` shows, then hangs up (the client leaves).
async fn hang_up_after(resp: http::Response<hyper::body::Incoming>, needle: &str) {
    let mut body = resp.into_body();
    let mut seen = String::new();
    while !seen.contains(needle) {
        let frame = tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .expect("output in time")
            .expect("a frame")
            .expect("body");
        if let Some(data) = frame.data_ref() {
            seen.push_str(&String::from_utf8_lossy(data));
        }
    }
}

#[tokio::test]
async fn a_cell_whose_client_leaves_is_interrupted() {
    let addr = start().await;
    let (status, ctx) =
        json_of(send(addr, "POST", "/contexts", json!({"language": "python"})).await).await;
    assert_eq!(status, 200, "{ctx}");
    let ctx: Value = serde_json::from_str(&ctx).expect("context");
    let id = ctx["id"].as_str().expect("id").to_string();
    run(addr, json!({"code": "kept = 'yes'", "context_id": id})).await;
    // Start an endless cell and hang up after its first output.
    let resp = send(
        addr,
        "POST",
        "/execute",
        json!({"code": "print('looping', flush=True)\nwhile True:\n    pass", "context_id": id}),
    )
    .await;
    hang_up_after(resp, "looping").await;
    // The same context answers, its state intact.
    let lines = run(addr, json!({"code": "kept", "context_id": id})).await;
    assert_eq!(of_type(&lines, "result")[0]["text"], "yes", "{lines:?}");

    // The interrupt is repeated while the cell runs on: one that catches the first
    // KeyboardInterrupt still stops well within the grace period, its context intact.
    let resp = send(
        addr,
        "POST",
        "/execute",
        json!({"code": "try:\n    print('looping', flush=True)\n    while True:\n        pass\nexcept KeyboardInterrupt:\n    pass\nwhile True:\n    pass", "context_id": id}),
    )
    .await;
    hang_up_after(resp, "looping").await;
    let started = std::time::Instant::now();
    let lines = run(addr, json!({"code": "kept", "context_id": id})).await;
    assert_eq!(of_type(&lines, "result")[0]["text"], "yes", "{lines:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bash_contexts_and_bad_requests() {
    let addr = start().await;
    let lines = run(
        addr,
        json!({"code": "V=7; cd /; echo $V", "language": "bash"}),
    )
    .await;
    assert_eq!(of_type(&lines, "stdout")[0]["text"], "7\n");
    let lines = run(
        addr,
        json!({"code": "echo $V $(pwd); false", "language": "bash"}),
    )
    .await;
    assert_eq!(of_type(&lines, "stdout")[0]["text"], "7 /\n");
    assert_eq!(of_type(&lines, "error")[0]["value"], "1");

    let (status, text) =
        json_of(send(addr, "POST", "/contexts", json!({"language": "cobol"})).await).await;
    assert_eq!(status, 400);
    assert!(text.contains("unsupported language"), "{text}");
    let (status, _) = json_of(
        send(
            addr,
            "POST",
            "/execute",
            json!({"code": "1", "context_id": "nope"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = json_of(
        send(
            addr,
            "POST",
            "/execute",
            json!({"code": "1", "context_id": "a", "language": "python"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
}
