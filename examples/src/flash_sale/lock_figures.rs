//! The lock figures each instance shows at `/metrics` (Prometheus text,
//! written by the runtime's `metrics` feature), read back by the demo.

use std::collections::HashMap;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// This process's recorder, installed on first use; `None` if another
/// recorder was installed first.
pub fn recorder() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}

/// Lock figures summed over the instances read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockFigures {
    /// Instances whose `/metrics` answered.
    pub instances: usize,
    pub acquired: u64,
    pub busy: u64,
    pub lost: u64,
    /// Acquire wait quantiles (seconds) of the first instance that had them.
    pub wait_p50: Option<f64>,
    pub wait_p99: Option<f64>,
}

/// Read `/metrics` from every base URL (`http://host:port`).
pub async fn read(urls: &[String]) -> LockFigures {
    let http = reqwest::Client::new();
    let mut figures = LockFigures::default();
    for url in urls {
        let Ok(resp) = http.get(format!("{url}/metrics")).send().await else {
            continue;
        };
        let Ok(text) = resp.text().await else {
            continue;
        };
        figures.instances += 1;
        add(&mut figures, &text);
    }
    figures
}

/// Add one instance's Prometheus text to `figures`.
pub fn add(figures: &mut LockFigures, text: &str) {
    let mut quantiles: HashMap<&str, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        match name {
            "distributed_lock_acquired_total" => figures.acquired += v as u64,
            "distributed_lock_busy_total" => figures.busy += v as u64,
            "distributed_lock_lost_total" => figures.lost += v as u64,
            "distributed_lock_acquire_seconds" => {
                for q in ["0.5", "0.99"] {
                    if series.contains(&format!("quantile=\"{q}\"")) {
                        quantiles.insert(q, v);
                    }
                }
            }
            _ => {}
        }
    }
    if figures.wait_p50.is_none() {
        figures.wait_p50 = quantiles.get("0.5").copied();
        figures.wait_p99 = quantiles.get("0.99").copied();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_counters_and_quantiles() {
        let text = "# TYPE distributed_lock_acquired_total counter\n\
            distributed_lock_acquired_total{lock=\"stock:{req.item}\"} 200\n\
            distributed_lock_busy_total{lock=\"stock:{req.item}\"} 17\n\
            distributed_lock_acquire_seconds{lock=\"stock:{req.item}\",quantile=\"0.5\"} 0.002\n\
            distributed_lock_acquire_seconds{lock=\"stock:{req.item}\",quantile=\"0.99\"} 0.04\n";
        let mut f = LockFigures::default();
        add(&mut f, text);
        add(&mut f, text);
        assert_eq!((f.acquired, f.busy, f.lost), (400, 34, 0));
        assert_eq!((f.wait_p50, f.wait_p99), (Some(0.002), Some(0.04)));
    }
}
