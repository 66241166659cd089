//! The page's live counts, read from the same Prometheus exposition `/metrics` serves, so the
//! page and a dashboard never disagree.
//!
//! "Duplicates averted" counts the keyed requests that reached a record already there and
//! were not executed again: `replayed` (a stored result answered), `conflict` (another
//! execution of the key was in flight) and `mismatch` (the key was used for another request)
//! ([design §11](docs/design.md#11-properties-and-where-they-are-checked)).

use std::collections::BTreeMap;

/// The counts the page shows. Counters of this process since it started.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Counts {
    /// `idem_requests_total` by `outcome`.
    pub(crate) outcomes: BTreeMap<String, f64>,
    /// `idem_abandoned_records_total`.
    pub(crate) abandoned: f64,
    /// `idem_store_errors_total`, all operations.
    pub(crate) store_errors: f64,
    /// `idem_completions_lost_total`.
    pub(crate) completions_lost: f64,
}

impl Counts {
    /// Reads the counters out of a Prometheus text exposition.
    pub(crate) fn parse(exposition: &str) -> Counts {
        let mut c = Counts::default();
        for line in exposition.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            match name {
                "idem_requests_total" => {
                    if let Some(outcome) = label(labels, "outcome") {
                        *c.outcomes.entry(outcome.to_owned()).or_default() += value;
                    }
                }
                "idem_abandoned_records_total" => c.abandoned += value,
                "idem_store_errors_total" => c.store_errors += value,
                "idem_completions_lost_total" => c.completions_lost += value,
                _ => {}
            }
        }
        c
    }

    fn outcome(&self, name: &str) -> f64 {
        self.outcomes.get(name).copied().unwrap_or(0.0)
    }

    /// Requests that executed the effect.
    pub(crate) fn executions(&self) -> f64 {
        self.outcome("executed")
    }

    /// Stored results replayed.
    pub(crate) fn replays(&self) -> f64 {
        self.outcome("replayed")
    }

    /// Replayed + conflict + mismatch: repeats of a key that did not run the effect again.
    pub(crate) fn duplicates_averted(&self) -> f64 {
        self.outcome("replayed") + self.outcome("conflict") + self.outcome("mismatch")
    }
}

/// The value of `name` in `a="x",b="y"` (values of idem's labels hold no quotes).
fn label<'l>(labels: &'l str, name: &str) -> Option<&'l str> {
    labels
        .trim_end_matches('}')
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| v.trim().trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_from_the_exposition() {
        let text = "# TYPE idem_requests_total counter\n\
            idem_requests_total{outcome=\"executed\"} 7\n\
            idem_requests_total{outcome=\"replayed\"} 3\n\
            idem_requests_total{outcome=\"conflict\"} 2\n\
            idem_requests_total{outcome=\"mismatch\"} 1\n\
            idem_requests_total{outcome=\"outcome_unknown\"} 4\n\
            idem_store_errors_total{op=\"claim\"} 5\n\
            idem_store_errors_total{op=\"get\"} 1\n\
            idem_abandoned_records_total 4\n\
            idem_completions_lost_total 0\n";
        let c = Counts::parse(text);
        assert_eq!(c.executions(), 7.0);
        assert_eq!(c.replays(), 3.0);
        assert_eq!(
            c.duplicates_averted(),
            6.0,
            "outcome_unknown is not a duplicate averted"
        );
        assert_eq!(c.store_errors, 6.0);
        assert_eq!(c.abandoned, 4.0);
    }
}
