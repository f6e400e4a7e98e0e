//! The host-side egress proxy: one Unix-socket listener per sandbox (its identity is the socket
//! it came through), speaking HTTP CONNECT, plain HTTP in absolute form, and SOCKS5 CONNECT on
//! the same socket (told apart by the first byte).
//!
//! For every connection: resolve the name on the host, check every address against the
//! sandbox's current policy, connect to an address that was checked (never a second lookup),
//! then compare the name the client's first bytes carry (TLS SNI, HTTP Host) with the checked
//! name. Every refusal is logged (target `cella::network`) and recorded for observers.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::broadcast;

use super::policy::{NetworkPolicy, normalize_host};
use super::resolve::{HostsMap, resolve};
use super::sniff::{self, FirstBytes};

/// Denials kept in memory (oldest dropped first).
const RING: usize = 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send the first bytes of a tunnel before it is closed.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_HEAD: usize = 16 * 1024;

/// A refused connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub at: SystemTime,
    pub sandbox: String,
    /// `host:port` as the client asked for it.
    pub destination: String,
    /// The address that was refused, when the refusal concerned one.
    pub address: Option<IpAddr>,
    /// The rule that refused it, in words.
    pub rule: String,
}

/// Configuration of the proxy.
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    /// Names answered before the system resolver.
    pub hosts: HostsMap,
}

impl EgressConfig {
    /// `CELLA_EGRESS_HOSTS` names a hosts file (`/etc/hosts` format) the proxy resolves from
    /// first.
    pub fn from_env() -> Result<EgressConfig, String> {
        let hosts = match std::env::var_os("CELLA_EGRESS_HOSTS") {
            Some(p) if !p.is_empty() => HostsMap::load(Path::new(&p))?,
            _ => HostsMap::default(),
        };
        Ok(EgressConfig { hosts })
    }
}

struct Attached {
    policy: Arc<RwLock<NetworkPolicy>>,
    accept: tokio::task::AbortHandle,
}

struct Inner {
    config: EgressConfig,
    sandboxes: Mutex<HashMap<String, Attached>>,
    denials: Mutex<VecDeque<Denial>>,
    events: broadcast::Sender<Denial>,
}

/// The egress proxy of every sandbox of this process. Cheap to clone.
#[derive(Clone)]
pub struct EgressProxy {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy").finish_non_exhaustive()
    }
}

/// Who may connect to a sandbox's proxy socket: this process's uid and the sandbox's ids.
#[derive(Debug, Clone)]
pub struct Peers {
    pub uids: std::ops::Range<u32>,
}

impl EgressProxy {
    pub fn new(config: EgressConfig) -> EgressProxy {
        let (events, _) = broadcast::channel(256);
        EgressProxy {
            inner: Arc::new(Inner {
                config,
                sandboxes: Mutex::new(HashMap::new()),
                denials: Mutex::new(VecDeque::new()),
                events,
            }),
        }
    }

