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
#                          zone with a domain made from the first with `kubectl kontinuum zone
#                          add --domain --wait` (the plugin's live view of its conditions)
#                          until it is Ready — its cluster built, the zone agent installed
#                          into it and heard from in the hub's registry, its Certificate
#                          issued — then its describe tree and an HTTPS request to its
#                          endpoint, verified; it leaves everything running.
#                          In the zone cluster two STAND-INS (e2e/standins, DESIGN section 5)
#                          do what cannot run here: cert-manager-standin signs the zone's ACME
#                          Certificate from a test CA the demo makes (no ACME server is
#                          reachable), gateway-standin serves the zone's Gateway (Cilium's
#                          data plane cannot run here) on 127.77.5.1. They run as host
#                          processes against the zone cluster's API server, started by a
#                          background watcher (`standins`, below) once the bootstrap has
#                          stored the zone cluster's kubeconfig, while `zone add` waits.
#   scripts/demo.sh down   stops and removes everything `up` started, the stand-ins included.
#
# Settings (environment): KONTINUUM_DEMO_DIR (default target/demo), DEMO_MACHINES (1, the
# zone's control planes), DEMO_TIMEOUT_SECONDS (600), DEMO_DOMAIN (kontinuum.test: the zone is
# published at a.demo.<domain>), DEMO_GATEWAY_PORT_OFFSET (0: the Gateway's :443 and :80 are
# served on :443 and :80 of 127.77.5.1; e.g. 8000 for :8443 and :8080).
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
domain=${DEMO_DOMAIN:-kontinuum.test}
host=$zone.$region.$domain
# The gateway stand-in's listen address (what a load balancer's address is for a real
# Gateway) and the stand-ins' admin servers (:8080 cert-manager's, :8081 the gateway's).
gateway_ip=127.77.5.1
standin_admin=127.77.5.2
port_offset=${DEMO_GATEWAY_PORT_OFFSET:-0}
https_port=$(( 443 + port_offset ))
if [ "$https_port" = 443 ]; then url=https://$host/version; else url=https://$host:$https_port/version; fi

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
  local tool
  for tool in curl openssl; do
    command -v "$tool" >/dev/null || fail "$tool is needed (the demo's test CA and its HTTPS request)"
  done
  say "building the test-bed tools (first run only: ~20-30 min on 2 cores; progress below)"
  bin=$(bash e2e/testbed/build-tools.sh)
  say "building Kontinuum (cargo build)"
  cargo build --locked -q --bins \
    -p kontinuum-testbed -p kontinuum-hostlet -p talos-emulator \
    -p instance-discovery -p pool-claimer -p talos-bootstrapper -p addon-installer \
    -p etcd-proxy -p registry -p zone-installer -p kubectl-kontinuum -p kontinuum-standins
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
  # etcd-proxy on the node's network at $node_addr:2379 (server.grpcEndpoint). Zone
  # certificates come from the default issuer, ACME (acme.email), signed here by the
  # cert-manager stand-in; the zone-installer re-checks a zone cluster it waits on (the
  # Certificate) every retryInterval: 2s instead of the chart's 15s, so the demo does not idle.
  say "helm install $release charts/kontinuum (namespace $chart_ns)"
  "$helm" upgrade --install "$release" charts/kontinuum --namespace "$chart_ns" --create-namespace \
    --set operators.addonInstaller.chartMirror="http://$repo_addr" \
    --set acme.email=demo@kontinuum.test --set operators.zoneInstaller.retryInterval=2s \
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

  # The test CA the cert-manager stand-in signs the zone's "ACME" certificate from (the
  # zone's ClusterIssuer is the production default, ACME; no ACME server is reachable here).
  mkdir -p "$dir/standins"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=Kontinuum demo test ACME CA (cert-manager stand-in)" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$dir/standins/acme-ca.key" -out "$dir/standins/acme-ca.crt" 2>"$dir/logs/openssl.log" \
    || fail "openssl could not make the test CA; log: $dir/logs/openssl.log"
  say "watching for the zone cluster: once it exists, the STAND-INS cert-manager-standin and gateway-standin run against it"
  start standins env DEMO_TARGET="$target" DEMO_KUBECTL="$kubectl" bash "$root/scripts/demo.sh" standins

  local addresses=() i
  for i in $(seq 1 "$machines"); do
    addresses+=(--talos-address "${first_machine%.*}.$(( ${first_machine##*.} + i - 1 ))")
  done
  say "kubectl kontinuum zone add --region $region --zone $zone --domain $domain ${addresses[*]} --control-plane-replicas $machines --wait"
  local started; started=$(date +%s)
  "$target/kubectl-kontinuum" -n "$chart_ns" zone add --region "$region" --zone "$zone" --domain "$domain" \
    "${addresses[@]}" --control-plane-replicas "$machines" --wait --timeout "${timeout_s}s" || {
      "$target/kubectl-kontinuum" -n "$chart_ns" zone describe "$zone_name" >&2 || true
      tail -n 20 "$dir/logs/standins.log" >&2 || true
      fail "zone $zone_name not Ready after ${timeout_s}s (logs: $dir/logs, pods: $dir/hostlet, machines: $dir/machines)"
    }
  local ready_at; ready_at=$(date +%s)
  local ready_s=$(( ready_at - started ))
  local standins_at; standins_at=$(awk '$1 == "started" { print $2 }' "$dir/logs/standins.out")
  local standins_s=$(( ${standins_at:-$ready_at} - started ))
  say "zone describe $zone_name"
  "$target/kubectl-kontinuum" -n "$chart_ns" zone describe "$zone_name"
  local kubeconfig=$dir/$zone_name.kubeconfig
  "$target/kubectl-kontinuum" -n "$chart_ns" zone kubeconfig "$zone_name" --output "$kubeconfig" >/dev/null
  "$kubectl" get kontinuum -A

  # The endpoint the zone-installer published, over TLS: the host resolved to the gateway
  # stand-in's address (there is no DNS for it), the certificate verified against the CA
  # that signed it; the answer is the zone agent's.
  local endpoint; endpoint=$("$kubectl" get zone "$zone_name" -n "$chart_ns" -o jsonpath='{.status.endpoint}')
  [ "$endpoint" = "$host" ] || fail "the Zone's status.endpoint is '$endpoint', not $host"
  say "the zone endpoint (status.endpoint $endpoint): objects in the zone cluster"
  "$kubectl" --kubeconfig "$kubeconfig" get gatewayclasses,gateways,httproutes,certificates,clusterissuers -A
  local curl_args=(--silent --show-error --resolve "$host:$https_port:$gateway_ip" --cacert "$dir/standins/acme-ca.crt")
  say "GET $url ($host resolved to the gateway stand-in on $gateway_ip, verified against the test CA)"
  local answer="" attempts=0 earlier=() deadline=$(( $(date +%s) + 60 ))
  until answer=$(curl "${curl_args[@]}" --write-out '\n%{http_code} %{time_total}' "$url" 2>>"$dir/logs/curl.log") \
      && [ "$(tail -n 1 <<<"$answer" | cut -d' ' -f1)" = 200 ]; do
    attempts=$(( attempts + 1 ))
    earlier+=("$(tail -n 1 <<<"${answer:-000}" | cut -d' ' -f1 | sed 's/^000$/no answer/')")
    echo "attempt $attempts: ${answer:-no answer}" >>"$dir/logs/curl.log"
    [ "$(date +%s)" -lt "$deadline" ] || { tail -n 20 "$dir/logs/curl.log" >&2; fail "$url did not answer 200 within 60s of Ready"; }
    sleep 0.2
  done
  local answered_s=$(( $(date +%s) - ready_at ))
  local took_ms; took_ms=$(tail -n 1 <<<"$answer" | awk '{ printf "%.1f", $2 * 1000 }')
  local cert; cert=$(openssl s_client -connect "$gateway_ip:$https_port" -servername "$host" \
      -CAfile "$dir/standins/acme-ca.crt" -verify_return_error </dev/null 2>/dev/null \
    | openssl x509 -noout -ext subjectAltName -issuer -enddate | sed -e '/Subject Alternative Name/d' -e 's/^ *//')
  [ -n "$cert" ] || fail "openssl s_client got no verified certificate from $gateway_ip:$https_port"
  printf 'served certificate (verified): %s\n' "$(paste -sd ';' <<<"$cert" | sed 's/;/; /g')"
  local tries="the first request after Ready"
  [ "$attempts" = 0 ] || tries="after $attempts earlier attempts in the first seconds after Ready ($(printf '%s\n' "${earlier[@]}" \
    | sort | uniq -c | awk '{ c = $1; $1 = ""; printf "%s%s x%s", sep, c, $0; sep = ", " }'); $dir/logs/curl.log)"
  printf 'HTTP %s in %s ms, %s: %s\n' \
    "$(tail -n 1 <<<"$answer" | cut -d' ' -f1)" "$took_ms" "$tries" "$(sed '$d' <<<"$answer")"
  cat <<EOF

