//! Query-string components of envd's HTTP routes (`/files?path=…&username=…`).

/// Percent-encodes everything but RFC 3986 unreserved characters and `/`, so a path stays
/// readable and a value cannot end the parameter it is in.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_separators_and_non_ascii() {
        assert_eq!(
            percent_encode("/home/user/a b&c=d"),
            "/home/user/a%20b%26c%3Dd"
        );
        assert_eq!(percent_encode("/a b/ü&x=1"), "/a%20b/%C3%BC%26x%3D1");
        assert_eq!(percent_encode("a-z_0.9~"), "a-z_0.9~");
    }
}
