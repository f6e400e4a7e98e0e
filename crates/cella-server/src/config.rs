//! Server configuration: defaults, then a TOML file, then `CELLA_*` environment variables, then
//! flags (flags win). The binary does the layering; this is the resolved result.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

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
}

impl ServerConfig {
    pub fn with_data_dir(data_dir: PathBuf) -> Self {
        let database_url = format!("sqlite://{}", data_dir.join("cella.db").display());
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
        }
    }
}
