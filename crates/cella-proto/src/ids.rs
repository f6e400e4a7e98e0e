//! Identifiers: sandbox ids match `^[a-z0-9]+$` because E2B clients route on them.

/// Alphabet of sandbox ids.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Length of generated sandbox ids (36^20 ≈ 1.3e31 possibilities).
pub const SANDBOX_ID_LEN: usize = 20;

/// Creates a new random sandbox id from the kernel's random source.
pub fn new_sandbox_id() -> String {
    let mut raw = [0u8; SANDBOX_ID_LEN];
    fill_random(&mut raw);
    raw.iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// Random hex of `bytes` random bytes (tokens, keys).
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    fill_random(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn fill_random(buf: &mut [u8]) {
    use std::io::Read;
    // /dev/urandom never blocks after boot and never fails short on Linux.
    if let Ok(mut f) = std::fs::File::open("/dev/urandom")
        && f.read_exact(buf).is_ok()
    {
        return;
    }
    // Last resort (no /dev/urandom): time- and address-seeded, still unique per process.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (buf.as_ptr() as u64);
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Whether `id` is a valid sandbox id.
pub fn is_valid_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_routable() {
        for _ in 0..100 {
            let id = new_sandbox_id();
            assert_eq!(id.len(), SANDBOX_ID_LEN);
            assert!(is_valid_sandbox_id(&id), "{id}");
        }
        assert!(!is_valid_sandbox_id("Abc"));
        assert!(!is_valid_sandbox_id("a-b"));
        assert!(!is_valid_sandbox_id(""));
    }
}
