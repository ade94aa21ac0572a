//! The commands: each observes (a few bounded reads), calls the pure builders and renderers
//! of the other modules, and acts (one server-side apply or delete). The plugin writes only
//! Zones and Instances, with the field manager [`FIELD_MANAGER`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::labels;
use kontinuum_crds::v1alpha2::{
    Addon, Instance, InstancePool, KUBECONFIG_KEY, Kontinuum, TalosCluster, Zone,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cli::{
    Cli, Command, CompletionArgs, GlobalArgs, InstanceAddArgs, InstanceCommand, OutputFormat,
    Shell, ZoneAddArgs, ZoneCommand, ZoneKubeconfigArgs, ZoneRemoveArgs,
};
use crate::error::Error;
use crate::hub::{Hub, offline_namespace};
use crate::style::Style;
use crate::tree::{self, ZoneObjects};
use crate::{kubeconfig, manifest, view};

/// The field manager of everything the plugin applies.
pub const FIELD_MANAGER: &str = "kubectl-kontinuum";

/// Where output goes and how it looks.
pub struct Terminal {
    /// Whether stdout is a terminal (redraw in place, colour).
    pub is_tty: bool,
    /// Colours.
    pub style: Style,
    /// Columns of the terminal (lines are cut to fit when redrawing in place).
    pub width: usize,
}

impl Terminal {
    /// Detects stdout: a terminal, `NO_COLOR`, and `COLUMNS` (default 120).
    pub fn detect() -> Self {
        use std::io::IsTerminal as _;
        let is_tty = std::io::stdout().is_terminal();
        let no_color = std::env::var("NO_COLOR").ok();
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .filter(|w| *w > 20)
            .unwrap_or(120);
        Self {
            is_tty,
            style: Style::detect(is_tty, no_color.as_deref()),
            width,
        }
    }
}

fn out(text: &str) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(Error::Output)
}

fn note(text: &str) -> Result<(), Error> {
    let mut stderr = std::io::stderr().lock();
    writeln!(stderr, "{text}").map_err(Error::Output)
}

/// Runs a parsed command line.
pub async fn run(cli: Cli, term: &Terminal) -> Result<(), Error> {
    let global = cli.global;
    match cli.command {
        Command::Zone(ZoneCommand::Add(args)) => zone_add(&global, &args, term).await,
        Command::Zone(ZoneCommand::Remove(args)) => zone_remove(&global, &args, term).await,
        Command::Zone(ZoneCommand::List) => zone_list(&global, term).await,
        Command::Zone(ZoneCommand::Describe(arg)) => zone_describe(&global, &arg.name, term).await,
        Command::Zone(ZoneCommand::Kubeconfig(args)) => zone_kubeconfig(&global, &args).await,
        Command::Zone(ZoneCommand::RotateIdentity(arg)) => {
            zone_rotate_identity(&global, &arg.name).await
        }
        Command::Instance(InstanceCommand::Add(args)) => instance_add(&global, &args).await,
        Command::Instance(InstanceCommand::List) => instance_list(&global, term).await,
        Command::Version => version(&global).await,
        Command::Completion(args) => completion(&args),
    }
}

async fn zone_add(global: &GlobalArgs, args: &ZoneAddArgs, term: &Terminal) -> Result<(), Error> {
    if args.dry_run.is_some() {
        let zone = manifest::zone(args, &offline_namespace(global)?)?;
        return out(&manifest::render(
            &zone,
            args.output.unwrap_or(OutputFormat::Yaml),
        )?);
    }
    // Validate before connecting: a bad flag never needs a cluster to be reported.
    manifest::zone(args, "kontinuum-system")?;
    let hub = Hub::connect(global).await?;
    let zone = manifest::zone(args, &hub.namespace)?;
    let name = zone.name_any();
    let outcome = apply(&hub, &zone, args.force_conflicts).await?;
    out(&format!("zone.kontinuum.sh/{name} {outcome}\n"))?;
    if args.wait {
        wait(&hub, &name, args.timeout, WaitFor::Ready, term).await?;
    }
    Ok(())
}

