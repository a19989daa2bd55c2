//! narrator's [`AudioStore`] on S3 or any S3-compatible server (moto, s3s, MinIO, ...).
//!
//! Keys (the prefix is used verbatim: give it its trailing `/`):
//! - segments: `{prefix}jobs/{job}/segments/{index:06}.wav`, the same 16-bit mono WAV bytes
//!   `narrator_pipeline::LocalAudioStore` writes ([`narrator_audio::encode_wav_bytes`]);
//!   a PUT is atomic, so an object that exists is complete;
//! - outputs: `{prefix}jobs/{job}/out/{name}`; files above `multipart_threshold` go up as a
//!   multipart upload in `part_size` parts, aborted on any error so no partial object ever
//!   becomes visible.
//!
//! With an `endpoint` the client uses path-style addressing (`http://host:port/bucket/key`),
//! which every S3-compatible test server understands. Credentials are the static pair from
//! [`S3Config`] when given, else the standard AWS chain (`aws-config`, without SSO):
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN` optional), the shared
//! profile files (`AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`,
//! `credential_process`), a web identity token (`AWS_WEB_IDENTITY_TOKEN_FILE` +
//! `AWS_ROLE_ARN`, as Kubernetes service accounts mount it), container credentials
//! (`AWS_CONTAINER_CREDENTIALS_*`) and instance metadata. HTTPS trusts the system's store
//! plus [`S3Config::ca_file`] (`AWS_CA_BUNDLE`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLocationConstraint, CompletedMultipartUpload, CompletedPart, CreateBucketConfiguration,
};
use narrator_core::{AudioStore, PackedAt, SeamError, SegmentAudio};
use tokio::io::AsyncReadExt;

const MIB: u64 = 1024 * 1024;
/// S3's smallest part (except the last).
const MIN_PART: u64 = 5 * MIB;
/// S3's largest part.
const MAX_PART: u64 = 5 * 1024 * MIB;
/// S3's most parts per upload.
const MAX_PARTS: u64 = 10_000;
/// Parts of one multipart upload sent at once.
const PARTS_IN_FLIGHT: usize = 4;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where and how to reach the bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    /// `http(s)://host:port` of an S3-compatible server (path-style addressing); `None` for
    /// AWS itself.
    pub endpoint: Option<String>,
    /// Where the users of presigned URLs reach the same server, when not at `endpoint`
    /// (a compose network's `http://s3:9000` is `http://localhost:9000` on the host): the
    /// URLs are signed for, and point at, this one. `None`: `endpoint`.
    pub public_endpoint: Option<String>,
    /// The bucket.
    pub bucket: String,
    /// Signing region, e.g. `us-east-1`.
    pub region: String,
    /// Static access key id; with `secret_access_key`. `None`: `AWS_ACCESS_KEY_ID`.
    pub access_key_id: Option<String>,
    /// Static secret; never printed by `Debug`. `None` (with `access_key_id`): the AWS
    /// credential chain.
    pub secret_access_key: Option<String>,
    /// CA certificates (PEM) trusted for HTTPS besides the system's store, for a
    /// self-hosted server with a private CA.
    pub ca_file: Option<PathBuf>,
    /// Prepended verbatim to every key, e.g. `narrator/`; may be empty.
    pub prefix: String,
    /// Outputs larger than this many bytes go up as multipart uploads (default 16 MiB).
    pub multipart_threshold: u64,
    /// Multipart part size in bytes (default 8 MiB, at least 5 MiB).
    pub part_size: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint: None,
            public_endpoint: None,
            bucket: "narrator".into(),
            region: "us-east-1".into(),
            access_key_id: None,
            secret_access_key: None,
            ca_file: None,
            prefix: String::new(),
            multipart_threshold: 16 * MIB,
            part_size: 8 * MIB,
        }
    }
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("public_endpoint", &self.public_endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_file", &self.ca_file)
            .field("prefix", &self.prefix)
            .field("multipart_threshold", &self.multipart_threshold)
            .field("part_size", &self.part_size)
            .finish()
    }
}

