//! `narrator serve`: the flags, the voice's engine loaded once, then the server
//! ([`narrator_serve::run`]).

use std::sync::Arc;

use narrator_serve::ServeConfig;

use crate::cli::{ServeAction, ServeArgs, TokenAction};
use crate::engine;
use crate::paths::Paths;

/// `narrator serve`.
pub(crate) async fn serve(
    paths: &Paths,
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| paths.data.join("serve"));
    let tokens_file = args
        .tokens
        .clone()
        .unwrap_or_else(|| data.join("tokens.json"));
    if let Some(ServeAction::Token(action)) = args.action {
        return token(&tokens_file, action);
    }
    let tokens = narrator_serve::auth::Tokens::load(&tokens_file)?;
    let loopback = args
        .listen
        .rsplit_once(':')
        .map(|(host, _)| host.trim_matches(['[', ']']))
        .is_some_and(|h| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
    if !loopback && tokens.is_empty() {
        anyhow::bail!(
            "--listen {} is not a loopback address, and {} has no tokens: make one with `narrator serve token add NAME` (or listen on 127.0.0.1)",
            args.listen,
            tokens_file.display()
        );
    }
    let voice = engine::find_voice(paths, &args.engine)?;
    let planning = match args.engine.calibrate.as_deref() {
        Some(p) => p.parse()?,
        None => engine::Planning::CachedOnly,
    };
    let fleet = match args.fleet {
        true => Some(fleet(paths, &args).await?),
        false => None,
    };
    let loaded = engine::load(
        paths,
        &engine::options(&args.engine),
        voice.clone(),
        planning,
        &Default::default(),
    )?;
    narrator_serve::run(
        ServeConfig {
            listen: args.listen,
            voice,
            parallel: loaded.in_flight,
            synth: Arc::new(loaded.synth),
            max_input_chars: args.max_input_chars,
            pauses: args.text.pauses(),
            data: Some(data),
            jobs: usize::from(args.jobs),
            voices_dir: paths.voices.clone(),
            max_input_bytes: args.text.max_input_mb.saturating_mul(1024 * 1024),
            tokens,
            speech_per_tenant: usize::from(args.speech_per_tenant),
            cors_origins: args.cors_origins,
            fleet,
            metrics_open: args.metrics_open,
        },
        shutdown,
    )
    .await
}

/// `narrator serve token add|list|remove`.
fn token(file: &std::path::Path, action: TokenAction) -> anyhow::Result<()> {
    use narrator_serve::auth;
    match action {
        TokenAction::Add { name, tenant } => {
            let tenant = tenant.unwrap_or_else(|| name.clone());
            let token = auth::add_token(file, &name, &tenant)?;
            eprintln!(
                "token {name:?} for tenant {tenant:?} added to {} (shown once; a running server reads it when restarted):",
                file.display()
            );
            println!("{token}");
        }
        TokenAction::List { json } => {
            let tokens = auth::list_tokens(file)?;
            if json {
                let list: Vec<_> = tokens
                    .iter()
                    .map(|t| serde_json::json!({"name": t.name, "tenant": t.tenant, "created_at": t.created_at}))
                    .collect();
                println!("{}", serde_json::Value::Array(list));
            } else if tokens.is_empty() {
                eprintln!("no tokens in {}", file.display());
            } else {
                println!("{:<24} {:<24} created", "name", "tenant");
                for t in tokens {
                    println!(
                        "{:<24} {:<24} {}",
                        t.name,
                        t.tenant,
                        t.created_at.format("%Y-%m-%d %H:%M")
                    );
                }
            }
        }
        TokenAction::Remove { name } => {
            auth::remove_token(file, &name)?;
            eprintln!("token {name:?} removed from {}", file.display());
        }
    }
    Ok(())
}

/// `--fleet`: the database (migrated), the broker and the bucket, connected.
async fn fleet(
    paths: &Paths,
    args: &ServeArgs,
) -> anyhow::Result<narrator_serve::fleet::FleetJobs> {
    let pool = crate::cluster::database(&args.services).await?;
    let conn = crate::cluster::broker(&args.services, "narrator-serve").await?;
    let store = crate::cluster::store(&args.services).await?;
    narrator_serve::fleet::FleetJobs::connect(
        pool,
        conn,
        store,
        paths.voices.clone(),
        args.text.max_input_mb.saturating_mul(1024 * 1024),
    )
    .await
}
