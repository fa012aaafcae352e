//! Pingora's smallest HTTP proxy: a `ProxyHttp` whose only hook is `upstream_peer`, returning
//! one plain-HTTP peer. Every request is forwarded as is over Pingora's own upstream
//! connection pool, with Pingora's defaults for everything else (no logging, no filters).
//!
//! It is the baseline of the per-request cost benches (`benches/callgrind_targets.sh`,
//! `benches/load.rs`): what Pingora itself spends per request, so that Sluice's cost splits
//! into Pingora's share (this binary) and Sluice's (the rest). Built from the same vendored
//! Pingora as Sluice (`vendor/`, applied by the workspace's `[patch.crates-io]`).
//!
//! ```text
//! pingora-smallest LISTEN UPSTREAM [THREADS] [work_stealing]
//! pingora-smallest 127.0.0.1:8080 127.0.0.1:9000 2 true
//! ```
//!
//! `LISTEN` and `UPSTREAM` are `host:port`; `THREADS` (default 1) is Pingora's worker thread
//! count, `work_stealing` (`true`/`false`, default `true`) its runtime flavour, as Sluice's
//! `server.threads` and `server.work_stealing`. Prints `listening on LISTEN` once the service
//! is added; runs until SIGTERM/SIGINT.

use async_trait::async_trait;
use pingora::prelude::{http_proxy_service, HttpPeer, ProxyHttp, Result, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;

/// The proxy: every request goes to `peer`.
struct Smallest {
    /// The upstream's `host:port`.
    peer: String,
}

#[async_trait]
impl ProxyHttp for Smallest {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.peer.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(upstream)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: pingora-smallest LISTEN UPSTREAM [THREADS] [work_stealing]");
        std::process::exit(2);
    };
    let threads = args.get(3).map_or(Ok(1), |t| t.parse::<usize>());
    let work_stealing = args.get(4).map_or(Ok(true), |w| w.parse::<bool>());
    let (Ok(threads), Ok(work_stealing)) = (threads, work_stealing) else {
        eprintln!("THREADS is a number, work_stealing true or false");
        std::process::exit(2);
    };
    let conf = ServerConf {
        threads,
        work_stealing,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = http_proxy_service(
        &server.configuration,
        Smallest {
            peer: upstream.clone(),
        },
    );
    service.add_tcp(listen);
    server.add_service(service);
    println!("listening on {listen}");
    server.run_forever();
}
