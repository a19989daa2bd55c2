//! S3 credentials the way operators hand them out, each one alone in the environment,
//! against the S3 test server (which checks every request's signature with its keys):
//! shared profile files, a web identity token exchanged at STS (Kubernetes service
//! accounts), container credentials (ECS, EKS Pod Identity), instance metadata (IMDSv2),
//! and secrets mounted as files (`AWS_*_FILE`, read by the command). STS and the metadata
//! endpoints are local stand-ins that answer as AWS does and log what they were sent.
//!
//! One test: the steps change the process environment, which nothing else in this binary
//! reads meanwhile.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post, put};
use narrator_s3::{S3AudioStore, S3Error};
use narrator_test_support::{World, s3_config};

/// The variables of the AWS credential chain, cleared before each step.
const CHAIN_VARS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
];

/// Sets exactly `vars` among [`CHAIN_VARS`] (and `AWS_EC2_METADATA_DISABLED=true` unless
/// given, so that no step waits for a metadata service that is not there).
#[allow(unsafe_code)]
fn chain_env(vars: &[(&str, String)]) {
    for k in CHAIN_VARS {
        // SAFETY: no other thread of this test binary reads the environment meanwhile
        // (one test; the runtime of the previous step is gone).
        unsafe { std::env::remove_var(k) };
    }
    let mut all: Vec<(&str, String)> = vars.to_vec();
    if !vars.iter().any(|(k, _)| k.starts_with("AWS_EC2_METADATA")) {
        all.push(("AWS_EC2_METADATA_DISABLED", "true".into()));
    }
    // Nothing from the home folder.
    if !vars
        .iter()
        .any(|(k, _)| *k == "AWS_SHARED_CREDENTIALS_FILE")
    {
        all.push((
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/credentials".into(),
        ));
        all.push(("AWS_CONFIG_FILE", "/nonexistent/config".into()));
    }
    for (k, v) in all {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
}

/// Connects to the test bucket in a runtime of its own (made after the environment).
fn connect() -> Result<S3AudioStore, S3Error> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = S3AudioStore::connect(s3_config()).await?;
        // A signed write and read: the credentials are really accepted.
        let key = format!("credentials-test/{}", narrator_db::Uuid::new_v4());
        store.put_bytes(&key, b"ok".to_vec(), "text/plain").await?;
        assert_eq!(store.get_bytes(&key).await?, b"ok");
        store.delete(&key).await?;
        Ok(store)
    })
}

type Log = Arc<Mutex<Vec<String>>>;

/// Stand-ins for STS, the container credentials endpoint and IMDSv2, on one port.
struct FakeAws {
    port: u16,
    log: Log,
    _rt: tokio::runtime::Runtime,
}

/// A request header's value as text (empty when absent).
fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn credentials_json(id: &str, secret: &str) -> String {
    format!(
        r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"{id}","SecretAccessKey":"{secret}","Token":"session-token","Expiration":"2099-01-01T00:00:00Z","LastUpdated":"2026-12-03T00:00:00Z"}}"#
    )
}

