//! Server configuration: defaults, then a TOML file, then `CELLA_*` environment variables, then
//! flags (flags win). The binary reads flags and the environment; this module owns the resolved
//! result and the file format.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; SQLite under the data directory by default.
    pub database_url: String,
    /// Serve `<port>-<id>.<domain>` hosts too.
    pub domain: Option<String>,
    /// Require API keys (refused off loopback when false).
    pub auth: bool,
    /// Live sandboxes allowed per tenant (429 past it).
    pub max_sandboxes_per_tenant: u64,
    /// Ready sandboxes kept per template.
    pub warm_pools: BTreeMap<String, usize>,
    /// Lifetime when a create asks for none (seconds).
    pub default_timeout_secs: u64,
    /// Upper bound on any lifetime (seconds).
    pub max_timeout_secs: u64,
    /// How this node runs jobs.
    pub jobs: crate::jobs::JobsConfig,
}

impl ServerConfig {
    pub fn with_data_dir(data_dir: PathBuf) -> Self {
        let database_url = default_database_url(&data_dir);
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            data_dir,
            database_url,
            domain: None,
            auth: true,
            max_sandboxes_per_tenant: 100,
            warm_pools: BTreeMap::new(),
            default_timeout_secs: 300,
            max_timeout_secs: 24 * 3600,
            jobs: Default::default(),
        }
    }
}

/// The embedded database's URL for a data directory.
fn default_database_url(data_dir: &Path) -> String {
    format!("sqlite://{}", data_dir.join("cella.db").display())
}

/// The TOML configuration file (`cella serve --config FILE`). Every key is optional; unknown
/// keys are refused so a typo does not silently fall back to a default.
///
/// ```toml
/// listen = "0.0.0.0:3000"
/// data_dir = "/var/lib/cella"
/// database_url = "postgres://cella@db/cella"
/// domain = "sandboxes.example.com"
/// auth = true
/// max_sandboxes_per_tenant = 100
/// default_timeout = "5m"
/// max_timeout = "24h"
///
/// [warm_pools]
/// base = 4
/// ```
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<String>,
    pub domain: Option<String>,
    pub auth: Option<bool>,
    pub max_sandboxes_per_tenant: Option<u64>,
    pub default_timeout: Option<String>,
    pub max_timeout: Option<String>,
    #[serde(default)]
    pub warm_pools: BTreeMap<String, usize>,
}

impl FileConfig {
    /// Reads and parses a configuration file; errors name the file, line and key.
    pub fn load(path: &Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the configuration file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("in {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<FileConfig, String> {
        let file: FileConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        for key in [&file.default_timeout, &file.max_timeout]
            .into_iter()
            .flatten()
        {
            cella_sandbox::spec::parse_duration(key)
                .map_err(|e| format!("invalid duration {key:?}: {e}"))?;
        }
        Ok(file)
    }

    /// The configuration this file describes over the defaults.
    pub fn resolve(&self, default_data_dir: PathBuf) -> Result<ServerConfig, String> {
        let data_dir = self.data_dir.clone().unwrap_or(default_data_dir);
        let mut c = ServerConfig::with_data_dir(data_dir);
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = &self.database_url {
            c.database_url = v.clone();
        }
        c.domain = self.domain.clone();
        if let Some(v) = self.auth {
            c.auth = v;
        }
        if let Some(v) = self.max_sandboxes_per_tenant {
            c.max_sandboxes_per_tenant = v;
        }
        let secs = |t: &str| cella_sandbox::spec::parse_duration(t).map(|d| d.as_secs());
        if let Some(t) = &self.default_timeout {
            c.default_timeout_secs = secs(t)?;
        }
        if let Some(t) = &self.max_timeout {
            c.max_timeout_secs = secs(t)?;
        }
        c.warm_pools = self.warm_pools.clone();
        Ok(c)
    }
}

/// Parses `--warm-pool TEMPLATE=SIZE`.
pub fn parse_warm_pool(text: &str) -> Result<(String, usize), String> {
    let (name, size) = text
        .split_once('=')
        .ok_or_else(|| format!("expected TEMPLATE=SIZE (e.g. base=4), got {text:?}"))?;
    if name.is_empty() {
        return Err(format!("missing template name in {text:?}"));
    }
    let size = size
        .parse::<usize>()
        .map_err(|_| format!("pool size in {text:?} must be a whole number"))?;
    Ok((name.to_string(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_layers_over_defaults() {
        let f = FileConfig::parse(
            "listen = \"0.0.0.0:4000\"\nmax_sandboxes_per_tenant = 7\ndefault_timeout = \"2m\"\n[warm_pools]\nbase = 3\n",
        )
        .unwrap();
        let c = f.resolve(PathBuf::from("/d")).unwrap();
        assert_eq!(c.listen.port(), 4000);
        assert_eq!(c.max_sandboxes_per_tenant, 7);
        assert_eq!(c.default_timeout_secs, 120);
        assert_eq!(c.max_timeout_secs, 24 * 3600);
        assert_eq!(c.warm_pools.get("base"), Some(&3));
        assert_eq!(c.database_url, "sqlite:///d/cella.db");
        assert!(c.auth);
    }

    #[test]
    fn typos_and_bad_values_are_named() {
        let e = FileConfig::parse("lisen = \"x\"\n").unwrap_err();
        assert!(e.contains("lisen"), "{e}");
        let e = FileConfig::parse("listen = \"nowhere\"\n").unwrap_err();
        assert!(e.contains("listen"), "{e}");
        let e = FileConfig::parse("max_timeout = \"forever\"\n").unwrap_err();
        assert!(e.contains("forever"), "{e}");
        let e = FileConfig::parse("[warm_pools]\nbase = -1\n").unwrap_err();
        assert!(e.contains("base"), "{e}");
    }

    #[test]
    fn warm_pool_flags() {
        assert_eq!(parse_warm_pool("base=4").unwrap(), ("base".into(), 4));
        assert!(
            parse_warm_pool("base")
                .unwrap_err()
                .contains("TEMPLATE=SIZE")
        );
        assert!(parse_warm_pool("=4").unwrap_err().contains("template"));
        assert!(
            parse_warm_pool("base=x")
                .unwrap_err()
                .contains("whole number")
        );
    }
}
