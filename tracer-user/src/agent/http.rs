//! A minimal HTTP/1.1 endpoint for Prometheus: `GET /metrics` and `GET /healthz`, one request
//! per connection. Nothing else is served, and a slow or oversized request is dropped.

use std::{io, sync::Arc, time::Duration};

use log::debug;
use prometheus_client::{encoding::text, registry::Registry};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::timeout,
};

/// A request's head must arrive within this long and fit in `MAX_HEAD` bytes.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD: usize = 8192;
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `registry` on `listener` from a thread of its own, so that a busy collector (a kill
/// storm, 1 kHz NVML readings) never delays a scrape.
pub fn spawn(listener: std::net::TcpListener, registry: Arc<Registry>) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("linger-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(l) => serve(l, registry).await,
                    Err(e) => log::warn!("metrics listener: {e}"),
                }
            })
        })?;
    Ok(())
}

async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let registry = Arc::clone(&registry);
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &registry).await {
                        debug!("metrics request from {peer}: {e}");
                    }
                });
            }
            // Out of descriptors and the like: wait a little instead of spinning.
            Err(e) => {
                debug!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    let head = timeout(READ_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request head too slow"))??;
    let (status, kind, body) = respond(&head, registry);
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

async fn read_head(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn respond(head: &str, registry: &Registry) -> (&'static str, &'static str, String) {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split('?').next().unwrap_or_default();
    let plain = "text/plain; charset=utf-8";
    match (method, path) {
        ("GET", "/metrics") => {
            let mut body = String::new();
            match text::encode(&mut body, registry) {
                Ok(()) => ("200 OK", OPENMETRICS, body),
                Err(_) => (
                    "500 Internal Server Error",
                    plain,
                    "encoding failed\n".into(),
                ),
            }
        }
        ("GET", "/healthz") => ("200 OK", plain, "ok\n".into()),
        ("GET", _) => (
            "404 Not Found",
            plain,
            "linger serves /metrics and /healthz\n".into(),
        ),
        _ => ("405 Method Not Allowed", plain, "only GET\n".into()),
    }
}
