//! `LockClient::from_env` against real servers. One test in its own binary:
//! the environment is the process's, so nothing else may read it meanwhile.

use lock_runtime::{LockClient, LockError};
use tests::{unique, RedisServer};

const VARS: [&str; 6] = [
    "LOCK_REDIS_URL",
    "REDIS_URL",
    "LOCK_REDIS_SENTINELS",
    "LOCK_REDIS_MASTER",
    "LOCK_REDIS_CLUSTER",
    "LOCK_REDIS_REDLOCK",
];

fn only(vars: &[(&str, &str)]) {
    for k in VARS {
        std::env::remove_var(k);
    }
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
}

#[tokio::test]
async fn from_env_connects_to_the_deployment_the_environment_names() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();

    only(&[("LOCK_REDIS_URL", &servers[0].url())]);
    let one = LockClient::from_env().await.expect("LOCK_REDIS_URL");
    let key = unique("env");
    let g = one.lock(&key).await.unwrap();
    assert!(
        servers[0].exists(&format!("lock:{{{key}}}")),
        "locked on the named server"
    );
    g.release().await.unwrap();

    only(&[("REDIS_URL", &servers[1].url())]);
    let fallback = LockClient::from_env().await.expect("REDIS_URL");
    let key = unique("env");
    let g = fallback.lock(&key).await.unwrap();
    assert!(servers[1].exists(&format!("lock:{{{key}}}")));
    g.release().await.unwrap();

    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    only(&[("LOCK_REDIS_REDLOCK", &urls.join(","))]);
    let redlock = LockClient::from_env().await.expect("LOCK_REDIS_REDLOCK");
    let key = unique("env");
    let g = redlock.lock(&key).await.unwrap();
    let on = servers
        .iter()
        .filter(|s| s.exists(&format!("lock:{{{key}}}")))
        .count();
    assert!(on >= 2, "a Redlock lock on a majority, found on {on}");
    g.release().await.unwrap();

    only(&[
        ("LOCK_REDIS_URL", &urls[0]),
        ("LOCK_REDIS_REDLOCK", &urls.join(",")),
    ]);
    let e = LockClient::from_env().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(m) if m.contains("LOCK_REDIS_URL, LOCK_REDIS_REDLOCK")),
        "{e:?}"
    );

    only(&[]);
    let e = LockClient::from_env().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(m) if m.contains("REDIS_URL")),
        "{e:?}"
    );
}
