//! TLS and ACL users against real servers: a `redis-server` with a TLS
//! port and a certificate made here by a private CA, the default user off
//! and ACL users on; a Sentinel whose data node wants an ACL user and whose
//! sentinels want a password of their own.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockMode};
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

/// The ACL user `docs/PRODUCTION.md` documents, read out of it (so the doc
/// and this test cannot drift): the `ACL SETUSER` block's words.
fn documented_acl_line() -> Vec<String> {
    let doc = include_str!("../../docs/PRODUCTION.md");
    let start = doc
        .find("```text\nACL SETUSER")
        .expect("docs/PRODUCTION.md has an ACL SETUSER block");
    let block = &doc[start + "```text\n".len()..];
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .split_whitespace()
        .filter(|w| *w != "\\")
        .map(str::to_owned)
        .collect()
}

/// Every operation, contended and not, as the user `docs/PRODUCTION.md`
/// documents: locks (fenced, unfenced, handed over), read and write locks,
/// semaphores (taken, queued, handed over),
/// renewals, `min_hold`, inspect, list and both force releases. Redis
/// refused none of the commands they sent (`ACL LOG` stays empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_user_can_do_everything() {
    let server = tests::RedisServer::start();
    let words = documented_acl_line();
    assert_eq!(words[..3], ["ACL", "SETUSER", "locks"], "{words:?}");
    let password = words
        .iter()
        .find_map(|w| w.strip_prefix('>'))
        .expect("a password")
        .to_owned();
    let mut setuser = redis::cmd("ACL");
    for w in &words[1..] {
        setuser.arg(w);
    }
    let ok: Result<String, _> = setuser.query(&mut server.conn());
    assert_eq!(ok.as_deref().ok(), Some("OK"), "{ok:?} for {words:?}");
    let url = format!("redis://locks:{password}@127.0.0.1:{}", server.port());
    let connect = || async {
        LockClient::builder()
            .op_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .expect("connect as the documented user")
    };
    let (a, b) = (connect().await, connect().await);
    let wait = Duration::from_secs(10);
    let waiters_of =
        |key: &str| -> i64 { server.cmd(&["HLEN", &format!("lock:{{{key}}}:waiters")]) };

    // Locks: fenced and not, reentered, renewed, kept under min_hold.
    for fence in [true, false] {
        let key = unique("acl-lock");
        let g = a
            .lock(&key)
            .fence(fence)
            .lease(Duration::from_millis(300))
            .await
            .expect("lock");
        // Past a lease: only renewals keep it.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let info = b.inspect(&key).await.expect("inspect").expect("held");
        assert_eq!(info.mode, LockMode::Write);
        // A waiter queues, and the release hands the lock over.
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move { b.lock(&key).fence(fence).wait(wait).await })
        };
        assert!(tests::eventually(wait, || waiters_of(&key) == 1).await);
        g.release().await.expect("release");
        let h = waiter.await.unwrap().expect("handed over");
        h.release().await.expect("release");
        let g = a
            .lock(&key)
            .fence(fence)
            .min_hold(Duration::from_millis(200))
            .await
            .expect("lock under min_hold");
        g.release().await.expect("release under min_hold");
    }

    // Read and write locks: readers share, a writer waits for them.
    let key = unique("acl-rw");
    let r1 = a.read_lock(&key).await.expect("read lock");
    let r2 = b.read_lock(&key).await.expect("second reader");
    let writer = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.write_lock(&key).wait(wait).await })
    };
    assert!(tests::eventually(wait, || waiters_of(&key) == 1).await);
    assert_eq!(a.inspect(&key).await.unwrap().unwrap().mode, LockMode::Read);
    r1.release().await.expect("reader release");
    r2.release().await.expect("reader release");
    writer
        .await
        .unwrap()
        .expect("writer")
        .release()
        .await
        .unwrap();

    // Semaphores: taken, renewed, queued, handed over, inspected.
    let key = unique("acl-sem");
    let s1 = a
        .semaphore(&key, 1)
        .lease(Duration::from_millis(300))
        .await
        .expect("permit");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.semaphore(&key, 1).wait(wait).await })
    };
    assert!(tests::eventually(wait, || waiters_of(&key) == 1).await);
    let info = a.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(info.mode, LockMode::Semaphore { permits: 1 });
    s1.release().await.expect("permit release");
    let s2 = waiter.await.unwrap().expect("permit handed over");
    s2.release().await.unwrap();
    let s = a
        .semaphore(&key, 1)
        .min_hold(Duration::from_millis(200))
        .await
        .expect("permit under min_hold");
    s.release().await.expect("permit release under min_hold");

    // Listing and force releases, of a lock and of a permit.
    let key = unique("acl-ops");
    let _held = a.lock(&key).await.expect("lock");
    assert!(b.locks(&format!("{key}*")).await.expect("list").len() == 1);
    assert!(b.force_release(&key).await.expect("force release"));
    let _permit = a.semaphore(&key, 2).await.expect("permit");
    let holder = b.inspect(&key).await.unwrap().unwrap().holders[0].clone();
    assert!(b
        .force_release_if(&key, &holder)
        .await
        .expect("force release of one holder"));

    // A user refused a command a script runs gets that refusal as a
    // Backend error at once, not a lock or permit that looks busy until
    // its wait runs out.
    let mut narrower = redis::cmd("ACL");
    narrower.arg("SETUSER").arg("nohlen");
    for w in &words[3..] {
        narrower.arg(w.as_str());
    }
    narrower.arg("-hlen").arg("-get");
    let _: String = narrower.query(&mut server.conn()).unwrap();
    let c = LockClient::connect(&format!(
        "redis://nohlen:{password}@127.0.0.1:{}",
        server.port()
    ))
    .await
    .unwrap();
    for (what, r) in [
        (
            "HLEN",
            c.semaphore(unique("acl-no-hlen"), 2).wait(wait).await,
        ),
        ("GET", {
            let key = unique("acl-no-get");
            let _held = a.lock(&key).await.unwrap();
            c.lock(&key).wait(wait).await
        }),
    ] {
        let e = r.expect_err("refused");
        assert!(matches!(e, LockError::Backend(_)), "{e:?}");
        assert!(e.to_string().contains(what), "{e}");
    }
    server.cmd::<String>(&["ACL", "LOG", "RESET"]);

    // (`CLIENT SETINFO`, which the `redis` crate sends where the server has
    // it, is optional: its refusal is ignored.)
    let refused: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
    let refused: Vec<String> = refused
        .iter()
        .map(|e| format!("{e:?}"))
        .filter(|e| !e.contains("setinfo"))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
}

