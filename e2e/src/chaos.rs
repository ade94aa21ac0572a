//! Random kill points for the crash tests: a small deterministic generator whose seed is
//! printed, so a failing sequence can be replayed with `KONTINUUM_CHAOS_SEED=<seed>`.

use std::time::Duration;

/// The variable that replays a sequence: its value is the seed a failing run printed.
pub const SEED_VAR: &str = "KONTINUUM_CHAOS_SEED";

/// A xorshift generator: not for cryptography, only to choose kill points and victims.
pub struct Rng {
    state: u64,
    seed: u64,
}

impl Rng {
    /// Seeded from `KONTINUUM_CHAOS_SEED` when it is set, else from the clock and the
    /// process id. A test prints [`Rng::replay`] so that a failure can be replayed.
    pub fn from_env() -> Self {
        let seed = std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                (u64::from(nanos) << 16) ^ u64::from(std::process::id())
            });
        Self::new(seed)
    }

    /// Seeded with `seed` (0, which xorshift cannot leave, is replaced by 1).
    pub fn new(seed: u64) -> Self {
        let seed = seed.max(1);
        Self { state: seed, seed }
    }

    /// `seed <seed> (replay with KONTINUUM_CHAOS_SEED=<seed>)`.
    pub fn replay(&self) -> String {
        format!("seed {0} (replay with {SEED_VAR}={0})", self.seed)
    }

    /// The next value in `0..n` (`n` of 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state.checked_rem(n).unwrap_or(0)
    }

    /// An index into a list of `len` items (0 for an empty list).
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// A duration in `min..max` (`min` when the range is empty), to the millisecond.
    pub fn between(&mut self, min: Duration, max: Duration) -> Duration {
        let span = u64::try_from(max.saturating_sub(min).as_millis()).unwrap_or(u64::MAX);
        min + Duration::from_millis(self.below(span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_within_bounds() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..64)
                .map(|_| {
                    rng.between(Duration::from_millis(200), Duration::from_millis(2700))
                        .as_millis()
                })
                .collect::<Vec<_>>()
        };
        let first = draw(42);
        assert_eq!(first, draw(42), "a seed replays its sequence");
        assert_ne!(first, draw(43), "another seed, another sequence");
        assert!(first.iter().all(|ms| (200..2700).contains(ms)), "{first:?}");
        let mut rng = Rng::new(0);
        let picks: std::collections::BTreeSet<usize> = (0..200).map(|_| rng.index(7)).collect();
        assert_eq!(
            picks,
            (0..7).collect(),
            "every victim is chosen, seed 0 included"
        );
        assert_eq!(rng.index(0), 0);
        assert_eq!(
            Rng::new(7).replay(),
            "seed 7 (replay with KONTINUUM_CHAOS_SEED=7)"
        );
    }
}
