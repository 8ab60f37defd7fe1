# cudatrace. `make demo` traces a bundled simulated CUDA workload; `make test`
# runs every test (the end-to-end ones need root: see README.md).

GO        ?= go
CC        ?= gcc
BIN       := bin/cudatrace
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# -z lazy: go-nvml leaves NVML's functions for the dynamic loader to bind
# on first call, and the driver's libnvidia-ml lacks the newest of them; a
# binary bound at start-up (-z now, as hardening flags ask) would not start
# at all on a host with an older driver or none.
LDFLAGS   := -X main.version=$(VERSION) -extldflags=-Wl,-z,lazy
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEMO_DIR  := bin/demo
# go-nvml's cgo declares NVML's deprecated functions; their warnings on every
# fresh build say nothing about cudatrace.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build release deps generate test test-unit bench bench-agent lint demo clean FORCE

all: build

# For the host's architecture (amd64 or arm64).
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/cudatrace

# Release binaries for linux/amd64 and linux/arm64, bin/cudatrace-linux-ARCH,
# from either host: cgo (go-nvml) cross-compiles with Debian's
# gcc-aarch64-linux-gnu (or gcc-x86-64-linux-gnu on an arm64 host); each
# embeds its architecture's BPF object (bpf/cudatrace_*_bpfel.o).
HOSTARCH := $(shell $(GO) env GOARCH)
CC_amd64 ?= $(if $(filter amd64,$(HOSTARCH)),$(CC),x86_64-linux-gnu-gcc)
CC_arm64 ?= $(if $(filter arm64,$(HOSTARCH)),$(CC),aarch64-linux-gnu-gcc)
release: bin/cudatrace-linux-amd64 bin/cudatrace-linux-arm64

bin/cudatrace-linux-%: FORCE
	CGO_ENABLED=1 GOOS=linux GOARCH=$* CC=$(CC_$*) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/cudatrace

FORCE:

# Regenerates bpf/cudatrace_{x86,arm64}_bpfel.{go,o} with clang (bpf/gen.go);
# CI checks the committed files match.
generate:
	$(GO) generate ./bpf/

# Everything, the privileged end-to-end tests (vmtest/) included. They need
# root (CAP_BPF, CAP_PERFMON); with CI=true a skip is a failure. deps
# installs what they need on Debian 12 (packages, and the kernels the QEMU
# matrix boots) and says nothing when it is all there. The matrix makes
# vmtest longer than go test's default 10 minutes.
test: deps build
	VMTEST_CUDATRACE=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 45m ./...

deps:
	@./scripts/deps.sh

# Unit tests only: no root, no BPF.
test-unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /vmtest)

# Per-event figures as ratios measured in one run (docs/benchmarks.md):
# user-space benchmarks (the agent's over ten million events, its flight
# recorder off and on); the overhead per allocation/free pair against the
# empty-probe floor, idle and with one core busy; the reader's CPU per
# event by stage; time in the return probe, by window and with and without
# the Python walk (BENCH_PYTHON, CPython 3.10-3.13); every program's time
# per pair against the floor's; the reader's CPU per event on a CPython
# process (BENCH_PYTHON). BASELINE=/path/to/an
# older cudatrace adds it to each script's rounds.
BENCH_PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 python3.11 python3.10 2>/dev/null))
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./ledger/ ./tracefile/ ./symbolize/ ./unwind/ ./export/ ./top/ ./record/ ./procmodel/
	$(GO) test -run '^$$' -bench AgentEvent -benchtime 10000000x ./agent/
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/overhead.sh
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/startup.sh
	$(GO) run ./bench/verifierstats ct_exit ct_usdt
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/readercpu.sh
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/bpfcost.sh
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/progcost.sh
	CUDATRACE=$(CURDIR)/$(BIN) THREADS=2 LOAD=6 ./bench/burst.sh 10000000 1
	$(if $(BENCH_PYTHON),CUDATRACE=$(CURDIR)/$(BIN) PYTHON=$(BENCH_PYTHON) ./bench/bpfcost.sh 20000 5,@echo "bench: no CPython 3.10-3.13 found for the Python walk's cost (BENCH_PYTHON=...)")
	$(if $(BENCH_PYTHON),CUDATRACE=$(CURDIR)/$(BIN) PYTHON=$(BENCH_PYTHON) ./bench/readercpu.sh 300000 3,@echo "bench: no CPython 3.10-3.13 found for the reader's CPU on a CPython process (BENCH_PYTHON=...)")

# The agent's memory over 5000 short-lived traced processes (a few minutes).
bench-agent: build
	CUDATRACE=$(CURDIR)/$(BIN) ./bench/agent-churn.sh 5000 5

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# A simulated CUDA program (demo/workload.c) on a stand-in libcudart
# (vmtest/testdata/fakecudart.c): no GPU needed, every event is real eBPF.
demo: build
	@mkdir -p $(DEMO_DIR)
	$(CC) -shared -fPIC -O2 -pthread -Wl,-soname,libcudart.so.12 \
		-Wl,--version-script=vmtest/testdata/fakecudart.map \
		-o $(DEMO_DIR)/libcudart.so.12 vmtest/testdata/fakecudart.c
	ln -sf libcudart.so.12 $(DEMO_DIR)/libcudart.so
	$(CC) -O0 -g -fno-omit-frame-pointer -pthread -o $(DEMO_DIR)/train demo/workload.c \
		-I vmtest/testdata -L$(DEMO_DIR) -lcudart -Wl,-rpath,$(CURDIR)/$(DEMO_DIR)
	@echo "== cudatrace record: a SIMULATED CUDA workload (stand-in libcudart, no GPU) =="
	$(BIN) record --lib $(DEMO_DIR)/libcudart.so.12 -o $(DEMO_DIR)/demo.trace -- $(DEMO_DIR)/train
	@echo "== cudatrace report $(DEMO_DIR)/demo.trace =="
	$(BIN) report $(DEMO_DIR)/demo.trace --top 5

clean:
	rm -rf bin
