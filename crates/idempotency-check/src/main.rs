//! `idempotency-check`: runs the IETF Idempotency-Key draft's scenarios against a running create
//! endpoint, in any language, and says what is wrong.
//!
//! ```text
//! idempotency-check POST https://host/payments --body '{"amount":{{n}},"currency":"EUR"}' \
//!   --header 'Authorization: Bearer …'
//! ```
//!
//! `idempotency-check --help` lists the flags. The exit code is 0 if no scenario failed, 1 if
//! one did, 2 for a bad command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use idempotency_check::{Http, SCENARIOS, Slow, Target, client_with, run};

/// Runs the IETF Idempotency-Key draft's scenarios against a running create endpoint and says
/// what is wrong. In a template (the body, a header's value), `{{key}}` is the scenario's key
/// and `{{n}}` a number unique to the request's payload.
///
/// Exit codes: 0 no scenario failed, 1 one did, 2 a bad command line.
#[derive(Debug, Parser)]
#[command(name = "idempotency-check", version)]
struct Args {
    /// The create's method (any case).
    #[arg(value_parser = method)]
    method: Method,
    /// The create's URL, http:// or https://.
    #[arg(value_parser = url)]
    url: String,
    /// The request body's template.
    #[arg(long, value_name = "TEMPLATE", allow_hyphen_values = true)]
    body: Option<String>,
    /// A header to send, its value a template ('Name: template'); repeatable.
    #[arg(long = "header", value_name = "'Name: template'", value_parser = header_template)]
    headers: Vec<(HeaderName, String)>,
    /// The header the key is sent in (default Idempotency-Key).
    #[arg(long, value_name = "NAME", value_parser = header_name)]
    key_header: Option<HeaderName>,
    /// The status of a create (default 201).
    #[arg(long, value_name = "STATUS", value_parser = status)]
    expect_created: Option<StatusCode>,
    /// Requests sent at once by the concurrent scenarios (default 32).
    #[arg(long, value_name = "N")]
    concurrency: Option<usize>,
    /// Seconds a request may take (default 10).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    timeout_s: Option<u64>,
    /// Another create endpoint of the server, for `other_endpoint`.
    #[arg(long, value_name = "URL")]
    other_url: Option<String>,
    /// The endpoint's creates take longer than N ms: the retry of `retry_while_running` is
    /// sent after N ms.
    #[arg(long, value_name = "N")]
    slow_ms: Option<u64>,
    /// A delay hook the first attempt of `retry_while_running` sends ('Name: value'); its retry
    /// is sent after --slow-ms, 200 by default.
    #[arg(long, value_name = "'Name: value'", value_parser = header_value)]
    slow_header: Option<(HeaderName, HeaderValue)>,
    /// The key as a Structured Field string (quoted).
    #[arg(long)]
    quote_key: bool,
    /// HTTP/1.1 only.
    #[arg(long, conflicts_with = "http2")]
    http1: bool,
    /// HTTP/2 with prior knowledge (by default HTTP/1.1, or HTTP/2 where TLS negotiates it).
    #[arg(long)]
    http2: bool,
    /// CA certificates (PEM) to trust beside the platform's; repeatable.
    #[arg(long, value_name = "PEM")]
    ca_file: Vec<PathBuf>,
    /// The key's advertised lifetime in seconds, for `after_lifetime`.
    #[arg(long, value_name = "N", value_parser = seconds)]
    after_s: Option<Duration>,
    /// The report as one JSON document.
    #[arg(long)]
    json: bool,
    /// Only these scenarios (comma-separated).
    #[arg(long, value_name = "a,b", value_delimiter = ',', value_parser = scenario)]
    only: Vec<String>,
    /// Every scenario but these (comma-separated).
    #[arg(long, value_name = "a,b", value_delimiter = ',', value_parser = scenario)]
    skip: Vec<String>,
}

fn method(text: &str) -> Result<Method, String> {
    Method::from_bytes(text.to_ascii_uppercase().as_bytes()).map_err(|_| "not a method".into())
}

fn url(text: &str) -> Result<String, String> {
    if text.starts_with("http://") || text.starts_with("https://") {
        Ok(text.to_owned())
    } else {
        Err("not an http:// or https:// URL".into())
    }
}

fn header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::try_from(text.trim()).map_err(|_| "not a header name".into())
}

fn header_template(text: &str) -> Result<(HeaderName, String), String> {
    let (name, template) = text.split_once(':').ok_or("Name: value")?;
    let name = header_name(name)?;
    let template = template.trim().to_owned();
    let sample = template.replace("{{key}}", "k").replace("{{n}}", "1");
    HeaderValue::from_str(&sample).map_err(|_| "not a header value")?;
    Ok((name, template))
}

fn header_value(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = header_template(text)?;
    let value = HeaderValue::from_str(&value).map_err(|_| "not a header value")?;
    Ok((name, value))
}

fn status(text: &str) -> Result<StatusCode, String> {
    text.parse::<u16>()
        .ok()
        .and_then(|status| StatusCode::from_u16(status).ok())
        .ok_or_else(|| "not a status".into())
}

fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "a number of seconds".into())
}

