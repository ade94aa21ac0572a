{{/*
What differs between operators. Adding an operator: an entry under `operators` in
values.yaml (and values.schema.json), plus its three defines here:
  kontinuum.rules.<key>  its RBAC rules in the watched namespace(s): a ClusterRole, or a Role
                         in watchNamespace. Only what the binary calls; every rule says why.
                         (Events and its Lease are added for every operator.)
  kontinuum.env.<key>    env for its own settings
  kontinuum.args.<key>   arguments beyond the common ones
Verbs not granted on purpose, everywhere: `get` where the binary only reads through watches
(list+watch already show every object, so granting it would only widen the surface), and
`update` (all writes are patches: merge patches guarded by resourceVersion, JSON patches of
the finalizer list, server-side apply).
*/}}

{{- define "kontinuum.rules.instanceDiscovery" -}}
# Instances are read from a watch (reflector); probes run on the unclaimed ones.
- apiGroups: ["kontinuum.sh"]
  resources: ["instances"]
  verbs: ["list", "watch"]
# The discovery result: server-side apply of Instance status (field manager
# instance-discovery.kontinuum.sh). Nothing else of an Instance is written.
- apiGroups: ["kontinuum.sh"]
  resources: ["instances/status"]
  verbs: ["patch"]
{{- end -}}

{{- define "kontinuum.rules.poolClaimer" -}}
# InstancePools: watched; `patch` adds and removes the finalizer kontinuum.sh/pool-claimer
# (a JSON patch), which releases every claim when a pool is deleted.
- apiGroups: ["kontinuum.sh"]
  resources: ["instancepools"]
  verbs: ["list", "watch", "patch"]
# The pool's status (claimedReplicas, readyReplicas, conditions), server-side applied.
- apiGroups: ["kontinuum.sh"]
  resources: ["instancepools/status"]
  verbs: ["patch"]
# Instances: watched (candidates), listed by the claim label (the exact count of a pool's
# claims), and `patch` writes the kontinuum.sh/claimed-by label with a compare-and-set merge
# patch carrying the resourceVersion. Instances are never created or deleted here.
- apiGroups: ["kontinuum.sh"]
  resources: ["instances"]
  verbs: ["list", "watch", "patch"]
{{- end -}}

{{- define "kontinuum.rules.talosBootstrapper" -}}
# TalosClusters: watched; `get` reads the cluster fresh at the start of every reconcile
# (its status is the record of what was done, a cache may lag behind its own last write);
# `patch` adds and removes the teardown finalizer kontinuum.sh/talos-bootstrapper.
- apiGroups: ["kontinuum.sh"]
  resources: ["talosclusters"]
  verbs: ["get", "list", "watch", "patch"]
# The cluster's status (conditions, secretRef, endpoint, members, teardown), server-side
# applied.
- apiGroups: ["kontinuum.sh"]
  resources: ["talosclusters/status"]
  verbs: ["patch"]
# The Secret and the built-in Addons it creates carry a controller ownerReference with
# blockOwnerDeletion; API servers with the OwnerReferencesPermissionEnforcement admission
# plugin (e.g. OpenShift) allow that only to who may update the owner's finalizers.
- apiGroups: ["kontinuum.sh"]
  resources: ["talosclusters/finalizers"]
  verbs: ["update"]
