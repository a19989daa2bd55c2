//! Who may do what: bearer tokens, each naming a tenant. `narrator serve token add NAME`
//! prints a new token once and keeps only its SHA-256 in the tokens file (JSON, mode
//! 0600); the server reads the file when it starts. With tokens, every `/v1` request
//! needs one (`Authorization: Bearer TOKEN`, or the cookie the web page's sign-in sets)
//! and sees only its tenant's jobs; without, the server listens on loopback only and
//! everything belongs to the tenant `local`. Tokens are never logged.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{ApiError, AppState};

/// The tenant of requests on a server without tokens.
pub const LOCAL_TENANT: &str = "local";

/// The cookie the web page's sign-in sets (HttpOnly, SameSite=Strict).
pub const COOKIE: &str = "narrator_token";

/// A request's tenant (put in its extensions by [`require_token`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// One token as the file keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredToken {
    /// Its name (unique in the file).
    pub name: String,
    /// Whose jobs it sees and makes.
    pub tenant: String,
    /// SHA-256 of the token, hex.
    pub sha256: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokenFile {
    version: u32,
    tokens: Vec<StoredToken>,
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn read(path: &Path) -> anyhow::Result<TokenFile> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a tokens file ({e}); fix it, or move it away and add tokens again",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenFile {
            version: 1,
            tokens: Vec::new(),
        }),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

fn write(path: &Path, file: &TokenFile) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(file)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

/// Adds a token named `name` for `tenant` to the file at `path` (made if missing) and
/// returns it: the only time it is seen.
pub fn add_token(path: &Path, name: &str, tenant: &str) -> anyhow::Result<String> {
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !valid(name) || !valid(tenant) {
        anyhow::bail!(
            "token names and tenants are 1 to 64 letters, digits, '-', '_' or '.'; got {name:?} for tenant {tenant:?}"
        );
    }
    let mut file = read(path)?;
    if file.tokens.iter().any(|t| t.name == name) {
        anyhow::bail!(
            "{} already has a token named {name:?}; remove it first (`narrator serve token remove {name}`) or choose another name",
            path.display()
        );
    }
    // 244 bits from the operating system's generator (two version-4 UUIDs).
    let token = format!(
        "nrt_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    file.version = 1;
    file.tokens.push(StoredToken {
        name: name.to_string(),
        tenant: tenant.to_string(),
        sha256: digest(&token),
        created_at: Utc::now(),
    });
    write(path, &file)?;
    Ok(token)
}

/// Removes the token named `name`.
pub fn remove_token(path: &Path, name: &str) -> anyhow::Result<()> {
    let mut file = read(path)?;
    let before = file.tokens.len();
    file.tokens.retain(|t| t.name != name);
    if file.tokens.len() == before {
        anyhow::bail!(
            "{} has no token named {name:?} (`narrator serve token list` lists them)",
            path.display()
        );
    }
    write(path, &file)
}

/// The tokens in the file (their hashes, names and tenants).
pub fn list_tokens(path: &Path) -> anyhow::Result<Vec<StoredToken>> {
    Ok(read(path)?.tokens)
}

/// The tokens a server accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    /// SHA-256 hex → tenant.
    by_digest: HashMap<String, String>,
}

impl Tokens {
    /// The tokens of the file at `path` (none when it does not exist).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Ok(Tokens {
            by_digest: read(path)?
                .tokens
                .into_iter()
                .map(|t| (t.sha256, t.tenant))
                .collect(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The tenant of `token`, if it is one of these.
    pub fn tenant(&self, token: &str) -> Option<&str> {
        self.by_digest.get(&digest(token)).map(String::as_str)
    }
}

/// The token a request carries: `Authorization: Bearer …`, else the sign-in cookie.
fn presented(req: &Request) -> Option<&str> {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    bearer.or_else(|| {
        req.headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)
            .map(|(_, v)| v)
    })
}

/// A request's tenant: from its token, or `local` when the server has no tokens; else
/// why not (a code and a message).
pub fn tenant_of(state: &AppState, req: &Request) -> Result<Tenant, (&'static str, &'static str)> {
    if state.tokens.is_empty() {
        return Ok(Tenant(LOCAL_TENANT.to_string()));
    }
    match presented(req) {
        None => Err((
            "missing_token",
            "this server needs a token: send `Authorization: Bearer TOKEN` (the operator makes one with `narrator serve token add NAME`)",
        )),
        Some(t) => state.tokens.tenant(t).map(|t| Tenant(t.to_string())).ok_or((
            "invalid_token",
            "the token is not one this server knows; check it, or ask the operator for a new one",
        )),
    }
}

/// Runs `next` with the request's [`Tenant`] in its extensions, or answers `refuse`.
pub async fn with_tenant(
    state: &AppState,
    mut req: Request,
    next: Next,
    refuse: impl FnOnce(&'static str, &'static str) -> Response,
) -> Response {
    match tenant_of(state, &req) {
        Ok(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        Err((code, message)) => refuse(code, message),
    }
}

/// Middleware on `/v1`: the request's tenant from its token (401 without a valid one),
/// or `local` when the server has no tokens.
pub async fn require_token(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    with_tenant(&state, req, next, unauthorized).await
}

fn unauthorized(code: &'static str, message: &str) -> Response {
    let mut res = ApiError::with(StatusCode::UNAUTHORIZED, code, message).into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"narrator\""),
    );
    res
}

/// Speech requests each tenant has in progress, bounded per tenant (429 beyond).
#[derive(Debug, Default)]
pub struct SpeechSlots {
    limit: usize,
    taken: Mutex<HashMap<String, usize>>,
}

/// A speech request's place; given back when dropped.
#[derive(Debug)]
pub struct SpeechSlot {
    slots: Arc<SpeechSlots>,
    tenant: String,
}

impl SpeechSlots {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            taken: Mutex::new(HashMap::new()),
        }
    }

    /// A place for one more of `tenant`'s requests, or 429 with `Retry-After`.
    pub fn take(self: &Arc<Self>, tenant: &str) -> Result<SpeechSlot, ApiError> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let n = taken.entry(tenant.to_string()).or_default();
        if *n >= self.limit {
            return Err(ApiError::with(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                format!(
                    "{} speech requests of yours are in progress, the most this server takes at once (--speech-per-tenant); wait for one to finish",
                    self.limit
                ),
            )
            .retry_after(1));
        }
        *n += 1;
        Ok(SpeechSlot {
            slots: self.clone(),
            tenant: tenant.to_string(),
        })
    }
}

impl Drop for SpeechSlot {
    fn drop(&mut self) {
        let mut taken = self.slots.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = taken.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                taken.remove(&self.tenant);
            }
        }
    }
}
