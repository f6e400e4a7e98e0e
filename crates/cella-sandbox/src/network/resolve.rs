//! Host-side name resolution for the egress proxy. The proxy resolves once, checks every
//! address, and connects only to addresses it checked (no second lookup, so no rebinding).
//!
//! A hosts map (the `/etc/hosts` format, from `CELLA_EGRESS_HOSTS`) answers first; the system
//! resolver answers the rest. Tests use the map to make names resolvable without internet,
//! through the same path real lookups take.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

/// Names the proxy answers itself before asking the system.
#[derive(Debug, Clone, Default)]
pub struct HostsMap(HashMap<String, Vec<IpAddr>>);

impl HostsMap {
    /// Parses `/etc/hosts` syntax: `ADDRESS NAME [NAME…]`, `#` comments.
    pub fn parse(text: &str) -> Result<HostsMap, String> {
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let addr = words.next().unwrap_or("");
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("line {}: invalid address {addr:?}", n + 1))?;
            let mut any = false;
            for name in words {
                any = true;
                map.entry(super::policy::normalize_host(name))
                    .or_default()
                    .push(ip);
            }
            if !any {
                return Err(format!("line {}: address {addr} names no host", n + 1));
            }
        }
        Ok(HostsMap(map))
    }

    pub fn load(path: &Path) -> Result<HostsMap, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the egress hosts file {}: {e}", path.display()))?;
        HostsMap::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn get(&self, name: &str) -> Option<&[IpAddr]> {
        self.0
            .get(&super::policy::normalize_host(name))
            .map(Vec::as_slice)
    }
}

/// Resolves `name` to every address it has (hosts map first, then the system resolver).
pub async fn resolve(hosts: &HostsMap, name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    if let Some(ips) = hosts.get(name) {
        return Ok(ips.to_vec());
    }
    let mut ips: Vec<IpAddr> = tokio::net::lookup_host((name, port))
        .await?
        .map(|a| a.ip())
        .collect();
    ips.dedup();
    if ips.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{name} has no addresses"),
        ));
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_format() {
        let m = HostsMap::parse("# test names\n203.0.113.7 api.test Web.Test.\n::1 six.test\n")
            .expect("parse");
        assert_eq!(
            m.get("API.test"),
            Some(&["203.0.113.7".parse().expect("ip")][..])
        );
        assert!(m.get("web.test").is_some());
        assert!(m.get("nope.test").is_none());
        assert!(HostsMap::parse("nonsense name").is_err());
        assert!(HostsMap::parse("1.2.3.4").is_err());
    }

    #[tokio::test]
    async fn map_answers_before_the_system() {
        let m = HostsMap::parse("127.0.0.1 rebind.test").expect("parse");
        let ips = resolve(&m, "rebind.test", 80).await.expect("resolve");
        assert_eq!(ips, vec!["127.0.0.1".parse::<IpAddr>().expect("ip")]);
        let lit = resolve(&m, "198.51.100.1", 80).await.expect("literal");
        assert_eq!(lit, vec!["198.51.100.1".parse::<IpAddr>().expect("ip")]);
    }
}