/// Sets the Zone's `kontinuum.sh/rotate-identity` annotation to a new value (the current
/// time). A merge patch, not an apply: an apply of the annotation alone under our field
/// manager would drop the spec fields `zone add` applied.
async fn zone_rotate_identity(global: &GlobalArgs, name: &str) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let api: Api<Zone> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let value = Timestamp::now().to_string();
    let patch = serde_json::json!({
        "metadata": { "annotations": { labels::ROTATE_IDENTITY: value } }
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let found = hub
        .call(|| format!("annotating Zone {name}"), async {
            match api.patch(name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await?;
    if !found {
        return Err(Error::NotFound(format!(
            "zone {name:?} not found in namespace {}",
            hub.namespace
        )));
    }
    out(&format!(
        "zone.kontinuum.sh/{name} identity rotation requested ({}={value}); status.identityThumbprint changes once the zone-installer has issued the new identity\n",
        labels::ROTATE_IDENTITY
    ))
}

async fn instance_add(global: &GlobalArgs, args: &InstanceAddArgs) -> Result<(), Error> {
    manifest::instance(args, "kontinuum-system")?;
    let hub = Hub::connect(global).await?;
    let instance = manifest::instance(args, &hub.namespace)?;
    let outcome = apply(&hub, &instance, args.force_conflicts).await?;
    out(&format!(
        "instance.kontinuum.sh/{} {outcome}\n",
        instance.name_any()
    ))
}

/// Server-side applies `object` with [`FIELD_MANAGER`] and says what happened: `created`,
/// `configured`, or `unchanged` (the apply was a no-op: same resourceVersion). With
/// `force`, fields another manager owns are taken over instead of refused.
async fn apply<K>(hub: &Hub, object: &K, force: bool) -> Result<&'static str, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let name = object.name_any();
    let kind = K::kind(&());
    let before = hub
        .call(|| format!("reading {kind} {name}"), api.get_opt(&name))
        .await?;
    let mut params = PatchParams::apply(FIELD_MANAGER);
    if force {
        params = params.force();
    }
    let after = hub
        .call(
            || format!("applying {kind} {name}"),
            api.patch(&name, &params, &Patch::Apply(object)),
        )
        .await?;
    Ok(match before {
        None => "created",
        Some(before) if before.resource_version() == after.resource_version() => "unchanged",
        Some(_) => "configured",
    })
}

async fn zone_remove(
    global: &GlobalArgs,
    args: &ZoneRemoveArgs,
    term: &Terminal,
) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let api: Api<Zone> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let name = &args.name;
    let found = hub
        .call(|| format!("deleting Zone {name}"), async {
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await?;
    if !found {
        return Err(Error::NotFound(format!(
            "zone {name:?} not found in namespace {}",
            hub.namespace
        )));
    }
    out(&format!("zone.kontinuum.sh/{name} deleted\n"))?;
    if args.wait {
        wait(&hub, name, args.timeout, WaitFor::Gone, term).await?;
    }
    Ok(())
}

async fn list<K>(hub: &Hub) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let kind = K::kind(&());
    let list = hub
        .call(
            || format!("listing {kind}s in namespace {}", hub.namespace),
            api.list(&ListParams::default()),
        )
        .await?;
    Ok(list.items)
}

async fn get_opt<K>(hub: &Hub, name: &str) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let kind = K::kind(&());
    hub.call(|| format!("reading {kind} {name}"), api.get_opt(name))
        .await
}

async fn zone_list(global: &GlobalArgs, term: &Terminal) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let zones: Vec<Zone> = list(&hub).await?;
    if zones.is_empty() {
        return note(&format!("No zones found in namespace {}.", hub.namespace));
    }
    out(&tree::zone_table(&zones, Timestamp::now(), term.style))
}

async fn instance_list(global: &GlobalArgs, term: &Terminal) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let instances: Vec<Instance> = list(&hub).await?;
    if instances.is_empty() {
        return note(&format!(
            "No instances found in namespace {}.",
            hub.namespace
        ));
    }
    out(&tree::instance_table(
        &instances,
        Timestamp::now(),
        term.style,
    ))
}

