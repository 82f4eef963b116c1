//! Case 4's traced run: where a hand-off's time goes, from the holder's
//! call to release to the next holder's body starting, split at the points
//! that can be seen from outside the runtime.

use std::collections::HashMap;
use std::time::Duration;

use crate::grant_tap::Taps;
use crate::report::Report;
use crate::stats::{fmt_ns, fmt_opt, nearest_rank};

/// What a traced run stamps (wall clock, ns since the epoch).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// The holder is about to release.
    Call,
    /// Its release returned.
    Reply,
    /// Its body started.
    Body,
}

/// Signed durations in ns (a body may start before its releaser has the
/// release's reply).
#[derive(Default)]
struct Signed(Vec<i64>);

impl Signed {
    fn push(&mut self, to: u64, from: u64) {
        self.0.push(to as i64 - from as i64);
    }

    fn pct(&self, p: f64) -> Option<i64> {
        nearest_rank(&self.0, p)
    }
}

fn fmt_signed(ns: Option<i64>) -> String {
    match ns {
        None => "n/a".into(),
        Some(n) if n < 0 => format!("−{}", fmt_ns(n.unsigned_abs())),
        Some(n) => fmt_ns(n as u64),
    }
}

#[derive(Default)]
struct Segments {
    /// Hand-offs in the run, and those with every stamp the run takes.
    handoffs: usize,
    joined: usize,
    call_publish: Signed,
    publish_heard: Signed,
    call_heard: Signed,
    heard_body: Signed,
    total: Signed,
    call_reply: Signed,
    reply_body: Signed,
}

/// Line the stamps up per hand-off. The lock is exclusive, so the bodies in
/// time order are its holders in turn: each body's releaser is the holder
/// of the body before it.
fn segments(trace: &[(Event, String, u64)], taps: &Taps, monitored: bool) -> Segments {
    let at = |kind: Event| -> HashMap<&str, u64> {
        trace
            .iter()
            .filter(|(e, _, _)| *e == kind)
            .map(|(_, h, t)| (h.as_str(), *t))
            .collect()
    };
    let (calls, replies) = (at(Event::Call), at(Event::Reply));
    let mut bodies: Vec<(u64, &str)> = trace
        .iter()
        .filter(|(e, _, _)| *e == Event::Body)
        .map(|(_, h, t)| (*t, h.as_str()))
        .collect();
    bodies.sort_unstable();
    let mut s = Segments::default();
    for pair in bodies.windows(2) {
        let ((_, releaser), (body, next)) = (pair[0], pair[1]);
        s.handoffs += 1;
        let (Some(&call), Some(&reply), Some(&heard)) = (
            calls.get(releaser),
            replies.get(releaser),
            taps.heard.get(next),
        ) else {
            continue;
        };
        let published = taps.published.get(next).copied();
        if monitored && published.is_none() {
            continue;
        }
        s.joined += 1;
        if let Some(published) = published {
            s.call_publish.push(published, call);
            s.publish_heard.push(heard, published);
        }
        s.call_heard.push(heard, call);
        s.heard_body.push(body, heard);
        s.total.push(body, call);
        s.call_reply.push(reply, call);
        s.reply_body.push(body, reply);
    }
    s
}

type Traced<'a> = Result<(&'a [(Event, String, u64)], &'a Taps), &'a String>;

