//! Bounded capture of tool output: the first and last bytes of a stream are kept, the middle is
//! counted and replaced by one line saying how many bytes and lines were cut.
//!
//! Owns the capping rule only; must not know where the bytes come from (processes, files).

use std::collections::VecDeque;

/// Keeps at most `head + tail` bytes of a stream of any length.
#[derive(Debug, Clone)]
pub struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_limit: usize,
    tail_limit: usize,
    total_bytes: u64,
    total_lines: u64,
}

impl Capture {
    /// Keeps `limit` bytes at most: half from the start, half from the end.
    pub fn new(limit: usize) -> Self {
        let head_limit = limit / 2;
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_limit,
            tail_limit: limit - head_limit,
            total_bytes: 0,
            total_lines: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total_bytes += bytes.len() as u64;
        self.total_lines += bytes.iter().filter(|b| **b == b'\n').count() as u64;
        let room = self.head_limit.saturating_sub(self.head.len());
        if room > 0 {
            let n = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= self.tail_limit {
            self.tail.clear();
            self.tail
                .extend(&bytes[bytes.len() - self.tail_limit..bytes.len()]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_limit);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    /// Whether anything was cut.
    pub fn truncated(&self) -> bool {
        self.total_bytes > (self.head.len() + self.tail.len()) as u64
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.total_bytes == 0
    }

    /// The kept text (invalid UTF-8 replaced), with the cut marked.
    pub fn render(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail_bytes: Vec<u8> = self.tail.iter().copied().collect();
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail_bytes);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let tail = String::from_utf8_lossy(&tail_bytes);
        let kept = (self.head.len() + tail_bytes.len()) as u64;
        let kept_lines = (self.head.iter().filter(|b| **b == b'\n').count()
            + tail_bytes.iter().filter(|b| **b == b'\n').count()) as u64;
        let cut_bytes = self.total_bytes - kept;
        let cut_lines = self.total_lines.saturating_sub(kept_lines);
        let sep = if head.ends_with('\n') { "" } else { "\n" };
        format!(
            "{head}{sep}[... {cut_bytes} bytes ({cut_lines} lines) cut from the middle of {} bytes ...]\n{tail}",
            self.total_bytes
        )
    }
}

/// `text` capped to `limit` bytes head+tail (see [`Capture`]); the flag says whether it was cut.
pub fn cap(text: &str, limit: usize) -> (String, bool) {
    if text.len() <= limit {
        return (text.to_owned(), false);
    }
    let mut c = Capture::new(limit);
    c.push(text.as_bytes());
    (c.render(), true)
}

/// The first line of `text`, at most `max` characters, for one-line summaries.
pub fn first_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut out: String = line.chars().take(max).collect();
    if line.chars().count() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = Capture::new(100);
        c.push(b"hello\n");
        c.push(b"world\n");
        assert!(!c.truncated());
        assert_eq!(c.render(), "hello\nworld\n");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_what_was_cut() {
        let mut c = Capture::new(40);
        for i in 0..1000 {
            c.push(format!("line {i}\n").as_bytes());
        }
        assert!(c.truncated());
        let r = c.render();
        assert!(r.starts_with("line 0\nline 1\n"), "{r}");
        assert!(r.ends_with("line 999\n"), "{r}");
        assert!(r.contains("bytes ("), "{r}");
        assert!(r.contains("lines) cut"), "{r}");
        let total: usize = (0..1000).map(|i| format!("line {i}\n").len()).sum();
        assert!(r.contains(&format!("of {total} bytes")), "{r}");
    }

    #[test]
    fn one_big_chunk_and_split_utf8_do_not_panic() {
        let text = "é".repeat(10_000);
        let (r, cut) = cap(&text, 101);
        assert!(cut);
        assert!(r.len() < 300);
        let mut c = Capture::new(3);
        c.push("ééé".as_bytes());
        let _ = c.render();
    }
}