/// What went wrong talking to S3. Every message says what failed and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3Error {
    /// The settings cannot work (no credentials, part size out of range, ...).
    #[error("invalid S3 settings: {reason}")]
    Config {
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// No connection (refused, DNS, timeout) to the endpoint.
    #[error(
        "cannot reach the S3 endpoint {endpoint} ({action}); check that the server runs and the URL is right (tests: bash ops/s3-server.sh start)"
    )]
    Unreachable {
        /// The endpoint URL.
        endpoint: String,
        /// The operation, e.g. `head_bucket narrator`.
        action: String,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake failed: the server's certificate was refused.
    #[error(
        "TLS to the S3 endpoint {endpoint} failed ({action}): {problem}; for a private CA pass --s3-ca-file (or set AWS_CA_BUNDLE)"
    )]
    Tls {
        /// The endpoint URL.
        endpoint: String,
        /// The operation.
        action: String,
        /// The cause, named.
        problem: narrator_net::TlsProblem,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// The bucket does not exist.
    #[error(
        "S3 bucket {bucket:?} does not exist at {endpoint}; create it or pass --s3-bucket (tests: bash ops/s3-server.sh start creates it)"
    )]
    NoSuchBucket {
        /// The bucket.
        bucket: String,
        /// The endpoint URL.
        endpoint: String,
    },
    /// The server refused the credentials or the signature.
    #[error(
        "S3 refused access ({code}) for {action} in bucket {bucket:?} at {endpoint}; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or --s3-access-key-id / --s3-secret-access-key) and the region"
    )]
    Denied {
        /// Error code or HTTP status.
        code: String,
        /// The operation.
        action: String,
        /// The bucket.
        bucket: String,
        /// The endpoint URL.
        endpoint: String,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// The object does not exist.
    #[error(
        "S3 object {key:?} does not exist in bucket {bucket:?}; it was never stored or was deleted"
    )]
    NotFound {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// The server rejected the request as such (HTTP 4xx other than 403, 404, 408 and
    /// 429: a bad request, a key or object too large, a quota): it will not succeed by
    /// being sent again.
    #[error(
        "S3 rejected {action} at {endpoint} with HTTP {status} ({code}); sending it again will not help: fix the cause (a quota, a size limit, a key too long) and retry the job"
    )]
    Rejected {
        /// The operation and its key.
        action: String,
        /// The endpoint URL.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The server's error code, or `unknown`.
        code: String,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// Any other failed request.
    #[error(
        "S3 {action} failed at {endpoint}: {detail}; retry, and check the server's log if it persists"
    )]
    Request {
        /// The operation and its key.
        action: String,
        /// The endpoint URL.
        endpoint: String,
        /// The SDK's error chain in one line.
        detail: String,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// A local file (an output to upload) could not be read.
    #[error("cannot read {}: {source}; check that the file exists and is readable", .path.display())]
    LocalIo {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Segment audio could not be encoded or a stored segment is not valid WAV.
    #[error("segment audio {key:?}: {source}")]
    Audio {
        /// The key.
        key: String,
        /// The audio error.
        #[source]
        source: narrator_audio::AudioError,
    },
}

impl S3Error {
    /// A stable word for metrics and `failure_kind`: `store_config` for settings that
    /// cannot work, `store_rejected` for requests the server refuses as such, `store_io`
    /// (transient: retry) for everything else.
    pub fn kind(&self) -> &'static str {
        match self {
            S3Error::Config { .. } => "store_config",
            S3Error::Rejected { .. } => "store_rejected",
            _ => "store_io",
        }
    }

    /// How an operation that failed with this error is retried: settings or audio that
    /// cannot work never will; the store being away, refusing or timing out is an outage.
    pub fn retry_class(&self) -> narrator_core::RetryClass {
        use narrator_core::RetryClass;
        match self {
            S3Error::Config { .. }
            | S3Error::Audio { .. }
            | S3Error::LocalIo { .. }
            | S3Error::Rejected { .. } => RetryClass::Permanent,
            S3Error::NotFound { .. } => RetryClass::Transient,
            _ => RetryClass::Infrastructure,
        }
    }
}

impl From<S3Error> for SeamError {
    fn from(e: S3Error) -> Self {
        SeamError::new(e.kind(), e.retry_class(), e.to_string(), e)
    }
}

