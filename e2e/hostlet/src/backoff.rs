//! The crash-loop back-off of a kubelet: the first restart waits the initial back-off
//! (10 s), each further one twice as long, up to 5 minutes; a container that ran for 10
//! minutes before exiting starts over from the initial back-off.

use std::time::Duration;

/// The default initial back-off.
pub const INITIAL: Duration = Duration::from_secs(10);
/// The longest back-off.
pub const MAX: Duration = Duration::from_secs(300);
/// A run this long resets the back-off.
pub const RESET_AFTER: Duration = Duration::from_secs(600);

/// One container's back-off.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A back-off starting at `initial` (capped at [`MAX`], or at `initial` if larger).
    pub fn new(initial: Duration) -> Self {
        Self {
            initial,
            max: MAX.max(initial),
            next: initial,
        }
    }

    /// How long to wait before restarting a container that just exited after running for
    /// `ran`; advances the back-off.
    pub fn after_exit(&mut self, ran: Duration) -> Duration {
        if ran >= RESET_AFTER {
            self.next = self.initial;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_ten_seconds_to_five_minutes_and_resets_after_ten_minutes() {
        let mut b = Backoff::new(INITIAL);
        let short = Duration::from_secs(1);
        let delays: Vec<u64> = (0..8).map(|_| b.after_exit(short).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.after_exit(RESET_AFTER).as_secs(), 10);
        assert_eq!(b.after_exit(short).as_secs(), 20);
    }

    #[test]
    fn the_initial_back_off_is_configurable() {
        let mut b = Backoff::new(Duration::from_secs(1));
        assert_eq!(b.after_exit(Duration::ZERO).as_secs(), 1);
        assert_eq!(b.after_exit(Duration::ZERO).as_secs(), 2);
        let mut zero = Backoff::new(Duration::ZERO);
        assert_eq!(zero.after_exit(Duration::ZERO), Duration::ZERO);
    }
}
