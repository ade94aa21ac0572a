//! One shutdown signal for the whole process: SIGTERM or SIGINT (or a fatal condition such
//! as a lost leader lease) triggers it, and every controller, the admin server and the lease
//! manager wait on it.

use std::sync::Arc;

use tokio::sync::watch;

/// Why the process is stopping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// SIGTERM or SIGINT.
    Signal,
    /// Something the process cannot continue without failed (e.g. leadership was lost);
    /// the process should exit non-zero.
    Fatal(String),
}

/// A cloneable handle on the shutdown signal.
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: Arc<watch::Sender<Option<Reason>>>,
    rx: watch::Receiver<Option<Reason>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal that nothing has triggered yet.
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(None);
        Self {
            tx: Arc::new(tx),
            rx,
        }
    }

    /// A signal triggered by SIGTERM or SIGINT. Must be called inside a Tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let shutdown = Self::new();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("received a termination signal; shutting down");
            trigger.trigger(Reason::Signal);
        });
        Ok(shutdown)
    }

    /// Triggers the signal; the first reason wins.
    pub fn trigger(&self, reason: Reason) {
        self.tx.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(reason);
            true
        });
    }

    /// The reason, once triggered.
    pub fn reason(&self) -> Option<Reason> {
        self.rx.borrow().clone()
    }

    /// Resolves once the signal is triggered.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An error means every sender is gone, which cannot happen while `self` holds one.
        let _ = rx.wait_for(Option::is_some).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_and_the_first_reason_wins() {
        let shutdown = Shutdown::new();
        let waiter = {
            let s = shutdown.clone();
            tokio::spawn(async move { s.wait().await })
        };
        assert!(shutdown.reason().is_none());
        shutdown.trigger(Reason::Fatal("lease lost".into()));
        shutdown.trigger(Reason::Signal);
        waiter.await.unwrap();
        assert_eq!(shutdown.reason(), Some(Reason::Fatal("lease lost".into())));
        // Waiting after the fact returns at once.
        shutdown.wait().await;
    }
}
