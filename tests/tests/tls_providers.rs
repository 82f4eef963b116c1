//! Both rustls crypto providers compiled in (*ring*, ours, and aws-lc-rs,
//! as another crate of a user's may bring, here through a dev-dependency)
//! and none installed: rustls then cannot pick one by itself, and a TLS
//! connect that relied on that would panic. Its own binary, so that nothing
//! installs a provider before the test looks.

use lock_runtime::LockClient;
use rustls::crypto::CryptoProvider;
use tests::tls::{tls_server, Certs, PASSWORD, USER};

#[tokio::test]
async fn tls_connects_with_two_crypto_providers_in_the_tree() {
    // Both are there (this would not compile otherwise)...
    let _ = (
        rustls::crypto::ring::default_provider(),
        rustls::crypto::aws_lc_rs::default_provider(),
    );
    // ...and neither is the default yet.
    assert!(CryptoProvider::get_default().is_none());
    let certs = Certs::make();
    let (_server, port) = tls_server(&certs);
    let client = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .connect(&format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("connect over TLS");
    let guard = client.lock("tls:providers").await.expect("lock");
    guard.release().await.expect("release");
    assert!(
        CryptoProvider::get_default().is_some(),
        "ring was installed as the process default"
    );
}
