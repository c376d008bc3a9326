# `make run`: install what is missing, build (Release, ccache), run the main job.
# `make test`: install what is missing, build, run the tests.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
MODELS ?= $(abspath ../shared/models)
# ccache hits across clones (CI builds a fresh clone each time).
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all setup configure build run test check-threads check-deploy check-fuzz clean

all: build

setup:
	@./scripts/setup.sh

configure: setup
	@if [ ! -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null; fi

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@./scripts/run_demo.sh $(BUILD_DIR)/bin "$(MODELS)"

test: build
	@cd $(BUILD_DIR) && LAZYKV_MODELS_DIR="$(MODELS)" ctest --output-on-failure -j $(JOBS)

# clang -Wthread-safety as errors, and the concurrent tests under ThreadSanitizer.
check-threads: setup
	@LAZYKV_MODELS_DIR="$(MODELS)" JOBS=$(JOBS) ./scripts/check_threads.sh $(BUILD_DIR)-tsan

# The Helm chart (lint, render, Kubernetes schemas, yamllint), the Prometheus rules (promtool
# check and unit tests) and the dashboards (valid, unique ids, PromQL parses, metrics exist in
# the saved scrapes). Offline once the tools are installed.
check-deploy: setup
	@./scripts/check_helm.sh
	@./scripts/check_prometheus.sh
	@/usr/bin/python3 scripts/check_dashboards.py --scrape deploy/local/scrapes/*.prom

# The fuzz targets (fuzz/), a few seconds each over their seed corpora (which hold every
# input that once crashed). Longer: scripts/fuzz.sh 120.
check-fuzz: setup
	@CCACHE_NOHASHDIR=1 JOBS=$(JOBS) ./scripts/fuzz.sh 5

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR)-tsan build-fuzz