# Instances: watched (members, and the instance-reset controller); `get` for the
# read-modify-write of member conditions and before releasing one at teardown; `patch`
# releases a claim (compare-and-set label) and adds/removes the finalizer
# kontinuum.sh/instance-reset; `delete` unregisters machines when
# spec.teardown.unregisterInstances is set.
- apiGroups: ["kontinuum.sh"]
  resources: ["instances"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Member conditions Configured/Joined/Ready and Deleting on Instances (merge patch guarded
# by the resourceVersion; server-side apply for instance-reset).
- apiGroups: ["kontinuum.sh"]
  resources: ["instances/status"]
  verbs: ["patch"]
# At teardown: whether the pool holding a member's claim still exists (the cluster's own
# pools release their claims themselves).
- apiGroups: ["kontinuum.sh"]
  resources: ["instancepools"]
  verbs: ["get"]
# Addons: watched (AddonsReady, ControlPlaneReady gates); `create` seeds the built-ins
# <cluster>-gateway-api-crds, -cilium and -cert-manager (never updated: the
# addon-installer's defaults do the rest, and a deleted one is created again).
- apiGroups: ["kontinuum.sh"]
  resources: ["addons"]
  verbs: ["list", "watch", "create"]
# Secrets: `create` writes the cluster's Talos secrets bundle (its CAs and keys, generated
# once, never regenerated) into Secret taloscluster-<cluster>; `patch` stores the admin
# kubeconfig in it and removes the Secret's finalizer at teardown; `get` reads the bundle
# back (configs, talosconfig identity, reset). The names are made at run time from
# TalosCluster names, and RBAC matches resourceNames only exactly (no prefixes), so `get`
# cannot be narrowed to them; `list`/`watch` (label-selected in the code, which RBAC cannot
# express) wake the cluster when its Secret changes. To keep this away from unrelated
# Secrets, set watchNamespace: the grant becomes a Role in that namespace.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end -}}

{{- define "kontinuum.rules.addonInstaller" -}}
# Addons: watched (its own, and siblings for priority waves and dependencies); `patch` adds
# and removes the finalizer kontinuum.sh/addon-installer (uninstall on deletion).
- apiGroups: ["kontinuum.sh"]
  resources: ["addons"]
  verbs: ["list", "watch", "patch"]
# The Addon's status (Installed/Healthy/Ready, release, revision), server-side applied.
- apiGroups: ["kontinuum.sh"]
  resources: ["addons/status"]
  verbs: ["patch"]
# TalosClusters, read from a watch: the kubeconfig Secret's name (status.secretRef), the
# CEL context of values, and whether the cluster is being deleted. Never written.
- apiGroups: ["kontinuum.sh"]
  resources: ["talosclusters"]
  verbs: ["list", "watch"]
# Secrets: `get` reads a cluster's kubeconfig (the Secret named in status.secretRef, known
# only at run time, so not narrowable by resourceNames); `list`/`watch` of their metadata
# wake the Addons when a kubeconfig appears or changes (RBAC cannot grant metadata-only
# reads). Never written. Set watchNamespace to confine this to one namespace.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{- define "kontinuum.env.instanceDiscovery" -}}
{{- include "kontinuum.settingsEnv" (list . "KONTINUUM_DISCOVERY_" (list "dialTimeoutSeconds" "reprobeSeconds" "retrySeconds" "concurrency")) -}}
{{- end -}}

{{- define "kontinuum.env.poolClaimer" -}}
{{- end -}}

{{- define "kontinuum.env.talosBootstrapper" -}}
{{- include "kontinuum.settingsEnv" (list . "KONTINUUM_" (list "talosPort" "talosConnectTimeoutSeconds" "talosRpcTimeoutSeconds" "healthCheckTimeoutSeconds" "healthCheckIntervalSeconds" "retrySeconds" "bootstrapGraceSeconds" "teardownTimeoutSeconds" "serviceAccountKeyBits")) -}}
{{- end -}}

{{- define "kontinuum.env.addonInstaller" -}}
{{- include "kontinuum.settingsEnv" (list . "KONTINUUM_ADDON_" (list "chartMirror" "resyncInterval" "retryInterval" "installTimeout" "probeTimeout" "uninstallDeadline" "concurrency")) -}}
{{- end -}}

{{- define "kontinuum.args.instanceDiscovery" -}}
{{- end -}}

{{- define "kontinuum.args.poolClaimer" -}}
{{- end -}}

{{- define "kontinuum.args.talosBootstrapper" -}}
{{- end -}}

{{/* The image's helm, and its home on the /tmp emptyDir (the root filesystem is read-only). */}}
{{- define "kontinuum.args.addonInstaller" -}}
- --helm=/usr/local/bin/helm
- --helm-home=/tmp/kontinuum-helm
{{- end -}}
