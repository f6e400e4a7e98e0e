//! The Connect streaming envelope: one flag byte, a 4-byte big-endian length, then the message.
//! A stream ends with an envelope whose flags carry [`FLAG_END_STREAM`] and whose body is the
//! end-of-stream JSON (`{}` or `{"error": {...}}`).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{Code, RpcError};

/// The message is compressed (cella never compresses and refuses compressed input).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// The envelope is the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;

/// Largest single message accepted (matches connect-go's default read limit of 4 MiB × 4).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// One framed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub data: Bytes,
}

impl Envelope {
    /// Frames a message body.
    pub fn encode(flags: u8, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(5 + data.len());
        out.put_u8(flags);
        out.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
        out.put_slice(data);
        out.freeze()
    }

    /// Frames a serializable message as a data envelope.
    pub fn message<T: serde::Serialize>(msg: &T) -> Bytes {
        // Serializing our own wire structs cannot fail: they hold only strings, numbers and maps.
        let json = serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec());
        Self::encode(0, &json)
    }

    /// The end-of-stream envelope, carrying an error when the call failed.
    pub fn end_stream(error: Option<&RpcError>) -> Bytes {
        let body = match error {
            None => b"{}".to_vec(),
            Some(err) => serde_json::to_vec(&serde_json::json!({ "error": err }))
                .unwrap_or_else(|_| b"{}".to_vec()),
        };
        Self::encode(FLAG_END_STREAM, &body)
    }

    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }

    /// Parses an end-of-stream body into the error it carries, if any.
    pub fn end_stream_error(&self) -> Option<RpcError> {
        #[derive(serde::Deserialize)]
        struct EndStream {
            error: Option<RpcError>,
        }
        match serde_json::from_slice::<EndStream>(&self.data) {
            Ok(end) => end.error,
            Err(e) => Some(RpcError::new(
                Code::Internal,
                format!("malformed end-of-stream message: {e}"),
            )),
        }
    }
}

/// Incremental decoder: feed it body chunks as they arrive, take complete envelopes out.
#[derive(Debug, Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Returns the next complete envelope, `Ok(None)` when more bytes are needed.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, RpcError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit"),
            ));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Internal,
                "compressed messages are not supported: send uncompressed envelopes",
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let data = self.buf.split_to(len).freeze();
        Ok(Some(Envelope { flags, data }))
    }

    /// Bytes received that do not yet form a whole envelope.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_split_across_chunks() {
        let a = Envelope::encode(0, br#"{"a":1}"#);
        let b = Envelope::end_stream(None);
        let mut all = a.to_vec();
        all.extend_from_slice(&b);
        let mut dec = EnvelopeDecoder::new();
        let mut got = Vec::new();
        for byte in all {
            dec.push(&[byte]);
            while let Some(env) = dec.next_envelope().expect("valid") {
                got.push(env);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].data[..], br#"{"a":1}"#);
        assert!(got[1].is_end_stream());
        assert_eq!(got[1].end_stream_error(), None);
        assert_eq!(dec.pending(), 0);
    }

    #[test]
    fn end_stream_carries_error() {
        let err = RpcError::new(Code::NotFound, "process 7 not found");
        let bytes = Envelope::end_stream(Some(&err));
        let mut dec = EnvelopeDecoder::new();
        dec.push(&bytes);
        let env = dec.next_envelope().expect("valid").expect("complete");
        assert_eq!(env.flags, FLAG_END_STREAM);
        assert_eq!(env.end_stream_error(), Some(err));
    }

    #[test]
    fn refuses_oversized_and_compressed() {
        let mut dec = EnvelopeDecoder::new();
        dec.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            dec.next_envelope().expect_err("too big").code,
            Code::ResourceExhausted
        );
        let mut dec = EnvelopeDecoder::new();
        dec.push(&Envelope::encode(FLAG_COMPRESSED, b"x"));
        assert_eq!(
            dec.next_envelope().expect_err("compressed").code,
            Code::Internal
        );
    }
}
