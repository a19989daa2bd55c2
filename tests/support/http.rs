//! HTTP from the tests' side: curl (the client users bring) and plain requests (ureq),
//! for `narrator serve`'s suites.

use std::process::Command;

use serde_json::{Value, json};

/// `curl -sS ARGS`: its stdout and stderr.
pub fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "600"])
        .args(args)
        .output()
        .expect("run curl");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a request got.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// `Retry-After`, when sent.
    pub retry_after: Option<String>,
    /// `WWW-Authenticate`, when sent.
    pub authenticate: Option<String>,
    /// The body as JSON (null when it is none, or not JSON).
    pub json: Value,
}

/// `METHOD BASE+PATH` (GET, DELETE, or POST with `body` as JSON), with `token` as a
/// bearer token when given; any status is an answer.
pub fn call(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let url = format!("{base}{path}");
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut res = match method {
        "GET" | "DELETE" => {
            let mut r = if method == "GET" {
                agent.get(&url)
            } else {
                agent.delete(&url)
            };
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
        _ => {
            let mut r = agent.post(&url);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            match body {
                Some(b) => r
                    .header("content-type", "application/json")
                    .send(b.to_string()),
                None => r.send_empty(),
            }
        }
    }
    .expect("request");
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (retry_after, authenticate) = (header("retry-after"), header("www-authenticate"));
    let status = res.status().as_u16();
    let text = res.body_mut().read_to_string().unwrap_or_default();
    Reply {
        status,
        retry_after,
        authenticate,
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

/// The events of a Server-Sent Events stream, as (event, data as JSON) pairs.
pub fn sse_events(stream: &str) -> Vec<(String, Value)> {
    stream
        .split("\n\n")
        .filter_map(|block| {
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = e.trim().to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim());
                }
            }
            (!data.is_empty()).then(|| {
                let v = serde_json::from_str(&data).unwrap_or_else(|_| json!({"raw": data}));
                (event, v)
            })
        })
        .collect()
}

/// `curl -f -L` of `url` into `out`, with extra `headers` (`Name: value`): the bytes
/// written (redirects followed, as a browser's player would).
pub fn download(url: &str, headers: &[&str], out: &std::path::Path) -> Vec<u8> {
    let mut args = vec!["-f", "-L"];
    for h in headers {
        args.extend(["-H", h]);
    }
    let out_arg = out.display().to_string();
    args.extend(["-o", &out_arg, url]);
    let (_, err) = curl(&args);
    assert!(err.is_empty(), "curl {url}: {err}");
    std::fs::read(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()))
}
