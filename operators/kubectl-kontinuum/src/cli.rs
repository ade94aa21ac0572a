//! The command line: every command, flag and default, as clap derive types.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The namespace used when neither `-n` nor the kubeconfig context names one: the chart's
/// default namespace.
pub const DEFAULT_NAMESPACE: &str = "kontinuum-system";

/// Text appended to `--help`: the exit codes scripts can rely on.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  usage or validation error (bad flag or value), or a local file/kubeconfig problem
  2  the Kubernetes API refused or failed a request
  3  timeout: --timeout passed before the zone got there, or an API call did not answer";

/// `kubectl kontinuum`: add, inspect and remove Kontinuum zones and instances on the hub.
///
/// The plugin only writes Zones and Instances; the operators on the hub do the rest.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-kontinuum",
    bin_name = "kubectl kontinuum",
    version,
    about = "Add, inspect and remove Kontinuum zones and instances on the hub",
    after_help = EXIT_CODES_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Options every command shares.
    #[command(flatten)]
    pub global: GlobalArgs,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Connection options, as kubectl spells them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Path to the kubeconfig file of the hub (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// Namespace of the Kontinuum objects (default: the context's namespace, else
    /// kontinuum-system).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// How long one call to the API server may take, e.g. 30s.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Add, list, describe and remove zones.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Zone(ZoneCommand),
    /// Register and list machines booted into Talos maintenance mode.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Instance(InstanceCommand),
    /// Print the plugin's version and the hub's Kontinuum version.
    #[command(after_help = EXIT_CODES_HELP)]
    Version,
    /// Print a shell completion script.
    #[command(after_help = EXIT_CODES_HELP)]
    Completion(CompletionArgs),
}

/// `zone …`.
#[derive(Debug, Subcommand)]
pub enum ZoneCommand {
    /// Create or update a Zone (server-side apply); the operators build the rest.
    ///
    /// The Zone is a declaration, as with `kubectl apply`: re-running with the same flags
    /// changes nothing, and a flag left out (e.g. a --talos-address) is removed from the
    /// Zone. `--dry-run=client -o yaml` prints the same object for a Git repository.
    #[command(after_help = EXIT_CODES_HELP)]
    Add(Box<ZoneAddArgs>),
    /// Delete a Zone: its cluster is torn down and its machines released.
    #[command(after_help = EXIT_CODES_HELP)]
    Remove(ZoneRemoveArgs),
    /// List the Zones of the namespace.
    #[command(after_help = EXIT_CODES_HELP)]
    List,
    /// Show a Zone as a tree: cluster, pools and machines, addons, registry entry.
    #[command(after_help = EXIT_CODES_HELP)]
    Describe(ZoneNameArg),
    /// Write the zone cluster's admin kubeconfig to a file, stdout, or the user's kubeconfig.
    #[command(after_help = EXIT_CODES_HELP)]
    Kubeconfig(ZoneKubeconfigArgs),
    /// Request a new identity for the zone (both certificates are accepted while the agent
    /// switches); after a revocation, this re-admits the zone.
    #[command(after_help = EXIT_CODES_HELP)]
    RotateIdentity(ZoneNameArg),
}

/// `zone add`.
#[derive(Debug, Clone, Args)]
pub struct ZoneAddArgs {
    /// Region of the zone (a DNS-1123 label).
    #[arg(long)]
    pub region: String,

    /// Name of the zone within its region (a DNS-1123 label).
    #[arg(long)]
    pub zone: String,

    /// Address (IP or DNS name) of a machine in Talos maintenance mode; repeat for more.
    #[arg(long = "talos-address", visible_alias = "seed", value_name = "ADDRESS")]
    pub talos_addresses: Vec<String>,

    /// Base DNS domain: the zone is published at <zone>.<region>.<domain>.
    #[arg(long)]
    pub domain: Option<String>,

    /// Talos version of the zone's machines, e.g. v1.13.0 (default: the operators').
    #[arg(long)]
    pub talos_version: Option<String>,

    /// Kubernetes version of the zone's cluster, e.g. v1.32.0 (default: the operators').
    #[arg(long)]
    pub kubernetes_version: Option<String>,

    /// Number of control-plane machines (default: 1).
    #[arg(long, value_name = "N")]
    pub control_plane_replicas: Option<i32>,

    /// A Talos machine-config patch for every machine of the zone (strategic merge, one
    /// YAML document per patch; a file of several documents is several patches); repeat
    /// for more, applied in order. Written into the Zone as spec.cluster.configPatches.
    #[arg(long = "patch", value_name = "FILE")]
    pub patches: Vec<std::path::PathBuf>,

    /// The zone cluster's Kubernetes API endpoint: a load balancer or DNS name (IP or DNS
    /// name) in front of its control planes, serving port 6443. Written into the Zone as
    /// spec.cluster.endpoint.host; it cannot be changed later. Default: the first
    /// control-plane machine's address (a single point of failure with more than one).
    #[arg(long, value_name = "HOST", conflicts_with = "vip")]
    pub endpoint: Option<String>,

    /// A Talos shared IP as the zone cluster's Kubernetes API endpoint: a free address of
    /// the control planes' layer-2 subnet, held by one healthy control plane and taken over
    /// by another when that one stops. Written into the Zone as spec.cluster.endpoint.vip;
    /// it cannot be changed later.
    #[arg(long, value_name = "IP")]
    pub vip: Option<std::net::IpAddr>,

