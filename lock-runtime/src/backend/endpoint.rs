//! How a URL becomes a Redis client: TLS trust and credentials, also for
//! the data nodes that Sentinel names and for the sentinels themselves.

use std::fmt;
use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use super::fault::Fault;

/// Trust and credentials every connection of a client shares.
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// A private CA (PEM) that `rediss://` servers' certificates chain to;
    /// `None`: the platform's roots.
    pub(crate) root_ca: Option<Arc<[u8]>>,
    /// User (may be empty: password only) and password of the sentinels
    /// themselves; the credentials in the Sentinel URLs are the data nodes'.
    pub(crate) sentinel_auth: Option<(String, String)>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("root_ca", &self.root_ca.as_ref().map(|_| "<set>"))
            .field(
                "sentinel_auth",
                &self.sentinel_auth.as_ref().map(|(u, _)| (u, "<redacted>")),
            )
            .finish()
    }
}

/// A URL as it may appear in a message: its password replaced.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// Parse a Redis URL; a TLS URL without TLS support compiled in is a
/// configuration error that says what to enable, and so is `#insecure`
/// without the `tls-insecure` feature (with it, a warning).
pub(crate) fn info(url: &str) -> Result<ConnectionInfo, Fault> {
    let tls = url.starts_with("rediss://") || url.starts_with("valkeys://");
    if tls && !cfg!(feature = "tls") {
        return Err(Fault::Config(format!(
            "`{}` asks for TLS, which needs lock-runtime's `tls` feature \
             (`lock-runtime = {{ version = \"…\", features = [\"tls\"] }}`)",
            redact(url)
        )));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| Fault::Config(format!("bad Redis URL `{}`: {e}", redact(url))))?;
    if matches!(info.addr(), ConnectionAddr::TcpTls { insecure: true, .. }) {
        if !cfg!(feature = "tls-insecure") {
            return Err(Fault::Config(format!(
                "`{}` turns off TLS certificate verification (`#insecure`), which lock-runtime \
                 refuses unless its `tls-insecure` feature is enabled (meant for tests); drop \
                 `#insecure` and trust the server's CA with `LockClientBuilder::tls_root_ca`",
                redact(url)
            )));
        }
        tracing::warn!(
            url = %redact(url),
            "TLS certificate verification is OFF for this Redis connection (`#insecure`): \
             anyone on the path can impersonate the server; use it in tests only"
        );
    }
    Ok(info)
}

/// rustls needs a crypto provider. `redis` builds its TLS settings with the
/// process-wide default, which rustls picks by itself only when exactly one
/// provider is compiled in: with *ring* (ours) and aws-lc-rs (another
/// crate's) both in the tree, the first connect would panic. So *ring* is
/// installed as the default unless the application installed one.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing the race to another installer is fine: one is in place.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A client for `info`, trusting the client's private CA if it has one.
pub(crate) fn client(info: ConnectionInfo, access: &Access) -> Result<redis::Client, Fault> {
    #[cfg(feature = "tls")]
    if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        ensure_crypto_provider();
    }
    #[cfg(feature = "tls")]
    if let (ConnectionAddr::TcpTls { .. }, Some(ca)) = (info.addr(), &access.root_ca) {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.to_vec()),
        };
        return redis::Client::build_with_tls(info, certs)
            .map_err(|e| Fault::Config(format!("cannot use the TLS root CA: {e}")));
    }
    let _ = access;
    redis::Client::open(info).map_err(|e| Fault::Config(format!("bad Redis settings: {e}")))
}

#[cfg(feature = "cluster")]
/// A Redis Cluster client's builder over `urls`, trusting the client's
/// private CA if it has one.
pub(crate) fn cluster(
    urls: &[String],
    access: &Access,
) -> Result<redis::cluster::ClusterClientBuilder, Fault> {
    for url in urls {
        #[cfg(feature = "tls")]
        if matches!(info(url)?.addr(), ConnectionAddr::TcpTls { .. }) {
            ensure_crypto_provider();
        }
        #[cfg(not(feature = "tls"))]
        info(url)?;
    }
    let builder = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str));
    #[cfg(feature = "tls")]
    if let Some(ca) = &access.root_ca {
        return Ok(builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.to_vec()),
        }));
    }
    let _ = access;
    Ok(builder)
}

#[cfg(feature = "cluster")]
/// The nodes of `urls`, for messages (passwords replaced).
pub(crate) fn shown(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sentinel: reached as its URL says (TLS included), with the sentinels'
/// own credentials rather than the URL's.
pub(crate) fn sentinel(url: &str, access: &Access) -> Result<redis::Client, Fault> {
    let info = info(url)?;
    let mut auth = RedisConnectionInfo::default();
    if let Some((user, password)) = &access.sentinel_auth {
        if !user.is_empty() {
            auth = auth.set_username(user);
        }
        auth = auth.set_password(password);
    }
    client(info.set_redis_settings(auth), access)
}

/// The data node at `host:port` that a sentinel named, reached the way the
/// Sentinel URL says: over TLS if it uses TLS (`#insecure` too), with its
/// user, password and database.
pub(crate) fn data_node(
    sentinel_url: &str,
    host: &str,
    port: u16,
) -> Result<ConnectionInfo, Fault> {
    let via = info(sentinel_url)?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let addr = match via.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => {
            format!(
                "rediss://{host}:{port}/{}",
                if *insecure { "#insecure" } else { "" }
            )
        }
        _ => format!("redis://{host}:{port}"),
    };
    Ok(info(&addr)?.set_redis_settings(via.redis_settings().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("rediss://:pw@db:6380"), "rediss://:***@db:6380");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
    }

    #[test]
    fn a_data_node_gets_the_sentinel_urls_credentials_and_database() {
        let node = data_node("redis://app:p%40ss@s1:26379/3", "10.0.0.5", 6379).unwrap();
        let r = node.redis_settings();
        assert_eq!(r.username(), Some("app"));
        assert_eq!(r.password(), Some("p@ss"));
        assert_eq!(r.db(), 3);
        assert!(matches!(node.addr(), ConnectionAddr::Tcp(h, 6379) if h == "10.0.0.5"));
    }

    #[cfg(all(feature = "tls", not(feature = "tls-insecure")))]
    #[test]
    fn insecure_without_its_feature_is_refused_with_what_to_do() {
        let e = info("rediss://u:pw@db:6380/#insecure")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tls-insecure` feature"), "{e}");
        assert!(e.contains("tls_root_ca"), "{e}");
        assert!(!e.contains("pw"), "{e}");
        assert!(info("rediss://db:6380").is_ok());
    }

    #[cfg(feature = "tls-insecure")]
    #[test]
    fn insecure_with_its_feature_is_accepted() {
        assert!(info("rediss://db:6380/#insecure").is_ok());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_feature_says_what_to_enable() {
        let e = info("rediss://u:pw@db:6380").unwrap_err().to_string();
        assert!(e.contains("`tls` feature"), "{e}");
        assert!(!e.contains("pw"), "{e}");
    }
}
