//! `process.Process`: start, attach to, list, feed, signal and resize processes.

pub mod pty;
pub mod spawn;
pub mod table;

use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use cella_proto::process::{
    CloseStdinRequest, ConnectRequest, Empty, ListRequest, ListResponse, ProcessEvent,
    ProcessEventMessage, ProcessInput, SendInputRequest, SendSignalRequest, StartRequest,
    StreamInputRequest, UpdateRequest,
};
use cella_proto::{Code, RpcError};
use tokio::sync::mpsc;

pub use table::ProcessTable;
use table::{Input, ProcessEntry};

use crate::Envd;
use crate::rpc::{self, ClientStream, Failure, RpcResult, StreamRequest, StreamWriter, Unary};

pub fn routes() -> Router<Envd> {
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
}

async fn start(
    State(envd): State<Envd>,
    headers: HeaderMap,
    StreamRequest(req): StreamRequest<StartRequest>,
) -> Response {
    let result = (|| {
        let user = envd
            .users
            .resolve(rpc::request_user(&headers)?.as_deref())?;
        spawn::start(&envd, &req, &user)
    })();
    let started = match result {
        Ok(s) => s,
        Err(e) => return rpc::stream_error(e),
    };
    let events = started.entry.subscribe();
    started.run(&envd);
    let (writer, response) = rpc::stream_response();
    tokio::spawn(forward(events, writer, rpc::keepalive_interval(&headers)));
    response
}

async fn connect(
    State(envd): State<Envd>,
    headers: HeaderMap,
    StreamRequest(req): StreamRequest<ConnectRequest>,
) -> Response {
    let entry = match envd.processes.find(req.process.as_ref()) {
        Ok(e) => e,
        Err(e) => return rpc::stream_error(e),
    };
    let events = entry.subscribe();
    let (writer, response) = rpc::stream_response();
    tokio::spawn(forward(events, writer, rpc::keepalive_interval(&headers)));
    response
}

/// Streams a subscriber's events to the client, with keepalives, until the process ends or
/// the client goes away (the process keeps running then).
async fn forward(
    mut events: mpsc::Receiver<ProcessEvent>,
    writer: StreamWriter,
    keepalive: Option<Duration>,
) {
    let period = keepalive.unwrap_or(Duration::from_secs(3600 * 24 * 365));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(event) => {
                    let end = matches!(event, ProcessEvent::End(_));
                    if !writer.send(&ProcessEventMessage { event }).await {
                        return;
                    }
                    if end {
                        writer.finish(None).await;
                        return;
                    }
                }
                None => {
                    writer.finish(Some(RpcError::new(Code::Unavailable, "process event stream closed before the process ended"))).await;
                    return;
                }
            },
            _ = ticker.tick() => {
                if !writer.send(&ProcessEventMessage { event: ProcessEvent::Keepalive {} }).await {
                    return;
                }
            }
            _ = writer.closed() => return,
        }
    }
}

async fn list(
    State(envd): State<Envd>,
    Unary(_req): Unary<ListRequest>,
) -> RpcResult<ListResponse> {
    Ok(Unary(ListResponse {
        processes: envd.processes.list(),
    }))
}

async fn write_input(entry: &ProcessEntry, input: ProcessInput) -> Result<(), RpcError> {
    let mut guard = entry.input.lock().await;
    match (&mut *guard, input) {
        (Input::Pipe(tx), ProcessInput::Stdin(data)) => {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&data).await.map_err(|e| {
                RpcError::new(
                    Code::FailedPrecondition,
                    format!("writing to stdin of process {}: {e}", entry.pid),
                )
            })
        }
        (Input::Pty(m), ProcessInput::Pty(data)) | (Input::Pty(m), ProcessInput::Stdin(data)) => {
            m.write_all(&data).await.map_err(|e| {
                RpcError::new(
                    Code::FailedPrecondition,
                    format!("writing to terminal of process {}: {e}", entry.pid),
                )
            })
        }
        (Input::Pipe(_), ProcessInput::Pty(_)) => Err(RpcError::new(
            Code::FailedPrecondition,
            format!(
                "process {} has no terminal: send stdin input instead of pty input",
                entry.pid
            ),
        )),
        (Input::None, _) => Err(RpcError::new(
            Code::FailedPrecondition,
            format!(
                "process {} was started without stdin (start it with stdin: true) or its stdin was closed",
                entry.pid
            ),
        )),
    }
}

