//! `NetworkPolicy`: which destinations a sandbox may open connections to, as data, and the one
//! decision function the egress proxy asks for every resolved address.
//!
//! Default: deny everything. Allow-lists name domains (exact, or `*.example.com` for every name
//! under it) and CIDRs; `allow_internet` allows every public address. Deny-lists win over
//! everything. Private, loopback, link-local, metadata, multicast and unspecified ranges are
//! refused even under `allow_internet` or an allowed domain (that is what stops DNS rebinding):
//! only an allow CIDR that names such an address opens it.
//!
//! Pure data and decisions: no sockets, no DNS, no logging.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A CIDR block (`10.0.0.0/8`, `2001:db8::/32`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, String> {
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix /{prefix} is longer than {max} bits"));
        }
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("invalid address {addr:?} in CIDR {s:?}"))?;
        let max = if addr.to_canonical().is_ipv4() {
            32
        } else {
            128
        };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .map_err(|_| format!("invalid prefix length {p:?} in CIDR {s:?}"))?,
        };
        Cidr::new(addr, prefix).map_err(|e| format!("invalid CIDR {s:?}: {e}"))
    }
}

/// A domain rule: an exact name, or `*.suffix` for every name strictly under `suffix`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DomainPattern {
    Exact(String),
    Wildcard(String),
}

/// Lower-case, without a trailing dot: the form names are compared in.
pub fn normalize_host(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl DomainPattern {
    pub fn matches(&self, name: &str) -> bool {
        let name = normalize_host(name);
        match self {
            DomainPattern::Exact(d) => name == *d,
            DomainPattern::Wildcard(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainPattern::Exact(d) => f.write_str(d),
            DomainPattern::Wildcard(s) => write!(f, "*.{s}"),
        }
    }
}

impl FromStr for DomainPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<DomainPattern, String> {
        let n = normalize_host(s.trim());
        let (wild, name) = match n.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, n),
        };
        if !valid_hostname(&name) {
            return Err(format!(
                "invalid domain {s:?}: use a host name like example.com or *.example.com"
            ));
        }
        Ok(if wild {
            DomainPattern::Wildcard(name)
        } else {
            DomainPattern::Exact(name)
        })
    }
}

/// One allow- or deny-list entry: a CIDR (or address) or a domain pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Rule {
    Cidr(Cidr),
    Domain(DomainPattern),
}

impl Rule {
    fn matches(&self, name: Option<&str>, ip: IpAddr) -> bool {
        match self {
            Rule::Cidr(c) => c.contains(ip),
            Rule::Domain(d) => name.is_some_and(|n| d.matches(n)),
        }
    }
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Rule, String> {
        let t = s.trim();
        let first = t.chars().next();
        // An address or CIDR starts with a digit (IPv4) or contains ':' (IPv6).
        if t.contains(':') || (first.is_some_and(|c| c.is_ascii_digit()) && t.contains('/')) {
            return t.parse().map(Rule::Cidr);
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Cidr::new(ip, if ip.is_ipv4() { 32 } else { 128 }).map(Rule::Cidr);
        }
        t.parse().map(Rule::Domain)
    }
}

impl TryFrom<String> for Rule {
    type Error = String;
    fn try_from(s: String) -> Result<Rule, String> {
        s.parse()
    }
}

impl From<Rule> for String {
    fn from(r: Rule) -> String {
        r.to_string()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Cidr(c) => c.fmt(f),
            Rule::Domain(d) => d.fmt(f),
        }
    }
}

/// Egress policy of one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PolicyRepr")]
pub struct NetworkPolicy {
    /// Every public address is allowed (reserved ranges still need an allow CIDR).
    pub allow_internet: bool,
    pub allow: Vec<Rule>,
    /// Wins over every allow.
    pub deny: Vec<Rule>,
}

/// What specs stored before policies existed said (`"none"`), or a policy.
#[derive(Deserialize)]
#[serde(untagged)]
enum PolicyRepr {
    Mode(#[allow(dead_code)] String),
    Policy {
        #[serde(default)]
        allow_internet: bool,
        #[serde(default)]
        allow: Vec<Rule>,
        #[serde(default)]
        deny: Vec<Rule>,
    },
}

impl From<PolicyRepr> for NetworkPolicy {
    fn from(r: PolicyRepr) -> NetworkPolicy {
        match r {
            PolicyRepr::Mode(_) => NetworkPolicy::default(),
            PolicyRepr::Policy {
                allow_internet,
                allow,
                deny,
            } => NetworkPolicy {
                allow_internet,
                allow,
                deny,
            },
        }
    }
}

/// Why a destination was refused: the rule a log line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// A deny-list entry matched.
    DenyList(Rule),
    /// A reserved range (private, loopback, …) without an allow CIDR naming it.
    Reserved(Reserved),
    /// Nothing allowed it (the default).
    NotAllowed,
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::DenyList(r) => write!(f, "deny-list entry {r}"),
            DenyReason::Reserved(r) => write!(
                f,
                "{} range {} (allow it explicitly with a CIDR)",
                r.kind, r.range
            ),
            DenyReason::NotAllowed => f.write_str("not in the allow-list (default deny)"),
        }
    }
}

