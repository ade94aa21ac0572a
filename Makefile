# Kontinuum — developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

# The test-bed tools live in a cache outside the checkout (see e2e/testbed/build-tools.sh);
# the script is a no-op when the cache is warm and prints the bin directory.
TESTBED_BIN = $(shell bash e2e/testbed/build-tools.sh)

.PHONY: demo demo-down help build test fmt fmt-check clippy crds testbed testbed-smoke unit fidelity bench kind-up

demo: ## A local hub, the chart installed, an emulated machine, a zone to Ready with its endpoint over TLS (leaves it running)
	bash scripts/demo.sh up

demo-down: ## Stop and remove everything `make demo` started
	bash scripts/demo.sh down

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

build: ## Build every crate and binary
	$(CARGO) build --workspace --all-targets --locked

fmt: ## Format the code
	$(CARGO) fmt --all

fmt-check: ## Fail on unformatted code
	$(CARGO) fmt --all -- --check

clippy: ## Lint, warnings are errors
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

crds: ## Regenerate the CRD YAML in crds/ from the Rust types
	$(CARGO) run --locked -q -p kontinuum-crds --bin crdgen -- crds

testbed: ## Build the test-bed tools (etcd, kube-*, kubectl, kwok, helm) into the cache
	@bash e2e/testbed/build-tools.sh

testbed-smoke: ## Start one control plane with kontinuum-testbed, use it, stop it
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) bash scripts/testbed-smoke.sh

unit: ## Tests that need no test bed
	$(CARGO) test --workspace --locked --lib --bins

bench: ## Benchmarks (release build); Markdown figures in bench-results/
	$(CARGO) build --release --locked -p talos-emulator -p kontinuum-hostlet -p instance-discovery -p pool-claimer -p talos-bootstrapper -p addon-installer -p etcd-proxy -p registry -p zone-installer -p kubectl-kontinuum -p kontinuum-bench
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench talos --machines 1000 --concurrency 16,64 --out bench-results/talos.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench discovery --machines 10000 --pools 1000 --out bench-results/discovery.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench bootstrap --runs 5 --out bench-results/bootstrap.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench addons --runs 3 --out bench-results/addons.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench zone-watches --clusters 100,200,400 --cycles 5 --out bench-results/zone-watches.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench etcd-proxy --ops put,range,put-lease --concurrency 1,16 --rounds 3 --out bench-results/etcd-proxy.md
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) target/release/kontinuum-bench zone --runs 5 --out bench-results/zone.md

fidelity: ## The Talos emulator against a client built from the official Talos protos
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) bash e2e/fidelity/run.sh

test: fmt-check clippy ## Everything CI runs: fmt, clippy, unit, real-test-bed and fidelity tests
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) $(CARGO) test --workspace --locked --no-fail-fast
	KONTINUUM_TESTBED_BIN=$(TESTBED_BIN) bash e2e/fidelity/run.sh

# A hub on kind for users with a container engine (not this project's CI: no Docker here).
KIND ?= kind
HELM ?= helm
KIND_CLUSTER ?= kontinuum
KIND_NAMESPACE ?= kontinuum-system
CONTAINER_ENGINE ?= $(shell command -v docker >/dev/null 2>&1 && echo docker || echo podman)
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
# Podman names local images localhost/<name>; the pod must ask for that name.
KIND_IMAGE_REPO ?= $(if $(filter podman,$(notdir $(CONTAINER_ENGINE))),localhost/kontinuum,kontinuum)

kind-up: ## A hub on kind: cluster, image (docker/podman), kind load, helm install (needs a container engine)
	@command -v $(KIND) >/dev/null || { echo "kind-up: $(KIND) is not installed" >&2; exit 1; }
	@command -v $(CONTAINER_ENGINE) >/dev/null || { echo "kind-up: neither docker nor podman is installed" >&2; exit 1; }
	@if [ "$(notdir $(CONTAINER_ENGINE))" = podman ]; then export KIND_EXPERIMENTAL_PROVIDER=podman; fi; \
	  $(KIND) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' \
	    || $(KIND) create cluster --name $(KIND_CLUSTER) --config kind-config.yaml
	$(CONTAINER_ENGINE) build -f Containerfile -t $(KIND_IMAGE_REPO):$(VERSION) .
	@archive=$$(mktemp --suffix=.tar); trap 'rm -f "$$archive"' EXIT; \
	  $(CONTAINER_ENGINE) save -o "$$archive" $(KIND_IMAGE_REPO):$(VERSION); \
	  if [ "$(notdir $(CONTAINER_ENGINE))" = podman ]; then export KIND_EXPERIMENTAL_PROVIDER=podman; fi; \
	  $(KIND) load image-archive "$$archive" --name $(KIND_CLUSTER)
	$(HELM) upgrade --install kontinuum charts/kontinuum --kube-context kind-$(KIND_CLUSTER) \
	  --namespace $(KIND_NAMESPACE) --create-namespace \
	  --set image.repository=$(KIND_IMAGE_REPO) --set image.tag=$(VERSION) --set image.pullPolicy=Never \
	  --wait --timeout 5m
	kubectl --context kind-$(KIND_CLUSTER) get pods -n $(KIND_NAMESPACE)
