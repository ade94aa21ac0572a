//! A proxy in front of the test bed's API server that can hold back watch events: a test
//! gives an operator a kubeconfig pointing here, freezes the watches of one resource, and
//! so makes the operator act on a cache it knows is stale — the race of two writers,
//! deterministically. Requests and every other stream pass straight through, with the
//! identity of the client the proxy was started with (so the audit log names it).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use kube::Client;
use tokio::sync::watch;

/// A running proxy. Dropping it stops it.
pub struct ApiProxy {
    address: SocketAddr,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Shared {
    client: Client,
    /// Watches whose path ends with this are the ones a freeze holds.
    held: String,
    frozen: watch::Receiver<bool>,
}

impl ApiProxy {
    /// Listens on a free loopback port and forwards to the API server through `client`.
    /// While frozen, watch streams of paths ending with `held` (e.g. `/instances`) deliver
    /// nothing; what arrived meanwhile follows in order once thawed.
    pub async fn start(client: Client, held: &str) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let (frozen, receiver) = watch::channel(false);
        let shared = Shared {
            client,
            held: held.to_owned(),
            frozen: receiver,
        };
        let app = axum::Router::new().fallback(forward).with_state(shared);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            frozen,
            task,
        })
    }

    /// `http://<address>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Holds the watch events of the held resource back (true) or lets them flow (false).
    pub fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Writes a kubeconfig for this proxy (no credentials: the proxy adds its own) into
    /// `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let path = dir.join(format!("{name}.proxy.kubeconfig"));
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: {}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\nusers:\n- name: proxy\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(&path, yaml)?;
        Ok(path)
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(shared): State<Shared>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let held = parts.uri.path().ends_with(&shared.held)
        && parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let Ok(bytes) = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
    else {
        return (http::StatusCode::BAD_REQUEST, "unreadable request body").into_response();
    };
    parts.headers.remove(http::header::HOST);
    parts.headers.remove(http::header::AUTHORIZATION);
    let upstream = http::Request::from_parts(parts, kube::client::Body::from(bytes));
    let response = match shared.client.send(upstream).await {
        Ok(response) => response,
        Err(error) => {
            return (http::StatusCode::BAD_GATEWAY, format!("proxy: {error}")).into_response();
        }
    };
    let (parts, body) = response.into_parts();
    let frozen = shared.frozen;
    let stream = body.into_data_stream().then(move |chunk| {
        let mut frozen = frozen.clone();
        async move {
            if held {
                // A closed sender means the proxy is going away: let the chunk through.
                let _ = frozen.wait_for(|f| !*f).await;
            }
            chunk
        }
    });
    Response::from_parts(parts, AxumBody::from_stream(stream))
}