async fn zone_describe(global: &GlobalArgs, name: &str, term: &Terminal) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let zone: Zone = get_opt(&hub, name).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "zone {name:?} not found in namespace {}",
            hub.namespace
        ))
    })?;
    let objects = ZoneObjects {
        cluster: get_opt(&hub, name).await?,
        pools: list::<InstancePool>(&hub).await?,
        instances: list(&hub).await?,
        addons: list(&hub).await?,
        registry: list(&hub).await?,
    };
    let root = tree::describe_tree(&zone, &objects, Timestamp::now());
    out(&tree::render_tree(&root, term.style))
}

async fn zone_kubeconfig(global: &GlobalArgs, args: &ZoneKubeconfigArgs) -> Result<(), Error> {
    let hub = Hub::connect(global).await?;
    let name = &args.name;
    let cluster: TalosCluster = get_opt(&hub, name).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "TalosCluster {name:?} not found in namespace {}: has the zone been added?",
            hub.namespace
        ))
    })?;
    let secret_name = cluster
        .status
        .as_ref()
        .and_then(|s| s.secret_ref.as_ref())
        .map(|r| r.name.clone())
        .ok_or_else(|| {
            Error::NotFound(format!(
                "TalosCluster {name:?} has no kubeconfig yet (status.secretRef is unset)"
            ))
        })?;
    let secret: Secret = get_opt(&hub, &secret_name).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "Secret {secret_name:?} of TalosCluster {name:?} not found"
        ))
    })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            Error::NotFound(format!(
                "Secret {secret_name:?} of TalosCluster {name:?} has no {KUBECONFIG_KEY:?} key yet"
            ))
        })?;
    let text = String::from_utf8(bytes).map_err(|_| {
        Error::ZoneKubeconfig(format!(
            "the kubeconfig in Secret {secret_name:?} is not UTF-8"
        ))
    })?;
    if args.merge {
        let path = kubeconfig::user_kubeconfig_path(
            global.kubeconfig.as_deref(),
            std::env::var_os("KUBECONFIG").as_deref(),
            std::env::var_os("HOME").as_deref().map(Path::new),
        )
        .ok_or_else(|| Error::Invalid {
            flag: "--merge",
            message: "no kubeconfig file to merge into (set --kubeconfig, $KUBECONFIG or $HOME)"
                .to_owned(),
        })?;
        // The parser's message is not shown: it may quote the document, which holds
        // credentials.
        let zone = Kubeconfig::from_yaml(&text).map_err(|_| {
            Error::ZoneKubeconfig(format!(
                "the kubeconfig in Secret {secret_name:?} is not a valid kubeconfig document"
            ))
        })?;
        let user = if path.exists() {
            Kubeconfig::read_from(&path).map_err(|source| Error::Kubeconfig {
                path: Some(path.clone()),
                source,
            })?
        } else {
            Kubeconfig::default()
        };
        let merged = kubeconfig::merge(user, &zone, name)
            .map_err(|e| Error::ZoneKubeconfig(e.to_string()))?;
        let yaml = serde_saphyr::to_string(&merged)
            .map_err(|e| Error::Encode(format!("the merged kubeconfig: {e}")))?;
        write_private(&path, &yaml)?;
        out(&format!(
            "merged context {name:?} into {}; use it with: kubectl --context {name}\n",
            path.display()
        ))
    } else if let Some(path) = &args.output {
        write_private(path, &text)?;
        out(&format!(
            "wrote the kubeconfig of zone {name} to {}\n",
            path.display()
        ))
    } else {
        out(&text)
    }
}

