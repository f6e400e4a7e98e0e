//! What a client's first bytes say about the name it means: the SNI of a TLS ClientHello, or
//! the Host header of a plain HTTP request. The egress proxy compares that name with the one it
//! checked the policy against. Pure parsing, no I/O.

/// What the first bytes of a tunnelled stream turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstBytes {
    /// A complete TLS ClientHello; the server name if it carries one.
    Tls(Option<String>),
    /// A complete HTTP/1 request head; its Host (without port) if any.
    Http(Option<String>),
    /// Something else (SSH, a database protocol…): nothing to compare.
    Opaque,
    /// Not enough bytes yet to tell.
    Incomplete,
}

const HTTP_METHODS: &[&str] = &[
    "GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT ",
];

/// Longest prefix worth buffering before giving up on a complete head.
pub const MAX_SNIFF: usize = 16 * 1024 + 5;

pub fn classify(buf: &[u8]) -> FirstBytes {
    if buf.is_empty() {
        return FirstBytes::Incomplete;
    }
    if buf[0] == 0x16 {
        return match client_hello_sni(buf) {
            Ok(sni) => FirstBytes::Tls(sni),
            Err(Partial::More) if buf.len() < MAX_SNIFF => FirstBytes::Incomplete,
            Err(_) => FirstBytes::Opaque,
        };
    }
    let could_be_http = HTTP_METHODS
        .iter()
        .any(|m| buf.starts_with(m.as_bytes()) || m.as_bytes().starts_with(buf));
    if !could_be_http {
        return FirstBytes::Opaque;
    }
    match find_head_end(buf) {
        Some(end) => FirstBytes::Http(host_header(&buf[..end])),
        None if buf.len() < MAX_SNIFF => FirstBytes::Incomplete,
        None => FirstBytes::Opaque,
    }
}

/// Index just past `\r\n\r\n`.
pub fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The Host header of a request head, lower-cased, without its port.
pub fn host_header(head: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("host")
            .then(|| strip_port(v.trim()).to_ascii_lowercase())
    })
}

/// `host:port`, `[v6]:port`, `host` → host (brackets removed).
pub fn strip_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

enum Partial {
    More,
    Invalid,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Partial> {
        let end = self.pos.checked_add(n).ok_or(Partial::Invalid)?;
        let s = self.buf.get(self.pos..end).ok_or(Partial::More)?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<usize, Partial> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, Partial> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

/// Parses the ClientHello in the first TLS record (the common case: it fits in one record).
fn client_hello_sni(buf: &[u8]) -> Result<Option<String>, Partial> {
    let mut rec = Reader { buf, pos: 0 };
    if rec.u8()? != 0x16 {
        return Err(Partial::Invalid);
    }
    let version = rec.take(2)?;
    if version[0] != 3 {
        return Err(Partial::Invalid);
    }
    let len = rec.u16()?;
    let body = rec.take(len)?;
    let mut r = Reader { buf: body, pos: 0 };
    // A body that is cut short means the hello spans records: treat it as unparseable.
    let cut = |e: Partial| match e {
        Partial::More => Partial::Invalid,
        other => other,
    };
    if r.u8().map_err(cut)? != 1 {
        return Err(Partial::Invalid);
    }
    r.take(3).map_err(cut)?; // handshake length
    r.take(2 + 32).map_err(cut)?; // version, random
    let sid = r.u8().map_err(cut)?;
    r.take(sid).map_err(cut)?;
    let suites = r.u16().map_err(cut)?;
    r.take(suites).map_err(cut)?;
    let comp = r.u8().map_err(cut)?;
    r.take(comp).map_err(cut)?;
    if r.pos == body.len() {
        return Ok(None);
    }
    let ext_len = r.u16().map_err(cut)?;
    let exts = r.take(ext_len).map_err(cut)?;
    let mut e = Reader { buf: exts, pos: 0 };
    while e.pos < exts.len() {
        let kind = e.u16().map_err(cut)?;
        let len = e.u16().map_err(cut)?;
        let data = e.take(len).map_err(cut)?;
        if kind != 0 {
            continue;
        }
        let mut s = Reader { buf: data, pos: 0 };
        let list_len = s.u16().map_err(cut)?;
        let list = s.take(list_len).map_err(cut)?;
        let mut l = Reader { buf: list, pos: 0 };
        while l.pos < list.len() {
            let name_type = l.u8().map_err(cut)?;
            let n = l.u16().map_err(cut)?;
            let name = l.take(n).map_err(cut)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).map_err(|_| Partial::Invalid)?;
                return Ok(Some(name.to_ascii_lowercase()));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal, well-formed ClientHello carrying `sni` (used by the proxy's tests too).
    pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let n = name.as_bytes();
            let mut list = vec![0u8];
            list.extend((n.len() as u16).to_be_bytes());
            list.extend(n);
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend(list);
            exts.extend(0u16.to_be_bytes());
            exts.extend((data.len() as u16).to_be_bytes());
            exts.extend(data);
        }
        // An unrelated extension (supported_versions) before or after does not matter.
        exts.extend(43u16.to_be_bytes());
        exts.extend(3u16.to_be_bytes());
        exts.extend([2, 3, 4]);
        let mut hello = vec![3, 3];
        hello.extend([7u8; 32]);
        hello.push(0); // session id
        hello.extend(2u16.to_be_bytes());
        hello.extend([0x13, 0x01]);
        hello.extend([1, 0]); // compression
        hello.extend((exts.len() as u16).to_be_bytes());
        hello.extend(exts);
        let mut hs = vec![1];
        hs.extend(&(hello.len() as u32).to_be_bytes()[1..]);
        hs.extend(hello);
        let mut rec = vec![0x16, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn tls_sni() {
        let h = client_hello(Some("Api.Example.com"));
        assert_eq!(
            classify(&h),
            FirstBytes::Tls(Some("api.example.com".into()))
        );
        assert_eq!(classify(&client_hello(None)), FirstBytes::Tls(None));
        for cut in 1..h.len() {
            assert_eq!(classify(&h[..cut]), FirstBytes::Incomplete, "cut at {cut}");
        }
    }

    #[test]
    fn http_host() {
        let req = b"GET / HTTP/1.1\r\nhost: Example.com:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(classify(req), FirstBytes::Http(Some("example.com".into())));
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), FirstBytes::Incomplete);
        assert_eq!(classify(b"GE"), FirstBytes::Incomplete);
        assert_eq!(classify(b"SSH-2.0-OpenSSH\r\n"), FirstBytes::Opaque);
        assert_eq!(strip_port("[::1]:80"), "::1");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("a.test"), "a.test");
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u32 = 12345;
        for len in 0..600 {
            let mut buf = vec![0x16u8, 3, 1];
            for _ in 0..len {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                buf.push((x >> 16) as u8);
            }
            let _ = classify(&buf);
        }
    }
}
