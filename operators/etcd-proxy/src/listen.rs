//! Listeners for the gRPC servers: TCP (plain or TLS) and unix sockets, as streams of
//! connections for tonic's `serve_with_incoming`. TLS handshakes run off the accept loop,
//! each with a deadline, so a slow or silent client delays nobody.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::debug;

/// How long a client gets to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a server listens: `host:port` or `unix:///path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err("a unix socket must be unix:///absolute/path".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>()
            .map(Self::Tcp)
            .map_err(|_| "expected host:port (an IP address) or unix:///path".into())
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

/// A server-side connection of any kind.
pub enum ServerConn {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// A unix socket.
    Unix(UnixStream),
}

impl Connected for ServerConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for ServerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Self::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The stream of accepted connections.
pub type Incoming = ReceiverStream<io::Result<ServerConn>>;

/// Binds `listen` and accepts connections until the returned stream is dropped; with `tls`,
/// TCP connections are wrapped in TLS first (handshakes that fail are dropped). A stale
/// unix socket file is removed first.
pub async fn bind(
    listen: &Listen,
    tls: Option<Arc<ServerConfig>>,
) -> io::Result<(Incoming, String)> {
    let (tx, rx) = mpsc::channel(64);
    match listen {
        Listen::Tcp(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let local = listener.local_addr()?.to_string();
            tokio::spawn(accept_tcp(listener, tls, tx));
            Ok((ReceiverStream::new(rx), local))
        }
        Listen::Unix(path) => {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = UnixListener::bind(path)?;
            tokio::spawn(accept_unix(listener, tx));
            Ok((ReceiverStream::new(rx), listen.to_string()))
        }
    }
}

async fn accept_tcp(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    tx: mpsc::Sender<io::Result<ServerConn>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let tcp = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(err) => {
                    debug!(error = &err as &dyn std::error::Error, "accept failed");
                    // Out of file descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let Some(acceptor) = acceptor.clone() else {
            if tx.send(Ok(ServerConn::Tcp(tcp))).await.is_err() {
                return;
            }
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = tx.send(Ok(ServerConn::Tls(Box::new(stream)))).await;
                }
                Ok(Err(err)) => {
                    debug!(
                        error = &err as &dyn std::error::Error,
                        "TLS handshake failed"
                    );
                }
                Err(_) => debug!("TLS handshake timed out"),
            }
        });
    }
}

async fn accept_unix(listener: UnixListener, tx: mpsc::Sender<io::Result<ServerConn>>) {
    loop {
        let conn = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        match conn {
            Ok((stream, _)) => {
                if tx.send(Ok(ServerConn::Unix(stream))).await.is_err() {
                    return;
                }
            }
            Err(err) => {
                debug!(error = &err as &dyn std::error::Error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "127.0.0.1:2379".parse::<Listen>(),
            Ok(Listen::Tcp("127.0.0.1:2379".parse().unwrap()))
        );
        assert_eq!(
            "unix:///tmp/relay.sock".parse::<Listen>(),
            Ok(Listen::Unix("/tmp/relay.sock".into()))
        );
        assert!("unix://relative".parse::<Listen>().is_err());
        assert!("localhost:80".parse::<Listen>().is_err());
        assert_eq!(
            "unix:///tmp/x".parse::<Listen>().unwrap().to_string(),
            "unix:///tmp/x"
        );
    }
}
