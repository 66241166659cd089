//! Where the gateway's connections come from: a [`Listener`] is anything that accepts byte
//! streams with a peer address. `idem serve` listens with tokio's TCP listener; the
//! deterministic simulation (`tests/simulation/`) brings a simulated network's.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

/// A source of connections for the accept loop.
pub trait Listener: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection and its peer's address. An error is the listener's, not a
    /// connection's (out of file descriptors, say): the accept loop logs it, pauses and tries
    /// again.
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, SocketAddr)>> + Send;

    /// The address it listens on.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

impl Listener for TcpListener {
    type Io = TcpStream;

    async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        // Answers are small and written whole: Nagle's algorithm would only delay them.
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpListener::local_addr(self)
    }
}