async fn send_input(
    State(envd): State<Envd>,
    Unary(req): Unary<SendInputRequest>,
) -> RpcResult<Empty> {
    let entry = envd.processes.find(req.process.as_ref())?;
    let input = req
        .input
        .ok_or_else(|| RpcError::invalid_argument("input is required"))?;
    write_input(&entry, input).await?;
    Ok(Unary(Empty {}))
}

async fn stream_input(State(envd): State<Envd>, req: Request) -> Result<Unary<Empty>, Failure> {
    let mut stream = ClientStream::from_request(req)?;
    let mut entry = None;
    while let Some(msg) = stream.next::<StreamInputRequest>().await? {
        match msg {
            StreamInputRequest::Start { process } => {
                entry = Some(envd.processes.find(process.as_ref())?)
            }
            StreamInputRequest::Data { input } => {
                let Some(e) = &entry else {
                    return Err(RpcError::invalid_argument(
                        "the first message of StreamInput must be start{process}",
                    )
                    .into());
                };
                if let Some(input) = input {
                    write_input(e, input).await?;
                }
            }
            StreamInputRequest::Keepalive {} => {}
        }
    }
    Ok(Unary(Empty {}))
}

async fn send_signal(
    State(envd): State<Envd>,
    Unary(req): Unary<SendSignalRequest>,
) -> RpcResult<Empty> {
    let entry = envd.processes.find(req.process.as_ref())?;
    let Some(signo) = req.signal.number() else {
        return Err(RpcError::invalid_argument(
            "signal is required: SIGNAL_SIGTERM or SIGNAL_SIGKILL",
        )
        .into());
    };
    signal_group(entry.pid, signo)?;
    Ok(Unary(Empty {}))
}

/// Signals a process's whole group (every process started is a session and group leader),
/// falling back to the process alone.
pub fn signal_group(pid: u32, signo: i32) -> Result<(), RpcError> {
    let pid = pid as i32;
    // SAFETY: kill only sends a signal; no memory is involved.
    let rc = unsafe { libc::kill(-pid, signo) };
    // SAFETY: as above.
    if rc == 0 || unsafe { libc::kill(pid, signo) } == 0 {
        return Ok(());
    }
    Err(RpcError::new(
        Code::NotFound,
        format!(
            "signalling process {pid}: {}",
            std::io::Error::last_os_error()
        ),
    ))
}

async fn close_stdin(
    State(envd): State<Envd>,
    Unary(req): Unary<CloseStdinRequest>,
) -> RpcResult<Empty> {
    let entry = envd.processes.find(req.process.as_ref())?;
    let mut guard = entry.input.lock().await;
    match &*guard {
        Input::Pty(_) => Err(RpcError::new(
            Code::FailedPrecondition,
            format!(
                "process {} uses a terminal; send EOT (Ctrl-D, 0x04) instead of closing stdin",
                entry.pid
            ),
        )
        .into()),
        _ => {
            *guard = Input::None;
            Ok(Unary(Empty {}))
        }
    }
}

async fn update(State(envd): State<Envd>, Unary(req): Unary<UpdateRequest>) -> RpcResult<Empty> {
    let entry = envd.processes.find(req.process.as_ref())?;
    let Some(size) = req.pty.and_then(|p| p.size) else {
        return Ok(Unary(Empty {}));
    };
    let Some(master) = &entry.pty else {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!("process {} has no terminal to resize", entry.pid),
        )
        .into());
    };
    let cols =
        u16::try_from(size.cols).map_err(|_| RpcError::invalid_argument("cols out of range"))?;
    let rows =
        u16::try_from(size.rows).map_err(|_| RpcError::invalid_argument("rows out of range"))?;
    master
        .resize(cols, rows)
        .map_err(|e| RpcError::internal(format!("resizing terminal: {e}")))?;
    Ok(Unary(Empty {}))
}