    /// The link (network interface) the shared IP is put on, the same on every control
    /// plane.
    #[arg(long, value_name = "LINK", default_value = "eth0", requires = "vip")]
    pub vip_link: String,

    /// On removal, delete the zone's Instances instead of releasing them for reuse.
    #[arg(long)]
    pub unregister_instances_on_delete: bool,

    /// Take over fields another field manager (e.g. a GitOps tool) set, instead of failing
    /// with a conflict, as `kubectl apply --server-side --force-conflicts` does.
    #[arg(long, conflicts_with = "dry_run")]
    pub force_conflicts: bool,

    /// `client`: print the manifest instead of applying it (for a Git repository).
    #[arg(long, value_enum, value_name = "MODE")]
    pub dry_run: Option<DryRun>,

    /// Output format of --dry-run=client.
    #[arg(
        short = 'o',
        long,
        value_enum,
        requires = "dry_run",
        value_name = "FORMAT"
    )]
    pub output: Option<OutputFormat>,

    /// Wait until the Zone is Ready, showing every condition of the zone, its cluster and
    /// its addons.
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,

    /// How long --wait waits, e.g. 15m or 1h.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// Dry-run modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    /// Build and validate the manifest locally and print it; nothing is sent.
    Client,
}

/// Manifest output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// YAML (the default).
    Yaml,
    /// JSON.
    Json,
}

/// `zone remove`.
#[derive(Debug, Clone, Args)]
pub struct ZoneRemoveArgs {
    /// Name of the Zone (<region>-<zone>).
    pub name: String,

    /// Wait until the Zone and its TalosCluster are gone (the machines reset and released),
    /// showing their teardown progress and deadline.
    #[arg(long)]
    pub wait: bool,

    /// How long --wait waits, e.g. 20m.
    #[arg(long, default_value = "20m", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// A zone name argument.
#[derive(Debug, Clone, Args)]
pub struct ZoneNameArg {
    /// Name of the Zone (<region>-<zone>).
    pub name: String,
}

/// `zone kubeconfig`.
#[derive(Debug, Clone, Args)]
pub struct ZoneKubeconfigArgs {
    /// Name of the Zone (<region>-<zone>).
    pub name: String,

    /// Write the kubeconfig to this file (mode 0600) instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE", conflicts_with = "merge")]
    pub output: Option<PathBuf>,

    /// Merge it into the user's kubeconfig (--kubeconfig, else the first file of
    /// $KUBECONFIG, else ~/.kube/config) as a context named after the zone.
    #[arg(long)]
    pub merge: bool,
}

/// `instance …`.
#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// Register a machine booted into Talos maintenance mode (server-side apply).
    #[command(after_help = EXIT_CODES_HELP)]
    Add(InstanceAddArgs),
    /// List the Instances of the namespace.
    #[command(after_help = EXIT_CODES_HELP)]
    List,
}

/// `instance add`.
#[derive(Debug, Clone, Args)]
pub struct InstanceAddArgs {
    /// Address (IP or DNS name) of the machine's Talos API.
    #[arg(long)]
    pub address: String,

    /// Name of the Instance (default with --region/--zone: the zone's seed name for the
    /// address, <region>-<zone>-<hash>, so that `zone add` adopts it).
    #[arg(long)]
    pub name: Option<String>,

    /// Region label of the machine.
    #[arg(long, requires = "zone")]
    pub region: Option<String>,

    /// Zone label of the machine.
    #[arg(long, requires = "region")]
    pub zone: Option<String>,

    /// Take over fields another field manager set, instead of failing with a conflict.
    #[arg(long)]
    pub force_conflicts: bool,
}

/// `completion`.
#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Shells with completion scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

/// Parses a duration such as `15m`, `90s`, `1h30m` or `PT15M`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed: k8s_openapi::jiff::SignedDuration = text
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 30s, 15m or 1h"))?;
    Duration::try_from(parsed).map_err(|_| format!("{text:?} is negative"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn zone_add_flags_parse() {
        let cli = Cli::try_parse_from([
            "kubectl-kontinuum",
            "-n",
            "hub",
            "zone",
            "add",
            "--region",
            "eu",
            "--zone",
            "west-1a",
            "--talos-address",
            "192.0.2.10",
            "--seed",
            "192.0.2.11",
            "--dry-run=client",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("hub"));
        let Command::Zone(ZoneCommand::Add(args)) = cli.command else {
            panic!("not zone add");
        };
        assert_eq!(args.talos_addresses, ["192.0.2.10", "192.0.2.11"]);
        assert_eq!(args.dry_run, Some(DryRun::Client));
        assert_eq!(args.output, Some(OutputFormat::Json));
        assert_eq!(args.timeout, Duration::from_secs(900));
    }

    #[test]
    fn output_needs_dry_run_and_wait_excludes_it() {
        let base = [
            "kubectl-kontinuum",
            "zone",
            "add",
            "--region",
            "eu",
            "--zone",
            "a",
        ];
        let err = Cli::try_parse_from(base.iter().chain(&["-o", "yaml"])).unwrap_err();
        assert!(err.to_string().contains("--dry-run"), "{err}");
        let err =
            Cli::try_parse_from(base.iter().chain(&["--dry-run=client", "--wait"])).unwrap_err();
        assert!(err.to_string().contains("--wait"), "{err}");
    }

    #[test]
    fn help_documents_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("3  timeout"), "{help}");
    }
}
