//! How a PostgreSQL connection is secured. `sslmode=require` in the URL,
//! with the `tls` feature: TLS over rustls, the server's certificate
//! verified against the platform's roots (or the client's private CA,
//! `LockClientBuilder::tls_root_ca`) and its name against the URL's host,
//! as libpq's `verify-full` does: a lock store is not a place for an
//! unverified peer. `disable` and `prefer` connect without TLS.

use tokio_postgres::config::SslMode;

use crate::backend::endpoint::Access;
use crate::backend::fault::Fault;

/// The connections' transport.
#[derive(Clone)]
pub(crate) enum Tls {
    Off,
    #[cfg(feature = "tls")]
    On(rustls_connect::Rustls),
}

impl Tls {
    /// What `config`'s `sslmode` asks for.
    pub(crate) fn of(config: &tokio_postgres::Config, access: &Access) -> Result<Tls, Fault> {
        if config.get_ssl_mode() != SslMode::Require {
            return Ok(Tls::Off);
        }
        #[cfg(feature = "tls")]
        {
            rustls_connect::Rustls::new(access.root_ca.as_deref()).map(Tls::On)
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = access;
            Err(Fault::Config(
                "sslmode=require needs the `tls` feature of lock-runtime \
                 (or sslmode=disable, or a TLS-terminating proxy)"
                    .into(),
            ))
        }
    }
}

#[cfg(feature = "tls")]
pub(crate) mod rustls_connect {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
    use tokio_rustls::TlsConnector;

    use crate::backend::fault::Fault;

    /// Makes the TLS session of each new connection.
    #[derive(Clone)]
    pub(crate) struct Rustls {
        config: Arc<rustls::ClientConfig>,
    }

    impl Rustls {
        /// Trusting `root_ca` (PEM) if given, else the platform's roots.
        pub(crate) fn new(root_ca: Option<&[u8]>) -> Result<Rustls, Fault> {
            crate::backend::endpoint::ensure_crypto_provider();
            let mut roots = rustls::RootCertStore::empty();
            match root_ca {
                Some(pem) => {
                    for cert in CertificateDer::pem_slice_iter(pem) {
                        let cert = cert.map_err(|e| {
                            Fault::Config(format!("cannot use the TLS root CA: {e}"))
                        })?;
                        roots.add(cert).map_err(|e| {
                            Fault::Config(format!("cannot use the TLS root CA: {e}"))
                        })?;
                    }
                }
                None => {
                    for cert in rustls_native_certs::load_native_certs().certs {
                        // (A platform root rustls cannot use is skipped.)
                        let _ = roots.add(cert);
                    }
                }
            }
            if roots.is_empty() {
                return Err(Fault::Config(
                    "sslmode=require: no root certificate to verify the server with \
                     (see LockClientBuilder::tls_root_ca)"
                        .into(),
                ));
            }
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Rustls {
                config: Arc::new(config),
            })
        }
    }

    impl<S> MakeTlsConnect<S> for Rustls
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type TlsConnect = Connect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, host: &str) -> io::Result<Connect> {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(Connect {
                connector: TlsConnector::from(self.config.clone()),
                name,
            })
        }
    }

    /// One connection's handshake.
    pub(crate) struct Connect {
        connector: TlsConnector,
        name: ServerName<'static>,
    }

    impl<S> TlsConnect<S> for Connect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            Box::pin(async move {
                let tls = self.connector.connect(self.name, stream).await?;
                Ok(Stream(tls))
            })
        }
    }

    /// A connection's stream once the handshake is done.
    pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S> TlsStream for Stream<S>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        fn channel_binding(&self) -> ChannelBinding {
            // SCRAM without channel binding, as with `channel_binding=prefer`
            // against a server that offers none.
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
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
}