fn scenario(text: &str) -> Result<String, String> {
    if SCENARIOS.contains(&text) {
        Ok(text.to_owned())
    } else {
        Err(format!("no such scenario ({})", SCENARIOS.join(", ")))
    }
}

/// The target and the client's options the arguments describe; an error for a CA file that
/// cannot be read or holds no certificate.
fn target(args: Args) -> Result<(Target, Http, Vec<reqwest::Certificate>), String> {
    let mut target = Target::new(args.method, args.url);
    if let Some(body) = args.body {
        target = target.body(body);
    }
    for (name, template) in args.headers {
        target = target.header(name, template);
    }
    if let Some(name) = args.key_header {
        target = target.key_header(name);
    }
    if let Some(status) = args.expect_created {
        target = target.created(status);
    }
    if let Some(concurrency) = args.concurrency {
        target = target.concurrency(concurrency);
    }
    if let Some(seconds) = args.timeout_s {
        target = target.timeout(Duration::from_secs(seconds));
    }
    if let Some(url) = args.other_url {
        target = target.other_url(url);
    }
    if args.quote_key {
        target = target.quote_key();
    }
    if let Some(after) = args.after_s {
        target = target.after(after);
    }
    if !args.only.is_empty() {
        target = target.only(args.only);
    }
    if !args.skip.is_empty() {
        target = target.skip(args.skip);
    }
    let slow_after = args.slow_ms.map(Duration::from_millis);
    target = match (args.slow_header, slow_after) {
        (Some((name, value)), after) => target.slow(Slow::Header(
            name,
            value,
            after.unwrap_or(Duration::from_millis(200)),
        )),
        (None, Some(after)) => target.slow(Slow::Already(after)),
        (None, None) => target,
    };
    let http = match (args.http1, args.http2) {
        (true, _) => Http::Http1,
        (_, true) => Http::Http2,
        _ => Http::Negotiated,
    };
    let mut roots = Vec::new();
    for file in args.ca_file {
        let shown = file.display();
        let pem = std::fs::read(&file).map_err(|e| format!("--ca-file {shown}: {e}"))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("--ca-file {shown}: {e}"))?;
        if certificates.is_empty() {
            return Err(format!("--ca-file {shown}: no CERTIFICATE in it"));
        }
        roots.extend(certificates);
    }
    Ok((target, http, roots))
}

#[tokio::main]
async fn main() {
    let (target, http, roots, json) = {
        let args = Args::parse();
        let json = args.json;
        match target(args) {
            Ok((target, http, roots)) => (target, http, roots, json),
            Err(message) => {
                eprintln!("idempotency-check: {message}");
                std::process::exit(2);
            }
        }
    };
    let client = match client_with(http, &roots) {
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
    use super::*;
    use clap::error::ErrorKind;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("idempotency-check").chain(line.split(' ')))
    }

    fn refused(line: &str) -> (ErrorKind, String) {
        let error = parse(line).expect_err(line);
        (error.kind(), error.to_string())
    }

    #[test]
    fn a_command_line_is_read_or_refused_with_its_reason() {
        let args = parse("post http://h/p --json --http2 --only conflict,bad_keys").unwrap();
        assert_eq!(args.method, Method::POST);
        assert!(args.json && args.http2 && !args.http1);
        assert_eq!(args.only, ["conflict", "bad_keys"]);
        let args =
            parse("POST http://h/p --body --x-- --header X-A:{{key}} --timeout-s 3").unwrap();
        assert_eq!(args.body.as_deref(), Some("--x--"));
        assert_eq!(args.headers[0].1, "{{key}}");
        assert_eq!(args.timeout_s, Some(3));

        assert_eq!(
            refused("POST http://h/p --jsn").0,
            ErrorKind::UnknownArgument
        );
        assert_eq!(refused("POST http://h/p --body").0, ErrorKind::InvalidValue);
        assert_eq!(
            refused("POST http://h/p --http1 --http2").0,
            ErrorKind::ArgumentConflict
        );
        for (line, reason) in [
            ("POST http://h/p --timeout-s 0", "0 is not in 1.."),
            ("POST http://h/p --only nope", "no such scenario"),
            ("POST ftp://h/p", "not an http:// or https:// URL"),
            ("POST http://h/p --after-s NaN", "a number of seconds"),
            ("POST http://h/p --header NoColon", "Name: value"),
            ("POST http://h/p --expect-created 99", "not a status"),
            ("POST http://h/p --key-header a\tb", "not a header name"),
            ("P(ST http://h/p", "not a method"),
        ] {
            let (kind, message) = refused(line);
            assert_eq!(kind, ErrorKind::ValueValidation, "{line}");
            assert!(message.contains(reason), "{line}: {message}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = std::env::temp_dir().join(format!("check-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let line = format!("POST http://h/p --ca-file {}", key.display());
        let error = target(parse(&line).unwrap()).err().unwrap_or_default();
        assert!(error.ends_with("no CERTIFICATE in it"), "{error}");
        let missing = format!(
            "POST http://h/p --ca-file {}",
            dir.join("none.pem").display()
        );
        assert!(target(parse(&missing).unwrap()).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
