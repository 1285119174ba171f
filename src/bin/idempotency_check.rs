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

/// The flags that take no value.
const SWITCHES: [&str; 5] = ["--json", "--quote-key", "--http1", "--http2", "--help"];

/// The flags that take one.
const VALUED: [&str; 13] = [
    "--body",
    "--header",
    "--key-header",
    "--expect-created",
    "--concurrency",
    "--timeout-s",
    "--other-url",
    "--slow-ms",
    "--slow-header",
    "--ca-file",
    "--after-s",
    "--only",
    "--skip",
];

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} {value}: not a number"))
}

fn header(flag: &str, value: &str) -> Result<(HeaderName, String), String> {
    let (name, template) = value
        .split_once(':')
        .ok_or_else(|| format!("{flag} {value}: Name: value"))?;
    let name = HeaderName::try_from(name.trim())
        .map_err(|_| format!("{flag} {name}: not a header name"))?;
    let template = template.trim().to_owned();
    let sample = template.replace("{{key}}", "k").replace("{{n}}", "1");
    http::HeaderValue::from_str(&sample)
        .map_err(|_| format!("{flag} {value}: not a header value"))?;
    Ok((name, template))
}

fn parse(args: Vec<String>) -> Result<(Target, bool, Client), String> {
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        println!("{USAGE}");
        std::process::exit(0);
    }
    let mut args = args.into_iter();
    let method = args.next().ok_or("METHOD URL are needed")?;
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("{method}: not a method"))?;
    let url = args.next().ok_or("URL is needed")?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{url}: not an http:// or https:// URL"));
    }
    let mut target = Target::new(method, url);
    let mut json = false;
    let mut http = Http::Negotiated;
    let mut roots = Vec::new();
    let (mut slow_after, mut slow_header) = (None, None);
    let names = |flag: &str, value: &str| -> Result<Vec<String>, String> {
        let names: Vec<String> = value.split(',').map(str::to_owned).collect();
        match names
            .iter()
            .find(|name| !SCENARIOS.contains(&name.as_str()))
        {
            Some(unknown) => Err(format!(
                "{flag} {unknown}: no such scenario ({})",
                SCENARIOS.join(", ")
            )),
            None => Ok(names),
        }
    };
    while let Some(flag) = args.next() {
        if SWITCHES.contains(&flag.as_str()) {
            match flag.as_str() {
                "--json" => json = true,
                "--quote-key" => target = target.quote_key(),
                "--http1" => http = Http::Http1,
                _ => http = Http::Http2,
            }
            continue;
        }
        if !VALUED.contains(&flag.as_str()) {
            return Err(format!("unknown flag {flag}"));
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if value.starts_with("--") && flag != "--body" {
            return Err(format!("{flag} needs a value, not {value}"));
        }
        target = match flag.as_str() {
            "--body" => target.body(value),
            "--header" => {
                let (name, template) = header(&flag, &value)?;
                target.header(name, template)
            }
            "--key-header" => target.key_header(
                HeaderName::try_from(value.as_str())
                    .map_err(|_| format!("{flag} {value}: not a header name"))?,
            ),
            "--expect-created" => target.created(
                number::<u16>(&flag, &value)
                    .ok()
                    .and_then(|status| StatusCode::from_u16(status).ok())
                    .ok_or_else(|| format!("{flag} {value}: not a status"))?,
            ),
            "--concurrency" => target.concurrency(number(&flag, &value)?),
            "--timeout-s" => match number::<u64>(&flag, &value)? {
                0 => return Err(format!("{flag} {value}: at least 1")),
                seconds => target.timeout(Duration::from_secs(seconds)),
            },
            "--other-url" => target.other_url(value),
            "--slow-ms" => {
                slow_after = Some(Duration::from_millis(number(&flag, &value)?));
                target
            }
            "--slow-header" => {
                let (name, template) = header(&flag, &value)?;
                let value = http::HeaderValue::from_str(&template)
                    .map_err(|_| format!("{flag} {value}: not a header value"))?;
                slow_header = Some((name, value));
                target
            }
            "--ca-file" => {
                let pem = std::fs::read(&value).map_err(|e| format!("{flag} {value}: {e}"))?;
                let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("{flag} {value}: {e}"))?;
                if certificates.is_empty() {
                    return Err(format!("{flag} {value}: no CERTIFICATE in it"));
                }
                roots.extend(certificates);
                target
            }
            "--after-s" => target.after(Duration::from_secs_f64(
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
                    .ok_or_else(|| format!("{flag} {value}: a number of seconds"))?,
            )),
            "--only" => target.only(names(&flag, &value)?),
            "--skip" => target.skip(names(&flag, &value)?),
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
    let (target, json, options) = match parse(std::env::args().skip(1).collect()) {
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

#[cfg(test)]
mod tests {
    use super::parse;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    fn error(line: &str) -> String {
        parse(args(line)).err().unwrap_or_default()
    }

    #[test]
    fn a_command_line_is_read_or_refused_with_its_reason() {
        assert!(
            parse(args(
                "post http://h/p --json --http2 --only conflict,bad_keys"
            ))
            .is_ok()
        );
        assert_eq!(error("POST http://h/p --jsn"), "unknown flag --jsn");
        assert_eq!(error("POST http://h/p --body"), "--body needs a value");
        assert_eq!(
            error("POST http://h/p --key-header --json"),
            "--key-header needs a value, not --json"
        );
        assert_eq!(
            error("POST http://h/p --timeout-s 0"),
            "--timeout-s 0: at least 1"
        );
        assert!(error("POST http://h/p --only nope").starts_with("--only nope: no such scenario"));
        assert!(error("POST ftp://h/p").ends_with("not an http:// or https:// URL"));
        assert!(error("POST http://h/p --after-s NaN").ends_with("a number of seconds"));
        assert!(error("POST http://h/p --header NoColon").ends_with(": Name: value"));
        let dir = std::env::temp_dir().join(format!("check-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let line = format!("POST http://h/p --ca-file {}", key.display());
        assert!(
            error(&line).ends_with("no CERTIFICATE in it"),
            "{}",
            error(&line)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
