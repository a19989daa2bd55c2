//! `narrator serve`: the flags, the voice's engine loaded once, then the server
//! ([`narrator_serve::run`]).

use std::sync::Arc;

use narrator_serve::ServeConfig;

use crate::cli::ServeArgs;
use crate::engine;
use crate::paths::Paths;

/// `narrator serve`.
pub(crate) async fn serve(
    paths: &Paths,
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let loopback = args
        .listen
        .rsplit_once(':')
        .map(|(host, _)| host.trim_matches(['[', ']']))
        .is_some_and(|h| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
    if !loopback {
        anyhow::bail!(
            "--listen {} is not a loopback address, and this server has no tokens yet: listen on 127.0.0.1 (put a proxy with authentication in front to reach it from elsewhere)",
            args.listen
        );
    }
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| paths.data.join("serve"));
    let voice = engine::find_voice(paths, &args.engine)?;
    let planning = match args.engine.calibrate.as_deref() {
        Some(p) => p.parse()?,
        None => engine::Planning::CachedOnly,
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
        },
        shutdown,
    )
    .await
}