/// The longest one S3 request (one attempt) may take before it fails.
pub const OPERATION_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Segment audio and outputs in an S3 bucket. Cheap to clone (shares the HTTP pool).
#[derive(Clone)]
pub struct S3AudioStore {
    client: aws_sdk_s3::Client,
    /// Signs presigned URLs for the public endpoint, when one is set.
    presigner: Option<aws_sdk_s3::Client>,
    bucket: String,
    prefix: String,
    endpoint: String,
    multipart_threshold: u64,
    part_size: u64,
}

impl fmt::Debug for S3AudioStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3AudioStore")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("multipart_threshold", &self.multipart_threshold)
            .field("part_size", &self.part_size)
            .finish_non_exhaustive()
    }
}

fn config_err(reason: impl Into<String>) -> S3Error {
    S3Error::Config {
        reason: reason.into(),
    }
}

/// `Content-Type` for an output, by extension.
fn content_type_for(name: &str) -> &'static str {
    let ext = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("ogg" | "opus" | "oga") => "audio/ogg",
        Some("mp3") => "audio/mpeg",
        Some("wav") => "audio/wav",
        Some("json") => "application/json",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The HTTP(S) client: hyper + rustls on ring, trusting the system's CAs and `ca_file`.
fn http_client(cfg: &S3Config) -> Result<SharedHttpClient, S3Error> {
    use aws_smithy_http_client::tls;
    let builder = aws_smithy_http_client::Builder::new().tls_provider(tls::Provider::Rustls(
        tls::rustls_provider::CryptoMode::Ring,
    ));
    let Some(ca) = &cfg.ca_file else {
        return Ok(builder.build_https());
    };
    let pem = std::fs::read(ca).map_err(|e| {
        config_err(format!(
            "cannot read the S3 CA file {}: {e}; give a PEM file (--s3-ca-file or AWS_CA_BUNDLE)",
            ca.display()
        ))
    })?;
    let context = tls::TlsContext::builder()
        .with_trust_store(tls::TrustStore::default().with_pem_certificate(pem))
        .build()
        .map_err(|e| config_err(format!("the S3 CA file {}: {e}", ca.display())))?;
    Ok(builder.tls_context(context).build_https())
}

/// The static pair when both halves are given, else the standard AWS chain, asked once
/// now so that a missing credential is one clear error at start.
async fn credentials(
    cfg: &S3Config,
    http: &SharedHttpClient,
) -> Result<SharedCredentialsProvider, S3Error> {
    match (&cfg.access_key_id, &cfg.secret_access_key) {
        (Some(id), Some(secret)) => Ok(SharedCredentialsProvider::new(Credentials::new(
            id,
            secret,
            None,
            None,
            "narrator-static",
        ))),
        (Some(_), None) | (None, Some(_)) => Err(config_err(
            "give both the access key id and the secret access key, or neither (then the AWS credential chain is used: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, a web identity token, container or instance credentials)",
        )),
        (None, None) => {
            let sdk = aws_config::defaults(BehaviorVersion::latest())
                .http_client(http.clone())
                .region(Region::new(cfg.region.clone()))
                .load()
                .await;
            let provider = sdk.credentials_provider().ok_or_else(|| {
                config_err("the AWS credential chain is not available in this build")
            })?;
            if let Err(e) = provider.provide_credentials().await {
                return Err(config_err(format!(
                    "no S3 credentials: {}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or their *_FILE twins), AWS_PROFILE, or AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or run where container or instance credentials exist",
                    DisplayErrorContext(&e)
                )));
            }
            Ok(provider)
        }
    }
}

/// Counts every HTTP request the client sends (each attempt, each part of a multipart
/// upload) by method, and the bytes of request and response bodies: what S3 bills and
/// what `ops/bench` divides by segments.
#[derive(Debug)]
struct CountRequests;