/// Writes `text` to `path`, readable by the owner only: it holds credentials.
fn write_private(path: &Path, text: &str) -> Result<(), Error> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let err = |what| {
        move |source| Error::File {
            what,
            path: path.to_owned(),
            source,
        }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err("creating the directory of"))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err("writing"))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err("restricting the permissions of"))?;
    file.write_all(text.as_bytes()).map_err(err("writing"))
}

async fn version(global: &GlobalArgs) -> Result<(), Error> {
    out(&format!("Client Version: v{}\n", env!("CARGO_PKG_VERSION")))?;
    let server = match Hub::connect(global).await {
        Err(e) => format!(
            "unavailable ({})",
            e.one_line().trim_start_matches("error: ")
        ),
        Ok(hub) => match list::<Kontinuum>(&hub).await {
            Err(e) => format!(
                "unavailable ({})",
                e.one_line().trim_start_matches("error: ")
            ),
            Ok(entries) => server_version(&entries, &hub.namespace),
        },
    };
    out(&format!("Server Version: {server}\n"))
}

/// The hub's version from its registry entry: the `Kontinuum` without region and zone.
pub fn server_version(entries: &[Kontinuum], namespace: &str) -> String {
    let mut hubs: Vec<&Kontinuum> = entries
        .iter()
        .filter(|k| k.spec.region.is_none() && k.spec.zone.is_none())
        .collect();
    hubs.sort_by_key(|k| k.name_any());
    match hubs.first() {
        None => format!("unknown (no hub Kontinuum registered in namespace {namespace})"),
        Some(hub) => match hub.status.as_ref().and_then(|s| s.version.as_deref()) {
            Some(version) => format!("{version} (Kontinuum {})", hub.name_any()),
            None => format!(
                "unknown (Kontinuum {} reports no version yet)",
                hub.name_any()
            ),
        },
    }
}

fn completion(args: &CompletionArgs) -> Result<(), Error> {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    let mut buffer = Vec::new();
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, "kubectl-kontinuum", &mut buffer);
    std::io::stdout()
        .lock()
        .write_all(&buffer)
        .map_err(Error::Output)
}

/// What `--wait` waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// The Zone's `Ready=True`.
    Ready,
    /// The Zone and its TalosCluster to be gone (the machines reset and released).
    Gone,
}

impl WaitFor {
    fn goal(self) -> &'static str {
        match self {
            Self::Ready => "to become Ready",
            Self::Gone => "to be removed",
        }
    }

    /// The first line of the view.
    pub fn title(self, name: &str, timeout: Duration) -> String {
        format!(
            "Waiting up to {} for zone {name} {}",
            view::format_elapsed(timeout),
            self.goal()
        )
    }

    /// Whether `snapshot` is what we wait for.
    pub fn reached(self, snapshot: &view::Snapshot) -> bool {
        match self {
            Self::Ready => view::zone_ready(snapshot),
            Self::Gone => view::zone_removed(snapshot),
        }
    }

    /// The last line, once reached.
    pub fn finished(self, name: &str) -> String {
        match self {
            Self::Ready => format!("zone {name} is Ready\n"),
            Self::Gone => format!("zone {name} removed\n"),
        }
    }

    /// The one-line timeout error: what we waited for and the condition that blocks it
    /// (`snapshot` is `None` when the Zone could not even be watched).
    pub fn timeout_message(
        self,
        name: &str,
        timeout: Duration,
        snapshot: Option<&view::Snapshot>,
        last_watch_error: Option<&str>,
    ) -> String {
        let blocker = match (self, snapshot) {
            (_, None) => "the Zone could not be watched yet".to_owned(),
            (Self::Ready, Some(s)) => view::ready_blocker(s),
            (Self::Gone, Some(s)) => view::removal_blocker(s),
        };
        let mut message = format!(
            "timed out after {} waiting for zone {name} {}; blocked on: {blocker}",
            view::format_elapsed(timeout),
            self.goal()
        );
        if let Some(err) = last_watch_error {
            let _ = write!(message, " (last watch error: {err})");
        }
        message
    }
}

