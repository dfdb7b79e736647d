# kvctl build. `make test` is what CI runs; `make verify` checks formatting, lint, modules and
# that generated files are up to date.

GO        ?= go
BIN       ?= bin/kvctl
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GOLANGCI_LINT_VERSION ?= v2.15.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
GOBIN     ?= $(shell $(GO) env GOPATH)/bin
LINT      := $(GOBIN)/golangci-lint
BENCH     ?= .
BENCHTIME ?= 1s
COUNT     ?= 5

# go-nvml's cgo build warns about deprecated declarations it cannot avoid.
export CGO_CFLAGS := -Wno-deprecated-declarations

.PHONY: all build install test test-norace bench lint fmt golden docs verify proto tools clean pyenv ptx pytools engineenv vllmenv pytest-sdk pytest-vllm proto-python ruff image

# The Python environment the interoperability tests use: the real mooncake_master and Mooncake's
# Python store client, pinned in tools/python/requirements.txt. Tests find it through KVCTL_PYENV.
PYENV     ?= $(CURDIR)/.cache/pyenv
PYTHON3   ?= python3
export KVCTL_PYENV := $(PYENV)
# Libraries the wheel's binaries need that the system lacks, unpacked there by `make pyenv`
# (tools/python/syslibs.sh); the test harness adds the same folder when run without make.
export LD_LIBRARY_PATH := $(PYENV)/syslib/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))

all: build

# The GPU kernels (gpu/kernels/*.cu) compiled to PTX with NVRTC from PyPI (pinned in
# tools/ptx/requirements.txt), in a virtual environment of their own; no GPU or CUDA toolkit is
# needed. The PTX is committed; TestPTXMatchesSource fails when it is older than its source.
PTXENV    ?= $(CURDIR)/.cache/ptxenv
ptx: $(PTXENV)/.stamp
	$(PTXENV)/bin/python tools/ptx/nvrtc.py gpu/kernels/pagesum.cu gpu/kernels/pagesum.ptx

$(PTXENV)/.stamp: tools/ptx/requirements.txt
	@rm -rf $(PTXENV) && $(PYTHON3) -m venv $(PTXENV) && \
		$(PTXENV)/bin/pip install -q --disable-pip-version-check -r tools/ptx/requirements.txt && touch $@

# Python developer tools (tools/pytools/requirements.txt: grpcio-tools, ruff), in a virtual
# environment of their own. grpcio-tools' bundled protoc generates the engine SDK's stubs, so the
# Python side needs no system protoc.
PYTOOLS   ?= $(CURDIR)/.cache/pytools
PYSDK     := clients/python
PYSDK_PB  := $(PYSDK)/kvctl_engine/_pb
pytools: $(PYTOOLS)/.stamp

$(PYTOOLS)/.stamp: tools/pytools/requirements.txt
	@rm -rf $(PYTOOLS) && $(PYTHON3) -m venv $(PYTOOLS) && \
		$(PYTOOLS)/bin/pip install -q --disable-pip-version-check -r tools/pytools/requirements.txt && touch $@

# The engine SDK's environment for its tests and the reference engine: torch (CPU) and
# transformers, pinned in tools/engine/requirements.txt, with the SDK installed from
# clients/python (editable, so a change to the SDK needs no rebuild).
ENGINEENV ?= $(CURDIR)/.cache/engineenv
engineenv: $(ENGINEENV)/.stamp

$(ENGINEENV)/.stamp: tools/engine/requirements.txt $(PYSDK)/pyproject.toml
	@echo '== engine SDK environment $(ENGINEENV)'
	@rm -rf $(ENGINEENV) && $(PYTHON3) -m venv $(ENGINEENV) && \
		$(ENGINEENV)/bin/pip install -q --disable-pip-version-check -r tools/engine/requirements.txt && \
		$(ENGINEENV)/bin/pip install -q --disable-pip-version-check --no-deps -e $(PYSDK) && touch $@

# vLLM's scheduler on CPU, for the vLLM connector's tests: a virtual environment layered over
# the engine SDK's (a .pth file adds ENGINEENV's site-packages), with vLLM and the modules its
# scheduler imports installed without their dependencies (tools/vllm/requirements.txt says why).
# The engine environment is an order-only prerequisite: built when missing, never rebuilt from here.
VLLMENV   ?= $(CURDIR)/.cache/vllmenv
vllmenv: $(VLLMENV)/.stamp