    /// Listens for `sandbox` on `socket` (replacing a stale file) with `policy`. Call inside a
    /// tokio runtime. Attaching an attached sandbox replaces its listener.
    pub fn attach(
        &self,
        sandbox: &str,
        policy: NetworkPolicy,
        socket: &Path,
        peers: Peers,
    ) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("binding the egress socket {}: {e}", socket.display()),
            )
        })?;
        // Sandbox users are unprivileged host ids; peer credentials decide who is served.
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
        let policy = Arc::new(RwLock::new(policy));
        let ctx = Arc::new(Ctx {
            sandbox: sandbox.to_string(),
            policy: policy.clone(),
            inner: Arc::downgrade(&self.inner),
        });
        let task = tokio::spawn(accept_loop(listener, ctx, peers));
        let old = self.map().insert(
            sandbox.to_string(),
            Attached {
                policy,
                accept: task.abort_handle(),
            },
        );
        if let Some(old) = old {
            old.accept.abort();
        }
        Ok(())
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attached>> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_attached(&self, sandbox: &str) -> bool {
        self.map().contains_key(sandbox)
    }

    /// Replaces the policy; connections opened from now on follow it. False when the sandbox
    /// is not attached.
    pub fn set_policy(&self, sandbox: &str, policy: NetworkPolicy) -> bool {
        match self.map().get(sandbox) {
            Some(a) => {
                *a.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
                true
            }
            None => false,
        }
    }

    pub fn policy(&self, sandbox: &str) -> Option<NetworkPolicy> {
        self.map()
            .get(sandbox)
            .map(|a| a.policy.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Stops serving a sandbox (it ended).
    pub fn detach(&self, sandbox: &str) {
        if let Some(a) = self.map().remove(sandbox) {
            a.accept.abort();
        }
    }

    /// The recorded denials of one sandbox, oldest first.
    pub fn denials(&self, sandbox: &str) -> Vec<Denial> {
        self.inner
            .denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|d| d.sandbox == sandbox)
            .cloned()
            .collect()
    }

    /// Every denial from now on, as it happens.
    pub fn subscribe(&self) -> broadcast::Receiver<Denial> {
        self.inner.events.subscribe()
    }
}

/// What one sandbox's connections share.
struct Ctx {
    sandbox: String,
    policy: Arc<RwLock<NetworkPolicy>>,
    inner: std::sync::Weak<Inner>,
}

impl Ctx {
    fn deny(&self, destination: &str, address: Option<IpAddr>, rule: String) {
        tracing::warn!(target: "cella::network", sandbox = %self.sandbox, destination,
            address = ?address, rule = %rule, "egress connection denied");
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let d = Denial {
            at: SystemTime::now(),
            sandbox: self.sandbox.clone(),
            destination: destination.to_string(),
            address,
            rule,
        };
        {
            let mut ring = inner.denials.lock().unwrap_or_else(|p| p.into_inner());
            if ring.len() == RING {
                ring.pop_front();
            }
            ring.push_back(d.clone());
        }
        let _ = inner.events.send(d);
    }

    fn hosts(&self) -> HostsMap {
        self.inner
            .upgrade()
            .map(|i| i.config.hosts.clone())
            .unwrap_or_default()
    }
}

async fn accept_loop(listener: UnixListener, ctx: Arc<Ctx>, peers: Peers) {
    let own = crate::native::sys::geteuid();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: "cella::network", sandbox = %ctx.sandbox, "egress accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if !uid.is_some_and(|u| u == own || peers.uids.contains(&u)) {
            tracing::warn!(target: "cella::network", sandbox = %ctx.sandbox, uid = ?uid,
                "egress socket connection from a foreign user refused");
            continue;
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(stream, &ctx).await {
                tracing::debug!(target: "cella::network", sandbox = %ctx.sandbox, "egress connection ended: {e}");
            }
        });
    }
}

/// Why a connection attempt was not made.
enum Refused {
    /// The policy refused it (already logged and recorded).
    Policy,
    /// The name did not resolve or no address answered.
    Unreachable(String),
    /// The request made no sense.
    Bad(String),
}

/// Resolves, checks every address, connects to a checked one.
async fn open(ctx: &Ctx, host: &str, port: u16) -> Result<TcpStream, Refused> {
    let destination = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let literal = host.parse::<IpAddr>().ok();
    let name = match literal {
        Some(_) => None,
        None => {
            let n = normalize_host(host);
            if n.is_empty()
                || n.len() > 253
                || !n
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            {
                return Err(Refused::Bad(format!("invalid host name {host:?}")));
            }
            Some(n)
        }
    };
    // Names nothing could allow are refused before any lookup leaves the host.
    {
        let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner()).clone();
        if policy.is_deny_all() {
            ctx.deny(
                &destination,
                literal,
                "no network access (the policy allows nothing)".into(),
            );
            return Err(Refused::Policy);
        }
        if let Some(n) = &name
            && let Err(reason) = policy.check_name(n)
        {
            ctx.deny(&destination, None, reason.to_string());
            return Err(Refused::Policy);
        }
    }
    let ips = resolve(&ctx.hosts(), host, port)
        .await
        .map_err(|e| Refused::Unreachable(format!("resolving {host}: {e}")))?;
    let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner()).clone();
    for ip in &ips {
        if let Err(reason) = policy.check(name.as_deref(), *ip) {
            ctx.deny(&destination, Some(*ip), reason.to_string());
            return Err(Refused::Policy);
        }
    }
    let mut last = String::from("no address");
    for ip in ips {
        let addr = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: timed out"),
        }
    }
    Err(Refused::Unreachable(format!(
        "connecting to {destination}: {last}"
    )))
}