/// A reserved range an address fell into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub kind: &'static str,
    pub range: &'static str,
}

const RESERVED: &[(&str, &str)] = &[
    // Metadata services first: they sit inside link-local and ULA space.
    ("metadata", "169.254.169.254/32"),
    ("metadata", "fd00:ec2::254/128"),
    ("unspecified", "0.0.0.0/8"),
    ("private", "10.0.0.0/8"),
    ("carrier-grade NAT", "100.64.0.0/10"),
    ("loopback", "127.0.0.0/8"),
    ("link-local", "169.254.0.0/16"),
    ("private", "172.16.0.0/12"),
    ("private", "192.168.0.0/16"),
    ("multicast", "224.0.0.0/4"),
    ("reserved", "240.0.0.0/4"),
    ("unspecified", "::/128"),
    ("loopback", "::1/128"),
    ("unique-local", "fc00::/7"),
    ("link-local", "fe80::/10"),
    ("multicast", "ff00::/8"),
];

/// The reserved range `ip` is in, if any. NAT64 addresses (`64:ff9b::/96`) are judged by the
/// IPv4 address they embed.
pub fn reserved_range(ip: IpAddr) -> Option<Reserved> {
    let ip = match ip.to_canonical() {
        IpAddr::V6(v6) if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => {
            let o = v6.octets();
            IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        other => other,
    };
    RESERVED.iter().find_map(|(kind, range)| {
        let cidr: Cidr = range.parse().ok()?;
        cidr.contains(ip).then_some(Reserved { kind, range })
    })
}

impl NetworkPolicy {
    /// Everything public (E2B's `allow_internet_access: true`).
    pub fn internet() -> NetworkPolicy {
        NetworkPolicy {
            allow_internet: true,
            ..Default::default()
        }
    }

    /// Whether a connection to `ip`, reached through the name `name` (None for an address
    /// literal), is allowed.
    pub fn check(&self, name: Option<&str>, ip: IpAddr) -> Result<(), DenyReason> {
        let ip = ip.to_canonical();
        if let Some(rule) = self.deny.iter().find(|r| r.matches(name, ip)) {
            return Err(DenyReason::DenyList(rule.clone()));
        }
        let cidr_allowed = self
            .allow
            .iter()
            .any(|r| matches!(r, Rule::Cidr(c) if c.contains(ip)));
        if let Some(reserved) = reserved_range(ip) {
            return if cidr_allowed {
                Ok(())
            } else {
                Err(DenyReason::Reserved(reserved))
            };
        }
        if self.allow_internet || cidr_allowed {
            return Ok(());
        }
        if self
            .allow
            .iter()
            .any(|r| matches!(r, Rule::Domain(_)) && r.matches(name, ip))
        {
            return Ok(());
        }
        Err(DenyReason::NotAllowed)
    }

    /// What can be decided from the name alone, before it is resolved: a name no rule could
    /// allow (or a deny-listed name) is refused without a lookup, so a sandbox cannot leak data
    /// through the host's resolver in the names it asks for.
    pub fn check_name(&self, name: &str) -> Result<(), DenyReason> {
        if let Some(rule) = self
            .deny
            .iter()
            .find(|r| matches!(r, Rule::Domain(d) if d.matches(name)))
        {
            return Err(DenyReason::DenyList(rule.clone()));
        }
        let could_allow = self.allow_internet
            || self.allow.iter().any(|r| match r {
                Rule::Cidr(_) => true,
                Rule::Domain(d) => d.matches(name),
            });
        if could_allow {
            Ok(())
        } else {
            Err(DenyReason::NotAllowed)
        }
    }

    /// Whether nothing at all is allowed (no allow rule, no internet).
    pub fn is_deny_all(&self) -> bool {
        !self.allow_internet && self.allow.is_empty()
    }
}

impl fmt::Display for NetworkPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |rules: &[Rule]| {
            rules
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        if self.is_deny_all() {
            f.write_str("none")?;
        } else if self.allow_internet {
            f.write_str("internet")?;
            if !self.allow.is_empty() {
                write!(f, " allow:{}", list(&self.allow))?;
            }
        } else {
            write!(f, "allow:{}", list(&self.allow))?;
        }
        if !self.deny.is_empty() {
            write!(f, " deny:{}", list(&self.deny))?;
        }
        Ok(())
    }
}

