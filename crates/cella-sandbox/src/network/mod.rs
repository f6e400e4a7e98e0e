//! Network access of sandboxes: the policy (what may be reached), the host-side egress proxy
//! that enforces it, and the names both sides agree on for the bridge into the sandbox.
//!
//! A sandbox's network namespace has only loopback. envd listens on
//! `127.0.0.1:`[`PROXY_PORT`] inside it and splices every connection to the host's proxy
//! socket, bind-mounted read-only at [`GUEST_DIR`]; the proxy decides.

pub mod policy;
pub mod proxy;
pub mod resolve;
pub mod sniff;

pub use policy::{Cidr, DenyReason, DomainPattern, NetworkPolicy, Rule};
pub use proxy::{Denial, EgressConfig, EgressProxy, Peers};

/// Port envd listens on inside the sandbox for the proxy bridge.
pub const PROXY_PORT: u16 = 3128;
/// Directory inside the sandbox where the host's proxy socket appears.
pub const GUEST_DIR: &str = "/run/cella";
/// File name of the proxy socket (in the host directory and in [`GUEST_DIR`]).
pub const SOCKET_NAME: &str = "egress.sock";

/// What envd needs to bridge the proxy into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bridge {
    pub port: u16,
    /// The proxy socket as seen inside the sandbox.
    pub socket: std::path::PathBuf,
}

impl Bridge {
    pub fn standard() -> Bridge {
        Bridge {
            port: PROXY_PORT,
            socket: std::path::Path::new(GUEST_DIR).join(SOCKET_NAME),
        }
    }

    /// The environment that sends processes' traffic through the bridge.
    pub fn proxy_env(&self) -> Vec<(String, String)> {
        let http = format!("http://127.0.0.1:{}", self.port);
        let socks = format!("socks5h://127.0.0.1:{}", self.port);
        let mut v = Vec::new();
        for (k, val) in [
            ("HTTP_PROXY", &http),
            ("HTTPS_PROXY", &http),
            ("ALL_PROXY", &socks),
        ] {
            v.push((k.to_string(), val.clone()));
            v.push((k.to_ascii_lowercase(), val.clone()));
        }
        for k in ["NO_PROXY", "no_proxy"] {
            v.push((k.to_string(), "localhost,127.0.0.1,::1".to_string()));
        }
        v
    }
}