Kontinuum is running on a local hub, with a zone built from emulated machines and joined:
zone $zone_name Ready ${ready_s}s after \`zone add\` (stand-ins running ${standins_s}s after it),
its endpoint answering over verified TLS ${answered_s}s after Ready; $(( $(date +%s) - t0 ))s for the whole demo.

The zone endpoint, as anyone on this machine reaches it ($host has no DNS record:
--resolve sends it to the gateway stand-in's address; the CA is the demo's test ACME CA):
  curl --resolve $host:$https_port:$gateway_ip --cacert $dir/standins/acme-ca.crt $url
  openssl s_client -connect $gateway_ip:$https_port -servername $host -CAfile $dir/standins/acme-ca.crt </dev/null
Its certificate and Gateway are real cert-manager and Gateway API objects written by the
zone-installer, served by STAND-INS (e2e/standins): cert-manager-standin signed it from
that test CA (no ACME server is reachable here), gateway-standin serves the Gateway on
$gateway_ip (Cilium's data plane cannot run here). Logs: $dir/logs/{cert-manager,gateway}-standin.log.

  kubectl get kontinuum -A                      # every Kontinuum object, the zone's agent included
  $target/kubectl-kontinuum -n $chart_ns zone describe $zone_name
  kubectl get kontinuums.v1alpha1.kontinuum.sh -n $chart_ns   # the same, converted by the webhook
  kubectl get pods -n $chart_ns -o wide     # the operators, run by the hostlet as processes
  kubectl --kubeconfig $kubeconfig get pods -n kontinuum-system   # the zone agent
  kubectl --kubeconfig $kubeconfig get gateways,httproutes,certificates -A   # its endpoint
  $target/kubectl-kontinuum -n $chart_ns zone remove $zone_name --wait   # machines back to maintenance mode
  make demo-down                                # stop and remove everything, the stand-ins too

Logs: $dir/logs (hub, hostlet, emulator, stand-ins), $dir/hostlet (each pod's output).
kubectl is $kubectl; for the hub:
export KUBECONFIG=$KUBECONFIG
EOF
}

# The zone cluster's STAND-INS (e2e/standins; DESIGN section 5 allows them for what cannot run
# here), run by `up` in the background before `zone add --wait`: that waits for the Zone to be
# Ready, which needs its Certificate Ready, which needs cert-manager in the zone cluster, which
# exists only once the machine is bootstrapped. So this waits for the cluster's kubeconfig (the
# bootstrapper stores it on the hub), then for the CRDs its addons install, creates the
# GatewayClass the zone-installer's Gateway names (`cilium`, its default; a real Cilium
# creates it) for the stand-in's controller, and runs both stand-ins until `down`: they share
# this process group, so `down` stops them with it.
standins() {
  local target=$DEMO_TARGET kubectl=$DEMO_KUBECTL
  local kubeconfig=$dir/$zone_name.kubeconfig
  local deadline=$(( $(date +%s) + timeout_s ))
  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 ))s; }
  # Watches, not polls (each poll would be a kubectl process on a busy machine): the
  # TalosCluster created and its kubeconfig stored, then the addons' CRDs in the zone cluster.
  # A watch that fails (the zone's API server still starting) is retried until the deadline.
  until "$kubectl" wait -n "$chart_ns" --for=create --for=condition=KubeconfigAvailable \
      --timeout="$(left)" "taloscluster.kontinuum.sh/$zone_name" >/dev/null 2>>"$dir/logs/standins-wait.log" \
      && "$target/kubectl-kontinuum" -n "$chart_ns" zone kubeconfig "$zone_name" --output "$kubeconfig" \
        >/dev/null 2>>"$dir/logs/standins-wait.log"; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no kubeconfig of $zone_name within ${timeout_s}s"
    sleep 1
  done
  echo "kubeconfig $(date +%s)"
  local crds=() crd
  for crd in gatewayclasses gateways httproutes; do crds+=("crd/$crd.gateway.networking.k8s.io"); done
  for crd in certificates clusterissuers issuers; do crds+=("crd/$crd.cert-manager.io"); done
  # One CRD per kubectl: given several names of which none exists yet, `kubectl wait
  # --for=create` fails at once with NotFound instead of waiting.
  for crd in "${crds[@]}"; do
    until "$kubectl" --kubeconfig "$kubeconfig" wait --for=create --for=condition=Established \
        --timeout="$(left)" "$crd" >/dev/null 2>>"$dir/logs/standins-wait.log"; do
      [ "$(date +%s)" -lt "$deadline" ] || fail "the zone cluster's $crd not established within ${timeout_s}s"
      sleep 1
    done
  done
  "$kubectl" --kubeconfig "$kubeconfig" apply --server-side --field-manager kontinuum-demo -f - >&2 <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: cilium