/// The objects the wait view follows, kept current from watch events.
struct Cache<K> {
    objects: BTreeMap<String, K>,
    buffer: BTreeMap<String, K>,
    synced: bool,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: BTreeMap::new(),
            synced: false,
        }
    }
}

impl<K: Resource> Cache<K> {
    /// Applies one watch event (a relist replaces the whole set at `InitDone`).
    fn apply(&mut self, event: Event<K>) {
        match event {
            Event::Init => self.buffer.clear(),
            Event::InitApply(object) => {
                self.buffer.insert(object.name_any(), object);
            }
            Event::InitDone => {
                self.objects = std::mem::take(&mut self.buffer);
                self.synced = true;
            }
            Event::Apply(object) => {
                self.objects.insert(object.name_any(), object);
            }
            Event::Delete(object) => {
                self.objects.remove(&object.name_any());
            }
        }
    }
}

type UpdateStream = std::pin::Pin<Box<dyn Stream<Item = Result<Update, watcher::Error>> + Send>>;

enum Update {
    Zone(Event<Zone>),
    Cluster(Event<TalosCluster>),
    Addon(Event<Addon>),
}

fn watch<K>(
    hub: &Hub,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(hub.client.clone(), &hub.namespace);
    watcher::watcher(api, config).default_backoff()
}

