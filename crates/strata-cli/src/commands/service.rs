//! `strata copy-forward-service`: a small HTTP service to run next to the
//! bucket of a cloud tier (DD Cloud Tier §7). It takes requests to
//! assemble a new object from byte ranges of existing ones and literal
//! bytes (`POST /assemble`, JSON: `{"dest": NAME, "pieces": [{"literal":
//! HEX} | {"range": {"source": NAME, "offset": N, "len": N}}]}`) and does
//! it with its own access to the bucket, so cleaning the cloud tier moves
//! no data over the client's network. It holds the bucket's credentials,
//! never the repository's key: it copies sealed bytes it cannot read.

use crate::location;
use anyhow::{Context, Result};
use std::io::Read;

/// Largest request accepted (a request carries names, offsets and a
/// container's metadata tail, never data).
const MAX_REQUEST: u64 = 64 << 20;

#[derive(clap::Args)]
pub struct ServiceArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8089")]
    pub listen: String,
}

pub fn run(repo: Option<&str>, listen: &str) -> Result<i32> {
    let loc = location::location(repo)?;
    let backend = location::backend(&loc, false)?;
    let server = tiny_http::Server::http(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    eprintln!(
        "copy-forward service for {} listening on http://{}",
        loc,
        server
            .server_addr()
            .to_ip()
            .map(|a| a.to_string())
            .unwrap_or_else(|| listen.to_string())
    );
    for mut req in server.incoming_requests() {
        let reply = |code: u16, body: String| {
            tiny_http::Response::from_string(body)
                .with_status_code(code)
                .with_header(
                    tiny_http::Header::from_bytes("Content-Type", "application/json")
                        .expect("a valid header"),
                )
        };
        if req.method() != &tiny_http::Method::Post || req.url() != "/assemble" {
            let _ = req.respond(reply(404, "{\"error\":\"POST /assemble\"}".into()));
            continue;
        }
        let mut body = Vec::new();
        let read = req
            .as_reader()
            .take(MAX_REQUEST)
            .read_to_end(&mut body)
            .context("reading a request");
        let r = read.and_then(|_| Ok(strata_store::tier::copy_forward::serve(&backend, &body)?));
        let _ = match r {
            Ok(ok) => req.respond(reply(200, ok)),
            Err(e) => {
                let msg = serde_json::json!({ "error": format!("{e:#}") }).to_string();
                req.respond(reply(400, msg))
            }
        };
    }
    Ok(0)
}
