# Sheepfold. `make help` lists the targets.
SHELL := /bin/bash
DATA_DIR ?= /var/lib/sheepfold
LISTEN ?= 127.0.0.1:8080
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
PYTHON := /usr/bin/python3
export SHEEPFOLD_DATA_DIR := $(DATA_DIR)

.PHONY: help setup build template run test test-unit test-gvisor test-cgroupv2 lint proto bench bench-isolation deb install clean ui ui-check kubernetes-cluster test-kubernetes bench-kubernetes

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: ## install host packages and build the pinned runc, runsc (gVisor) and CRIU (idempotent)
	@scripts/setup.sh

build: ## build bin/sheepfold and bin/sheepfold-agent, both static (no libc: the server's image needs none)
	CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(VERSION)" -o bin/sheepfold ./cmd/sheepfold
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/sheepfold-agent ./cmd/sheepfold-agent

template: setup build ## build the python template once, again when its definition changes (--force to rebuild: bin/sheepfold template build --force python); then react-ts from templates/react-ts (its npm steps cached)
	bin/sheepfold template build --update python
	bin/sheepfold template build -q -f templates/react-ts/Dockerfile react-ts

run: template ## start the server on $(LISTEN) with everything it needs
	bin/sheepfold serve --listen $(LISTEN)

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint: ## gofmt, go vet, staticcheck (its default checks), go.mod tidy, and the source rules kept by tests (no panic re-raised outside abort.Handler)
	@fmt=$$(gofmt -l cmd internal client api test $(wildcard *.go) 2>/dev/null); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	go vet ./...
	GOBIN=$(CURDIR)/bin/tools go install $(STATICCHECK)
	bin/tools/staticcheck ./...
	@go mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	go test -count=1 -run '^TestNoRepanic' ./internal/abort

ui: ## rebuild the dashboard (web/) into internal/ui/dist, which the binary embeds
	cd web && npm ci --no-audit --no-fund && npm run build

ui-check: ui ## fail when the embedded dashboard is not the build of web/
	@git diff --quiet --exit-code -- internal/ui/dist && test -z "$$(git ls-files --others --exclude-standard internal/ui/dist)" || \
		{ echo "internal/ui/dist is stale: run make ui and commit it"; git status --short internal/ui/dist; exit 1; }

PROTOC_GEN_GO := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_CONNECT := connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
proto: ## regenerate internal/e2b/envdpb from api/envd/*.proto (protoc from apt's protobuf-compiler)
	@command -v protoc >/dev/null || apt-get install -y --no-install-recommends protobuf-compiler
	GOBIN=$(CURDIR)/bin/tools go install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/bin/tools go install $(PROTOC_GEN_CONNECT)
	PATH=$(CURDIR)/bin/tools:$$PATH protoc -I api/envd \
		--go_out=. --go_opt=module=github.com/sheepfold/sheepfold \
		--connect-go_out=. --connect-go_opt=module=github.com/sheepfold/sheepfold \
		process/process.proto filesystem/filesystem.proto

test-unit: ## tests that need neither root nor a template
	go test -count=1 ./...

# Everything runs once as is; then every package of the module runs again
# under the race detector (tests that measure time or memory skip their
# measurement there: testutil.Race), but for test/: the integration and
# Kubernetes suites drive binaries built without it, and their own code is
# covered here. Measured on the loaded 2-core CI host, the packages this
# adds to the engine's and the server's cost about 2 minutes (kernel 17 s,
# oci 11 s, template/ociimage 23 s, the other 40-odd packages 75 s).
RACE_PKGS := . ./api/... ./client/... ./cmd/... ./examples/... ./internal/...
test: template lint ui-check ## everything: unit, privileged (as root), SDK and end-to-end tests; then every package but test/'s again under -race
	$(PYTHON) -m unittest discover -s sdk/python/tests
	go test -count=1 -timeout 40m ./...
	go test -race -count=1 -timeout 30m $(RACE_PKGS)

test-gvisor: template ## the engine's suite (internal/sandbox: executions, files, commands, limits, attacks) again with every sandbox under gVisor; tests of what gVisor does not offer skip, saying why
	SHEEPFOLD_TEST_RUNTIME=gvisor go test -count=1 -timeout 40m ./internal/sandbox/

test-cgroupv2: template deb ## the engine's privileged tests, limits and the installed .deb's service in a qemu guest: Debian, systemd, pure cgroup v2 (test/cgroupv2)
	test/cgroupv2/run.sh

kubernetes-cluster: setup ## build the test Kubernetes cluster's binaries and images once (test/kubernetes/cluster.sh; about 20 minutes the first time)
	test/kubernetes/cluster.sh build

test-kubernetes: kubernetes-cluster template ## a real two-node Kubernetes cluster on this host: up, smoke test, serve --backend kubernetes end to end, down (always), host restored (test/kubernetes)
	test/kubernetes/test.sh

bench-kubernetes: kubernetes-cluster template ## the test cluster up, a Kubernetes-backed server measured by `sheepfold bench --url --local-baseline` (pool hit ×local, warm 1+1), down
	SHEEPFOLD_KUBE_BENCH=1 test/kubernetes/test.sh

NFPM := github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
DEB_VERSION := 0.0~$(subst -,.,$(VERSION))
deb: setup build ## bin/sheepfold.deb: both binaries, the pinned runc and CRIU, sheepfold.service, /etc/sheepfold/config.toml (nfpm from the Go proxy)
	GOBIN=$(CURDIR)/bin/tools go install $(NFPM)
	install -m 0755 $(DATA_DIR)/bin/runc bin/runc
	install -m 0755 $(DATA_DIR)/bin/criu bin/criu
	SHEEPFOLD_DEB_VERSION=$(DEB_VERSION) bin/tools/nfpm package --packager deb --config packaging/nfpm.yaml --target bin/sheepfold.deb

PREFIX ?= /usr/local
install: setup build ## sheepfold and the agent into $(PREFIX)/bin, the pinned runc, sheepfold.service and /etc/sheepfold/config.toml; enables and starts the service
	install -D -m 0755 bin/sheepfold $(PREFIX)/bin/sheepfold
	install -D -m 0755 bin/sheepfold-agent $(PREFIX)/bin/sheepfold-agent
	install -D -m 0755 $(DATA_DIR)/bin/runc $(PREFIX)/lib/sheepfold/runc
	sed 's#/usr/#$(PREFIX)/#g' packaging/sheepfold.service >/etc/systemd/system/sheepfold.service
	test -e /etc/sheepfold/config.toml || install -D -m 0644 packaging/config.toml /etc/sheepfold/config.toml
	packaging/postinst configure

BENCH_FLAGS ?=
bench: template ## a real `sheepfold serve` against host/runc/bwrap baselines (BENCHMARKS.md); also writes bench.json
	bin/sheepfold bench --json bench.json $(BENCH_FLAGS)

bench-isolation: template ## one tenant's floods (storage; logins and streams; unpaced requests) against another's p99: the ratio flooded / alone of each (BENCHMARKS.md, "Isolation")
	go test -run '^$$' -bench 'BenchmarkStorageFlood|BenchmarkFloodLeavesOthersAlone|BenchmarkUnpacedFlood' -benchtime 1x -count 3 ./internal/server/

clean: ## remove build outputs (templates stay in $(DATA_DIR))
	rm -rf bin
