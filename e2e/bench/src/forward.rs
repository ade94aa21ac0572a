//! `kontinuum-bench forward`: a TCP forwarder that copies bytes and nothing else (no gRPC, no
//! TLS, no token), on one thread. Two of them in a row are the etcd-proxy benchmark's floor:
//! what any path through two more processes costs on this machine, however little each
//! process does.

use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};

/// Flags of `forward`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to accept connections on.
    #[arg(long)]
    listen: SocketAddr,
    /// Address every accepted connection is forwarded to.
    #[arg(long)]
    to: SocketAddr,
}

/// Forwards until killed.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let to = args.to;
        loop {
            let (mut inbound, _) = listener.accept().await.context("accepting")?;
            tokio::spawn(async move {
                let _ = inbound.set_nodelay(true);
                let Ok(mut outbound) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    })
}