/// Every command a script calls is on the documented ACL line (some run
/// only in states the test above does not reach, such as a semaphore
/// waiter at the head of a lock's queue).
#[test]
fn the_documented_acl_line_names_every_command_the_scripts_call() {
    let words = documented_acl_line();
    let scripts = [
        include_str!("../../lock-runtime/scripts/acquire.lua"),
        include_str!("../../lock-runtime/scripts/inspect.lua"),
        include_str!("../../lock-runtime/scripts/inspect_permits.lua"),
        include_str!("../../lock-runtime/scripts/keep.lua"),
        include_str!("../../lock-runtime/scripts/keep_permit.lua"),
        include_str!("../../lock-runtime/scripts/permit.lua"),
        include_str!("../../lock-runtime/scripts/raise_fence.lua"),
        include_str!("../../lock-runtime/scripts/raise_permit_fence.lua"),
        include_str!("../../lock-runtime/scripts/release.lua"),
        include_str!("../../lock-runtime/scripts/release_permit.lua"),
        include_str!("../../lock-runtime/scripts/renew.lua"),
        include_str!("../../lock-runtime/scripts/renew_permits.lua"),
        include_str!("../../lock-runtime/scripts/renew_read.lua"),
    ];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../lock-runtime/scripts");
    let on_disk = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(on_disk, scripts.len(), "a script was added: list it here");
    let mut missing = Vec::new();
    for script in scripts {
        for call in ["redis.call('", "redis.pcall('"] {
            for rest in script.split(call).skip(1) {
                let command = &rest[..rest.find('\'').unwrap()];
                if !words.iter().any(|w| w == &format!("+{command}")) {
                    missing.push(command.to_owned());
                }
            }
        }
    }
    assert!(missing.is_empty(), "not on the ACL line: {missing:?}");
}
