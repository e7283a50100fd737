//! A node's load, read from the Prometheus text its daemon serves at `/metrics`
//! (crates/glovebox-daemon/src/metrics.rs): the `glovebox_sandboxes` gauge by state. Only
//! the samples placement needs are read; anything else in the exposition is skipped.

use thiserror::Error;

/// What placement knows of a node from one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeLoad {
    /// Sandboxes handed out and alive (`glovebox_sandboxes{state="running"}`).
    pub running: u64,
    /// Booted sandboxes waiting in the node's warm pools (`state="warm"`).
    pub warm: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LoadError {
    #[error("no glovebox_sandboxes{{state=\"running\"}} sample: not a Glovebox daemon's /metrics")]
    NotGlovebox,
    #[error("bad sample value on line {line}: {text}")]
    BadValue { line: usize, text: String },
}

/// Reads the load from a `/metrics` exposition.
pub fn parse(text: &str) -> Result<NodeLoad, LoadError> {
    let mut running = None;
    let mut warm = 0;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let state = match series.trim() {
            r#"glovebox_sandboxes{state="running"}"# => &mut running,
            r#"glovebox_sandboxes{state="warm"}"# => {
                warm = count(value, i)?;
                continue;
            }
            _ => continue,
        };
        *state = Some(count(value, i)?);
    }
    Ok(NodeLoad { running: running.ok_or(LoadError::NotGlovebox)?, warm })
}

/// A gauge's value as a count (the exposition writes integers; a float is accepted).
fn count(value: &str, line: usize) -> Result<u64, LoadError> {
    let bad = || LoadError::BadValue { line: line + 1, text: value.to_string() };
    let v: f64 = value.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of a real exposition, as `glovebox serve` wrote it.
    const RECORDED: &str = "# HELP glovebox_sandboxes Sandboxes by state.\n\
        # TYPE glovebox_sandboxes gauge\n\
        glovebox_sandboxes{state=\"running\"} 17\n\
        glovebox_sandboxes{state=\"warm\"} 2\n\
        # HELP glovebox_sandboxes_created_total Sandboxes created.\n\
        # TYPE glovebox_sandboxes_created_total counter\n\
        glovebox_sandboxes_created_total 120\n\
        glovebox_create_seconds_bucket{le=\"0.005\"} 99\n\
        glovebox_up 1\n";

    #[test]
    fn reads_running_and_warm() {
        assert_eq!(parse(RECORDED), Ok(NodeLoad { running: 17, warm: 2 }));
    }

    #[test]
    fn refuses_what_is_not_a_glovebox_exposition() {
        assert_eq!(parse("up 1\n"), Err(LoadError::NotGlovebox));
        assert_eq!(parse(""), Err(LoadError::NotGlovebox));
        let bad = RECORDED.replace("} 17", "} seventeen");
        assert_eq!(parse(&bad), Err(LoadError::BadValue { line: 3, text: "seventeen".into() }));
        assert!(parse(&RECORDED.replace("} 17", "} -1")).is_err());
    }

    #[test]
    fn warm_is_optional() {
        let old = "glovebox_sandboxes{state=\"running\"} 3\n";
        assert_eq!(parse(old), Ok(NodeLoad { running: 3, warm: 0 }));
    }
}
