//! Daemon metrics in the Prometheus text format (`GET /metrics`). A handful of atomic
//! counters and fixed-bucket histograms; no registry library needed for this few.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use glovebox_proto::api::EndReason;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0];

pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Default::default(), count: AtomicU64::new(0), sum_us: AtomicU64::new(0) }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i].load(Ordering::Relaxed));
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

const REASONS: [EndReason; 6] = [
    EndReason::Timeout,
    EndReason::Killed,
    EndReason::Oom,
    EndReason::Error,
    EndReason::DaemonRestart,
    EndReason::Idle,
];

#[derive(Default)]
pub struct Metrics {
    pub created: AtomicU64,
    pub create_failed: AtomicU64,
    ended: [AtomicU64; 6],
    pub commands: AtomicU64,
    pub command_timeouts: AtomicU64,
    pub command_ooms: AtomicU64,
    pub cells: AtomicU64,
    pub cell_errors: AtomicU64,
    /// Creates refused by a tenant quota (429).
    pub quota_refusals: AtomicU64,
    /// HTTP responses by status class (index = status / 100).
    pub responses: [AtomicU64; 6],
    pub create_latency: Histogram,
    pub exec_latency: Histogram,
    pub code_latency: Histogram,
}

impl Metrics {
    pub fn ended(&self, r: EndReason) {
        if let Some(i) = REASONS.iter().position(|x| *x == r) {
            self.ended[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn response(&self, status: u16) {
        if let Some(c) = self.responses.get(usize::from(status / 100)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The whole exposition; `live` and `warm` are gauges the manager knows.
    pub fn render(&self, live: usize, warm: usize) -> String {
        let mut o = String::new();
        let g = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let c = |o: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        };
        let _ = writeln!(o, "# HELP glovebox_sandboxes Sandboxes by state.\n# TYPE glovebox_sandboxes gauge");
        let _ = writeln!(o, "glovebox_sandboxes{{state=\"running\"}} {live}");
        let _ = writeln!(o, "glovebox_sandboxes{{state=\"warm\"}} {warm}");
        c(&mut o, "glovebox_sandboxes_created_total", "Sandboxes created.", &self.created);
        c(&mut o, "glovebox_sandbox_create_failures_total", "Sandbox creations that failed.", &self.create_failed);
        let _ = writeln!(o, "# HELP glovebox_sandboxes_ended_total Sandboxes ended, by reason.\n# TYPE glovebox_sandboxes_ended_total counter");
        for (i, r) in REASONS.iter().enumerate() {
            let _ = writeln!(
                o,
                "glovebox_sandboxes_ended_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.ended[i].load(Ordering::Relaxed)
            );
        }
        c(&mut o, "glovebox_commands_total", "Commands run to completion through exec.", &self.commands);
        c(&mut o, "glovebox_command_timeouts_total", "Commands killed by their timeout.", &self.command_timeouts);
        c(
            &mut o,
            "glovebox_command_oom_total",
            "Commands during which the sandbox hit its memory limit.",
            &self.command_ooms,
        );
        c(&mut o, "glovebox_code_cells_total", "Code cells run.", &self.cells);
        c(&mut o, "glovebox_code_cell_errors_total", "Code cells that ended with an error.", &self.cell_errors);
        self.create_latency.render(&mut o, "glovebox_create_seconds", "Time to create a sandbox.");
        self.exec_latency.render(&mut o, "glovebox_exec_seconds", "Time from exec request to the command's result.");
        self.code_latency.render(&mut o, "glovebox_code_seconds", "Time from run_code request to the cell's end.");
        c(&mut o, "glovebox_quota_refusals_total", "Creates refused by a tenant quota.", &self.quota_refusals);
        let egress_denied = crate::egress::DENIED.load(Ordering::Relaxed);
        let _ = writeln!(
            o,
            "# HELP glovebox_egress_denied_total Egress attempts (DNS and TCP) the network policy denied.\n\
             # TYPE glovebox_egress_denied_total counter\nglovebox_egress_denied_total {egress_denied}"
        );
        let _ = writeln!(
            o,
            "# HELP glovebox_http_responses_total HTTP responses by status class.\n\
             # TYPE glovebox_http_responses_total counter"
        );
        for (i, n) in self.responses.iter().enumerate().skip(1) {
            let _ = writeln!(o, "glovebox_http_responses_total{{class=\"{i}xx\"}} {}", n.load(Ordering::Relaxed));
        }
        g(&mut o, "glovebox_up", "1 while the daemon serves.", 1);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_valid_exposition() {
        let m = Metrics::default();
        m.create_latency.observe(Duration::from_millis(3));
        m.ended(EndReason::Timeout);
        Metrics::inc(&m.created);
        let text = m.render(2, 1);
        assert!(text.contains("glovebox_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("glovebox_sandboxes_ended_total{reason=\"timeout\"} 1"));
        assert!(text.contains("glovebox_create_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("glovebox_create_seconds_bucket{le=\"0.002\"} 0"));
        assert!(text.contains("glovebox_create_seconds_count 1"));
        // Every sample line is `name{labels} value` or `name value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad sample: {line}");
        }
    }
}
