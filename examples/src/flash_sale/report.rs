//! The verdict: what the store really holds after a run, next to what the
//! buyers were told.

use std::fmt::Write;
use std::time::Duration;

use super::loadgen::LoadResult;
use super::lock_figures::LockFigures;
use super::store::Audit;

/// The result of one run.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    /// `unsafe` or `locked`.
    pub label: String,
    /// Whether the instances took the lock.
    pub locked: bool,
    /// Units put on sale, all items.
    pub stock: i64,
    /// Order records written, all items.
    pub sold: u64,
    /// Sum of the stock counters at the end (what the shop *thinks* is left).
    pub stock_counter: i64,
    /// Orders beyond the stock, summed per item.
    pub oversold: u64,
    /// Users with more than one order for the same item.
    pub duplicates: u64,
    /// What the buyers saw.
    pub load: LoadResult,
    /// Lock figures the instances' `/metrics` showed (locked run).
    pub lock: Option<LockFigures>,
    /// The paused holder's sale (locked run, instances as processes).
    pub paused: Option<PausedHolder>,
}

/// One instance paused (SIGSTOP) past its lease just before its write,
/// while another instance took the lock and sold the one unit of an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PausedHolder {
    /// Units of the item on sale (1).
    pub stock: i64,
    /// Order records written for it.
    pub sold: u64,
    /// Writes the store refused for their older token.
    pub refused: u64,
}

impl PausedHolder {
    /// The stale write did not go through.
    pub fn correct(&self) -> bool {
        self.sold as i64 <= self.stock
    }
}

impl PhaseReport {
    /// Build from the per-item audits and the load result.
    pub fn new(label: &str, locked: bool, audits: &[Audit], load: LoadResult) -> PhaseReport {
        PhaseReport {
            label: label.to_owned(),
            locked,
            stock: audits.iter().map(|a| a.initial).sum(),
            sold: audits.iter().map(|a| a.sold).sum(),
            stock_counter: audits.iter().map(|a| a.stock_counter).sum(),
            oversold: audits.iter().map(Audit::oversold).sum(),
            duplicates: audits.iter().map(|a| a.duplicate_buyers).sum(),
            load,
            lock: None,
            paused: None,
        }
    }

    /// No overselling and no duplicate purchases.
    pub fn correct(&self) -> bool {
        self.oversold == 0 && self.duplicates == 0 && self.paused.is_none_or(|p| p.correct())
    }

    /// One word for the table.
    pub fn verdict(&self) -> &'static str {
        match (self.oversold > 0, self.duplicates > 0) {
            (false, false) => "OK",
            (true, false) => "OVERSOLD",
            (false, true) => "DUPLICATES",
            (true, true) => "OVERSOLD+DUP",
        }
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// The verdict table, one column per run.
pub fn render(reports: &[PhaseReport]) -> String {
    let mut rows: Vec<(&str, Vec<String>)> = vec![
        ("", reports.iter().map(|r| r.label.clone()).collect()),
        (
            "stock on sale",
            reports.iter().map(|r| r.stock.to_string()).collect(),
        ),
        (
            "items sold (order records)",
            reports.iter().map(|r| r.sold.to_string()).collect(),
        ),
        (
            "oversold",
            reports.iter().map(|r| r.oversold.to_string()).collect(),
        ),
        (
            "duplicate purchases",
            reports.iter().map(|r| r.duplicates.to_string()).collect(),
        ),
        (
            "stock counter at the end",
            reports
                .iter()
                .map(|r| r.stock_counter.to_string())
                .collect(),
        ),
        (
            "requests (incl. retries)",
            reports
                .iter()
                .map(|r| r.load.requests.to_string())
                .collect(),
        ),
        (
            "201 created",
            reports.iter().map(|r| r.load.created.to_string()).collect(),
        ),
        (
            "409 sold out",
            reports
                .iter()
                .map(|r| r.load.sold_out.to_string())
                .collect(),
        ),
        (
            "409 already bought",
            reports
                .iter()
                .map(|r| r.load.already_bought.to_string())
                .collect(),
        ),
        (
            "503 lock busy",
            reports
                .iter()
                .map(|r| r.load.lock_busy.to_string())
                .collect(),
        ),
        (
            "other errors",
            reports.iter().map(|r| r.load.other.to_string()).collect(),
        ),
        (
            "paused holder: stale writes refused",
            reports
                .iter()
                .map(|r| match r.paused {
                    Some(p) => format!("{} (sold {} of {})", p.refused, p.sold, p.stock),
                    None => "-".to_owned(),
                })
                .collect(),
        ),
        (
            "latency p50",
            reports
                .iter()
                .map(|r| ms(r.load.percentile(0.50)))
                .collect(),
        ),
        (
            "latency p99",
            reports
                .iter()
                .map(|r| ms(r.load.percentile(0.99)))
                .collect(),
        ),
        (
            "wall time",
            reports
                .iter()
                .map(|r| format!("{:.1} s", r.load.elapsed.as_secs_f64()))
                .collect(),
        ),
        (
            "verdict",
            reports.iter().map(|r| r.verdict().to_owned()).collect(),
        ),
    ];
    let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let col_w = rows
        .iter()
        .flat_map(|(_, v)| v.iter().map(String::len))
        .max()
        .unwrap_or(0)
        .max(8);
    let rule = format!(
        "  +-{}-+{}",
        "-".repeat(label_w),
        format!("-{}-+", "-".repeat(col_w)).repeat(reports.len())
    );
    let mut out = String::new();
    let _ = writeln!(out, "{rule}");
    for (i, (label, values)) in rows.iter_mut().enumerate() {
        let _ = write!(out, "  | {label:<label_w$} |");
        for v in values.iter() {
            let _ = write!(out, " {v:>col_w$} |");
        }
        out.push('\n');
        if i == 0 || i == 5 || i == 11 {
            let _ = writeln!(out, "{rule}");
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(initial: i64, sold: u64, duplicate_buyers: u64) -> Audit {
        Audit {
            initial,
            stock_counter: 0,
            sold,
            duplicate_buyers,
            stale_refused: 0,
        }
    }

    #[test]
    fn oversold_is_counted_per_item() {
        // One item oversold by 3, the other undersold: not netted out.
        let r = PhaseReport::new(
            "unsafe",
            false,
            &[audit(10, 13, 0), audit(10, 5, 1)],
            LoadResult::default(),
        );
        assert_eq!((r.stock, r.sold, r.oversold, r.duplicates), (20, 18, 3, 1));
        assert_eq!(r.verdict(), "OVERSOLD+DUP");
        assert!(!r.correct());
        let ok = PhaseReport::new("locked", true, &[audit(10, 10, 0)], LoadResult::default());
        assert!(ok.correct());
        assert!(render(&[r, ok]).contains("OVERSOLD+DUP"));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let load = LoadResult {
            latencies: (1..=100).map(Duration::from_millis).collect(),
            ..LoadResult::default()
        };
        assert_eq!(load.percentile(0.50), Duration::from_millis(50));
        assert_eq!(load.percentile(0.99), Duration::from_millis(99));
        assert_eq!(load.percentile(1.0), Duration::from_millis(100));
        assert_eq!(LoadResult::default().percentile(0.5), Duration::ZERO);
    }
}
