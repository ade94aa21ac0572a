#!/usr/bin/env bash
# `make demo` / `make demo-down`: Kontinuum on one machine, installed as a user installs it.
#
#   scripts/demo.sh up     a hub (a real control plane), the Kontinuum store (the test bed's
#                          etcd, given to the chart as an external store: the chart's own
#                          StatefulSet would be reached through Service DNS, which the
#                          host-network pods here do not have), a hostlet node that runs the
#                          chart's pods as real processes, a local chart repository serving the
#                          fixture charts (stand-ins for the public cilium, gateway-api-crds
#                          and cert-manager charts, which cannot be fetched here), `helm
#                          install` of charts/kontinuum, N emulated Talos machines, and a
#                          zone made from the first with `kubectl kontinuum zone add --wait`
#                          (the plugin's live view of its conditions) until it is Ready —
#                          its cluster built, the zone agent installed into it and heard
#                          from in the hub's registry — then its describe tree; it leaves
#                          everything running.
#   scripts/demo.sh down   stops and removes everything `up` started.
#
# Settings (environment): KONTINUUM_DEMO_DIR (default target/demo), DEMO_MACHINES (1, the
# zone's control planes), DEMO_TIMEOUT_SECONDS (600).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

dir=${KONTINUUM_DEMO_DIR:-$root/target/demo}
machines=${DEMO_MACHINES:-1}
timeout_s=${DEMO_TIMEOUT_SECONDS:-600}
# Loopback addresses of their own, so the demo never meets a test's control plane.
hub_addr=127.77.0.1
node_addr=127.77.0.2
pod_cidr=127.77.1.0/24
repo_addr=127.77.0.1:8879
store_addr=127.77.0.3
first_machine=127.10.0.1
node=kontinuum-demo
release=kontinuum
chart_ns=kontinuum-system
region=demo
zone=a
zone_name=$region-$zone

say() { printf '\033[1mdemo:\033[0m %s\n' "$*"; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# Starts a long-running process in its own session (it outlives `make`), logs to
# $dir/logs/<name>.log, records its pid for `down`.
start() {
  local name=$1; shift
  setsid "$@" >"$dir/logs/$name.out" 2>"$dir/logs/$name.log" < /dev/null &
  echo "$name $!" >>"$dir/pids"
}

# Waits until $dir/logs/<name>.out has a line matching <pattern>, or the process died.
wait_line() {
  local name=$1 pattern=$2 limit=${3:-300}
  local pid; pid=$(awk -v n="$name" '$1 == n { print $2 }' "$dir/pids")
  for _ in $(seq 1 $((limit * 10))); do
    grep -qE "$pattern" "$dir/logs/$name.out" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$dir/logs/$name.log" >&2; fail "$name exited; log: $dir/logs/$name.log"; }
    sleep 0.1
  done
  fail "$name did not print '$pattern' within ${limit}s; log: $dir/logs/$name.log"
}

down() {
  if [ -f "$dir/pids" ]; then
    say "stopping $(wc -l <"$dir/pids") processes"
    # Reverse order: the workloads first, the hub last.
    tac "$dir/pids" | while read -r name pid; do
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 1 300); do
      alive=0
      while read -r name pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$dir/pids"
      [ $alive = 0 ] && break
      sleep 0.1
    done
    while read -r name pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done <"$dir/pids"
  fi
  rm -rf "$dir"
  say "removed $dir"
}

