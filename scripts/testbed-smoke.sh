#!/usr/bin/env bash
# Starts `kontinuum-testbed up`, waits for its `ready` line, checks the node is Ready with
# the test bed's kubectl, then stops it with SIGTERM and checks that it exits.
set -euo pipefail
bin="${KONTINUUM_TESTBED_BIN:?set KONTINUUM_TESTBED_BIN (make testbed prints it)}"
dir=$(mktemp -d)
cargo build --locked -q -p kontinuum-testbed --bin kontinuum-testbed
out="$dir/out"
start=$(date +%s.%N)
target/debug/kontinuum-testbed up --dir "$dir" --port 0 >"$out" 2>"$dir/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 900); do
  grep -qx ready "$out" && break
  kill -0 $pid 2>/dev/null || { cat "$dir/stderr"; echo "testbed-smoke: kontinuum-testbed exited" >&2; exit 1; }
  sleep 0.1
done
grep -qx ready "$out" || { echo "testbed-smoke: no 'ready' line" >&2; exit 1; }
echo "testbed-smoke: ready after $(echo "$(date +%s.%N) - $start" | bc) s"
"$bin/kubectl" --kubeconfig "$dir/kubeconfig" wait --for=condition=Ready node/kwok-node-0 --timeout=60s
"$bin/kubectl" --kubeconfig "$dir/kubeconfig" get nodes,namespaces
kill -TERM $pid
wait $pid
echo "testbed-smoke: stopped cleanly"
rm -rf "$dir"
