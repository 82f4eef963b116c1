//! Metrics, tracing spans and the axum response of `LockError`, against a
//! real `redis-server`. One test per concern that touches process-wide
//! state (the metrics recorder is installed once for this binary).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::response::IntoResponse;
use lock_runtime::{distributed_lock, LockClient, LockError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tests::{eventually, global, unique};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// Held by every test of this binary: they share the recorder (reading it
/// drains what it counted) and its labels ("manual" and the templates).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        s
    })
}

/// (metric, lock label) → counter total or number of histogram samples,
/// since the last call.
fn taken() -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let k = key.key();
        let label = k
            .labels()
            .find(|l| l.key() == "lock")
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(v) => v.len() as u64,
            DebugValue::Gauge(_) => 0,
        };
        *out.entry((k.name().to_owned(), label)).or_default() += n;
    }
    out
}

fn get(m: &HashMap<(String, String), u64>, name: &str, label: &str) -> u64 {
    m.get(&(name.to_owned(), label.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[distributed_lock(key = "order:{id}", wait = "0s")]
async fn order(id: u64, nested: bool) -> Result<u64, LockError> {
    if nested {
        // A reentry: not a fresh acquisition.
        return inner_order(id).await;
    }
    Ok(lock_runtime::current_fence().unwrap())
}

#[distributed_lock(key = "order:{id}", wait = "0s")]
async fn inner_order(id: u64) -> Result<u64, LockError> {
    Ok(lock_runtime::current_fence().unwrap())
}

#[tokio::test(flavor = "current_thread")]
async fn metrics_count_fresh_acquisitions_busy_and_lost_by_template() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = global::redis().await;
    let _ = taken();
    let client = lock_runtime::client().unwrap();
    let id = fastrand::u64(1..u64::MAX / 2);

    order(id, true).await.unwrap();
    let m = taken();
    assert_eq!(
        get(&m, "distributed_lock_acquired_total", "order:{id}"),
        1,
        "{m:?}"
    );
    assert_eq!(get(&m, "distributed_lock_acquire_seconds", "order:{id}"), 1);
    assert_eq!(get(&m, "distributed_lock_held_seconds", "order:{id}"), 1);
    assert!(
        m.keys().all(|(_, label)| !label.contains(&id.to_string())),
        "a formatted key became a label: {m:?}"
    );

    // Busy: another holder has it.
    let other = client
        .lock(format!("order:{id}"))
        .name("by-hand")
        .await
        .unwrap();
    assert!(matches!(
        order(id, false).await,
        Err(LockError::Timeout { .. })
    ));
    let m = taken();
    assert_eq!(
        get(&m, "distributed_lock_busy_total", "order:{id}"),
        1,
        "{m:?}"
    );
    assert_eq!(
        get(&m, "distributed_lock_acquired_total", "by-hand"),
        1,
        "{m:?}"
    );

    // Lost: the lock is deleted under its holder; the release finds out.
    server.cmd::<i64>(&["DEL", &format!("lock:{{order:{id}}}")]);
    assert!(matches!(other.release().await, Err(LockError::Lost { .. })));
    let m = taken();
    assert_eq!(
        get(&m, "distributed_lock_lost_total", "by-hand"),
        1,
        "{m:?}"
    );

    // A manual request without a name is "manual".
    let g = client.lock(unique("plain")).await.unwrap();
    g.release().await.unwrap();
    let m = taken();
    assert_eq!(
        get(&m, "distributed_lock_acquired_total", "manual"),
        1,
        "{m:?}"
    );
}

/// Spans seen: name, fields, and the span events were emitted in.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<SeenInner>>);

#[derive(Default)]
struct SeenInner {
    spans: HashMap<u64, (String, HashMap<String, String>)>,
    events: Vec<(String, Option<String>)>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_owned(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_owned(), v.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut seen = self.0.lock().unwrap();
        seen.spans
            .insert(id.into_u64(), (attrs.metadata().name().to_owned(), fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some((_, fields)) = seen.spans.get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut msg = HashMap::new();
        event.record(&mut Fields(&mut msg));
        let parent = ctx.event_span(event).map(|s| s.name().to_owned());
        self.0
            .lock()
            .unwrap()
            .events
            .push((msg.remove("message").unwrap_or_default(), parent));
    }
}

#[distributed_lock(key = "report:{id}")]
async fn report(id: u64) -> Result<(), LockError> {
    let _ = id;
    tracing::info!("inside the body");
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_has_an_acquire_span_and_the_body_runs_in_a_hold_span() {
    let _one = ONE_AT_A_TIME.lock().await;
    global::redis().await;
    let seen = Seen::default();
    let _default = tracing_subscriber::registry()
        .with(seen.clone())
        .set_default();
    report(7).await.unwrap();
    let s = seen.0.lock().unwrap();
    let acquire = s
        .spans
        .values()
        .find(|(n, f)| n == "lock.acquire" && f.get("key").map(String::as_str) == Some("report:7"))
        .expect("a lock.acquire span");
    assert_eq!(
        acquire.1.get("lock").map(String::as_str),
        Some("report:{id}")
    );
    assert_eq!(
        acquire.1.get("outcome").map(String::as_str),
        Some("acquired")
    );
    assert_eq!(acquire.1.get("mode").map(String::as_str), Some("write"));
    // The wait the request has, the client's default here (5 s), also
    // when it never waits.
    assert_eq!(
        acquire.1.get("wait_ms").map(String::as_str),
        Some("5000"),
        "{:?}",
        acquire.1
    );
    let fence: u64 = acquire.1["fence"].parse().expect("fence recorded");
    let hold = s
        .spans
        .values()
        .find(|(n, _)| n == "lock.hold")
        .expect("a lock.hold span");
    assert_eq!(hold.1["fence"].parse::<u64>().unwrap(), fence);
    let body_event = s
        .events
        .iter()
        .find(|(m, _)| m == "inside the body")
        .expect("the body's event");
    assert_eq!(body_event.1.as_deref(), Some("lock.hold"));
}

/// Metrics carry a `mode` label and `lock.acquire` a `mode` field:
/// "semaphore" for a permit, "read" and "write" for locks.
#[tokio::test(flavor = "current_thread")]
async fn metrics_and_spans_say_the_mode() {
    let _one = ONE_AT_A_TIME.lock().await;
    global::redis().await;
    let client = lock_runtime::client().unwrap();
    let _ = snapshotter().snapshot();
    let seen = Seen::default();
    let _default = tracing_subscriber::registry()
        .with(seen.clone())
        .set_default();
    let key = unique("modes");
    let g = client.semaphore(&key, 2).name("sem-mode").await.unwrap();
    g.release().await.unwrap();
    let g = client.read_lock(&key).name("read-mode").await.unwrap();
    g.release().await.unwrap();
    let mut modes: HashMap<String, std::collections::BTreeSet<String>> = HashMap::new();
    for (k, _, _, _) in snapshotter().snapshot().into_vec() {
        let k = k.key();
        let label = |name: &str| {
            k.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        if let (Some(lock), Some(mode)) = (label("lock"), label("mode")) {
            modes.entry(lock).or_default().insert(mode);
        }
    }
    assert_eq!(
        modes["sem-mode"],
        ["semaphore".to_owned()].into(),
        "{modes:?}"
    );
    assert_eq!(modes["read-mode"], ["read".to_owned()].into(), "{modes:?}");
    let s = seen.0.lock().unwrap();
    let span_modes: std::collections::BTreeSet<&str> = s
        .spans
        .values()
        .filter(|(n, f)| n == "lock.acquire" && f.get("key") == Some(&key))
        .filter_map(|(_, f)| f.get("mode").map(String::as_str))
        .collect();
    assert_eq!(span_modes, ["read", "semaphore"].into());
}

async fn parts(e: LockError) -> (u16, Option<String>, serde_json::Value) {
    let r = e.into_response();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(r.headers()["content-type"], "application/json");
    let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
    (
        status,
        retry,
        serde_json::from_slice(&body).expect("JSON body"),
    )
}

#[tokio::test]
async fn lock_errors_are_http_responses() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (status, retry, body) = parts(LockError::Timeout {
        key: "order:\"7\"".into(),
        waited: Duration::from_millis(2500),
    })
    .await;
    assert_eq!((status, retry.as_deref()), (503, Some("3")));
    assert_eq!(body["error"], "lock_busy");
    assert_eq!(body["key"], "order:\"7\"");

    let (_, retry, _) = parts(LockError::Timeout {
        key: "k".into(),
        waited: Duration::ZERO,
    })
    .await;
    assert_eq!(retry.as_deref(), Some("1"), "at least a second");

    let (status, retry, body) = parts(LockError::Lost { key: "k".into() }).await;
    assert_eq!((status, retry), (503, None));
    assert_eq!(body["error"], "lock_lost");

    let (status, _, body) = parts(LockError::NotInitialized).await;
    assert_eq!(status, 500);
    assert_eq!(body["error"], "lock_unavailable");
    assert!(body.get("key").is_none());

    // A real backend error from an unreachable server.
    let e = lock_runtime::LockClient::builder()
        .connect_timeout(Duration::from_millis(200))
        .op_timeout(Duration::from_millis(200))
        .connect(&format!(
            "redis://u:secret@127.0.0.1:{}",
            tests::free_port()
        ))
        .await
        .unwrap_err();
    let (status, _, body) = parts(e).await;
    assert_eq!(status, 500);
    assert!(!body.to_string().contains("secret"), "{body}");
}

#[distributed_lock(key = "level:{id}", wait = "5s")]
async fn levelled(id: u64, stop: bool) -> Result<(), LockError> {
    let _ = id;
    if stop {
        std::future::pending::<()>().await;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn at_info_spans_show_the_waits_and_the_losses_only() {
    let _one = ONE_AT_A_TIME.lock().await;
    let seen = Seen::default();
    let _default = tracing_subscriber::registry()
        .with(
            seen.clone()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .set_default();
    let (client, control) = LockClient::memory_with_control();
    let spans = |name: &str, key: &str| -> Vec<HashMap<String, String>> {
        let s = seen.0.lock().unwrap();
        s.spans
            .values()
            .filter(|(n, f)| n == name && f.get("key").map(String::as_str) == Some(key))
            .map(|(_, f)| f.clone())
            .collect()
    };
    // Uncontended: DEBUG only, nothing at INFO.
    lock_runtime::with_client(client.clone(), levelled(1, false))
        .await
        .unwrap();
    assert!(spans("lock.acquire", "level:1").is_empty());
    assert!(spans("lock.hold", "level:1").is_empty());

    // It waited: an INFO `lock.acquire` covers the wait, with its outcome.
    let held = client.lock("level:2").await.unwrap();
    let waiter = tokio::spawn(lock_runtime::with_client(
        client.clone(),
        levelled(2, false),
    ));
    assert!(
        eventually(Duration::from_secs(5), || client.waiting_here("level:2")
            == 1)
        .await
    );
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let waited = spans("lock.acquire", "level:2");
    assert_eq!(waited.len(), 1, "{waited:?}");
    assert_eq!(
        waited[0].get("outcome").map(String::as_str),
        Some("acquired")
    );

    // Lost: an INFO `lock.hold` says so.
    let body = tokio::spawn(lock_runtime::with_client(client.clone(), levelled(3, true)));
    assert!(eventually(Duration::from_secs(5), || client.held_count() == 1).await);
    assert!(control.expire("level:3"));
    assert!(matches!(body.await.unwrap(), Err(LockError::Lost { .. })));
    let lost = spans("lock.hold", "level:3");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].get("lost").map(String::as_str), Some("true"));
}

#[tokio::test(flavor = "current_thread")]
async fn every_metric_is_described_and_held_locks_are_a_gauge() {
    let _one = ONE_AT_A_TIME.lock().await;
    snapshotter();
    let client = LockClient::memory();
    let gauge = || -> Option<f64> {
        snapshotter()
            .snapshot()
            .into_hashmap()
            .into_iter()
            .find(|(k, _)| {
                k.key().name() == "distributed_lock_held_locks"
                    && k.key().labels().any(|l| l.value() == "gauge-test")
            })
            .and_then(|(_, (_, _, v))| match v {
                DebugValue::Gauge(g) => Some(g.into_inner()),
                _ => None,
            })
    };
    let a = client.lock("g:1").name("gauge-test").await.unwrap();
    let b = client.lock("g:2").name("gauge-test").await.unwrap();
    // (The debugging recorder hands out each change once: the sum of the
    // readings is the gauge.)
    let holding = gauge().unwrap_or_default();
    assert_eq!(holding, 2.0);
    a.release().await.unwrap();
    drop(b);
    assert_eq!(
        holding + gauge().unwrap_or_default(),
        0.0,
        "both holds ended"
    );
    let described: Vec<String> = snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(_, _, help, _)| help.is_some())
        .map(|(k, _, _, _)| k.key().name().to_owned())
        .collect();
    for name in [
        "distributed_lock_acquired_total",
        "distributed_lock_acquire_seconds",
        "distributed_lock_held_seconds",
        "distributed_lock_held_locks",
    ] {
        assert!(
            described.iter().any(|d| d == name),
            "{name} has no description: {described:?}"
        );
    }
}