$(VLLMENV)/.stamp: tools/vllm/requirements.txt | $(ENGINEENV)/.stamp
	@echo '== vLLM environment $(VLLMENV)'
	@rm -rf $(VLLMENV) && $(PYTHON3) -m venv $(VLLMENV) && \
		$(ENGINEENV)/bin/python -c 'import site; print(site.getsitepackages()[0])' \
			>"$$($(VLLMENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/kvctl-engineenv.pth" && \
		$(VLLMENV)/bin/pip install -q --disable-pip-version-check --no-deps -r tools/vllm/requirements.txt && \
		$(VLLMENV)/bin/python -c 'from vllm.v1.core.sched.scheduler import Scheduler' && touch $@

# The SDK's tests run against a real kvctl serve built from this tree (the fixture builds it).
# Those marked vllm (kvctl_engine.vllm against vLLM's real scheduler) need vLLM and run in the
# vLLM environment (pytest-vllm), where a missing vLLM fails them instead of skipping them.
pytest-sdk: engineenv
	$(ENGINEENV)/bin/python -m pytest -q -m 'not vllm' $(PYSDK)/tests

pytest-vllm: vllmenv
	KVCTL_NEED_VLLM=1 $(VLLMENV)/bin/python -m pytest -q -m vllm $(PYSDK)/tests

# The Python stubs of the engine API, generated into the SDK with grpcio-tools' protoc. The proto
# is copied under the package path first so that the generated modules import each other as
# kvctl_engine._pb.
proto-python: pytools
	@tmp=$$(mktemp -d) && mkdir -p $$tmp/src/kvctl_engine/_pb $$tmp/out && cp core/engineapi/engine.proto $$tmp/src/kvctl_engine/_pb/ && \
		$(PYTOOLS)/bin/python -m grpc_tools.protoc -I $$tmp/src --python_out=$$tmp/out --pyi_out=$$tmp/out --grpc_python_out=$$tmp/out \
			kvctl_engine/_pb/engine.proto && \
		for f in engine_pb2.py engine_pb2.pyi engine_pb2_grpc.py; do cp $$tmp/out/kvctl_engine/_pb/$$f $(PYSDK_PB)/$$f; done; rm -rf $$tmp

ruff: pytools
	$(PYTOOLS)/bin/ruff check --config tools/pytools/ruff.toml .
	$(PYTOOLS)/bin/ruff format --check --config tools/pytools/ruff.toml .

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kvctl

# The container image the Kubernetes DaemonSet runs (Dockerfile; a non-root user, 65532).
IMAGE     ?= ghcr.io/kvctl/kvctl
DOCKER    ?= docker
image:
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE):$(VERSION) -t $(IMAGE):latest .

install:
	$(GO) install -trimpath -ldflags '$(LDFLAGS)' ./cmd/kvctl

# The whole suite runs under the race detector: the connector, pool and daemon are concurrent by
# design and their tests are written to catch races. The SDK's pytest suite runs beside the Go
# tests: it spends most of its time waiting (model processes starting, read leases running out),
# so together they take about the time of the Go tests alone. The vLLM connector's tests follow
# it in the same background job, in the vLLM environment. Their output follows the Go tests'.
test: pyenv engineenv vllmenv
	@mkdir -p .cache; log=.cache/pytest-sdk.log; \
	{ $(MAKE) --no-print-directory pytest-sdk; sdk=$$?; $(MAKE) --no-print-directory pytest-vllm; vl=$$?; \
		[ $$sdk -eq 0 ] && [ $$vl -eq 0 ]; } >$$log 2>&1 & py=$$!; \
	$(GO) test -race -count=1 ./...; go_rc=$$?; \
	wait $$py; py_rc=$$?; \
	echo "== pytest $(PYSDK)/tests"; cat $$log; \
	if [ $$go_rc -ne 0 ] || [ $$py_rc -ne 0 ]; then echo "make test: go test exit $$go_rc, pytest exit $$py_rc"; exit 1; fi

test-norace: pyenv
	$(GO) test -count=1 ./...

# Rebuilt only when the pinned requirements change. Without network access or python3-venv the
# Mooncake interop tests skip on a developer machine (CI=true makes them fail instead). The
# shared libraries the wheel links against are checked every time (syslibs.sh).
pyenv: $(PYENV)/.stamp
	@if [ -d $(PYENV) ]; then sh tools/python/syslibs.sh $(PYENV); fi

$(PYENV)/.stamp: tools/python/requirements.txt
	@echo '== python environment $(PYENV)'
	@rm -rf $(PYENV) && $(PYTHON3) -m venv $(PYENV) && \
		$(PYENV)/bin/pip install -q --disable-pip-version-check -r tools/python/requirements.txt && \
		touch $@ || { rm -rf $(PYENV); echo 'pyenv: could not build $(PYENV) (needs python3-venv and PyPI)'; \
		if [ -n "$$CI" ]; then exit 1; fi; }

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

