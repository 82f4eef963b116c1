//! Running the checker on a world, and reading its answer.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::keyspace::Data;
use crate::plan::World;
use crate::state::{owner_id, Action, Phase, State, EPOCH_MS};

/// What one exhaustive run found.
pub struct Report {
    pub name: String,
    pub states: usize,
    pub unique: usize,
    pub depth: usize,
    pub took: Duration,
    /// Property name → the counterexample (or example), as text.
    pub found: BTreeMap<&'static str, String>,
    /// Whether the whole bounded space was explored.
    pub complete: bool,
}

impl Report {
    pub fn has(&self, property: &str) -> bool {
        self.found.contains_key(property)
    }

    /// The properties violated (examples of `sometimes` ones left out).
    pub fn violations(&self) -> Vec<&'static str> {
        self.found
            .keys()
            .copied()
            .filter(|p| !crate::properties::is_example(p))
            .collect()
    }

    /// Panics unless the whole space was explored and no property was
    /// violated; prints each counterexample first.
    pub fn assert_clean(&self) {
        assert!(
            self.complete,
            "{}: the space was not explored to the end",
            self.name
        );
        let failures = self.violations();
        for p in &failures {
            println!("== {}: {p}\n{}", self.name, self.found[p]);
        }
        assert!(failures.is_empty(), "{}: {failures:?}", self.name);
    }

    /// Panics unless the checker found an example of the `sometimes`
    /// property `property` (the world reaches what it is meant to).
    pub fn assert_reached(&self, property: &str) {
        assert!(
            self.has(property),
            "{}: never reached: {property}",
            self.name
        );
    }

    /// The counterexample of `property`, or a panic that says what ran.
    pub fn trace(&self, property: &str) -> &str {
        self.found
            .get(property)
            .unwrap_or_else(|| panic!("{}: no counterexample of `{property}`", self.name))
    }
}

/// Explore `world` breadth-first (shortest counterexamples first), stopping
/// once `stop_at` (if given) has a counterexample. Prints the figures.
pub fn run(name: &str, world: World, stop_at: Option<&'static str>) -> Report {
    let started = Instant::now();
    // A search that stops at its first counterexample runs on one thread:
    // breadth-first, that is the shortest, the same every run (a test
    // reads it).
    let threads = match stop_at {
        Some(_) => 1,
        None => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(2),
    };
    let mut builder = world.clone().checker().threads(threads);
    if stop_at.is_some() {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let mut found = BTreeMap::new();
    for (prop, path) in checker.discoveries() {
        found.insert(prop, render(&world, path.into_vec()));
    }
    let report = Report {
        name: name.to_string(),
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        took: started.elapsed(),
        complete: checker.is_done(),
        found,
    };
    let failures: Vec<&&str> = report
        .found
        .keys()
        .filter(|p| !crate::properties::is_example(p))
        .collect();
    println!(
        "{name}: {} states ({} unique), depth {}, {:.1?}; violated: {failures:?}",
        report.states, report.unique, report.depth, report.took
    );
    report
}

/// A counterexample as text: each step, then what it changed.
pub fn render(w: &World, path: Vec<(State, Option<Action>)>) -> String {
    let mut out = String::new();
    let mut prev: Option<String> = None;
    for (i, (state, action)) in path.iter().enumerate() {
        let now = describe(state);
        if let Some(a) = action {
            let _ = writeln!(out, "{i:>3}. t={:<5} {}", state.now, show_action(state, a));
        }
        if prev.as_deref() != Some(now.as_str()) && action.is_none() {
            let _ = writeln!(out, "     {now}");
        }
        prev = Some(now);
    }
    if let Some((last, _)) = path.last() {
        let _ = writeln!(out, "   end: {}", describe(last));
        if let Some(v) = &last.ghost.violation {
            let _ = writeln!(out, "   => {v}");
        }
        if let Some(v) = crate::properties::permits_bounded(last) {
            let _ = writeln!(out, "   => {v}");
        }
        if crate::properties::quiescent(last) {
            if let Some(why) = crate::properties::left_behind(w, last) {
                let _ = writeln!(out, "   => once quiet: {why}");
            }
        }
    }
    out
}

fn show_action(s: &State, a: &Action) -> String {
    match a {
        Action::Serve {
            client,
            conn,
            fault,
        } => {
            let cmd = s.clients[*client as usize].out[*conn as usize]
                .first()
                .map(|x| format!("{:?}", x.cmd))
                .unwrap_or_default();
            format!("server runs c{client}'s {cmd} (conn {conn}) {fault:?}")
        }
        Action::Fire { client, timer } => format!("c{client} timer {timer:?}"),
        Action::Deliver { client, conn } => {
            let b = s.clients[*client as usize].inbox[*conn as usize].first();
            format!(
                "c{client} reads {:?} (conn {conn})",
                b.map(|b| (&b.reply, b.op))
            )
        }
        Action::DeliverPush { client } => {
            format!(
                "c{client} hears {:?}",
                s.clients[*client as usize].sub_in.first()
            )
        }
        other => format!("{other:?}"),
    }
}

/// One line: the keyspace's lock keys and who thinks it holds what.
pub fn describe(s: &State) -> String {
    let mut out = String::new();
    for (k, e) in &s.ks.keys {
        let v = match &e.data {
            Data::Str(v) => v.clone(),
            Data::Hash(h) => format!("{h:?}"),
            Data::List(l) => format!("{l:?}"),
            Data::ZSet(z) => format!("{:?}", z.keys().collect::<Vec<_>>()),
        };
        let ttl = e
            .expires
            .map_or(String::new(), |t| format!(" until {}", t - EPOCH_MS));
        let _ = write!(out, "{k}={v}{ttl}; ");
    }
    let holders: Vec<String> = s
        .ghost
        .holders
        .iter()
        .map(|(k, c, o, f)| format!("{}@k{k}#{}", owner_id(*c, *o), f % 1_000_000_000))
        .collect();
    let _ = write!(out, "holders {holders:?}");
    for (c, cl) in s.clients.iter().enumerate() {
        let phases: Vec<String> = cl
            .reqs
            .iter()
            .map(|q| match &q.phase {
                Phase::Done(o) => format!("{}:{o:?}", owner_id(c as u8, q.owner)),
                p => format!("{}:{p:?}", owner_id(c as u8, q.owner)),
            })
            .collect();
        let _ = write!(out, "; c{c} {phases:?}");
    }
    out
}
