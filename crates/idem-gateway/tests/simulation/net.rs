//! The gateway's two seams on turmoil's simulated network: a [`Listener`] for its accept
//! loops and a connector for its upstream client.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use idem_gateway::Listener;
use turmoil::net::{TcpListener, TcpStream};

/// A turmoil listener, accepting for the gateway.
pub(crate) struct SimListener(pub(crate) TcpListener);

impl std::fmt::Debug for SimListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SimListener")
            .field(&self.0.local_addr())
            .finish()
    }
}

impl Listener for SimListener {
    type Io = TcpStream;

    fn accept(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send {
        self.0.accept()
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Opens the gateway's upstream connections on the simulated network, by the upstream URL's
/// host name (turmoil resolves host names) and port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SimConnector;

impl tower::Service<Uri> for SimConnector {
    type Response = SimStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<SimStream>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host"))?
                .to_owned();
            let port = uri.port_u16().unwrap_or(80);
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            Ok(SimStream(TokioIo::new(stream)))
        })
    }
}

/// A simulated TCP connection as hyper's client wants one.
#[derive(Debug)]
pub(crate) struct SimStream(TokioIo<TcpStream>);

impl Connection for SimStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