up() {
  [ -f "$dir/pids" ] && fail "a demo is already running in $dir: 'make demo-down' first"
  [ "$(id -u)" = 0 ] || fail "the hostlet runs pods in mount namespaces of their own: run as root"
  say "building the test-bed tools (first run only: ~20-30 min on 2 cores; progress below)"
  bin=$(bash e2e/testbed/build-tools.sh)
  say "building Kontinuum (cargo build)"
  cargo build --locked -q --bins \
    -p kontinuum-testbed -p kontinuum-hostlet -p talos-emulator \
    -p instance-discovery -p pool-claimer -p talos-bootstrapper -p addon-installer \
    -p etcd-proxy -p registry -p zone-installer -p kubectl-kontinuum
  local target=${CARGO_TARGET_DIR:-$root/target}/debug
  local kubectl="$bin/kubectl" helm="$bin/helm"
  mkdir -p "$dir/logs"
  : >"$dir/pids"
  local t0; t0=$(date +%s)
  export KONTINUUM_TESTBED_BIN=$bin

  say "starting the hub (etcd, kube-apiserver, controller manager, scheduler) on $hub_addr"
  start hub "$target/kontinuum-testbed" up --dir "$dir/hub" --address "$hub_addr" --port 6443
  wait_line hub '^ready$' 180
  export KUBECONFIG=$dir/hub/kubeconfig

  say "starting the hostlet node $node ($node_addr): it runs the chart's pods as processes"
  # The chart's image (`kontinuum`, any tag) is our binaries and helm at their in-image paths.
  {
    echo "images:"
    echo "  - image: kontinuum"
    echo "    files:"
    for b in instance-discovery pool-claimer talos-bootstrapper addon-installer etcd-proxy registry zone-installer; do
      echo "      /usr/local/bin/$b: $target/$b"
    done
    echo "      /usr/local/bin/helm: $bin/helm"
  } >"$dir/images.yaml"
  start hostlet "$target/hostlet" --kubeconfig "$KUBECONFIG" --node-name "$node" \
    --node-ip "$node_addr" --pod-cidr "$pod_cidr" --image-map "$dir/images.yaml" \
    --dir "$dir/hostlet" --label kontinuum.sh/demo=true --unmapped pretend
  wait_line hostlet '^ready$' 60

  say "serving the fixture charts (stand-ins for the public ones) at http://$repo_addr"
  mkdir -p "$dir/charts"
  for chart in gateway-api-crds cilium cert-manager; do
    HELM_CACHE_HOME=$dir/helm HELM_CONFIG_HOME=$dir/helm HELM_DATA_HOME=$dir/helm \
      "$helm" package "e2e/fixtures/charts/$chart" --destination "$dir/charts" >/dev/null
  done
  "$helm" repo index "$dir/charts"
  start charts python3 -m http.server "${repo_addr#*:}" --bind "${repo_addr%:*}" --directory "$dir/charts"

  say "starting the Kontinuum store (etcd) on $store_addr:2379"
  start store "$bin/etcd" --name=store --data-dir="$dir/store" \
    --listen-client-urls="http://$store_addr:2379" --advertise-client-urls="http://$store_addr:2379" \
    --listen-peer-urls="http://$store_addr:2380" --initial-advertise-peer-urls="http://$store_addr:2380" \
    --initial-cluster="store=http://$store_addr:2380" --log-level=warn
  for _ in $(seq 1 300); do
    "$bin/etcdctl" --endpoints="http://$store_addr:2379" --dial-timeout=1s endpoint health >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$bin/etcdctl" --endpoints="http://$store_addr:2379" --dial-timeout=2s endpoint health >/dev/null 2>&1 \
    || fail "the store did not become healthy; log: $dir/logs/store.log"

  # The API server cannot reach a Service here (no kube-proxy; EndpointSlices refuse the
  # hostlet's loopback pod IPs), so it calls the registry's conversion webhook at the node's
  # address, where the registry runs on the node's network; likewise zone agents dial
  # etcd-proxy on the node's network at $node_addr:2379 (server.grpcEndpoint).
  say "helm install $release charts/kontinuum (namespace $chart_ns)"
  "$helm" upgrade --install "$release" charts/kontinuum --namespace "$chart_ns" --create-namespace \
    --set operators.addonInstaller.chartMirror="http://$repo_addr" \
    --set "store.external.endpoints[0]=http://$store_addr:2379" \
    --set auth.insecureAllowAnonymous=true \
    --set "server.grpcEndpoint=$node_addr:2379" \
    --set operators.etcdProxy.hostNetwork=true --set operators.etcdProxy.adminPort=8081 \
    --set operators.registry.hostNetwork=true \
    --set "operators.registry.webhookUrl=https://$node_addr:9443/convert" \
    --set-string 'operatorDefaults.nodeSelector.kontinuum\.sh/demo=true' \
    --wait --timeout 5m >"$dir/logs/helm-install.log"
  "$kubectl" get deployments -n "$chart_ns"

  say "starting $machines emulated Talos machines in maintenance mode from $first_machine"
  start machines "$target/talos-emulator" --machines "$machines" --first-address "$first_machine" \
    --dir "$dir/machines" --control-addr 127.77.0.1:0
  wait_line machines '^control ' 60

  local addresses=() i
  for i in $(seq 1 "$machines"); do
    addresses+=(--talos-address "${first_machine%.*}.$(( ${first_machine##*.} + i - 1 ))")
  done
  say "kubectl kontinuum zone add --region $region --zone $zone ${addresses[*]} --control-plane-replicas $machines --wait"
  local started; started=$(date +%s)
  "$target/kubectl-kontinuum" -n "$chart_ns" zone add --region "$region" --zone "$zone" \
    "${addresses[@]}" --control-plane-replicas "$machines" --wait --timeout "${timeout_s}s" || {
      "$target/kubectl-kontinuum" -n "$chart_ns" zone describe "$zone_name" >&2 || true
      fail "zone $zone_name not Ready after ${timeout_s}s (logs: $dir/logs, pods: $dir/hostlet, machines: $dir/machines)"
    }
  local ready_s=$(( $(date +%s) - started ))
  "$target/kubectl-kontinuum" -n "$chart_ns" zone describe "$zone_name"
  "$target/kubectl-kontinuum" -n "$chart_ns" zone kubeconfig "$zone_name" --output "$dir/$zone_name.kubeconfig" >/dev/null
  "$kubectl" get kontinuum -A
  cat <<EOF

Kontinuum is running on a local hub, with a zone built from emulated machines and joined:
zone $zone_name Ready ${ready_s}s after \`zone add\` ($(( $(date +%s) - t0 ))s for the whole demo).

  kubectl get kontinuum -A                      # every Kontinuum object, the zone's agent included
  $target/kubectl-kontinuum -n $chart_ns zone describe $zone_name
  kubectl get kontinuums.v1alpha1.kontinuum.sh -n $chart_ns   # the same, converted by the webhook
  kubectl get pods -n $chart_ns -o wide     # the operators, run by the hostlet as processes
  kubectl --kubeconfig $dir/$zone_name.kubeconfig get pods -n kontinuum-system   # the zone agent
  $target/kubectl-kontinuum -n $chart_ns zone remove $zone_name --wait   # machines back to maintenance mode
  make demo-down                                # stop and remove everything

The zone has no spec.domain here, so no Gateway or certificate is installed: its agent
serves health, version and status inside the zone cluster only.
Logs: $dir/logs (hub, hostlet, emulator), $dir/hostlet (each pod's output).
kubectl is $kubectl; for the hub:
export KUBECONFIG=$KUBECONFIG
EOF
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