/// A Content-Length header's value; 0 when absent or not a number.
fn length(header: Option<&str>) -> u64 {
    header.and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl aws_sdk_s3::config::Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "narrator-count-requests"
    }

    fn read_before_transmit(
        &self,
        ctx: &aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_s3::config::RuntimeComponents,
        _: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), BoxError> {
        use narrator_telemetry::metrics::{S3_BYTES, S3_REQUESTS};
        let request = ctx.request();
        let method = request.method().to_string();
        metrics::counter!(S3_REQUESTS, "method" => method).increment(1);
        let sent = request
            .body()
            .content_length()
            .unwrap_or_else(|| length(request.headers().get("content-length")));
        metrics::counter!(S3_BYTES, "direction" => "sent").increment(sent);
        Ok(())
    }

    fn read_after_transmit(
        &self,
        ctx: &aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef<'_>,
        _: &aws_sdk_s3::config::RuntimeComponents,
        _: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), BoxError> {
        let received = length(ctx.response().headers().get("content-length"));
        metrics::counter!(narrator_telemetry::metrics::S3_BYTES, "direction" => "received")
            .increment(received);
        Ok(())
    }
}

impl S3AudioStore {
    /// Checks the settings and makes the client (nothing is sent).
    async fn new(cfg: S3Config) -> Result<Self, S3Error> {
        Self::check_settings(&cfg)?;
        let http = http_client(&cfg)?;
        let credentials = credentials(&cfg, &http).await?;
        Self::build(cfg, http, credentials)
    }

    fn check_settings(cfg: &S3Config) -> Result<(), S3Error> {
        if cfg.bucket.is_empty() {
            return Err(config_err("the bucket name is empty; pass --s3-bucket"));
        }
        if cfg.region.is_empty() {
            return Err(config_err("the region is empty; pass e.g. us-east-1"));
        }
        if !(MIN_PART..=MAX_PART).contains(&cfg.part_size) {
            return Err(config_err(format!(
                "part_size {} is outside S3's 5 MiB..5 GiB",
                cfg.part_size
            )));
        }
        Ok(())
    }

