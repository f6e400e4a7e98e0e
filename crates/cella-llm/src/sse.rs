//! A server-sent-events decoder (the WHATWG `text/event-stream` framing) fed with arbitrary byte
//! chunks.
//!
//! Owns framing only: lines ending in `\n`, `\r\n` or `\r` (also when a terminator is split
//! across chunks), `:` comments (keep-alives), `event:` names, multi-line `data:`, and a blank
//! line dispatching the event. Knows nothing about JSON or providers; never panics, and reports
//! invalid UTF-8 or an over-long line as an error instead of buffering forever.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server sent one.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Why the byte stream is not valid SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("sse line is not valid utf-8: {0}")]
    Utf8(String),
    #[error("sse line longer than {limit} bytes without a line ending")]
    LineTooLong { limit: usize },
}

/// The longest line accepted (a single tool-call chunk is far smaller; this bounds memory).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// Incremental decoder: `push` chunks as they arrive, `finish` at the end of the body.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
    started: bool,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns the events completed by it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') else {
                break;
            };
            let terminator_len = if rest[pos] == b'\r' {
                match rest.get(pos + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    // A `\r` at the very end: a `\n` may follow in the next chunk.
                    None => break,
                }
            } else {
                1
            };
            let line = rest[..pos].to_vec();
            start += pos + terminator_len;
            if let Some(event) = self.line(&line)? {
                events.push(event);
            }
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_LINE {
            self.buf.clear();
            return Err(SseError::LineTooLong { limit: MAX_LINE });
        }
        Ok(events)
    }

    /// Ends the stream: a last line without a terminator is taken, and a pending event without
    /// the closing blank line is still dispatched (servers that close right after the last
    /// `data:` line are common enough).
    pub fn finish(mut self) -> Result<Option<SseEvent>, SseError> {
        let mut rest = std::mem::take(&mut self.buf);
        if rest.last() == Some(&b'\r') {
            rest.pop();
        }
        if !rest.is_empty()
            && let Some(event) = self.line(&rest)?
        {
            return Ok(Some(event));
        }
        Ok(self.dispatch())
    }

    fn line(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        let mut line = std::str::from_utf8(line).map_err(|e| {
            SseError::Utf8(format!(
                "{e} in {:?}",
                String::from_utf8_lossy(&line[..line.len().min(80)])
            ))
        })?;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            // `id` and `retry` are for reconnecting EventSources; a POST stream never reconnects.
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            events.extend(decoder.push(chunk).expect("valid sse"));
        }
        events.extend(decoder.finish().expect("valid sse"));
        events
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn every_split_point_and_line_ending_gives_the_same_events() {
        let body = "\u{feff}: keep-alive\n\nevent: message_start\ndata: {\"a\":1}\n\ndata: x\ndata:  y\n\n: ping\nevent: ping\n\ndata: [DONE]\n\n";
        let want = vec![
            ev(Some("message_start"), "{\"a\":1}"),
            ev(None, "x\n y"),
            ev(None, "[DONE]"),
        ];
        for ending in ["\n", "\r\n", "\r"] {
            let body = body.replace('\n', ending);
            for piece in 1..=body.len() {
                assert_eq!(
                    decode_in_pieces(body.as_bytes(), piece),
                    want,
                    "ending {ending:?}, pieces of {piece}"
                );
            }
        }
    }

    #[test]
    fn multibyte_characters_split_across_chunks() {
        let body = "data: {\"text\":\"héllo ✓ 🦀\"}\n\n";
        for piece in 1..8 {
            assert_eq!(
                decode_in_pieces(body.as_bytes(), piece),
                vec![ev(None, "{\"text\":\"héllo ✓ 🦀\"}")]
            );
        }
    }

    #[test]
    fn last_event_without_blank_line_is_dispatched() {
        assert_eq!(
            decode_in_pieces(b"data: a\n\ndata: b", 3),
            vec![ev(None, "a"), ev(None, "b")]
        );
        assert_eq!(decode_in_pieces(b"data: c\r", 100), vec![ev(None, "c")]);
        assert_eq!(decode_in_pieces(b"", 1), vec![]);
        assert_eq!(decode_in_pieces(b": only a comment\n\n\n", 1), vec![]);
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let mut decoder = SseDecoder::new();
        let err = decoder
            .push(b"data: \xff\xfe\n\n")
            .expect_err("invalid utf-8");
        assert!(matches!(err, SseError::Utf8(_)), "{err}");
    }

    #[test]
    fn unbounded_line_is_refused() {
        let mut decoder = SseDecoder::new();
        let big = vec![b'a'; MAX_LINE + 1];
        assert_eq!(
            decoder.push(&big),
            Err(SseError::LineTooLong { limit: MAX_LINE })
        );
    }
}
