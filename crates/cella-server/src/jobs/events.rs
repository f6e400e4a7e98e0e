//! A job's events as clients read them: `GET /v1/jobs/{id}/events` as Server-Sent Events
//! (`id:` is the event's seq, so `Last-Event-ID` resumes after it) or, with an `Upgrade:
//! websocket` request, as one JSON text message per event. Both replay the stored events after
//! the cursor, then follow the job live and end after its `job_finished` event.
//!
//! The store is the only source: the runner stores every event before it announces its seq
//! on the [`Hub`], and readers only ever send what they read back from the store. The hub is
//! a wake-up, never a data path; without it (a job running on another node) readers poll.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::{HeaderMap, Request};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cella_store::{JOB_FINISHED_EVENT, JobEvent, Store};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::watch;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// How long a reader without a hub subscription waits before looking at the store again.
const POLL: Duration = Duration::from_millis(500);
/// Events read from the store at once.
const BATCH: u32 = 500;

/// Per running job, the seq of its newest stored event.
#[derive(Default)]
pub struct Hub {
    jobs: Mutex<HashMap<String, watch::Sender<i64>>>,
}

impl Hub {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<i64>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The runner starts announcing job `id`.
    pub fn open(&self, id: &str, last_seq: i64) {
        self.map().insert(id.to_owned(), watch::channel(last_seq).0);
    }

    /// Event `seq` of job `id` is stored.
    pub fn stored(&self, id: &str, seq: i64) {
        if let Some(tx) = self.map().get(id) {
            tx.send_replace(seq);
        }
    }

    /// The job ended (its last event is stored): readers wake, see the end and stop.
    pub fn close(&self, id: &str) {
        self.map().remove(id);
    }

    fn subscribe(&self, id: &str) -> Option<watch::Receiver<i64>> {
        self.map().get(id).map(watch::Sender::subscribe)
    }
}

/// The wire form of one event (SSE `data:` and WebSocket text message).
pub fn event_json(e: &JobEvent) -> serde_json::Value {
    serde_json::json!({
        "seq": e.seq,
        "type": e.kind,
        "created_at": crate::control::rfc3339(e.created_at),
        "data": e.payload,
    })
}

/// Reads job `id`'s events after a cursor: stored ones first, then live ones, until the end.
struct Follower {
    state: AppState,
    store: Store,
    id: String,
    after: i64,
    buffer: VecDeque<JobEvent>,
    wake: Option<watch::Receiver<i64>>,
    finished: bool,
}

impl Follower {
    fn new(state: AppState, id: String, after: i64) -> Self {
        Follower {
            store: state.store.clone(),
            state,
            id,
            after,
            buffer: VecDeque::new(),
            wake: None,
            finished: false,
        }
    }

    /// The next event, or `None` once the job's last event was returned (or the job is gone).
    async fn next(&mut self) -> Result<Option<JobEvent>, ApiError> {
        loop {
            if let Some(e) = self.buffer.pop_front() {
                self.after = e.seq;
                if e.kind == JOB_FINISHED_EVENT {
                    self.finished = true;
                }
                return Ok(Some(e));
            }
            if self.finished {
                return Ok(None);
            }
            // Subscribe before reading, so an event stored after the read still wakes us.
            if self.wake.is_none() {
                self.wake = self.state.jobs.hub.subscribe(&self.id);
            }
            let events = self
                .store
                .list_job_events(&self.id, self.after, BATCH)
                .await?;
            if !events.is_empty() {
                self.buffer.extend(events);
                continue;
            }
            match self.store.get_job(&self.id).await? {
                // Ended and everything after the cursor was read (a cursor past the end).
                Some(job) if job.status.is_final() && job.last_seq <= self.after => {
                    return Ok(None);
                }
                None => return Ok(None),
                Some(_) => {}
            }
            match &mut self.wake {
                Some(rx) => {
                    let after = self.after;
                    let closed = tokio::time::timeout(POLL * 4, rx.wait_for(|seq| *seq > after))
                        .await
                        .is_ok_and(|r| r.is_err());
                    if closed {
                        // The job ended on this node: one more read finds the last event.
                        self.wake = None;
                    }
                }
                None => tokio::time::sleep(POLL).await,
            }
        }
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct EventsQuery {
    /// Resume after this seq (for clients that cannot send `Last-Event-ID`, e.g. WebSocket).
    after: Option<i64>,
}

fn cursor(headers: &HeaderMap, query: &EventsQuery) -> Result<i64, ApiError> {
    if let Some(after) = query.after {
        return Ok(after.max(0));
    }
    match headers.get("last-event-id") {
        None => Ok(0),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .map(|n| n.max(0))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid Last-Event-ID: send the seq (a number) of the last event received",
                )
            }),
    }
}

/// `GET /v1/jobs/{id}/events`: SSE, or a WebSocket when the request asks to upgrade.
pub async fn events(
    axum::extract::State(state): axum::extract::State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
    req: Request<Body>,
) -> Result<Response, ApiError> {
    super::api::job_of(&state, &caller, &id).await?;
    let after = cursor(req.headers(), &query)?;
    let wants_ws = req
        .headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let follower = Follower::new(state.clone(), id, after);
    if wants_ws {
        let (mut parts, _) = req.into_parts();
        let ws = WebSocketUpgrade::from_request_parts(&mut parts, &state)
            .await
            .map_err(|e| ApiError::bad_request(format!("websocket upgrade: {}", e.body_text())))?;
        return Ok(ws.on_upgrade(move |socket| websocket(socket, follower)));
    }
    Ok(Sse::new(sse_stream(follower))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn sse_stream(follower: Follower) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(follower, |mut f| async move {
        match f.next().await {
            Ok(Some(e)) => {
                let event = Event::default()
                    .id(e.seq.to_string())
                    .event(e.kind.clone())
                    .data(event_json(&e).to_string());
                Some((Ok(event), f))
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!(job = %f.id, "streaming events: {}", err.message);
                f.finished = true;
                f.buffer.clear();
                let event = Event::default()
                    .event("error")
                    .data(serde_json::json!({ "message": err.message }).to_string());
                Some((Ok(event), f))
            }
        }
    })
}

async fn websocket(mut socket: WebSocket, mut follower: Follower) {
    loop {
        let next = tokio::select! {
            next = follower.next() => next,
            // A client that closes (or sends anything unexpected) ends the stream.
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                _ => return,
            },
        };
        match next {
            Ok(Some(e)) => {
                let text = event_json(&e).to_string();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(err) => {
                let text = serde_json::json!({ "type": "error", "message": err.message });
                let _ = socket.send(Message::Text(text.to_string().into())).await;
                break;
            }
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}
