# Two commands for a new user (each installs what is missing, then builds):
#   make run    start mlaserve on the bundled tiny model (CPU workers) and answer a prompt
#   make test   build with ASan+UBSan and run every test under ctest (CUDA code compiled when
#               nvcc is there, run only on a GPU host: scripts/gpu_check.sh)
#   make check  a quick build without sanitizers and the fast labels (CHECK_LABELS) under ctest
# One test by name: cd build-test && ctest -R '^model_ds3_bf16$' --output-on-failure; labels
# and fixtures: docs/testing.md.
# `make build CUDA=ON` builds the CUDA backend too; `make bundle` a relocatable tree with it.
JOBS ?= $(shell nproc)
MODEL ?= models/tiny-deepseek3-bf16.gguf
BUILD ?= build
TEST_BUILD ?= build-test
CHECK_BUILD ?= build-check
CHECK_LABELS ?= unit|model
CUDA ?= OFF

# Ninja for a new build folder; one configured before (by hand, with another generator) keeps its own
gen = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja)

.PHONY: run test check deps build build-test build-check clean bundle

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(call gen,$(BUILD)) -DCMAKE_BUILD_TYPE=Release -DMLA_DEV_SWITCHES=OFF -DMLA_CUDA=$(CUDA) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@scripts/demo.sh $(BUILD) $(MODEL)

build-test:
	@scripts/install-deps.sh --test
	@CC=clang cmake -S . -B $(TEST_BUILD) $(call gen,$(TEST_BUILD)) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLA_SANITIZE=ON -DMLA_FUZZ=ON -DMLA_DEV_SWITCHES=ON >/dev/null
	@cmake --build $(TEST_BUILD) -j $(JOBS)

test: build-test
	cd $(TEST_BUILD) && ctest --output-on-failure -j $(JOBS)

build-check:
	@scripts/install-deps.sh --test
	@cmake -S . -B $(CHECK_BUILD) $(call gen,$(CHECK_BUILD)) -DCMAKE_BUILD_TYPE=Release -DMLA_DEV_SWITCHES=ON -DMLA_CUDA=OFF >/dev/null
	@cmake --build $(CHECK_BUILD) -j $(JOBS)

check: build-check
	cd $(CHECK_BUILD) && ctest --output-on-failure -j $(JOBS) -L '$(CHECK_LABELS)'

# a relocatable release tree with CUDA (sm_90/100/120) in .bundle/: bin/ + lib/ (scripts/bundle.sh)
bundle:
	@scripts/bundle.sh .bundle

clean:
	rm -rf $(BUILD) $(TEST_BUILD) $(CHECK_BUILD)
