# cutegen: build the default kernels on any CPU machine, test, and run the GPU tier on an H200.
#
#   make build      create .venv if needed, install cutegen[gen], build the default catalogue into build/
#                   (sm_90a and sm_100a; ARCH=sm_90a builds one architecture only)
#   make test       the CPU test tier (what CI runs)
#   make gpu-test   the GPU tier, on a machine with a Hopper GPU, from a build/ folder made elsewhere
#   make gpu-check  the GPU tier and the benchmark, each test file in its own time-limited process (logs in gpu-logs/)
#   make bench      the benchmark (GPU), reporting beside torch in the same run
#   make verify     check the SASS invariants of the built kernels (MMA opcode, no spills, registers, smem)
#   make export     export the built kernels with their C launcher into build/export (see examples/c_launcher)
#   make wheel      dist/cutegen-<version>-py3-none-any.whl: the runtime and the prebuilt default kernels, no generator
#   make install    create .venv and install cutegen[gen,test] (and a CPU torch)
#   make env        report versions, cuobjdump, GPU and cache location
#   make clean      remove the build folder
#   make help       this list
#
# `make` with no target creates .venv and installs cutegen[gen,test] (what `make install` does).

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
BUILD_DIR ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Empty: every architecture of the default schedules (sm_90a, sm_100a).
ARCH ?=
# The CPU machine needs torch only for the torch-facing layer's CPU tests; a CPU build is enough.
TORCH ?= torch==2.13.0
PATTERN ?=

EXPORT_DIR ?= $(BUILD_DIR)/export
DIST_DIR ?= dist
# The GPU targets point $CUTEGEN_BUILD_DIR at BUILD_DIR when it holds a catalogue; otherwise the
# runtime finds ./build or the kernels of an installed runtime wheel itself.
BUILD_DIR_ENV = $(if $(wildcard $(BUILD_DIR)/catalogue.json),CUTEGEN_BUILD_DIR=$(abspath $(BUILD_DIR)))

.PHONY: build test gpu-test gpu-check bench env clean install verify export wheel help

$(VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH)"
	$(VPY) -m pip install -q -e ".[gen,test]"
	touch $@

install: $(VENV)/.installed

build: $(VENV)/.installed
	$(VENV)/bin/cutegen build $(PATTERN) $(if $(ARCH),--arch $(ARCH)) -o $(BUILD_DIR) -j $(JOBS)

verify: $(VENV)/.installed
	$(VENV)/bin/cutegen verify $(PATTERN) --build-dir $(BUILD_DIR)

export: $(VENV)/.installed
	$(VENV)/bin/cutegen export $(PATTERN) --build-dir $(BUILD_DIR) -o $(EXPORT_DIR)

# The whole default catalogue (a cache hit when `make build` made it), then the wheel from it.
wheel: $(VENV)/.installed
	$(VENV)/bin/cutegen build -o $(BUILD_DIR) -j $(JOBS)
	$(VPY) -m cutegen.gen.wheel --build-dir $(BUILD_DIR) --dist $(DIST_DIR)

test: $(VENV)/.installed
	$(VPY) -m pytest tests/cpu -q -ra

# On the GPU machine: no package registry needed; uses the machine's python3 with torch and cuda-bindings.
# The kernels: BUILD_DIR (copied from the CPU machine), else those of an installed runtime wheel.
gpu-test:
	$(BUILD_DIR_ENV) $(PYTHON) -m pytest tests/gpu -q -ra

# The GPU tier and the benchmark, each test file in its own process under a time limit, logs in gpu-logs/.
gpu-check:
	$(BUILD_DIR_ENV) $(PYTHON) tests/gpu/run_all.py --out $(or $(OUT),gpu-logs)

bench:
	$(BUILD_DIR_ENV) $(PYTHON) -m cutegen.gen.cli bench

env: $(VENV)/.installed
	$(VENV)/bin/cutegen env

clean:
	rm -rf $(BUILD_DIR)

help:
	@sed -n 's/^#   make /make /p' $(firstword $(MAKEFILE_LIST))
