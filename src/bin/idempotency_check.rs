//! `idempotency-check`: runs the IETF Idempotency-Key draft's scenarios against a running create
//! endpoint, in any language, and says what is wrong.
//!
//! ```text
//! idempotency-check POST https://host/payments --body '{"amount":{{n}},"currency":"EUR"}' \
//!   --header 'Authorization: Bearer …'
//! ```
//!
//! `{{key}}` and `{{n}}` expand per request (the key, a number unique to the payload). Flags:
//! `--body TEMPLATE`, `--header 'Name: template'` (repeatable), `--key-header NAME`,
//! `--expect-created STATUS`, `--concurrency N`, `--timeout-s N`, `--other-url URL` (another
//! create endpoint of the server, for `other_endpoint`), `--quote-key` (the key as a
//! Structured Field string), `--slow-ms N` (the endpoint's creates take longer than N ms: the
//! retry of `retry_while_running` is sent after N ms), `--slow-header 'Name: value'` (a delay
//! hook the first attempt sends, the retry sent after `--slow-ms`, 200 by default), `--http1`
//! or `--http2` (HTTP/2 with prior knowledge; by default HTTP/1.1, or HTTP/2 where TLS
//! negotiates it), `--ca-file PEM` (CA certificates to trust beside the platform's),
//! `--after-s N` (the key's advertised lifetime, for `after_lifetime`), `--json`,
//! `--only a,b`, `--skip a,b`, `--help`. The exit code is 0 if no scenario failed, 1 if one did, 2 for a bad
//! command line.

use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use tower_idempotency::check::{Http, SCENARIOS, Slow, Target, run};

const USAGE: &str = "usage: idempotency-check METHOD URL [--body TEMPLATE] [--header 'Name: template']... \
    [--key-header NAME] [--expect-created STATUS] [--concurrency N] [--timeout-s N] \
    [--other-url URL] [--slow-ms N] [--slow-header 'Name: value'] [--quote-key] \
    [--http1 | --http2] [--ca-file PEM] [--after-s N] [--json] [--only a,b] [--skip a,b]";

/// What the command line asks of the client.
struct Client {
    http: Http,
    roots: Vec<reqwest::Certificate>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(Target, bool, Client), String> {
    let method = args.next().ok_or("METHOD URL are needed")?;
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| format!("{method}: not a method"))?;
    let url = args.next().ok_or("URL is needed")?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{url}: not an http:// or https:// URL"));
    }
    let mut target = Target::new(method, url);
    let mut json = false;
    let mut http = Http::Negotiated;
    let mut roots = Vec::new();
    let (mut slow_after, mut slow_header) = (None, None);
    let names = |value: &str| -> Result<Vec<String>, String> {
        let names: Vec<String> = value.split(',').map(str::to_owned).collect();
        match names
            .iter()
            .find(|name| !SCENARIOS.contains(&name.as_str()))
        {
            Some(unknown) => Err(format!(
                "{unknown}: no such scenario ({})",
                SCENARIOS.join(", ")
            )),
            None => Ok(names),
        }
    };
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--json" => {
                json = true;
                continue;
            }
            "--http1" => {
                http = Http::Http1;
                continue;
            }
            "--http2" => {
                http = Http::Http2;
                continue;
            }
            "--quote-key" => {
                target = target.quote_key();
                continue;
            }
            _ => {}
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if value.starts_with("--") && flag != "--body" {
            return Err(format!("{flag} needs a value, not {value}"));
        }
        target = match flag.as_str() {
            "--body" => target.body(value),
            "--header" => {
                let (name, template) = value
                    .split_once(':')
                    .ok_or_else(|| format!("--header {value}: Name: value"))?;
                let name = HeaderName::try_from(name.trim())
                    .map_err(|_| format!("{name}: not a header name"))?;
                target.header(name, template.trim())
            }
            "--key-header" => target.key_header(
                HeaderName::try_from(value.as_str())
                    .map_err(|_| format!("{value}: not a header name"))?,
            ),
            "--expect-created" => target.created(
                value
                    .parse::<u16>()
                    .ok()
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or_else(|| format!("{value}: not a status"))?,
            ),
            "--concurrency" => target.concurrency(
                value
                    .parse()
                    .map_err(|_| format!("{value}: not a number"))?,
            ),
            "--timeout-s" => target.timeout(Duration::from_secs(
                value
                    .parse()
                    .map_err(|_| format!("{value}: not a number"))?,
            )),
            "--other-url" => target.other_url(value),
            "--after-s" => target.after(Duration::from_secs_f64(
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
                    .ok_or_else(|| format!("--after-s {value}: a number of seconds"))?,
            )),
            "--ca-file" => {
                let pem = std::fs::read(&value).map_err(|e| format!("--ca-file {value}: {e}"))?;
                let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("--ca-file {value}: {e}"))?;
                roots.extend(certificates);
                target
            }
            "--slow-ms" => {
                let after = Duration::from_millis(
                    value
                        .parse()
                        .map_err(|_| format!("{value}: not a number"))?,
                );
                slow_after = Some(after);
                target
            }
            "--slow-header" => {
                let (name, header) = value
                    .split_once(':')
                    .ok_or_else(|| format!("--slow-header {value}: Name: value"))?;
                let name = HeaderName::try_from(name.trim())
                    .map_err(|_| format!("{name}: not a header name"))?;
                let header = http::HeaderValue::from_str(header.trim())
                    .map_err(|_| format!("{value}: not a header value"))?;
                slow_header = Some((name, header));
                target
            }
            "--only" => target.only(names(&value)?),
            "--skip" => target.skip(names(&value)?),
            _ => return Err(format!("unknown flag {flag}")),
        };
    }
    let target = match (slow_header, slow_after) {
        (Some((name, value)), after) => target.slow(Slow::Header(
            name,
            value,
            after.unwrap_or(Duration::from_millis(200)),
        )),
        (None, Some(after)) => target.slow(Slow::Already(after)),
        (None, None) => target,
    };
    Ok((target, json, Client { http, roots }))
}

#[tokio::main]
async fn main() {
    let (target, json, options) = match parse(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let client = match tower_idempotency::check::client_with(options.http, &options.roots) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("idempotency-check: {error}");
            std::process::exit(2);
        }
    };
    let report = run(&target, &client).await;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    std::process::exit(if report.passed() { 0 } else { 1 });
}
