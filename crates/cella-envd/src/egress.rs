//! The egress bridge: a TCP listener on the sandbox's loopback whose every connection is
//! spliced to a Unix socket the host serves (its egress proxy). envd does no filtering; the
//! host decides what a connection may reach.

use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};

/// Accepts forever; each connection is relayed to `socket` until either side closes.
pub async fn bridge(listener: TcpListener, socket: PathBuf) {
    loop {
        let Ok((mut tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            match UnixStream::connect(&socket).await {
                Ok(mut host) => {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut host).await;
                }
                Err(e) => eprintln!(
                    "cella-envd: egress proxy at {} unreachable: {e}",
                    socket.display()
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_both_ways() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("proxy.sock");
        let host = tokio::net::UnixListener::bind(&path).expect("bind");
        tokio::spawn(async move {
            let (mut s, _) = host.accept().await.expect("accept");
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.expect("read");
            s.write_all(&b.map(|c| c.to_ascii_uppercase()))
                .await
                .expect("write");
        });
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("tcp");
        let port = tcp.local_addr().expect("addr").port();
        tokio::spawn(bridge(tcp, path));
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        c.write_all(b"ping").await.expect("write");
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, b"PING");
    }
}