async fn serve(mut client: UnixStream, ctx: &Ctx) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    if client.read_buf(&mut buf).await? == 0 {
        return Ok(());
    }
    if buf[0] == 5 {
        return socks5(client, buf, ctx).await;
    }
    let end = loop {
        if let Some(end) = sniff::find_head_end(&buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            return reply(&mut client, 431, "request head too large").await;
        }
        if client.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let rest = buf[end..].to_vec();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    if !version.starts_with("HTTP/1.") {
        return reply(&mut client, 400, "not an HTTP/1 proxy request").await;
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_authority(target, None) else {
            return reply(&mut client, 400, "CONNECT needs host:port").await;
        };
        let upstream = match open(ctx, &host, port).await {
            Ok(u) => u,
            Err(r) => return refuse_http(&mut client, r).await,
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        return tunnel(client, rest, upstream, ctx, &host, port).await;
    }
    let Some(after) = target.strip_prefix("http://") else {
        let msg = if target.starts_with("https://") {
            "https URLs go through CONNECT"
        } else {
            "this is an egress proxy: send absolute-form requests (http://host/path) or CONNECT"
        };
        return reply(&mut client, 400, msg).await;
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let Some((host, port)) = split_authority(authority, Some(80)) else {
        return reply(&mut client, 400, "invalid host in the request URL").await;
    };
    let destination = authority.to_string();
    if let Some(h) = sniff::host_header(head.as_bytes())
        && h != normalize_host(&host)
    {
        ctx.deny(
            &destination,
            None,
            format!("Host header {h} does not match the requested host {host}"),
        );
        return reply(&mut client, 403, "Host header does not match the URL").await;
    }
    let mut upstream = match open(ctx, &host, port).await {
        Ok(u) => u,
        Err(r) => return refuse_http(&mut client, r).await,
    };
    // One request per connection: the next one may go elsewhere and must be checked again.
    let mut out = format!("{method} {path} {version}\r\n");
    let mut has_host = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or("").trim();
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        has_host |= name.eq_ignore_ascii_case("host");
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !has_host {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&rest).await?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// `host:port` (`[v6]:port`); `default` when the port is omitted.
fn split_authority(a: &str, default: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        (h, tail.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (a, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default?,
    };
    (!host.is_empty() && port != 0).then(|| (host.to_string(), port))
}

async fn reply(client: &mut UnixStream, status: u16, msg: &str) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("cella egress proxy: {msg}\n");
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(resp.as_bytes()).await?;
    client.shutdown().await
}

async fn refuse_http(client: &mut UnixStream, r: Refused) -> std::io::Result<()> {
    match r {
        Refused::Policy => {
            reply(
                client,
                403,
                "destination not allowed by the sandbox's network policy",
            )
            .await
        }
        Refused::Unreachable(m) => reply(client, 502, &m).await,
        Refused::Bad(m) => reply(client, 400, &m).await,
    }
}

/// Relays a tunnel after checking the name in the client's first bytes.
async fn tunnel(
    client: UnixStream,
    mut first: Vec<u8>,
    upstream: TcpStream,
    ctx: &Ctx,
    host: &str,
    port: u16,
) -> std::io::Result<()> {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    // Server-first protocols get their greeting while we wait for the client's first bytes.
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    });
    let sniffed = tokio::time::timeout(SNIFF_TIMEOUT, async {
        loop {
            match sniff::classify(&first) {
                FirstBytes::Incomplete => {}
                other => return Ok(Some(other)),
            }
            if cr.read_buf(&mut first).await? == 0 {
                return Ok::<_, std::io::Error>(None);
            }
        }
    })
    .await;
    let claimed = match sniffed {
        Ok(Ok(Some(FirstBytes::Tls(sni)))) => sni.map(|s| ("TLS server name", s)),
        Ok(Ok(Some(FirstBytes::Http(h)))) => h.map(|s| ("Host header", s)),
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            down.abort();
            return Err(e);
        }
        Err(_) => {
            down.abort();
            return Ok(());
        }
    };
    let expected = normalize_host(host);
    if let Some((what, name)) = claimed
        && normalize_host(&name) != expected
    {
        down.abort();
        let destination = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        ctx.deny(
            &destination,
            None,
            format!("{what} {name} does not match the requested host {host}"),
        );
        return Ok(());
    }
    uw.write_all(&first).await?;
    let _ = tokio::io::copy(&mut cr, &mut uw).await;
    let _ = uw.shutdown().await;
    let _ = down.await;
    Ok(())
}

