//! The proxy's client of the Kontinuum store: one lazily connected channel per `--store`
//! endpoint (`http://` or `https://`, with optional client certificates). Calls go to the
//! current endpoint; a call that finds it unavailable moves the next call to the next one.
//! Calls are never retried here: a write the store may have applied must not run twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Uri;
use kontinuum_proto::etcd::etcdserverpb::kv_client::KvClient;
use kontinuum_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use kontinuum_proto::etcd::etcdserverpb::watch_client::WatchClient;
use rustls::ClientConfig;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::warn;

use crate::tls::{Connector, channel};

/// Responses from the store may be large (a Range over many keys).
pub const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;

/// The store's endpoints.
pub struct Store {
    endpoints: Vec<(String, Channel)>,
    current: AtomicUsize,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|(u, _)| u).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Channels to `endpoints` (not connected until first used). `tls` serves `https://`.
    pub fn new(endpoints: &[Uri], tls: Option<Arc<ClientConfig>>) -> Self {
        let connector = Connector::new(tls);
        Self {
            endpoints: endpoints
                .iter()
                .map(|uri| (uri.to_string(), channel(uri.clone(), connector.clone())))
                .collect(),
            current: AtomicUsize::new(0),
        }
    }

    fn channel(&self) -> Channel {
        let n = self.endpoints.len().max(1);
        let i = self.current.load(Ordering::Relaxed) % n;
        // `new` is only called with at least one endpoint (clap requires one); an empty
        // store would be a programming error, answered by a channel that never connects.
        self.endpoints.get(i).map_or_else(
            || Channel::from_static("http://0.0.0.0:1").connect_lazy(),
            |(_, c)| c.clone(),
        )
    }

    /// A KV client on the current endpoint.
    pub fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// A Watch client on the current endpoint.
    pub fn watch(&self) -> WatchClient<Channel> {
        WatchClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// A Lease client on the current endpoint.
    pub fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Notes a failed call: when the endpoint was unavailable, the next call goes to the next.
    pub fn observe(&self, status: &Status) {
        if status.code() == Code::Unavailable && self.endpoints.len() > 1 {
            let before = self.current.fetch_add(1, Ordering::Relaxed);
            let next = (before + 1) % self.endpoints.len();
            if let Some((uri, _)) = self.endpoints.get(next) {
                warn!(store = %uri, "store endpoint unavailable; switching");
            }
        }
    }
}
