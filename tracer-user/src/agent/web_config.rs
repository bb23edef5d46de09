//! `--web-config-file`: TLS and basic auth for the metrics endpoint, in the format of the
//! Prometheus exporter-toolkit (node_exporter's `--web.config.file`), so one file serves a
//! fleet's exporters alike:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt      # relative to the file's own directory
//!   key_file: server.key
//!   min_version: TLS12         # TLS12 (default) or TLS13
//! basic_auth_users:
//!   prometheus: $2y$10$...     # bcrypt hashes
//! ```
//!
//! Read once at start; anything it cannot honour is an error then, never a silent default.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
};

use serde::Deserialize;
use thiserror::Error;
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    version::{TLS12, TLS13},
    ServerConfig, SupportedProtocolVersion,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
}

/// What the endpoint serves with; the default is plain HTTP without authentication.
#[derive(Default)]
pub struct WebConfig {
    /// None: plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// User names and their bcrypt hashes; empty: no authentication.
    pub users: BTreeMap<String, String>,
}

#[derive(Debug, Error)]
pub enum WebConfigError {
    #[error("reading {}", .0.display())]
    Read(PathBuf, #[source] io::Error),
    #[error("{}", .0.display())]
    Parse(PathBuf, #[source] Box<serde_saphyr::Error>),
    #[error("{}: {}", .0.display(), .1)]
    Invalid(PathBuf, String),
    #[error("{}: {what} {}", config.display(), file.display())]
    Pem {
        config: PathBuf,
        what: &'static str,
        file: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: the certificate and key", .0.display())]
    Tls(PathBuf, #[source] rustls::Error),
}

pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| WebConfigError::Read(path.into(), e))?;
    let file: File = serde_saphyr::from_str(&text)
        .map_err(|e| WebConfigError::Parse(path.into(), Box::new(e)))?;
    let invalid = |what: String| WebConfigError::Invalid(path.into(), what);
    for (user, hash) in &file.basic_auth_users {
        bcrypt::HashParts::from_str(hash).map_err(|e| {
            invalid(format!(
                "basic_auth_users: {user}'s password is not a bcrypt hash ({e})"
            ))
        })?;
    }
    let tls = file
        .tls_server_config
        .map(|t| tls(path, t))
        .transpose()?
        .map(Arc::new);
    Ok(WebConfig {
        tls,
        users: file.basic_auth_users,
    })
}

fn tls(path: &Path, file: TlsFile) -> Result<ServerConfig, WebConfigError> {
    let invalid = |what: String| WebConfigError::Invalid(path.into(), what);
    // Relative names are the file's own neighbours, as in the exporter-toolkit.
    let beside = |p: PathBuf| path.parent().unwrap_or(Path::new(".")).join(p);
    let (Some(cert), Some(key)) = (file.cert_file.map(beside), file.key_file.map(beside)) else {
        return Err(invalid(
            "tls_server_config needs both cert_file and key_file".into(),
        ));
    };
    let min = version(file.min_version.as_deref().unwrap_or("TLS12")).map_err(&invalid)?;
    let max = version(file.max_version.as_deref().unwrap_or("TLS13")).map_err(&invalid)?;
    let versions: Vec<&'static SupportedProtocolVersion> = [(12, &TLS12), (13, &TLS13)]
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, v)| v)
        .collect();
    if versions.is_empty() {
        return Err(invalid(
            "tls_server_config: min_version is above max_version".into(),
        ));
    }
    let pem = |what, file: &Path, source| WebConfigError::Pem {
        config: path.into(),
        what,
        file: file.into(),
        source,
    };
    let chain = CertificateDer::pem_file_iter(&cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem("cert_file", &cert, e))?;
    if chain.is_empty() {
        return Err(invalid(format!(
            "tls_server_config: cert_file {}: no certificate in it",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| pem("key_file", &key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| WebConfigError::Tls(path.into(), e))?;
    // The endpoint speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The exporter-toolkit's version names, as minor numbers of TLS 1.x.
fn version(name: &str) -> Result<u8, String> {
    match name {
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => Err(format!(
            "tls_server_config: {name} is not offered (rustls speaks TLS12 and TLS13)"
        )),
        _ => Err(format!(
            "tls_server_config: unknown TLS version {name:?} (TLS12 or TLS13)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(dir: &Path, text: &str) -> Result<WebConfig, String> {
        let path = dir.join("web.yml");
        std::fs::write(&path, text).expect("write");
        load(&path).map_err(|e| {
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                s += &format!(": {c}");
                cause = c.source();
            }
            s
        })
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("linger-web-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let d = dir("bad");
        let refused = |text: &str, why: &str| {
            let e = load_text(&d, text).err().expect("refused");
            assert!(e.contains(why), "{text:?}: {e}");
        };
        refused(
            "basic_auth_users:\n  a: secret\n",
            "a's password is not a bcrypt hash",
        );
        refused("tls_server_config:\n  cert_file: c.pem\n", "needs both");
        refused(
            "tls_server_config:\n  client_ca_file: ca.pem\n",
            "client_ca_file",
        );
        refused("basic_auth_user:\n  a: b\n", "basic_auth_user");
        refused(
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  min_version: TLS11\n",
            "TLS11 is not offered",
        );
        refused(
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  min_version: TLS13\n  \
             max_version: TLS12\n",
            "min_version is above max_version",
        );
        // Relative to the file, and the missing file named.
        refused(
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n",
            &format!("cert_file {}", d.join("c.pem").display()),
        );
        let e = load(&d.join("none.yml")).err().expect("no file");
        assert!(e.to_string().starts_with("reading "), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn users_without_tls_are_basic_auth_over_http() {
        let d = dir("users");
        let hash = bcrypt::hash("pw", 4).expect("hash");
        let c =
            load_text(&d, &format!("basic_auth_users:\n  prometheus: '{hash}'\n")).expect("valid");
        assert!(c.tls.is_none());
        assert_eq!(c.users.get("prometheus"), Some(&hash));
        let empty = load_text(&d, "{}\n").expect("an empty config");
        assert!(empty.tls.is_none() && empty.users.is_empty());
        std::fs::remove_dir_all(&d).ok();
    }
}