spec:
  controllerName: kontinuum.sh/gateway-standin
  description: "served by gateway-standin, a test stand-in (kontinuum demo)"
EOF
  # One process of each, run alone: no Lease (the binaries elect one by default).
  local common=(--kubeconfig "$kubeconfig" --log-format text --log-level info --leader-elect=false)
  "$target/cert-manager-standin" "${common[@]}" --admin-addr "$standin_admin:8080" \
    --acme-ca-cert "$dir/standins/acme-ca.crt" --acme-ca-key "$dir/standins/acme-ca.key" \
    >"$dir/logs/cert-manager-standin.log" 2>&1 </dev/null &
  local pids=($!)
  "$target/gateway-standin" "${common[@]}" --admin-addr "$standin_admin:8081" \
    --controller-name kontinuum.sh/gateway-standin --listen-ip "$gateway_ip" --port-offset "$port_offset" \
    >"$dir/logs/gateway-standin.log" 2>&1 </dev/null &
  pids+=($!)
  local port pid
  for port in 8080 8081; do
    until curl -fsS "http://$standin_admin:$port/readyz" >/dev/null 2>&1; do
      for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || fail "a stand-in exited; logs: $dir/logs/cert-manager-standin.log, $dir/logs/gateway-standin.log"
      done
      [ "$(date +%s)" -lt "$deadline" ] || fail "a stand-in was not ready within ${timeout_s}s; logs: $dir/logs/*-standin.log"
      sleep 0.2
    done
  done
  echo "started $(date +%s)"
  wait -n
  fail "a stand-in exited; logs: $dir/logs/cert-manager-standin.log, $dir/logs/gateway-standin.log"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  standins) standins ;;  # started by `up`
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
