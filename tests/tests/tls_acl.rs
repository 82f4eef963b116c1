//! TLS and ACL users against real servers: a `redis-server` with a TLS
//! port and a certificate made here by a private CA, the default user off
//! and ACL users on; a Sentinel whose data node wants an ACL user and whose
//! sentinels want a password of their own.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use tests::sentinel::{Sentinel, Timing};
use tests::tls::{tls_server, Certs, PASSWORD, USER};
use tests::{free_port, unique};

async fn lock_and_release(client: &LockClient) -> u64 {
    let guard = client.lock(unique("tls")).await.expect("lock");
    let fence = guard.fence();
    guard.release().await.expect("release");
    fence
}

/// The error a bad setting gives, and how long it took.
async fn failure(
    connect: impl std::future::Future<Output = Result<LockClient, LockError>>,
) -> (LockError, Duration) {
    let t = Instant::now();
    let out = match connect.await {
        Ok(client) => client.lock(unique("tls")).await.map(|_| ()),
        Err(e) => Err(e),
    };
    (out.expect_err("must fail"), t.elapsed())
}

#[tokio::test]
async fn locks_over_tls_with_a_private_ca_and_an_acl_user() {
    let certs = Certs::make();
    let (_server, port) = tls_server(&certs);
    let client = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .connect(&format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("connect over TLS");
    assert!(lock_and_release(&client).await > 0);
    // The hostname is checked too: `localhost` is in the certificate.
    let by_name = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .connect(&format!("rediss://{USER}:{PASSWORD}@localhost:{port}"))
        .await
        .expect("connect over TLS by name");
    assert!(lock_and_release(&by_name).await > 0);
    // Redlock over three TLS servers.
    let others: Vec<_> = (0..2).map(|_| tls_server(&certs)).collect();
    let urls: Vec<String> = std::iter::once(port)
        .chain(others.iter().map(|(_, p)| *p))
        .map(|p| format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{p}"))
        .collect();
    let redlock = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .redlock(&urls)
        .await
        .expect("Redlock over TLS");
    assert!(lock_and_release(&redlock).await > 0);
}

#[tokio::test]
async fn insecure_skips_verification_and_without_it_an_unknown_ca_is_refused() {
    let certs = Certs::make();
    let (_server, port) = tls_server(&certs);
    let insecure = LockClient::connect(&format!(
        "rediss://{USER}:{PASSWORD}@127.0.0.1:{port}/#insecure"
    ))
    .await
    .expect("insecure TLS");
    assert!(lock_and_release(&insecure).await > 0);

    let (e, took) = failure(LockClient::connect(&format!(
        "rediss://{USER}:{PASSWORD}@127.0.0.1:{port}"
    )))
    .await;
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        e.to_string().to_lowercase().contains("certificate"),
        "the message should name the certificate: {e}"
    );
}

#[tokio::test]
async fn wrong_password_and_plain_text_to_a_tls_port_are_clear_errors_within_5s() {
    let certs = Certs::make();
    let (server, port) = tls_server(&certs);
    let (e, took) = failure(
        LockClient::builder()
            .tls_root_ca(&certs.ca_pem())
            .connect(&format!("rediss://{USER}:wrong@127.0.0.1:{port}")),
    )
    .await;
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let msg = e.to_string();
    assert!(
        msg.to_lowercase().contains("password"),
        "the message should say the password is wrong: {msg}"
    );
    assert!(!msg.contains("wrong@"), "the password leaked: {msg}");

    // The plain port wants a user too: the default one is off.
    let (e, took) = failure(LockClient::connect(&server.url())).await;
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let (e, took) = failure(LockClient::connect(&format!(
        "redis://{USER}:{PASSWORD}@127.0.0.1:{port}"
    )))
    .await;
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test]
async fn acl_users_over_plain_tcp_and_a_user_without_the_keys() {
    let certs = Certs::make();
    let (server, _) = tls_server(&certs);
    let port = server.port();
    let client = LockClient::connect(&format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("ACL user over TCP");
    assert!(lock_and_release(&client).await > 0);

    let narrow = LockClient::connect(&format!("redis://narrow:narrow-pw@127.0.0.1:{port}"))
        .await
        .expect("the narrow user can connect");
    let t = Instant::now();
    let e = narrow
        .lock(unique("not-yours"))
        .await
        .expect_err("no permission on lock:* keys");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(e.to_string().to_lowercase().contains("noperm"), "{e}");
}

#[tokio::test]
async fn sentinel_passes_the_url_credentials_to_the_data_node_and_uses_its_own() {
    let certs = Certs::make();
    let (primary, _) = tls_server(&certs);
    let extra = format!(
        "sentinel auth-user mymaster {USER}\nsentinel auth-pass mymaster {PASSWORD}\nrequirepass sentinel-pw"
    );
    let sentinels: Vec<Sentinel> = (0..3)
        .map(|_| Sentinel::start_with("mymaster", primary.port(), Timing::default(), &extra))
        .collect();
    let urls: Vec<String> = sentinels
        .iter()
        .map(|s| {
            s.url()
                .replace("redis://", &format!("redis://{USER}:{PASSWORD}@"))
        })
        .collect();
    let client = LockClient::builder()
        .sentinel_auth("", "sentinel-pw")
        .sentinel(&urls, "mymaster")
        .await
        .expect("Sentinel with ACL data node and password-protected sentinels");
    assert!(lock_and_release(&client).await > 0);

    // Without the sentinels' password, no sentinel answers.
    let (e, took) = failure(LockClient::sentinel(&urls, "mymaster")).await;
    assert!(matches!(e, LockError::Backend(_)), "{e:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        !e.to_string().contains(PASSWORD),
        "the password leaked: {e}"
    );
}

#[tokio::test]
async fn sentinel_over_tls_reaches_the_data_node_over_tls_with_its_acl_user() {
    let certs = Certs::make();
    let (_primary, primary_tls) = tls_server(&certs);
    let tls = format!(
        "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes",
        certs.path("server.crt"),
        certs.path("server.key"),
        certs.path("ca.crt"),
    );
    let sentinel_tls: Vec<u16> = (0..3).map(|_| free_port()).collect();
    // The sentinels watch the primary through its TLS port, as its ACL
    // user, and listen on a TLS port of their own (their plain port is
    // for the harness's readiness check).
    let _sentinels: Vec<Sentinel> = sentinel_tls
        .iter()
        .map(|port| {
            let extra = format!(
                "{tls}\ntls-port {port}\nsentinel auth-user mymaster {USER}\nsentinel auth-pass mymaster {PASSWORD}"
            );
            Sentinel::start_with("mymaster", primary_tls, Timing::default(), &extra)
        })
        .collect();
    let urls: Vec<String> = sentinel_tls
        .iter()
        .map(|p| format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{p}"))
        .collect();
    let client = LockClient::builder()
        .tls_root_ca(&certs.ca_pem())
        .sentinel(&urls, "mymaster")
        .await
        .expect("Sentinel over TLS, the data node over TLS with the URLs' ACL user");
    assert!(lock_and_release(&client).await > 0);
}
