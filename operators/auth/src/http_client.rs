//! The HTTPS client that fetches the issuer's documents: rustls with ring, the system's
//! roots plus any extra CA, HTTP/1.1, no redirects followed, one deadline over the whole
//! exchange (connect, TLS, response, body) and a bound on the body size.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};
use serde::de::DeserializeOwned;

use crate::oidc::FetchError;

/// The largest document we read.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

pub(crate) struct HttpsClient {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
}

impl HttpsClient {
    pub(crate) fn new(roots: RootCertStore, timeout: Duration) -> Result<Self, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        // `http` URLs are allowed for loopback issuers; the caller checks every URL.
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self { client, timeout })
    }

    /// GETs `url` and parses its JSON body, within the timeout.
    pub(crate) async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, FetchError> {
        let body = self.get_bytes(url).await?;
        serde_json::from_slice(&body).map_err(FetchError::Json)
    }

    /// GETs `url` and returns its body, within the timeout.
    pub(crate) async fn get_bytes(&self, url: &str) -> Result<Bytes, FetchError> {
        tokio::time::timeout(self.timeout, self.get(url))
            .await
            .map_err(|_| FetchError::Timeout)?
    }

    async fn get(&self, url: &str) -> Result<Bytes, FetchError> {
        let request = Request::get(url)
            .header(header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|_| FetchError::Url)?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| FetchError::Connect(Box::new(e)))?;
        if response.status() != StatusCode::OK {
            return Err(FetchError::Status(response.status().as_u16()));
        }
        let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::TooLarge
                } else {
                    FetchError::Body(e)
                }
            })?;
        Ok(body.to_bytes())
    }
}