    fn build(
        cfg: S3Config,
        http: SharedHttpClient,
        credentials: SharedCredentialsProvider,
    ) -> Result<Self, S3Error> {
        let mut builder = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(cfg.region.clone()))
            .credentials_provider(credentials)
            // No CRC32 of every body on both ends (the SDK's default since 2025): segments
            // are small and many, and the assembler checks each one's length against its
            // record. Requests stay SigV4-signed.
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            )
            .http_client(http)
            .interceptor(CountRequests)
            // No request hangs for ever (a stuck read, a server that stopped answering):
            // it fails as an outage and the caller retries later.
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(OPERATION_ATTEMPT_TIMEOUT)
                    .build(),
            );
        let http_url = |url: &str, flag: &str| {
            if url.starts_with("http://") || url.starts_with("https://") {
                Ok(())
            } else {
                Err(config_err(format!(
                    "{flag} {url:?} must start with http:// or https://"
                )))
            }
        };
        let presigner = match &cfg.public_endpoint {
            Some(url) => {
                http_url(url, "--s3-public-endpoint")?;
                let conf = builder
                    .clone()
                    .endpoint_url(url)
                    .force_path_style(true)
                    .build();
                Some(aws_sdk_s3::Client::from_conf(conf))
            }
            None => None,
        };
        let endpoint = match &cfg.endpoint {
            Some(url) => {
                http_url(url, "endpoint")?;
                builder = builder.endpoint_url(url).force_path_style(true);
                // Printed in errors and logs: without credentials.
                narrator_net::redact(url.trim_end_matches('/'))
            }
            None => format!("https://s3.{}.amazonaws.com", cfg.region),
        };
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            presigner,
            bucket: cfg.bucket,
            prefix: cfg.prefix,
            endpoint,
            multipart_threshold: cfg.multipart_threshold,
            part_size: cfg.part_size,
        })
    }

    /// Connects and checks with `HeadBucket` that the bucket exists and the credentials
    /// are accepted.
    pub async fn connect(cfg: S3Config) -> Result<Self, S3Error> {
        let store = Self::new(cfg).await?;
        store.check_bucket().await?;
        Ok(store)
    }

    /// Like [`S3AudioStore::connect`], but creates the bucket when it is missing.
    pub async fn ensure_bucket(cfg: S3Config) -> Result<Self, S3Error> {
        let region = cfg.region.clone();
        let store = Self::new(cfg).await?;
        match store.check_bucket().await {
            Err(S3Error::NoSuchBucket { .. }) => {}
            other => return other.map(|()| store),
        }
        let mut req = store.client.create_bucket().bucket(&store.bucket);
        if region != "us-east-1" {
            req = req.create_bucket_configuration(
                CreateBucketConfiguration::builder()
                    .location_constraint(BucketLocationConstraint::from(region.as_str()))
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => {}
            // Another process created it in between.
            Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => {}
            Err(e) => return Err(store.classify("create_bucket", &store.bucket, e)),
        }
        tracing::info!(bucket = %store.bucket, endpoint = %store.endpoint, "created S3 bucket");
        Ok(store)
    }

    async fn check_bucket(&self) -> Result<(), S3Error> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| self.classify("head_bucket", "", e))?;
        Ok(())
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The same client (endpoint, credentials, HTTP pool) on another bucket, without a
    /// key prefix: to read an object a producer names (`s3://bucket/key`).
    pub fn for_bucket(&self, bucket: &str) -> Self {
        Self {
            bucket: bucket.to_owned(),
            prefix: String::new(),
            ..self.clone()
        }
    }

    /// `{prefix}jobs/{job}/segments/{index:06}.wav`
    pub fn segment_key(&self, job: &str, index: u32) -> String {
        format!("{}jobs/{job}/segments/{index:06}.wav", self.prefix)
    }

    /// `{prefix}jobs/{job}/packs/{first:06}-{count}-{nonce}.wavs`: several segments' WAVs
    /// back to back. The nonce keeps two workers that stored the same segments (after a
    /// redelivery) from replacing each other's pack; the database points at one of them.
    pub fn pack_key(&self, job: &str, first: u32, count: usize) -> String {
        format!(
            "{}jobs/{job}/packs/{first:06}-{count}-{}.wavs",
            self.prefix,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// `{prefix}jobs/{job}/out/{name}`
    pub fn output_key(&self, job: &str, name: &str) -> String {
        format!("{}jobs/{job}/out/{name}", self.prefix)
    }

    /// A URL that GETs `key` without credentials until `expires` has passed (at most
    /// 7 days), at the public endpoint when one is set.
    pub async fn presign_get(&self, key: &str, expires: Duration) -> Result<String, S3Error> {
        let presigning = PresigningConfig::expires_in(expires)
            .map_err(|e| config_err(format!("presigned URL lifetime {expires:?}: {e}")))?;
        let req = self
            .presigner
            .as_ref()
            .unwrap_or(&self.client)
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(presigning)
            .await
            .map_err(|e| self.classify("presign get_object", key, e))?;
        Ok(req.uri().to_owned())
    }

    /// The whole object.
    pub async fn get_bytes(&self, key: &str) -> Result<Vec<u8>, S3Error> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.classify("get_object", key, e))?;
        let body = out.body.collect().await.map_err(|e| S3Error::Request {
            action: format!("get_object {key}"),
            endpoint: self.endpoint.clone(),
            detail: format!("reading the body: {e}"),
            source: Box::new(e),
        })?;
        Ok(body.into_bytes().to_vec())
    }

    /// Stores `body` under `key` in one PUT (replacing any previous object).
    pub async fn put_bytes(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<(), S3Error> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| self.classify("put_object", key, e))?;
        Ok(())
    }

    /// Deletes `key` (deleting a missing object is not an error).
    pub async fn delete(&self, key: &str) -> Result<(), S3Error> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.classify("delete_object", key, e))?;
        Ok(())
    }

    /// The keys under `prefix`, in key order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, S3Error> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| self.classify("list_objects_v2", prefix, e))?;
            keys.extend(
                out.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_owned)),
            );
            match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => break,
            }
        }
        Ok(keys)
    }

    /// `{prefix}jobs/{job}/segments/` and `{prefix}jobs/{job}/packs/`: where a job's
    /// intermediate audio lives (the outputs are under `out/`).
    pub fn intermediate_prefixes(&self, job: &str) -> [String; 2] {
        [
            format!("{}jobs/{job}/segments/", self.prefix),
            format!("{}jobs/{job}/packs/", self.prefix),
        ]
    }

    /// Deletes every intermediate object of `job` (segments and packs, including any a
    /// crashed worker stored but never recorded); returns how many. Run once the job's
    /// outputs are stored.
    pub async fn delete_intermediates(&self, job: &str) -> Result<usize, S3Error> {
        self.delete_under(&self.intermediate_prefixes(job)).await
    }

    /// Deletes every object of `job` (`{prefix}jobs/{job}/`: intermediates and outputs);
    /// returns how many. For a cancelled job.
    pub async fn delete_job(&self, job: &str) -> Result<usize, S3Error> {
        self.delete_under(&[self.job_prefix(job)]).await
    }

    /// `{prefix}jobs/{job}/`: everything of `job` (its intermediates and `out/`).
    pub fn job_prefix(&self, job: &str) -> String {
        format!("{}jobs/{job}/", self.prefix)
    }

    /// Deletes every object under `prefixes`; returns how many.
    async fn delete_under(&self, prefixes: &[String]) -> Result<usize, S3Error> {
        let mut n = 0;
        for prefix in prefixes {
            for key in self.list(prefix).await? {
                self.delete(&key).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The object's size, or `None` when it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<u64>, S3Error> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(
                out.content_length()
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0),
            )),
            Err(e) if e.raw_response().map(|r| r.status().as_u16()) == Some(404) => Ok(None),
            Err(e) => Err(self.classify("head_object", key, e)),
        }
    }

    /// Uploads a local file to `key`: one PUT up to `multipart_threshold`, else multipart.
    pub async fn put_file(&self, key: &str, file: &Path) -> Result<(), S3Error> {
        let local = |source| S3Error::LocalIo {
            path: file.to_owned(),
            source,
        };
        let content_type = content_type_for(key);
        let len = tokio::fs::metadata(file).await.map_err(local)?.len();
        if len <= self.multipart_threshold {
            let body = tokio::fs::read(file).await.map_err(local)?;
            return self.put_bytes(key, body, content_type).await;
        }
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .send()
            .await
            .map_err(|e| self.classify("create_multipart_upload", key, e))?;
        let Some(upload_id) = created.upload_id() else {
            return Err(S3Error::Request {
                action: format!("create_multipart_upload {key}"),
                endpoint: self.endpoint.clone(),
                detail: "the response has no UploadId".into(),
                source: "no UploadId".into(),
            });
        };
        let result = match self.upload_parts(key, upload_id, file, len).await {
            Ok(parts) => self
                .client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map(|_| ())
                .map_err(|e| self.classify("complete_multipart_upload", key, e)),
            Err(e) => Err(e),
        };
        if result.is_err() {
            // Nothing of an aborted upload is ever visible under `key`.
            if let Err(e) = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .send()
                .await
            {
                tracing::warn!(key, upload_id, error = %DisplayErrorContext(&e), "abort_multipart_upload failed; a lifecycle rule for incomplete uploads cleans it up");
            }
        }
        result
    }

    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        file: &Path,
        len: u64,
    ) -> Result<Vec<CompletedPart>, S3Error> {
        let local = |source| S3Error::LocalIo {
            path: file.to_owned(),
            source,
        };
        // Grow the parts when the file would need more than S3's 10,000.
        let part_size = self.part_size.max(len.div_ceil(MAX_PARTS));
        let part_len = usize::try_from(part_size).map_err(|_| config_err("part_size too large"))?;
        let joined = |done: Result<Result<CompletedPart, S3Error>, tokio::task::JoinError>| {
            done.map_err(|e| S3Error::Request {
                action: format!("upload_part {key}"),
                endpoint: self.endpoint.clone(),
                detail: format!("the upload task failed: {e}"),
                source: Box::new(e),
            })?
        };
        let mut f = tokio::fs::File::open(file).await.map_err(local)?;
        // Parts go up PARTS_IN_FLIGHT at a time (memory: that many parts), read from the
        // file in order; the first failure ends the upload (the caller aborts it).
        let mut uploads: tokio::task::JoinSet<Result<CompletedPart, S3Error>> =
            tokio::task::JoinSet::new();
        let mut parts = Vec::new();
        for part_number in 1i32.. {
            let mut buf = vec![0u8; part_len];
            let mut filled = 0;
            while filled < part_len {
                let n = f.read(&mut buf[filled..]).await.map_err(local)?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 && part_number > 1 {
                break;
            }
            buf.truncate(filled);
            let last = filled < part_len;
            if uploads.len() >= PARTS_IN_FLIGHT
                && let Some(done) = uploads.join_next().await
            {
                parts.push(joined(done)?);
            }
            let this = self.clone();
            let (key, upload_id) = (key.to_owned(), upload_id.to_owned());
            uploads.spawn(async move {
                let out = this
                    .client
                    .upload_part()
                    .bucket(&this.bucket)
                    .key(&key)
                    .upload_id(upload_id)
                    .part_number(part_number)
                    .body(ByteStream::from(buf))
                    .send()
                    .await
                    .map_err(|e| {
                        this.classify("upload_part", &format!("{key} #{part_number}"), e)
                    })?;
                Ok(CompletedPart::builder()
                    .part_number(part_number)
                    .set_e_tag(out.e_tag().map(str::to_owned))
                    .build())
            });
            if last {
                break;
            }
        }
        while let Some(done) = uploads.join_next().await {
            parts.push(joined(done)?);
        }
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
    }

    fn classify<E>(&self, action: &str, key: &str, err: SdkError<E, HttpResponse>) -> S3Error
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let action = if key.is_empty() {
            format!("{action} {}", self.bucket)
        } else {
            format!("{action} {key}")
        };
        let status = err.raw_response().map(|r| r.status().as_u16());
        let code = err.code().map(str::to_owned);
        if matches!(
            err,
            SdkError::DispatchFailure(_) | SdkError::TimeoutError(_)
        ) {
            if let Some(problem) = narrator_net::tls_problem(&err) {
                return S3Error::Tls {
                    endpoint: self.endpoint.clone(),
                    action,
                    problem,
                    source: Box::new(err),
                };
            }
            return S3Error::Unreachable {
                endpoint: self.endpoint.clone(),
                action,
                source: Box::new(err),
            };
        }
        let bucket_op = action.starts_with("head_bucket") || action.starts_with("create_bucket");
        if code.as_deref() == Some("NoSuchBucket") || (bucket_op && status == Some(404)) {
            return S3Error::NoSuchBucket {
                bucket: self.bucket.clone(),
                endpoint: self.endpoint.clone(),
            };
        }
        if status == Some(403)
            || matches!(
                code.as_deref(),
                Some("AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch")
            )
        {
            return S3Error::Denied {
                code: code.unwrap_or_else(|| "HTTP 403".into()),
                action,
                bucket: self.bucket.clone(),
                endpoint: self.endpoint.clone(),
                source: Box::new(err),
            };
        }
        if code.as_deref() == Some("NoSuchKey") || status == Some(404) {
            return S3Error::NotFound {
                bucket: self.bucket.clone(),
                key: key.to_owned(),
            };
        }
        if let Some(status) = status.filter(|&s| rejects(s)) {
            return S3Error::Rejected {
                action,
                endpoint: self.endpoint.clone(),
                status,
                code: code.unwrap_or_else(|| "unknown".into()),
                source: Box::new(err),
            };
        }
        S3Error::Request {
            action,
            endpoint: self.endpoint.clone(),
            detail: DisplayErrorContext(&err).to_string(),
            source: Box::new(err),
        }
    }
}

