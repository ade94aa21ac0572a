//! Leader election on a coordination Lease (kube-lease-manager), so that two replicas of an
//! operator never act at once. On by default (`--leader-elect=false` turns it off): the
//! controllers start only once this replica holds the Lease, `/readyz` follows the Lease,
//! and losing the Lease (or the lease task dying) stops the process: a former leader must
//! not keep acting on a stale view (the linkerd rule). The Lease lives in the pod's own
//! namespace ([`LeaderArgs::namespace`]), never in a fixed one.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

use crate::admin::Readiness;
use crate::args::{LeaderArgs, NoLeaseNamespace, SERVICE_ACCOUNT_NAMESPACE_FILE};
use crate::shutdown::{Reason, Shutdown};

/// Leader election could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// No namespace for the Lease.
    #[error(transparent)]
    Namespace(#[from] NoLeaseNamespace),
    /// The lease manager could not be built.
    #[error("starting the lease manager")]
    Lease(#[source] LeaseManagerError),
}

/// Whether this replica may act.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// Without election nothing sends; holding the sender keeps the channel open.
    _always: Option<std::sync::Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// Leadership without election: always the leader.
    pub fn always(readiness: &Readiness) -> Self {
        readiness.set_leader(true);
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            _always: Some(std::sync::Arc::new(tx)),
        }
    }

    /// Starts leader election as configured, or [`Leadership::always`] when disabled.
    /// `default_name` names the Lease when `--lease-name` is unset; `watched` is the one
    /// namespace the operator watches, if any (the Lease's namespace of last resort).
    pub async fn start(
        client: Client,
        args: &LeaderArgs,
        default_name: &str,
        identity: String,
        readiness: Readiness,
        shutdown: Shutdown,
        watched: Option<&str>,
    ) -> Result<Self, LeaderError> {
        if !args.leader_elect {
            return Ok(Self::always(&readiness));
        }
        let namespace = args.namespace(SERVICE_ACCOUNT_NAMESPACE_FILE.as_ref(), watched)?;
        let duration = args.lease_duration_seconds;
        let manager =
            LeaseManagerBuilder::new(client, args.lease_name.as_deref().unwrap_or(default_name))
                .with_namespace(&namespace)
                .with_identity(identity.clone())
                .with_duration(duration)
                .with_grace((duration / 3).max(1))
                .with_field_manager(format!("{default_name}.kontinuum.sh/lease"))
                .build()
                .await
                .map_err(LeaderError::Lease)?;
        tracing::info!(namespace = %namespace, identity = %identity, "electing a leader");
        let (mut lease_rx, mut task) = manager.watch().await;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let mut was_leader = false;
            loop {
                tokio::select! {
                    changed = lease_rx.changed() => {
                        if changed.is_err() {
                            shutdown.trigger(Reason::Fatal("the lease manager stopped".into()));
                            break;
                        }
                        let leader = *lease_rx.borrow_and_update();
                        readiness.set_leader(leader);
                        let _ = tx.send(leader);
                        if leader {
                            tracing::info!(identity = %identity, "acquired the leader lease");
                        } else if was_leader {
                            tracing::error!(identity = %identity, "lost the leader lease; stopping");
                            shutdown.trigger(Reason::Fatal("lost the leader lease".into()));
                            break;
                        }
                        was_leader |= leader;
                    }
                    result = &mut task => {
                        let why = match result {
                            Ok(Ok(_)) => "the lease task ended".to_string(),
                            Ok(Err(e)) => format!("the lease task failed: {e}"),
                            Err(e) => format!("the lease task panicked: {e}"),
                        };
                        tracing::error!(reason = %why, "leader election stopped; stopping");
                        shutdown.trigger(Reason::Fatal(why));
                        return;
                    }
                    () = shutdown.wait() => break,
                }
            }
            // Closing the receiver makes the lease task release the Lease, so a successor
            // need not wait for it to expire.
            readiness.set_leader(false);
            drop(lease_rx);
            let _ = task.await;
        });
        Ok(Self { rx, _always: None })
    }

    /// Whether this replica holds the Lease now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once this replica holds the Lease (at once without election).
    pub async fn acquired(&mut self) {
        let _ = self.rx.wait_for(|leader| *leader).await;
    }
}