async fn read_exact_from<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    pos: &mut usize,
    n: usize,
) -> std::io::Result<Vec<u8>> {
    while buf.len() < *pos + n {
        if r.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    let out = buf[*pos..*pos + n].to_vec();
    *pos += n;
    Ok(out)
}

async fn socks_reply<W: AsyncWrite + Unpin>(w: &mut W, code: u8) -> std::io::Result<()> {
    w.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// SOCKS5 (RFC 1928), no authentication, CONNECT only.
async fn socks5(mut client: UnixStream, mut buf: Vec<u8>, ctx: &Ctx) -> std::io::Result<()> {
    let mut pos = 0;
    let hello = read_exact_from(&mut client, &mut buf, &mut pos, 2).await?;
    let methods = read_exact_from(&mut client, &mut buf, &mut pos, usize::from(hello[1])).await?;
    if !methods.contains(&0) {
        return client.write_all(&[5, 0xff]).await;
    }
    client.write_all(&[5, 0]).await?;
    let req = read_exact_from(&mut client, &mut buf, &mut pos, 4).await?;
    if req[0] != 5 {
        return Ok(());
    }
    let host = match req[3] {
        1 => {
            let a = read_exact_from(&mut client, &mut buf, &mut pos, 4).await?;
            IpAddr::from([a[0], a[1], a[2], a[3]]).to_string()
        }
        3 => {
            let n = read_exact_from(&mut client, &mut buf, &mut pos, 1).await?[0];
            let name = read_exact_from(&mut client, &mut buf, &mut pos, usize::from(n)).await?;
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let a = read_exact_from(&mut client, &mut buf, &mut pos, 16).await?;
            let mut o = [0u8; 16];
            o.copy_from_slice(&a);
            IpAddr::from(o).to_string()
        }
        _ => return socks_reply(&mut client, 8).await,
    };
    let p = read_exact_from(&mut client, &mut buf, &mut pos, 2).await?;
    let port = u16::from_be_bytes([p[0], p[1]]);
    if req[1] != 1 {
        // Only CONNECT: BIND and UDP ASSOCIATE would open other paths out.
        return socks_reply(&mut client, 7).await;
    }
    let upstream = match open(ctx, &host, port).await {
        Ok(u) => u,
        Err(Refused::Policy) => return socks_reply(&mut client, 2).await,
        Err(Refused::Unreachable(_)) => return socks_reply(&mut client, 4).await,
        Err(Refused::Bad(_)) => return socks_reply(&mut client, 1).await,
    };
    socks_reply(&mut client, 0).await?;
    let rest = buf[pos..].to_vec();
    tunnel(client, rest, upstream, ctx, &host, port).await
}

#[cfg(test)]
mod tests;
