//! Connect protocol plumbing for axum handlers: unary JSON calls, server-streaming responses
//! with envelopes, client-streaming request bodies, Connect errors, and E2B's user selection
//! (`Authorization: Basic base64("<user>:")`).

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cella_proto::{Code, Envelope, EnvelopeDecoder, RpcError};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

/// Largest unary request body accepted.
const MAX_UNARY_BODY: usize = 16 * 1024 * 1024;

/// A Connect error as an HTTP response (unary calls, and streaming calls that fail before the
/// first message).
#[derive(Debug)]
pub struct Failure(pub RpcError);

impl From<RpcError> for Failure {
    fn from(e: RpcError) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.0).unwrap_or_default();
        (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()
    }
}

/// Result type of unary handlers.
pub type RpcResult<T> = Result<Unary<T>, Failure>;

/// A unary Connect JSON message, as a request extractor and as a response.
pub struct Unary<T>(pub T);

impl<T: Serialize> IntoResponse for Unary<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(body) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            Err(e) => {
                Failure(RpcError::internal(format!("encoding response: {e}"))).into_response()
            }
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Unary<T> {
    type Rejection = Failure;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("");
            if !ct.starts_with("application/json") {
                return Err(Failure(RpcError::new(
                    Code::Unimplemented,
                    format!(
                        "unsupported content type {ct:?}: this endpoint speaks Connect with the JSON codec (application/json)"
                    ),
                )));
            }
        }
        let body = axum::body::to_bytes(req.into_body(), MAX_UNARY_BODY)
            .await
            .map_err(|e| {
                Failure(RpcError::new(
                    Code::ResourceExhausted,
                    format!("reading request body: {e}"),
                ))
            })?;
        parse_message(&body).map(Unary).map_err(Failure)
    }
}

/// Parses one JSON message; an empty body is the empty message.
pub fn parse_message<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| RpcError::invalid_argument(format!("malformed request message: {e}")))
}

/// The single request message of a server-streaming call (one envelope).
pub struct StreamRequest<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for StreamRequest<T> {
    type Rejection = Failure;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        check_stream_content_type(req.headers())?;
        let body = axum::body::to_bytes(req.into_body(), MAX_UNARY_BODY)
            .await
            .map_err(|e| {
                Failure(RpcError::new(
                    Code::ResourceExhausted,
                    format!("reading request body: {e}"),
                ))
            })?;
        let mut dec = EnvelopeDecoder::new();
        dec.push(&body);
        let env = dec.next_envelope()?.ok_or_else(|| {
            RpcError::invalid_argument("request body holds no complete Connect envelope")
        })?;
        parse_message(&env.data).map(StreamRequest).map_err(Failure)
    }
}

fn check_stream_content_type(headers: &HeaderMap) -> Result<(), Failure> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with(cella_proto::CONTENT_TYPE_STREAM) {
        Ok(())
    } else {
        Err(Failure(RpcError::new(
            Code::Unimplemented,
            format!(
                "unsupported content type {ct:?}: streaming calls use application/connect+json"
            ),
        )))
    }
}

/// The request messages of a client-streaming call, decoded as they arrive.
pub struct ClientStream {
    body: axum::body::BodyDataStream,
    decoder: EnvelopeDecoder,
    done: bool,
}

impl ClientStream {
    pub fn from_request(req: Request) -> Result<Self, Failure> {
        check_stream_content_type(req.headers())?;
        Ok(Self {
            body: req.into_body().into_data_stream(),
            decoder: EnvelopeDecoder::new(),
            done: false,
        })
    }

    /// The next message; `Ok(None)` at the end of the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, RpcError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(env) = self.decoder.next_envelope()? {
                if env.is_end_stream() {
                    self.done = true;
                    return Ok(None);
                }
                return parse_message(&env.data).map(Some);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("request stream broke: {e}"),
                    ));
                }
                None => {
                    self.done = true;
                    if self.decoder.pending() > 0 {
                        return Err(RpcError::invalid_argument(
                            "request stream ended mid-envelope",
                        ));
                    }
                    return Ok(None);
                }
            }
        }
    }
}

/// Writes the messages of a server-streaming response.
pub struct StreamWriter {
    tx: mpsc::Sender<Bytes>,
}

impl StreamWriter {
    /// Sends one message; `false` once the client has gone away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        self.tx.send(Envelope::message(msg)).await.is_ok()
    }

    /// Whether the client has gone away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Ends the stream, with an error when the call failed.
    pub async fn finish(self, error: Option<RpcError>) {
        let _ = self.tx.send(Envelope::end_stream(error.as_ref())).await;
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Starts a server-streaming response: the handler keeps the writer, the response streams out.
pub fn stream_response() -> (StreamWriter, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Bytes, std::convert::Infallible>),
    );
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, cella_proto::CONTENT_TYPE_STREAM)
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()));
    (StreamWriter { tx }, resp)
}

/// A streaming call that fails before its first message: HTTP 200 with only an end-of-stream
/// envelope carrying the error, as Connect clients expect (an HTTP error status would lose the
/// code: a plain 404 reads as `unimplemented`).
pub fn stream_error(error: RpcError) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, cella_proto::CONTENT_TYPE_STREAM)
        .body(Body::from(Envelope::end_stream(Some(&error))))
        .unwrap_or_else(|_| Failure(error).into_response())
}

/// The user a request selects with `Authorization: Basic base64("<user>:")`, if any.
pub fn request_user(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| RpcError::new(Code::Unauthenticated, "authorization header is not ASCII"))?;
    let Some(encoded) = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
    else {
        return Err(RpcError::new(
            Code::Unauthenticated,
            "authorization must be Basic base64(\"<user>:\") to select a user",
        ));
    };
    let decoded = cella_proto::b64::decode(encoded.trim())
        .map_err(|_| RpcError::new(Code::Unauthenticated, "authorization is not valid base64"))?;
    let text = String::from_utf8(decoded)
        .map_err(|_| RpcError::new(Code::Unauthenticated, "user name is not UTF-8"))?;
    let user = text.split(':').next().unwrap_or("").to_string();
    Ok(if user.is_empty() { None } else { Some(user) })
}

/// Keepalive interval a streaming client asked for (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive_interval(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(std::time::Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_selects_user() {
        let mut h = HeaderMap::new();
        assert_eq!(request_user(&h).expect("ok"), None);
        // base64("root:")
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic cm9vdDo="),
        );
        assert_eq!(request_user(&h).expect("ok").as_deref(), Some("root"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(
            request_user(&h).expect_err("bad").code,
            Code::Unauthenticated
        );
    }
}