# Rewrites the golden files of the packages whose tests take -update (only those define the flag).
golden:
	$(GO) test $$(grep -rl --include='*_test.go' 'flag.Bool("update"' . | xargs -n1 dirname | sort -u) -update

docs:
	$(GO) run ./cmd/gendocs -man man -completions completions

tools: $(LINT) $(GOBIN)/protoc-gen-go $(GOBIN)/protoc-gen-go-grpc

$(GOBIN)/protoc-gen-go:
	GOFLAGS= $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(GOBIN)/protoc-gen-go-grpc:
	GOFLAGS= $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Regenerates the engine API's Go code from core/engineapi/engine.proto (needs protoc) and the
# engine SDK's Python stubs (proto-python, grpcio-tools' own protoc).
proto: $(GOBIN)/protoc-gen-go $(GOBIN)/protoc-gen-go-grpc proto-python
	protoc --plugin=protoc-gen-go=$(GOBIN)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(GOBIN)/protoc-gen-go-grpc \
		--go_out=. --go_opt=module=github.com/kvctl/kvctl \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvctl/kvctl \
		-I core/engineapi core/engineapi/engine.proto
	protoc --include_imports --descriptor_set_out=core/daemon/testdata/engine.pb -I core/engineapi core/engineapi/engine.proto

$(LINT):
	GOFLAGS= $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

lint: $(LINT)
	$(LINT) run ./...

verify: tools pytools
	@echo '== gofmt'; out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@echo '== go vet'; $(GO) vet ./...
	@echo '== golangci-lint'; $(LINT) run ./...
	@echo '== go mod tidy'; bak=$$(mktemp -d); cp go.mod go.sum $$bak/; \
		$(GO) mod tidy; \
		if ! cmp -s go.mod $$bak/go.mod || ! cmp -s go.sum $$bak/go.sum; then \
			diff -u $$bak/go.mod go.mod; \
			cp $$bak/go.mod go.mod; cp $$bak/go.sum go.sum; rm -rf $$bak; \
			echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; fi; rm -rf $$bak
	@echo '== generated docs'; tmp=$$(mktemp -d); $(GO) run ./cmd/gendocs -man $$tmp/man -previous man -completions $$tmp/completions && \
		diff -r man $$tmp/man && diff -r completions $$tmp/completions || { echo "man pages or completions are stale: run make docs"; rm -rf $$tmp; exit 1; }; rm -rf $$tmp
	@echo '== generated protobuf'; if command -v protoc >/dev/null; then tmp=$$(mktemp -d); \
		protoc --plugin=protoc-gen-go=$(GOBIN)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(GOBIN)/protoc-gen-go-grpc \
			--go_out=$$tmp --go_opt=module=github.com/kvctl/kvctl --go-grpc_out=$$tmp --go-grpc_opt=module=github.com/kvctl/kvctl \
			-I core/engineapi core/engineapi/engine.proto && diff -r core/engineapi/enginepb $$tmp/core/engineapi/enginepb \
			&& protoc --include_imports --descriptor_set_out=$$tmp/engine.pb -I core/engineapi core/engineapi/engine.proto \
			&& cmp core/daemon/testdata/engine.pb $$tmp/engine.pb \
			|| { echo "generated protobuf is stale: run make proto"; rm -rf $$tmp; exit 1; }; rm -rf $$tmp; \
		else echo "protoc not installed: skipped (make tools needs it; apt-get install protobuf-compiler)"; fi
	@echo '== generated Python stubs'; tmp=$$(mktemp -d); mkdir -p $$tmp/src/kvctl_engine/_pb $$tmp/out && cp core/engineapi/engine.proto $$tmp/src/kvctl_engine/_pb/ && \
		$(PYTOOLS)/bin/python -m grpc_tools.protoc -I $$tmp/src --python_out=$$tmp/out --pyi_out=$$tmp/out --grpc_python_out=$$tmp/out kvctl_engine/_pb/engine.proto && \
		stale=; for f in engine_pb2.py engine_pb2.pyi engine_pb2_grpc.py; do cmp -s $(PYSDK_PB)/$$f $$tmp/out/kvctl_engine/_pb/$$f || stale="$$stale $$f"; done; \
		rm -rf $$tmp; if [ -n "$$stale" ]; then echo "the engine SDK's Python stubs are stale ($$stale): run make proto"; exit 1; fi
	@echo '== ruff'; $(PYTOOLS)/bin/ruff check --config tools/pytools/ruff.toml . && $(PYTOOLS)/bin/ruff format --check --config tools/pytools/ruff.toml . \
		|| { echo "ruff: fix the Python above (ruff format, ruff check --fix)"; exit 1; }
	@echo 'verify: ok'

clean:
	rm -rf bin
