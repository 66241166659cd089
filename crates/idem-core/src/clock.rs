//! Time, injected.
//!
//! Every decision a store makes (is this lease over? has this record expired?) depends on the
//! time, so stores read it from a [`Clock`] rather than the system: the conformance suite moves
//! a [`ManualClock`] forward instead of sleeping through a 24-hour retention.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Milliseconds are precise enough for leases and
/// retention, and every backend (SQLite, PostgreSQL, Redis) stores an i64 natively.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The end of time: the `expires_at` of records that never expire (not yet completed).
    pub const NEVER: Timestamp = Timestamp(i64::MAX);

    /// From milliseconds since the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant moved forward by `d`, saturating rather than wrapping.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// The time from `earlier` to `self`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.0)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC with milliseconds, e.g. `2026-11-29T21:46:28.123Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to a proleptic Gregorian date.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_millis);
        Timestamp(ms)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(ManualClock(AtomicI64::new(start.0)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp(1_796_161_588_123).to_string(),
            "2026-12-01T21:46:28.123Z"
        );
        assert_eq!(
            Timestamp(951_782_400_000).to_string(),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(Timestamp(-1).to_string(), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(1000));
        assert_eq!(c.now(), Timestamp(1000));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Timestamp(3000));
    }
}
