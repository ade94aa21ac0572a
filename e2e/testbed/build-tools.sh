#!/usr/bin/env bash
# Builds the test-bed tools (Kubernetes control plane, etcd, KWOK, helm) from the pinned
# go.mod/go.sum modules under e2e/testbed/tools/ into a cache OUTSIDE the checkout:
#   ${KONTINUUM_TESTBED_CACHE:-$HOME/.cache/kontinuum/testbed}/<key>/bin
# <key> hashes every go.mod/go.sum and this script, so a version bump builds a new set and
# an unchanged tree is a no-op. Prints the bin directory on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools="$here/tools"
root="${KONTINUUM_TESTBED_CACHE:-$HOME/.cache/kontinuum/testbed}"

KUBE_VERSION=v1.37.2
HELM_VERSION=v3.22.0

key=$(cat "$0" "$tools"/*/go.mod "$tools"/*/go.sum | sha256sum | cut -c1-16)
bin="$root/$key/bin"

if [ -f "$bin/.complete" ]; then
  echo "testbed: tools are cached (key $key)" >&2
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "testbed: go is not installed" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
# Go 1.27's default jsonv2 experiment breaks kube-openapi; be explicit for any toolchain.
export GOEXPERIMENT=nojsonv2

tmp="$root/$key/bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
step() { echo "testbed: [$(( $(date +%s) - start ))s] $*" >&2; }

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ldf="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldf="$ldf -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

step "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $KUBE_VERSION"
go build -C "$tools/k8s" -trimpath -ldflags "$ldf" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
step "building etcd and etcdctl"
go build -C "$tools/k8s" -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
go build -C "$tools/k8s" -trimpath -ldflags "-s -w" -o "$tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3
step "building kwok"
go build -C "$tools/kwok" -trimpath -ldflags "-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok
kwok_dir=$(go list -C "$tools/kwok" -m -f '{{.Dir}}' sigs.k8s.io/kwok)
mkdir -p "$tmp/kwok-stages"
for s in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
         pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  cp "$kwok_dir/kustomize/stage/$s.yaml" "$tmp/kwok-stages/$(basename "$s").yaml"
done
chmod -R u+w "$tmp/kwok-stages"
step "building helm $HELM_VERSION"
go build -C "$tools/helm" -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  -o "$tmp/helm" helm.sh/helm/v3/cmd/helm

touch "$tmp/.complete"
rm -rf "$bin"
mv "$tmp" "$bin"
step "done: $(du -sh "$bin" | cut -f1) in $bin"
echo "$bin"
