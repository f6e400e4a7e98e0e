//! What a caller asks for when creating a sandbox: template, resource limits, network, files
//! and environment. Also the parsers for human-friendly sizes and durations the CLI accepts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Resource limits; `None` means "not limited" (beyond the host's own limits).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    /// CPU bandwidth in CPUs (1.5 = one and a half cores).
    pub cpus: Option<f64>,
    pub pids: Option<u32>,
    /// Size of the sandbox's writable layer (root, home, /tmp together).
    pub disk_bytes: Option<u64>,
}

impl Limits {
    /// The defaults `cella exec` and the server apply: 512 MiB, 1 CPU, 256 processes, 1 GiB.
    pub fn standard() -> Self {
        Limits {
            memory_bytes: Some(512 << 20),
            cpus: Some(1.0),
            pids: Some(256),
            disk_bytes: Some(1 << 30),
        }
    }
}

/// Network access of a sandbox: its egress policy (deny-all by default; see
/// [`crate::network::policy`]). The CLI form is `none`, `internet`, `allow:LIST`, `deny:LIST`.
pub type Network = crate::network::NetworkPolicy;

/// Everything needed to create a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub template: String,
    pub limits: Limits,
    #[serde(default)]
    pub network: Network,
    /// Environment variables for every process in the sandbox.
    pub envs: BTreeMap<String, String>,
    /// A host directory bound read-write at [`WORKSPACE`] and used as the working directory.
    pub workdir: Option<PathBuf>,
    /// Agent Skills mounted read-only at `/skills/<name>`: name → host directory. Names are
    /// validated (no path separators, no `..`) before anything is mounted.
    #[serde(default)]
    pub skills: BTreeMap<String, PathBuf>,
    /// The user processes run as when a request names none.
    pub default_user: String,
    /// How long the sandbox may live; it is killed at `created + lifetime`.
    pub lifetime: Option<Duration>,
    pub metadata: BTreeMap<String, String>,
}

/// Where `workdir` appears inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            template: "base".into(),
            limits: Limits::standard(),
            network: Network::default(),
            envs: BTreeMap::new(),
            workdir: None,
            skills: BTreeMap::new(),
            default_user: "user".into(),
            lifetime: None,
            metadata: BTreeMap::new(),
        }
    }
}

/// Where skills appear inside the sandbox.
pub const SKILLS_DIR: &str = "/skills";

/// Checks a skill name used as a directory under [`SKILLS_DIR`].
pub fn validate_skill_mount_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid skill name {name:?} for a sandbox mount: use lowercase letters, digits and hyphens"
        ))
    }
}

/// Parses sizes like `512M`, `1G`, `1.5GiB`, `4096` (bytes). Binary multiples.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid size {text:?}: expected a number with an optional unit, like 512M or 1G")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {text:?}: use K, M, G or T"
            ));
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {text:?}: must be at least 1 byte"));
    }
    Ok(bytes as u64)
}

/// Parses durations like `30s`, `500ms`, `2m`, `1h`, `1.5s`, `10` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid duration {text:?}: expected a number with a unit, like 30s, 500ms or 2m")
    })?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("invalid duration {text:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("3 days").is_err());
    }
}
