//! The metrics endpoint: `GET /metrics` and `GET /healthz` over HTTP/1.1 (hyper), with TLS
//! and basic auth from `--web-config-file`. Each connection must send its request's headers
//! (after its TLS handshake) within `HEAD_TIMEOUT` and in at most `MAX_HEAD` bytes, and at
//! most `--metrics-max-connections` are open (`connections`): a slow or hostile client
//! never keeps a scraper out.

use std::{convert::Infallible, io, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE},
    server::conn::http1,
    service::service_fn,
    Method, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use log::debug;
use prometheus_client::{encoding::text, registry::Registry};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    time::timeout,
};
use tokio_rustls::TlsAcceptor;

use super::{
    basic_auth::BasicAuth,
    connections::{Connections, Ticket},
    web_config::WebConfig,
};

/// The TLS handshake, then a request's headers, must each come within this long...
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// ...and fit in this many bytes (hyper's least read buffer): a larger head is answered 431.
const MAX_HEAD: usize = 8192;
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";

/// How the endpoint serves.
pub struct Options {
    pub max_connections: usize,
    pub web: WebConfig,
}

struct Endpoint {
    registry: Arc<Registry>,
    tls: Option<TlsAcceptor>,
    auth: Option<Arc<BasicAuth>>,
}

/// Serves `registry` on `listener` from a thread of its own, so that a busy collector (a kill
/// storm, 1 kHz NVML readings) never delays a scrape.
pub fn spawn(
    listener: std::net::TcpListener,
    registry: Arc<Registry>,
    options: Options,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let endpoint = Arc::new(Endpoint {
        registry,
        tls: options.web.tls.map(TlsAcceptor::from),
        auth: BasicAuth::new(options.web.users),
    });
    let connections = Connections::new(options.max_connections);
    std::thread::Builder::new()
        .name("linger-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(l) => serve(l, endpoint, connections).await,
                    Err(e) => log::warn!("metrics listener: {e}"),
                }
            })
        })?;
    Ok(())
}

async fn serve(listener: TcpListener, endpoint: Arc<Endpoint>, connections: Connections) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let endpoint = Arc::clone(&endpoint);
                connections.admit(|ticket| {
                    tokio::spawn(async move {
                        if let Err(e) = endpoint.connection(stream, ticket).await {
                            debug!("metrics connection from {peer}: {e}");
                        }
                    })
                    .abort_handle()
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

impl Endpoint {
    async fn connection(self: Arc<Self>, stream: TcpStream, ticket: Ticket) -> io::Result<()> {
        match &self.tls {
            Some(tls) => {
                let stream = timeout(HEAD_TIMEOUT, tls.accept(stream))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake"))??;
                self.http(stream, ticket).await
            }
            None => self.http(stream, ticket).await,
        }
    }

    async fn http(
        self: Arc<Self>,
        stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
        ticket: Ticket,
    ) -> io::Result<()> {
        let ticket = Arc::new(ticket);
        let service = service_fn(move |request| {
            let (endpoint, ticket) = (Arc::clone(&self), Arc::clone(&ticket));
            async move {
                ticket.answering();
                let auth = request.headers().get(AUTHORIZATION).map(|h| h.as_bytes());
                let response = endpoint
                    .respond(request.method(), request.uri().path(), auth)
                    .await;
                ticket.waiting();
                Ok::<_, Infallible>(response)
            }
        });
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD)
            .serve_connection(TokioIo::new(stream), service)
            .await
            .map_err(io::Error::other)
    }

    async fn respond(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&[u8]>,
    ) -> Response<Full<Bytes>> {
        if method != Method::GET {
            let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only GET\n".into());
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET"));
            return r;
        }
        match path {
            // Says nothing but that the agent runs: open to probes that hold no password.
            "/healthz" => reply(StatusCode::OK, PLAIN, "ok\n".into()),
            "/metrics" => {
                if let Some(auth) = &self.auth {
                    if !auth.allows(authorization).await {
                        let mut r = reply(StatusCode::UNAUTHORIZED, PLAIN, "unauthorized\n".into());
                        r.headers_mut().insert(
                            WWW_AUTHENTICATE,
                            HeaderValue::from_static("Basic realm=\"linger\""),
                        );
                        return r;
                    }
                }
                let mut body = String::new();
                match text::encode(&mut body, &self.registry) {
                    Ok(()) => reply(StatusCode::OK, OPENMETRICS, body),
                    Err(_) => reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        PLAIN,
                        "encoding failed\n".into(),
                    ),
                }
            }
            _ => reply(
                StatusCode::NOT_FOUND,
                PLAIN,
                "linger serves /metrics and /healthz\n".into(),
            ),
        }
    }
}

fn reply(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use base64::{engine::general_purpose::STANDARD, Engine as _};

    use super::*;

    async fn status(e: &Endpoint, method: Method, path: &str, auth: Option<&str>) -> StatusCode {
        e.respond(&method, path, auth.map(str::as_bytes))
            .await
            .status()
    }

    #[tokio::test]
    async fn metrics_need_a_password_when_users_are_set_and_healthz_never_does() {
        let users = BTreeMap::from([("p".to_string(), bcrypt::hash("pw", 4).expect("hash"))]);
        let e = Endpoint {
            registry: Arc::new(Registry::default()),
            tls: None,
            auth: BasicAuth::new(users),
        };
        let refused = e.respond(&Method::GET, "/metrics", None).await;
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(refused.headers().contains_key(WWW_AUTHENTICATE));
        let right = format!("Basic {}", STANDARD.encode("p:pw"));
        let wrong = format!("Basic {}", STANDARD.encode("p:no"));
        let right = Some(right.as_str());
        assert_eq!(
            status(&e, Method::GET, "/metrics", right).await,
            StatusCode::OK
        );
        assert_eq!(
            status(&e, Method::GET, "/metrics", Some(&wrong)).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(&e, Method::GET, "/healthz", None).await,
            StatusCode::OK
        );
        assert_eq!(
            status(&e, Method::GET, "/other", right).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&e, Method::POST, "/metrics", right).await,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
