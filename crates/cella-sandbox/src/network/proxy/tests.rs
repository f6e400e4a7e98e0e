//! The proxy against real sockets: a Unix-socket client on one side, TCP servers on the host's
//! loopback on the other. Test names resolve through the hosts map, the path real lookups take.

use super::*;
use crate::network::sniff::tests::client_hello;
use tokio::sync::mpsc;

/// A TCP server on 127.0.0.1 that records the first bytes of each connection and answers a
/// small HTTP response.
async fn upstream() -> (u16, mpsc::UnboundedReceiver<Vec<u8>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                buf.truncate(n);
                let _ = tx.send(buf);
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nupstream")
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, rx)
}

struct Fixture {
    proxy: EgressProxy,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn fixture(policy: &str) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts =
        HostsMap::parse("127.0.0.1 api.test other.test rebind.test\n10.1.2.3 internal.test\n")
            .expect("hosts");
    let proxy = EgressProxy::new(EgressConfig { hosts });
    let socket = dir.path().join("egress.sock");
    proxy
        .attach(
            "sbx1",
            policy.parse().expect("policy"),
            &socket,
            Peers { uids: 0..0 },
        )
        .expect("attach");
    Fixture {
        proxy,
        socket,
        _dir: dir,
    }
}

async fn roundtrip(socket: &Path, request: &[u8]) -> String {
    let mut c = UnixStream::connect(socket).await.expect("connect");
    c.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn connect_req(host: &str, port: u16) -> Vec<u8> {
    format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn deny_all_refuses_and_records() {
    let f = fixture("none");
    let (port, _rx) = upstream().await;
    let out = roundtrip(&f.socket, &connect_req("api.test", port)).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let d = f.proxy.denials("sbx1");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].destination, format!("api.test:{port}"));
    assert!(d[0].rule.contains("allows nothing"), "{}", d[0].rule);
}

#[tokio::test]
async fn connect_tunnel_with_matching_host() {
    let f = fixture("allow:127.0.0.1");
    let (port, mut rx) = upstream().await;
    let mut req = connect_req("api.test", port);
    req.extend(b"GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n");
    let out = roundtrip(&f.socket, &req).await;
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established"),
        "{out}"
    );
    assert!(out.ends_with("upstream"), "{out}");
    let got = rx.recv().await.expect("upstream saw the request");
    assert!(got.starts_with(b"GET /x HTTP/1.1"));
    assert!(f.proxy.denials("sbx1").is_empty());
}

#[tokio::test]
async fn rebinding_to_loopback_is_refused() {
    // The name is allowed, but it resolves to loopback, which no CIDR allows.
    let f = fixture("allow:rebind.test");
    let (port, _rx) = upstream().await;
    let out = roundtrip(&f.socket, &connect_req("rebind.test", port)).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let d = f.proxy.denials("sbx1");
    assert_eq!(d[0].address, Some("127.0.0.1".parse().expect("ip")));
    assert!(d[0].rule.contains("loopback"), "{}", d[0].rule);
}

#[tokio::test]
async fn private_and_deny_list() {
    let f = fixture("internet;allow:127.0.0.0/8;deny:127.0.0.1");
    let (port, _rx) = upstream().await;
    let out = roundtrip(&f.socket, &connect_req("internal.test", 443)).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let out = roundtrip(&f.socket, &connect_req("127.0.0.1", port)).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let d = f.proxy.denials("sbx1");
    assert!(
        d[0].rule.contains("private range 10.0.0.0/8"),
        "{}",
        d[0].rule
    );
    assert!(
        d[1].rule.contains("deny-list entry 127.0.0.1/32"),
        "{}",
        d[1].rule
    );
}