/// Whether an HTTP status says the request itself is refused (4xx), not that the server
/// is busy or slow (408 Request Timeout, 429 Too Many Requests) or away (5xx). 403 and
/// 404 have errors of their own.
fn rejects(status: u16) -> bool {
    (400..500).contains(&status) && !matches!(status, 403 | 404 | 408 | 429)
}

impl AudioStore for S3AudioStore {
    async fn put_segment(
        &self,
        job: &str,
        index: u32,
        audio: &SegmentAudio,
    ) -> Result<(), SeamError> {
        let key = self.segment_key(job, index);
        let bytes = narrator_audio::encode_wav_bytes(audio.sample_rate, &audio.samples).map_err(
            |source| S3Error::Audio {
                key: key.clone(),
                source,
            },
        )?;
        Ok(self.put_bytes(&key, bytes, "audio/wav").await?)
    }

    async fn get_segment(&self, job: &str, index: u32) -> Result<SegmentAudio, SeamError> {
        let key = self.segment_key(job, index);
        let bytes = self.get_bytes(&key).await?;
        let (sample_rate, samples) = narrator_audio::decode_wav_bytes(&bytes)
            .map_err(|source| S3Error::Audio { key, source })?;
        Ok(SegmentAudio {
            sample_rate,
            samples,
        })
    }