impl FakeAws {
    fn start(id: String, secret: String) -> Self {
        let log: Log = Arc::default();
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sts_body = format!(
            r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials><AccessKeyId>{id}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey><SessionToken>session-token</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>
    <AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/narrator/test</Arn><AssumedRoleId>AROAEXAMPLE:test</AssumedRoleId></AssumedRoleUser>
    <SubjectFromWebIdentityToken>system:serviceaccount:narrator:worker</SubjectFromWebIdentityToken>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#
        );
        let creds = credentials_json(&id, &secret);
        let app = axum::Router::new()
            .route(
                "/",
                post({
                    let body = sts_body.clone();
                    move |State(log): State<Log>, form: String| async move {
                        log.lock().expect("log").push(format!("sts {form}"));
                        ([("content-type", "text/xml")], body)
                    }
                }),
            )
            .route(
                "/container-credentials",
                get({
                    let creds = creds.clone();
                    move |State(log): State<Log>, headers: HeaderMap| async move {
                        let auth = header(&headers, "authorization");
                        log.lock().expect("log").push(format!("container {auth}"));
                        ([("content-type", "application/json")], creds)
                    }
                }),
            )
            .route(
                "/latest/api/token",
                put(|State(log): State<Log>| async move {
                    log.lock().expect("log").push("imds token".into());
                    (
                        [("x-aws-ec2-metadata-token-ttl-seconds", "21600")],
                        "imds-session-token",
                    )
                }),
            )
            .route(
                "/latest/meta-data/iam/security-credentials/",
                get(|| async { "narrator-node-role" }),
            )
            .route(
                "/latest/meta-data/iam/security-credentials/narrator-node-role",
                get({
                    move |State(log): State<Log>, headers: HeaderMap| async move {
                        let token = header(&headers, "x-aws-ec2-metadata-token");
                        log.lock().expect("log").push(format!("imds role {token}"));
                        ([("content-type", "application/json")], creds)
                    }
                }),
            )
            .with_state(log.clone());
        rt.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { port, log, _rt: rt }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn logged(&self, prefix: &str) -> Vec<String> {
        self.log
            .lock()
            .expect("log")
            .iter()
            .filter(|l| l.starts_with(prefix))
            .cloned()
            .collect()
    }
}

#[test]
fn s3_credentials_come_from_every_link_of_the_aws_chain() {
    let id = std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID of the S3 test server");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY")
        .expect("AWS_SECRET_ACCESS_KEY of the S3 test server");
    let dir = tempfile::tempdir().expect("dir");
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf-8").to_owned()
    };
    let fake = FakeAws::start(id.clone(), secret.clone());

    // Today's variables.
    chain_env(&[
        ("AWS_ACCESS_KEY_ID", id.clone()),
        ("AWS_SECRET_ACCESS_KEY", secret.clone()),
    ]);
    connect().expect("environment variables");

    // Nothing anywhere: one clear error at start.
    chain_env(&[]);
    let e = connect().expect_err("no credentials");
    assert!(matches!(e, S3Error::Config { .. }), "{e:?}");
    let text = e.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("no S3 credentials"), "{text}");
    assert!(text.contains("AWS_WEB_IDENTITY_TOKEN_FILE"), "{text}");

    // A named profile in the shared files.
    let credentials = file(
        "credentials",
        &format!(
            "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n\
             [narrator]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n"
        ),
    );
    let config = file("config", "[profile narrator]\nregion = us-east-1\n");
    chain_env(&[
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.clone()),
        ("AWS_CONFIG_FILE", config.clone()),
        ("AWS_PROFILE", "narrator".into()),
    ]);
    connect().expect("profile narrator");
    // The default profile's keys are wrong: the server refuses them (the file is read).
    chain_env(&[
        ("AWS_SHARED_CREDENTIALS_FILE", credentials),
        ("AWS_CONFIG_FILE", config),
    ]);
    assert!(
        matches!(connect(), Err(S3Error::Denied { .. })),
        "the default profile holds wrong keys"
    );

    // A web identity token, as a Kubernetes service account mounts it.
    let token = file("token", "eyJhbGciOiJSUzI1NiJ9.service-account-token.sig");
    chain_env(&[
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/narrator".into(),
        ),
        ("AWS_ROLE_SESSION_NAME", "narrator-worker".into()),
        ("AWS_ENDPOINT_URL_STS", fake.url("")),
    ]);
    connect().expect("web identity");
    let sts = fake.logged("sts ");
    assert!(
        sts.iter()
            .any(|l| l.contains("Action=AssumeRoleWithWebIdentity")
                && l.contains("WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.service-account-token.sig")
                && l.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fnarrator")),
        "{sts:?}"
    );

    // Container credentials with an authorization token file (EKS Pod Identity, ECS).
    let auth = file("container-token", "pod-identity-token");
    chain_env(&[
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            fake.url("/container-credentials"),
        ),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", auth),
    ]);
    connect().expect("container credentials");
    assert!(
        fake.logged("container ")
            .contains(&"container pod-identity-token".to_owned()),
        "{:?}",
        fake.logged("container ")
    );

    // Instance metadata (IMDSv2: a session token first).
    chain_env(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url(""))]);
    connect().expect("instance metadata");
    assert!(
        fake.logged("imds role ")
            .contains(&"imds role imds-session-token".to_owned()),
        "{:?}",
        fake.logged("imds")
    );

    // Secrets mounted as files, read by the command: `status` presigns with them, and
    // with a wrong secret in the file S3 refuses.
    chain_env(&[]);
    let w = World::new();
    let id_file = file("id", &format!("{id}\n"));
    let status = |secret_text: &str| {
        let secret_file = file("secret", secret_text);
        let out = w
            .cmd()
            .env("AWS_ACCESS_KEY_ID_FILE", &id_file)
            .env("AWS_SECRET_ACCESS_KEY_FILE", secret_file)
            .args(["status", &narrator_db::Uuid::new_v4().to_string()])
            .output()
            .expect("status");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = status(&format!("{secret}\n"));
    assert!(err.contains("no job"), "{err}");
    assert!(!err.contains("no presigned URLs"), "{err}");
    let err = status("not-the-secret\n");
    assert!(
        err.contains("no presigned URLs") && err.contains("S3 refused access"),
        "{err}"
    );
}