#[tokio::test]
async fn sni_must_match_the_connect_name() {
    let f = fixture("allow:127.0.0.1");
    let (port, mut rx) = upstream().await;
    let mut req = connect_req("api.test", port);
    req.extend(client_hello(Some("evil.test")));
    let out = roundtrip(&f.socket, &req).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!out.contains("upstream"), "{out}");
    let d = f.proxy.denials("sbx1");
    assert_eq!(d.len(), 1);
    assert!(
        d[0].rule.contains("TLS server name evil.test"),
        "{}",
        d[0].rule
    );

    let mut req = connect_req("api.test", port);
    let hello = client_hello(Some("api.test"));
    req.extend(&hello);
    let out = roundtrip(&f.socket, &req).await;
    assert!(out.ends_with("upstream"), "{out}");
    // The refused tunnel was closed before a byte of its hello reached the server.
    let mut seen = vec![
        rx.recv().await.expect("first"),
        rx.recv().await.expect("second"),
    ];
    seen.sort();
    assert_eq!(seen, vec![Vec::new(), hello]);
}

#[tokio::test]
async fn plain_http_absolute_form() {
    let f = fixture("allow:127.0.0.1");
    let (port, mut rx) = upstream().await;
    let req = format!(
        "GET http://api.test:{port}/path?q=1 HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Connection: keep-alive\r\n\r\n"
    );
    let out = roundtrip(&f.socket, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    let got = String::from_utf8(rx.recv().await.expect("request")).expect("utf8");
    assert!(got.starts_with("GET /path?q=1 HTTP/1.1\r\n"), "{got}");
    assert!(got.contains("Connection: close"), "{got}");
    assert!(
        !got.to_ascii_lowercase().contains("proxy-connection"),
        "{got}"
    );

    let req = format!("GET http://api.test:{port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n");
    let out = roundtrip(&f.socket, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(
        f.proxy.denials("sbx1")[0]
            .rule
            .contains("Host header other.test")
    );
}

async fn socks(socket: &Path, atyp: u8, addr: &[u8], port: u16, payload: &[u8]) -> Vec<u8> {
    let mut c = UnixStream::connect(socket).await.expect("connect");
    let mut req = vec![5, 1, 0, 5, 1, 0, atyp];
    req.extend(addr);
    req.extend(port.to_be_bytes());
    req.extend(payload);
    c.write_all(&req).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    out
}

#[tokio::test]
async fn socks5_names_and_addresses() {
    let f = fixture("allow:127.0.0.1");
    let (port, _rx) = upstream().await;
    let mut name = vec![8u8];
    name.extend(b"api.test");
    let out = socks(
        &f.socket,
        3,
        &name,
        port,
        b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
    )
    .await;
    assert_eq!(&out[..4], &[5, 0, 5, 0], "{out:?}");
    assert!(out.ends_with(b"upstream"));
    let out = socks(&f.socket, 1, &[127, 0, 0, 1], port, b"hi").await;
    assert_eq!(&out[..4], &[5, 0, 5, 0]);

    f.proxy
        .set_policy("sbx1", "allow:api.test".parse().expect("policy"));
    let out = socks(&f.socket, 1, &[127, 0, 0, 1], port, b"").await;
    assert_eq!(&out[..4], &[5, 0, 5, 2], "ruleset refusal");
}

#[tokio::test]
async fn policy_changes_apply_to_the_next_connection() {
    let f = fixture("none");
    let (port, _rx) = upstream().await;
    let mut req = connect_req("api.test", port);
    req.extend(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
    assert!(roundtrip(&f.socket, &req).await.starts_with("HTTP/1.1 403"));
    assert!(
        f.proxy
            .set_policy("sbx1", "allow:127.0.0.1".parse().expect("policy"))
    );
    assert!(roundtrip(&f.socket, &req).await.ends_with("upstream"));
    f.proxy.detach("sbx1");
    assert!(!f.proxy.is_attached("sbx1"));
    assert!(!f.proxy.set_policy("sbx1", NetworkPolicy::default()));
}

#[tokio::test]
async fn names_nothing_allows_are_not_looked_up() {
    // Not in the hosts map: a lookup would go to the system resolver and fail (502); the
    // policy refuses it first (403), so the name never leaves the host.
    let f = fixture("allow:api.test");
    let out = roundtrip(&f.socket, &connect_req("secret-data.attacker.invalid", 443)).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let d = f.proxy.denials("sbx1");
    assert_eq!(d[0].address, None);
    assert!(d[0].rule.contains("not in the allow-list"), "{}", d[0].rule);
}