pub fn report_segments(
    report: &mut Report,
    subscribed: Traced,
    monitored: Traced,
    clean_p50: Option<u64>,
    window: Duration,
) {
    report.heading("Case 4b — where a hand-off's time goes (ours, fenced)");
    let a = subscribed.map(|(t, taps)| segments(t, taps, false));
    let b = monitored.map(|(t, taps)| segments(t, taps, true));
    let joined = |s: &Result<Segments, &String>| match s {
        Ok(s) => format!("{} of {}", s.joined, s.handoffs),
        Err(e) => format!("none (failed: {e})"),
    };
    report.para(&format!(
        "The same 16 tasks over {} `LockClient`s, twice more for {} s each on keys of their own, watched from \
         outside the runtime. The bench stamps (wall clock) the holder's call to release, the release's reply and \
         each body's start. A subscriber of the bench's own listens on the waiters' grant channels (joined once a \
         waiter's client listens there, found with `PUBSUB CHANNELS`, so that a release never counts it as a \
         waiter) and stamps each grant as it reads it off its socket, at the moment the waiter's client can read \
         its own copy. Run A has only that subscriber. Run B adds a `MONITOR` connection, which gives the \
         server's time of the release script's `PUBLISH` of each grant: the server stamps a command once it has \
         run, on the same machine's clock. Grants are matched to bodies by the owner id the message names \
         (`guard.holder()`); hand-offs with every stamp: {} in run A, {} in run B. The subscriber, and `MONITOR` \
         much more, add work to the server and to these 2 cores: compare each run's total with the clean run's \
         p50.",
        super::handoff::CLIENTS,
        window.as_secs(),
        joined(&a),
        joined(&b),
    ));
    let row = |run: &str,
               seg: &str,
               what: &str,
               s: &Result<Segments, &String>,
               pick: fn(&Segments) -> &Signed| {
        let (p50, p99) = match s {
            Ok(s) => (fmt_signed(pick(s).pct(0.5)), fmt_signed(pick(s).pct(0.99))),
            Err(_) => ("n/a".into(), "n/a".into()),
        };
        vec![run.to_owned(), seg.to_owned(), what.to_owned(), p50, p99]
    };
    report.table(
        &["run", "segment", "from → to", "p50", "p99"],
        &[
            row(
                "A",
                "1",
                "holder calls `release()` → the grant is read by a subscriber: the client's send path, the \
                 release script, the server writing the message, loopback, a reader thread waking",
                &a,
                |s| &s.call_heard,
            ),
            row(
                "A",
                "2",
                "the grant is read by a subscriber → the woken body starts: the waiter's client reading its copy \
                 on its I/O thread, routing it to the request, waking the task on a bench worker",
                &a,
                |s| &s.heard_body,
            ),
            row("A", "1 + 2", "holder calls `release()` → woken body starts", &a, |s| &s.total),
            row(
                "A",
                "aside",
                "holder calls `release()` → its `release()` returns (the release's round trip)",
                &a,
                |s| &s.call_reply,
            ),
            row(
                "A",
                "aside",
                "the releaser's `release()` returns → woken body starts (negative: the body started first)",
                &a,
                |s| &s.reply_body,
            ),
            row(
                "B",
                "1a",
                "holder calls `release()` → the release script's `PUBLISH` has run (server clock): the client's \
                 send path, the server reading the command, the script up to its publish",
                &b,
                |s| &s.call_publish,
            ),
            row(
                "B",
                "1b",
                "`PUBLISH` has run → the grant is read by a subscriber: the rest of the script, the server \
                 writing the message, loopback, a reader thread waking",
                &b,
                |s| &s.publish_heard,
            ),
            row("B", "2", "as in run A", &b, |s| &s.heard_body),
            row("B", "1a + 1b + 2", "holder calls `release()` → woken body starts", &b, |s| &s.total),
            vec![
                "clean".into(),
                "".into(),
                "holder calls `release()` → woken body starts (the table above)".into(),
                fmt_opt(clean_p50),
                "".into(),
            ],
        ],
    );
    report.para(
        "Not measurable from outside: how segment 2 splits between the waiter's client reading the grant off its \
         subscription socket, routing it to the waiting request, and the task being woken and polled (that needs \
         a timestamp inside the runtime where its subscription yields the message, e.g. a TRACE event in the \
         wake-up path carrying the arrival time); and how segment 1a splits between the client's send path and \
         the server (that needs the time the release reached the server: `MONITOR` stamps a command once it has \
         run, and `CLIENT LIST` reports idle time in whole seconds).",
    );
}