/// Follows the Zone `name`, its TalosCluster and its Addons with watches (no polling),
/// showing every condition, until `until` holds or `timeout` passes.
async fn wait(
    hub: &Hub,
    name: &str,
    timeout: Duration,
    until: WaitFor,
    term: &Terminal,
) -> Result<(), Error> {
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let streams: Vec<UpdateStream> = vec![
        Box::pin(watch::<Zone>(hub, by_name.clone()).map(|r| r.map(Update::Zone))),
        Box::pin(watch::<TalosCluster>(hub, by_name).map(|r| r.map(Update::Cluster))),
        Box::pin(watch::<Addon>(hub, watcher::Config::default()).map(|r| r.map(Update::Addon))),
    ];
    let mut updates = futures::stream::select_all(streams);
    let start = tokio::time::Instant::now();
    let deadline = start + timeout;
    let (mut zones, mut clusters, mut addons) = (
        Cache::<Zone>::default(),
        Cache::<TalosCluster>::default(),
        Cache::<Addon>::default(),
    );
    let title = until.title(name, timeout);
    if !term.is_tty {
        out(&format!("{title}\n"))?;
    }
    let mut shown = view::Snapshot::default();
    let mut drawn_lines = 0;
    let mut last_error: Option<String> = None;
    let mut seen_zone = false;
    loop {
        // Nothing is judged before every watch has listed once: a TalosCluster not yet listed
        // is not a TalosCluster gone.
        let synced = zones.synced && clusters.synced && addons.synced;
        let snapshot = view::snapshot(
            name,
            zones.objects.get(name),
            clusters.objects.get(name),
            &addons.objects.values().cloned().collect::<Vec<_>>(),
        );
        if synced && snapshot != shown {
            if term.is_tty {
                let lines =
                    view::frame(&title, &snapshot, term.style, term.width.saturating_sub(1));
                out(&view::redraw(drawn_lines, &lines))?;
                drawn_lines = lines.len();
            } else {
                for line in view::changes(&shown, &snapshot, start.elapsed()) {
                    out(&format!("{line}\n"))?;
                }
            }
            shown = snapshot;
        }
        if until == WaitFor::Ready && synced && seen_zone && view::zone_gone(&shown) {
            return Err(Error::NotFound(format!(
                "zone {name} was deleted while waiting for it to become Ready"
            )));
        }
        seen_zone |= !view::zone_gone(&shown);
        if synced && until.reached(&shown) {
            return out(&until.finished(name));
        }
        match tokio::time::timeout_at(deadline, updates.next()).await {
            Err(_) => {
                let snapshot = synced.then_some(&shown);
                return Err(Error::WaitTimeout(until.timeout_message(
                    name,
                    timeout,
                    snapshot,
                    last_error.as_deref(),
                )));
            }
            Ok(None) => {
                return Err(Error::WaitTimeout(format!(
                    "the watches of zone {name} ended unexpectedly"
                )));
            }
            Ok(Some(Err(err))) => last_error = Some(crate::error::fold_lines(&err.to_string())),
            Ok(Some(Ok(update))) => match update {
                Update::Zone(e) => zones.apply(e),
                Update::Cluster(e) => clusters.apply(e),
                Update::Addon(e) => addons.apply(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use kontinuum_crds::v1alpha2::{KontinuumSpec, KontinuumStatus, TalosClusterSpec, ZoneSpec};

    use super::*;

    fn zone(name: &str) -> Zone {
        Zone::new(
            name,
            ZoneSpec {
                region: "eu".into(),
                zone: "a".into(),
                domain: None,
                seed: None,
                cluster: None,
                teardown: None,
            },
        )
    }

    #[test]
    fn the_cache_follows_watch_events_including_relists() {
        let mut cache = Cache::<Zone>::default();
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(zone("a")));
        assert!(!cache.synced);
        assert!(cache.objects.is_empty());
        cache.apply(Event::InitDone);
        assert!(cache.synced);
        assert_eq!(cache.objects.len(), 1);
        cache.apply(Event::Apply(zone("b")));
        cache.apply(Event::Delete(zone("a")));
        assert_eq!(cache.objects.keys().collect::<Vec<_>>(), ["b"]);
        // A relist that no longer has "b" drops it.
        cache.apply(Event::Init);
        cache.apply(Event::InitDone);
        assert!(cache.objects.is_empty());
    }

    #[test]
    fn the_timeout_message_names_the_blocker_on_one_line() {
        let ready = WaitFor::Ready;
        assert_eq!(
            ready.title("eu-a", Duration::from_secs(900)),
            "Waiting up to 15m00s for zone eu-a to become Ready"
        );
        let empty = view::snapshot("eu-a", None, None, &[]);
        assert_eq!(
            ready.timeout_message("eu-a", Duration::from_secs(3), Some(&empty), None),
            "timed out after 3s waiting for zone eu-a to become Ready; blocked on: the Zone does not exist"
        );
        assert_eq!(
            WaitFor::Gone.timeout_message(
                "eu-a",
                Duration::from_secs(3),
                None,
                Some("403 forbidden")
            ),
            "timed out after 3s waiting for zone eu-a to be removed; blocked on: the Zone could not be watched yet (last watch error: 403 forbidden)"
        );
        assert!(WaitFor::Gone.reached(&empty));
        let cluster = TalosCluster::new("eu-a", TalosClusterSpec::default());
        assert!(!WaitFor::Gone.reached(&view::snapshot("eu-a", None, Some(&cluster), &[])));
        assert!(!ready.reached(&empty));
    }

    #[test]
    fn the_server_version_is_the_hubs() {
        let entry = |name: &str, region: Option<&str>, version: Option<&str>| {
            let mut k = Kontinuum::new(
                name,
                KontinuumSpec {
                    region: region.map(str::to_owned),
                    zone: region.map(str::to_owned),
                },
            );
            k.status = Some(KontinuumStatus {
                version: version.map(str::to_owned),
                ..KontinuumStatus::default()
            });
            k
        };
        assert_eq!(
            server_version(
                &[
                    entry("zone", Some("eu"), Some("v9")),
                    entry("hub", None, Some("v0.3.0"))
                ],
                "ns"
            ),
            "v0.3.0 (Kontinuum hub)"
        );
        assert_eq!(
            server_version(&[entry("zone", Some("eu"), Some("v9"))], "ns"),
            "unknown (no hub Kontinuum registered in namespace ns)"
        );
        assert_eq!(
            server_version(&[entry("hub", None, None)], "ns"),
            "unknown (Kontinuum hub reports no version yet)"
        );
    }
}