/// The CLI form: `none`, `internet`, `allow:RULE,RULE`, `deny:RULE,…`, several joined by `;` or
/// spaces (e.g. `internet;deny:10.0.0.0/8`).
impl FromStr for NetworkPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<NetworkPolicy, String> {
        let mut p = NetworkPolicy::default();
        let parts: Vec<&str> = s
            .split([';', ' '])
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .collect();
        if parts.is_empty() {
            return Err("empty network policy: use none, internet or allow:LIST".into());
        }
        for part in parts {
            let rules = |list: &str| -> Result<Vec<Rule>, String> {
                let rules: Vec<Rule> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                if rules.is_empty() {
                    return Err(format!("{part:?} names no domain or CIDR"));
                }
                Ok(rules)
            };
            match part.split_once(':') {
                _ if part == "none" => {}
                _ if part == "internet" => p.allow_internet = true,
                Some(("allow", list)) => p.allow.extend(rules(list)?),
                Some(("deny", list)) => p.deny.extend(rules(list)?),
                _ => {
                    return Err(format!(
                        "unknown network setting {part:?}: use none, internet, allow:LIST or deny:LIST \
                         (LIST = domains like example.com or *.example.com, and CIDRs like 10.0.0.0/8)"
                    ));
                }
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn policy(s: &str) -> NetworkPolicy {
        s.parse().expect("policy")
    }

    #[test]
    fn default_denies_everything() {
        let p = NetworkPolicy::default();
        assert_eq!(
            p.check(Some("example.com"), ip("93.184.216.34")),
            Err(DenyReason::NotAllowed)
        );
        assert!(p.is_deny_all());
    }

    #[test]
    fn domains_exact_and_wildcard() {
        let p = policy("allow:example.com,*.pypi.org");
        let public = ip("151.101.0.223");
        assert!(p.check(Some("example.com"), public).is_ok());
        assert!(p.check(Some("EXAMPLE.com."), public).is_ok());
        assert!(p.check(Some("files.pypi.org"), public).is_ok());
        assert!(p.check(Some("a.b.pypi.org"), public).is_ok());
        // A wildcard does not match the bare suffix, nor look-alikes.
        assert!(p.check(Some("pypi.org"), public).is_err());
        assert!(p.check(Some("evilpypi.org"), public).is_err());
        assert!(p.check(Some("www.example.com"), public).is_err());
        // An address literal never matches a domain rule.
        assert!(p.check(None, public).is_err());
    }

    #[test]
    fn reserved_ranges_need_a_cidr() {
        let p = policy("internet;allow:internal.test");
        for (a, kind) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.20.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("169.254.169.254", "metadata"),
            ("169.254.1.1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fd00:ec2::254", "metadata"),
            ("fd12::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("64:ff9b::a00:1", "private"),
        ] {
            match p.check(Some("internal.test"), ip(a)) {
                Err(DenyReason::Reserved(r)) => assert_eq!(r.kind, kind, "{a}"),
                other => panic!("{a}: {other:?}"),
            }
        }
        assert!(p.check(Some("x.test"), ip("8.8.8.8")).is_ok());
        let p = policy("allow:127.0.0.1,10.0.0.0/8");
        assert!(p.check(None, ip("127.0.0.1")).is_ok());
        assert!(p.check(Some("anything"), ip("10.9.9.9")).is_ok());
        assert!(p.check(None, ip("127.0.0.2")).is_err());
    }

    #[test]
    fn names_nothing_could_allow_are_refused_before_lookup() {
        let p = policy("allow:api.example.com;deny:*.bad.example");
        assert!(p.check_name("api.example.com").is_ok());
        assert_eq!(
            p.check_name("leak.attacker.example"),
            Err(DenyReason::NotAllowed)
        );
        assert!(matches!(
            policy("internet;deny:*.bad.example").check_name("x.bad.example"),
            Err(DenyReason::DenyList(_))
        ));
        // With a CIDR allow any name may resolve into it, so the lookup has to happen.
        assert!(
            policy("allow:10.0.0.0/8")
                .check_name("anything.example")
                .is_ok()
        );
        assert!(policy("internet").check_name("anything.example").is_ok());
    }

    #[test]
    fn deny_wins() {
        let p = policy("internet;allow:8.8.8.0/24,dns.google;deny:8.8.8.8,*.google");
        assert_eq!(
            p.check(None, ip("8.8.8.8")),
            Err(DenyReason::DenyList("8.8.8.8/32".parse().expect("rule")))
        );
        assert!(p.check(Some("dns.google"), ip("8.8.4.4")).is_err());
        assert!(p.check(None, ip("8.8.8.9")).is_ok());
    }

    #[test]
    fn parse_errors_say_what_to_do() {
        for bad in [
            "",
            "allow:",
            "maybe",
            "allow:exa mple.com",
            "allow:10.0.0.0/33",
            "deny:::1/200",
        ] {
            let e = bad.parse::<NetworkPolicy>().expect_err(bad);
            assert!(!e.is_empty());
        }
        assert!(
            "allow:10.0.0.0/33"
                .parse::<NetworkPolicy>()
                .expect_err("prefix")
                .contains("longer than 32")
        );
    }

    #[test]
    fn serde_round_trip_and_legacy_none() {
        let p = policy("allow:example.com,10.0.0.0/8;deny:*.bad.example");
        let v = serde_json::to_value(&p).expect("ser");
        assert_eq!(v["allow"], serde_json::json!(["example.com", "10.0.0.0/8"]));
        let back: NetworkPolicy = serde_json::from_value(v).expect("de");
        assert_eq!(back, p);
        let legacy: NetworkPolicy = serde_json::from_str("\"none\"").expect("legacy");
        assert!(legacy.is_deny_all());
        assert_eq!(p.to_string().parse::<NetworkPolicy>().expect("display"), p);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_ip() -> impl Strategy<Value = IpAddr> {
            prop_oneof![
                any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
                any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            ]
        }

        fn any_name() -> impl Strategy<Value = Option<String>> {
            proptest::option::of("[a-z]{1,8}(\\.[a-z]{1,8}){0,3}")
        }

        proptest! {
            #[test]
            fn default_policy_denies_all(name in any_name(), a in any_ip()) {
                prop_assert!(NetworkPolicy::default().check(name.as_deref(), a).is_err());
            }

            #[test]
            fn deny_cidr_wins_over_any_allow(a in any_ip(), prefix in 0u8..=32, name in any_name()) {
                let max = if a.to_canonical().is_ipv4() { 32 } else { 128 };
                let deny = Cidr::new(a, prefix.min(max)).expect("cidr");
                let p = NetworkPolicy {
                    allow_internet: true,
                    allow: vec![Rule::Cidr(Cidr::new(a, max).expect("cidr"))],
                    deny: vec![Rule::Cidr(deny)],
                };
                prop_assert!(matches!(p.check(name.as_deref(), a), Err(DenyReason::DenyList(_))));
            }

            #[test]
            fn reserved_addresses_need_a_cidr(a in any_ip(), name in any_name()) {
                let mut p = NetworkPolicy::internet();
                if let Some(n) = &name {
                    p.allow.push(Rule::Domain(n.parse().expect("domain")));
                }
                let reserved = reserved_range(a).is_some();
                prop_assert_eq!(p.check(name.as_deref(), a).is_err(), reserved);
                let max = if a.to_canonical().is_ipv4() { 32 } else { 128 };
                p.allow.push(Rule::Cidr(Cidr::new(a, max).expect("cidr")));
                prop_assert!(p.check(name.as_deref(), a).is_ok());
            }

            #[test]
            fn mapped_v6_is_judged_as_v4(b in any::<u32>(), name in any_name()) {
                let v4 = Ipv4Addr::from(b);
                let p = NetworkPolicy::internet();
                prop_assert_eq!(
                    p.check(name.as_deref(), IpAddr::V4(v4)),
                    p.check(name.as_deref(), IpAddr::V6(v4.to_ipv6_mapped()))
                );
            }

            #[test]
            fn cidr_contains_matches_the_mask(a in any::<u32>(), b in any::<u32>(), prefix in 0u8..=32) {
                let c = Cidr::new(IpAddr::V4(Ipv4Addr::from(a)), prefix).expect("cidr");
                let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                prop_assert_eq!(c.contains(IpAddr::V4(Ipv4Addr::from(b))), a & m == b & m);
                prop_assert_eq!(c.to_string().parse::<Cidr>().expect("round trip"), c);
            }

            #[test]
            fn wildcard_matches_only_strict_subdomains(label in "[a-z]{1,8}", suffix in "[a-z]{1,8}\\.[a-z]{2,4}") {
                let w: DomainPattern = format!("*.{suffix}").parse().expect("pattern");
                let sub = format!("{label}.{suffix}");
                let glued = format!("{label}{suffix}");
                prop_assert!(w.matches(&sub));
                prop_assert!(!w.matches(&suffix));
                prop_assert!(!w.matches(&glued));
            }
        }
    }
}
