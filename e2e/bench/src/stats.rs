//! Latency samples and their summary.

use std::time::Duration;

/// A summary of latency samples (nearest-rank percentiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub count: usize,
    pub min: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

/// Summarises `samples` (any order); all zero when empty.
pub fn summarize(samples: &[Duration]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let total: Duration = sorted.iter().sum();
    let count = u32::try_from(sorted.len()).unwrap_or(u32::MAX);
    Summary {
        count: sorted.len(),
        min: sorted[0],
        p50: percentile(&sorted, 50),
        p90: percentile(&sorted, 90),
        p99: percentile(&sorted, 99),
        max: sorted[sorted.len() - 1],
        mean: total / count,
    }
}

/// Nearest-rank percentile of a sorted, non-empty slice.
fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    let rank = (pct * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// Events per second over `elapsed`.
pub fn rate(events: usize, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let events = events as f64;
    events / secs
}

/// A duration for a table: `350 ns`, `850 µs`, `12.3 ms`, `4.56 s` (zero is `0 µs`).
pub fn fmt_duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros == 0 && !d.is_zero() {
        format!("{} ns", d.as_nanos())
    } else if micros < 1_000 {
        format!("{micros} µs")
    } else if micros < 1_000_000 {
        format!("{:.1} ms", d.as_secs_f64() * 1_000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// KiB for a table: `812 KiB`, `45.2 MiB`, `1.25 GiB`.
pub fn fmt_kib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let k = kib as f64;
    if kib < 1024 {
        format!("{kib} KiB")
    } else if kib < 1024 * 1024 {
        format!("{:.1} MiB", k / 1024.0)
    } else {
        format!("{:.2} GiB", k / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let s = summarize(&samples);
        assert_eq!(s.count, 100);
        assert_eq!(s.min, ms(1));
        assert_eq!(s.p50, ms(50));
        assert_eq!(s.p90, ms(90));
        assert_eq!(s.p99, ms(99));
        assert_eq!(s.max, ms(100));
        assert_eq!(s.mean, Duration::from_micros(50_500));
    }

    #[test]
    fn one_and_none() {
        let s = summarize(&[ms(7)]);
        assert_eq!((s.p50, s.p99, s.max), (ms(7), ms(7), ms(7)));
        assert_eq!(summarize(&[]), Summary::default());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_duration(Duration::ZERO), "0 µs");
        assert_eq!(fmt_duration(Duration::from_nanos(350)), "350 ns");
        assert_eq!(fmt_duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(fmt_duration(Duration::from_micros(12_340)), "12.3 ms");
        assert_eq!(fmt_duration(Duration::from_millis(4_560)), "4.56 s");
        assert_eq!(fmt_kib(812), "812 KiB");
        assert_eq!(fmt_kib(46_285), "45.2 MiB");
        assert_eq!(fmt_kib(1_310_720), "1.25 GiB");
        assert!((rate(1000, Duration::from_secs(4)) - 250.0).abs() < f64::EPSILON);
        assert!(rate(5, Duration::ZERO).abs() < f64::EPSILON);
    }
}
