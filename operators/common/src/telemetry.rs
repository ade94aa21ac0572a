//! Structured logging. Fields carry the values; messages are short and constant
//! (STYLE.md section 3.5). `RUST_LOG`, when set, overrides `--log-level` for debugging.

use tracing_subscriber::EnvFilter;

use crate::args::{LogFormat, LogLevel};

/// Installs the global subscriber. `crate_target` is the calling binary's crate name
/// (`env!("CARGO_CRATE_NAME")`), logged at `level` along with every `kontinuum*` crate.
/// Fails if a subscriber is already installed.
pub fn init(
    level: LogLevel,
    format: LogFormat,
    crate_target: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(directive(level, crate_target)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .flatten_event(true)
            .try_init(),
        LogFormat::Console => builder.try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    }
}

/// The filter for a level: our crates (targets starting with `kontinuum`, and the binary's
/// own) at that level, everything else one step quieter (kube's client is chatty).
fn directive(level: LogLevel, crate_target: &str) -> String {
    let (ours, others) = match level {
        LogLevel::Debug => ("debug", "info"),
        LogLevel::Info => ("info", "warn"),
        LogLevel::Warn => ("warn", "warn"),
        LogLevel::Error => ("error", "error"),
    };
    format!("{others},kontinuum={ours},{crate_target}={ours}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_crates_log_at_the_chosen_level_others_quieter() {
        let d = directive(LogLevel::Info, "pool_claimer");
        assert_eq!(d, "warn,kontinuum=info,pool_claimer=info");
        assert!(EnvFilter::try_new(&d).is_ok());
        assert!(EnvFilter::try_new(directive(LogLevel::Debug, "x")).is_ok());
    }
}