    async fn has_segment(&self, job: &str, index: u32) -> Result<bool, SeamError> {
        Ok(self.head(&self.segment_key(job, index)).await?.is_some())
    }

    async fn put_output(&self, job: &str, name: &str, file: &Path) -> Result<(), SeamError> {
        Ok(self.put_file(&self.output_key(job, name), file).await?)
    }

    /// One object per call, under a key of its own (a pack, even of one segment): two
    /// copies of a segment (a duplicate delivery) never overwrite each other, and the
    /// record that wins points at exactly the audio it describes.
    async fn put_segments(
        &self,
        job: &str,
        items: &[(u32, &SegmentAudio)],
    ) -> Result<Vec<Option<PackedAt>>, SeamError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let first = items.iter().map(|(i, _)| *i).min().unwrap_or(0);
        let key = self.pack_key(job, first, items.len());
        let mut body = Vec::new();
        let mut places = Vec::with_capacity(items.len());
        for (_, audio) in items {
            let wav = narrator_audio::encode_wav_bytes(audio.sample_rate, &audio.samples).map_err(
                |source| S3Error::Audio {
                    key: key.clone(),
                    source,
                },
            )?;
            places.push(Some(PackedAt {
                key: key.clone(),
                offset: body.len() as u64,
                len: wav.len() as u64,
            }));
            body.extend_from_slice(&wav);
        }
        self.put_bytes(&key, body, "application/octet-stream")
            .await?;
        Ok(places)
    }

    async fn get_pack(&self, _job: &str, key: &str) -> Result<Vec<u8>, SeamError> {
        Ok(self.get_bytes(key).await?)
    }

    async fn discard(&self, _job: &str, keys: &[String]) -> Result<(), SeamError> {
        for key in keys {
            self.delete(key).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_are_rejections_but_throttling_and_timeouts_are_not() {
        for s in [400, 409, 411, 413, 414, 431] {
            assert!(rejects(s), "{s}");
        }
        for s in [403, 404, 408, 429, 500, 502, 503, 200, 301] {
            assert!(!rejects(s), "{s}");
        }
    }

    #[test]
    fn debug_hides_the_secret() {
        let cfg = S3Config {
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some("very-secret-value".into()),
            ..S3Config::default()
        };
        let text = format!("{cfg:?}");
        assert!(!text.contains("very-secret-value"), "{text}");
        assert!(
            text.contains("<redacted>") && text.contains("AKIDEXAMPLE"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn keys_and_content_types() {
        let store = S3AudioStore::new(S3Config {
            endpoint: Some("http://127.0.0.1:1".into()),
            access_key_id: Some("a".into()),
            secret_access_key: Some("b".into()),
            prefix: "narrator/".into(),
            ..S3Config::default()
        })
        .await
        .expect("build");
        assert_eq!(
            store.segment_key("j1", 42),
            "narrator/jobs/j1/segments/000042.wav"
        );
        assert_eq!(
            store.output_key("j1", "book.opus"),
            "narrator/jobs/j1/out/book.opus"
        );
        assert_eq!(content_type_for("a/b.OGG"), "audio/ogg");
        assert_eq!(content_type_for("x.mp3"), "audio/mpeg");
        assert_eq!(content_type_for("x.wav"), "audio/wav");
        assert_eq!(content_type_for("manifest.json"), "application/json");
        assert_eq!(content_type_for("noext"), "application/octet-stream");
    }

    #[tokio::test]
    async fn bad_settings_are_config_errors() {
        let small = S3AudioStore::new(S3Config {
            part_size: MIB,
            access_key_id: Some("a".into()),
            secret_access_key: Some("b".into()),
            ..S3Config::default()
        })
        .await
        .expect_err("small part");
        assert_eq!(small.kind(), "store_config");
        let half = S3AudioStore::new(S3Config {
            access_key_id: Some("a".into()),
            ..S3Config::default()
        })
        .await
        .expect_err("half credentials");
        assert_eq!(SeamError::from(half).kind, "store_config");
    }
}
