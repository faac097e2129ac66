# One entry point for set-up, the demo, tests, lint and benchmarks. Everything installs into ./.venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Workers started by msrun look for `python` on PATH: the venv's must come first.
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python writes the bytecode of what it imports, once: where the environment sets PYTHONDONTWRITEBYTECODE (this
# machine's does), every process would compile MindSpore's ~2,000 modules from source again (7.5 s an import
# here, 3.4 s from bytecode), and the suite starts a few hundred such processes. .gitignore keeps __pycache__ out.
export PYTHONDONTWRITEBYTECODE :=
DEBIAN_PACKAGES := prometheus prometheus-alertmanager prometheus-pushgateway victoria-metrics chromium tmux

.PHONY: install demo test test-unit test-integration test-long test-py39 test-py312 mindformers-venv mindformers2 lint fmt generate bench bench-model-size bench-reductions bench-compare scaling reliability detection gil-hold hangs-healthy divergence-clean sdc failslow debian-packages clean

install: $(STAMP)

# --no-compile: Python compiles what is imported on first use (see PYTHONDONTWRITEBYTECODE above); byte-compiling all
# of MindSpore up front costs CI ~30 s.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[mindspore,test,otlp,auth,stacks]'
	touch $(STAMP)

demo: install
	$(BIN)/ms-exporter demo

debian-packages:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Under `make -j2 test` (.ci/run) the Debian packages install beside pip, then the second venv (MindSpore Transformers
# 1.8.0 with MindSpore 2.7.2, about 90 s the first time, then cached) is built beside lint and the unit tests, and the
# other Pythons' venvs and their short sets (OTHER_PYTHON_CI: the unit suite and one real training per driver on
# Python 3.9 + MindSpore 2.7.2 and 3.12 + 2.10) run two at a time with those; the integration tests run last (tests/integration/test_mindformers.py runs in the second venv and skips, saying why,
# where it cannot be built). The long scenarios (marked `long`: docs/development.md#the-suite-and-the-long-scenarios)
# are left to `make test-long`.
test: OTHER_PYTHON_TESTS = $(OTHER_PYTHON_CI)
test: debian-packages lint test-unit mindformers-venv mindformers2 test-py39 test-py312
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 -m "not long" tests/integration

mindformers-venv: install
	$(BIN)/python -m tests.support.mindformers_venv

# MindSpore Transformers 2.0.0 installed with --no-deps into ./.mindformers2 (12 MB, a few seconds, then kept while
# its stamp matches): its dependency hyper-parallel is not on the package index. tests/integration/test_mindformers2.py
# puts the folder on its jobs' PYTHONPATH and skips, saying so, where it is missing (docs/mindformers.md).
mindformers2: install
	$(BIN)/python -m tests.support.mindformers2

# The unit tests alone: no Prometheus, no browser (about 3 minutes on 2 cores; a few start processes of their own).
test-unit: install
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 -m "not long" tests/unit

# The integration tests alone: real training, real Prometheus, Alertmanager and Pushgateway, headless Chromium (most
# of `make test`'s time); the Debian packages and MindSpore Transformers (the 1.8 venv, the 2.0.0 install) first, as
# for `make test`.
test-integration: install debian-packages mindformers-venv mindformers2
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 -m "not long" tests/integration

# About 15 minutes: the long scenarios and the repeats that `make test` leaves out, each with the short version the
# suite keeps named in docs/development.md#the-suite-and-the-long-scenarios.
test-long: install debian-packages mindformers-venv
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 -m long tests

# The training side on the oldest and the newest Python it supports, each in a venv of its own (about 2.8 GB; built
# once, then kept while pyproject.toml is unchanged): pyenv's 3.9.18 with MindSpore 2.7.2 (the 2.7 line is what
# MindSpore serves 3.9 with) and pyenv's 3.12.1 with MindSpore 2.10.0. Each runs the unit suite, real Model.train runs
# scraped over HTTP (test_training.py) and the endpoint's TLS (its handshake is done by hand before 3.11:
# core/compat.py); on 3.9, mypy 1.x checks the package against 3.9's standard library too (mypy 2 cannot target it).
# docs/development.md#other-pythons says what skips there and why.
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON_39 := 3.9.18
MINDSPORE_39 := 2.7.2
EXTRAS_39 := mindspore,test
PYTHON_312 := 3.12.1
MINDSPORE_312 := 2.10.0
EXTRAS_312 := mindspore,test,otlp
TLS_TESTS := tests/integration/test_web_access.py::test_tls_serves_https_and_plain_http_fails \
	tests/integration/test_web_access.py::test_keep_alive_over_tls
OTHER_PYTHON_TESTS := tests/unit tests/integration/test_training.py \
	tests/integration/test_loop_api.py::test_the_quick_start_loop_serves_what_it_computed $(TLS_TESTS)
# What `make test` (CI) runs there, to stay inside its time: the unit suite, one real training of each driver (a
# Model.train scraped over HTTP, MindSpore's quick start loop with @ms.jit) and the TLS.
OTHER_PYTHON_CI := tests/unit 'tests/integration/test_training.py::test_real_training_is_reported_step_by_step[graph]' \
	'tests/integration/test_loop_api.py::test_the_quick_start_loop_serves_what_it_computed[jit]' $(TLS_TESTS)

.venv-py%/.installed: pyproject.toml
	@test -x $(PYENV_ROOT)/versions/$(PYTHON_$*)/bin/python3 || \
		(echo "needs pyenv's Python $(PYTHON_$*) in $(PYENV_ROOT)/versions: pyenv install $(PYTHON_$*)" >&2; exit 1)
	test -x $(@D)/bin/python || $(PYENV_ROOT)/versions/$(PYTHON_$*)/bin/python3 -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet --upgrade pip
	$(@D)/bin/python -m pip install --quiet --no-compile -e '.[$(EXTRAS_$*)]' 'mindspore==$(MINDSPORE_$*)' 'numpy<2'
	touch $@

test-py39: .venv-py39/.installed
	PATH=$(CURDIR)/.venv-py39/bin:$$PATH .venv-py39/bin/python -m pytest -q -p no:cacheprovider --durations=10 -rs \
		-m "not long" $(OTHER_PYTHON_TESTS)
	.venv-py39/bin/mypy --python-version 3.9 --ignore-missing-imports --exclude 'ms_exporter/sinks/(otlp|otel_sdk)\.py'

test-py312: .venv-py312/.installed
	PATH=$(CURDIR)/.venv-py312/bin:$$PATH .venv-py312/bin/python -m pytest -q -p no:cacheprovider --durations=10 -rs \
		-m "not long" $(OTHER_PYTHON_TESTS)

# ruff, and mypy with the settings in pyproject.toml ([tool.mypy]): zero errors.
lint: install
	$(BIN)/ruff check ms_exporter tests examples benchmarks
	$(BIN)/ruff format --check ms_exporter tests examples benchmarks
	$(BIN)/mypy

# Formats the code ([tool.ruff.format] in pyproject.toml) and applies ruff's safe fixes. The pre-commit hooks
# (.pre-commit-config.yaml: ruff, ruff format --check, mypy) check the same, from this venv.
fmt: install
	$(BIN)/ruff format ms_exporter tests examples benchmarks
	$(BIN)/ruff check --fix ms_exporter tests examples benchmarks

# Rewrites every generated deploy file from the code; tests fail while a committed one differs.
generate: install
	$(BIN)/ms-exporter rules -o deploy/prometheus/rules/mindspore-training.rules.yml
	$(BIN)/python -m ms_exporter.generate.rule_series -o ms_exporter/sinks/shared/rule_series.py
	$(BIN)/python -m ms_exporter.generate.parts -o ms_exporter/core/builtin_parts.py --docs docs/configuration.md
	$(BIN)/python -m ms_exporter.generate.module_map --docs docs/architecture.md
	$(BIN)/python -m ms_exporter.generate.settings_tables --docs docs/configuration.md
	$(BIN)/python -m ms_exporter.generate.metrics_tables --docs docs/metrics.md
	$(BIN)/ms-exporter dashboard -o deploy/grafana/dashboards/mindspore-training.json
	$(BIN)/ms-exporter kubernetes -o deploy/kubernetes/base

# About 80 minutes on 2 cores; rewrites docs/benchmarks.md (then its cost-against-model-size section and
# docs/model-size.svg) and the sketch's error table in docs/update-ratio.md. Run it on an otherwise idle machine.
bench: install
	$(BIN)/python -m benchmarks.run --output docs/benchmarks.md
	$(MAKE) bench-model-size
	$(BIN)/python -m benchmarks.update_ratio_sketch --output docs/update-ratio.md

# About 10 minutes, 10 GB of memory at 400 M parameters: every per-layer feature's cost at 1 M, 25 M, 100 M and
# 400 M parameters; rewrites that section of docs/benchmarks.md and draws docs/model-size.svg (matplotlib).
bench-model-size: install
	$(BIN)/python -m pip install --quiet --no-compile -e '.[bench]'
	$(BIN)/python -m benchmarks.model_size --output docs/benchmarks.md

# About a minute (48 s here): the rows of docs/benchmarks.md the device reductions decide (the fingerprint, replica
# check and rollback targets, rollback by size, the opt-in features per sample), rewritten in place without make bench.
bench-reductions: install
	$(BIN)/python -m benchmarks.reductions_refresh --output docs/benchmarks.md

# About 4 minutes: two commits' hot path and /metrics latency in alternating fresh processes, on this machine;
# rewrites docs/benchmark-comparison.md. make bench-compare OLD=<commit> NEW=<commit>
OLD ?= HEAD~1
NEW ?= HEAD
bench-compare: install
	$(BIN)/python -m benchmarks.compare $(OLD) $(NEW) --output docs/benchmark-comparison.md

# About 4 minutes: per-rank series and bytes, a real Prometheus over replayed ranks; rewrites docs/scaling.md.
scaling: install debian-packages
	$(BIN)/python -m benchmarks.scaling

# About 15 minutes: every documented failure injected into a real training, timed to the first webhook POST of a real
# Prometheus and Alertmanager running the shipped files, beside a healthy run; rewrites docs/detection.md.
detection: install debian-packages
	$(BIN)/python -m benchmarks.detection --output docs/detection.md

# About 2 minutes: the watchdog and the endpoint while a native call holds the GIL; rewrites docs/gil-hold.md.
gil-hold: install
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m benchmarks.gil_hold --output docs/gil-hold.md

# About 11 minutes: the healthy-run test of tests/integration/test_hangs.py for 10+ minutes instead of 2
# (70 epochs: 1,470 steps, 9 pauses of 45 s, 14 evaluations).
hangs-healthy: install debian-packages
	HANGS_HEALTHY_EPOCHS=70 $(BIN)/python -m pytest -q -s tests/integration/test_hangs.py -k healthy

# About 40 minutes: the silent data corruption injection campaign (three replicas of the demo Transformer, 10,000
# steps, one bit flip every 8), the replica checks' step time on and off in a 3-rank msrun job, and the campaign's
# flips in 3-rank msrun jobs; rewrites the measured sections of docs/sdc.md and draws docs/sdc.svg (matplotlib).
sdc: install
	$(BIN)/python -m pip install --quiet --no-compile -e '.[bench]'
	$(BIN)/python -m benchmarks.sdc --output docs/sdc.md
	$(BIN)/python -m benchmarks.sdc_msrun --output docs/sdc.md
	$(BIN)/python -m benchmarks.sdc_msrun_campaign --output docs/sdc.md

# A few minutes: fail-slow localisation and onset on simulated jobs of 64-1,024 ranks driven by a real trace, and the
# checkpoint interval advisor against the best interval over 10^4 simulated job-days per scenario (docs/failslow.md).
failslow: install
	$(BIN)/python -m benchmarks.failslow --output docs/failslow.md
	$(BIN)/python -m benchmarks.checkpoint_interval --output docs/failslow.md
	$(BIN)/python -m benchmarks.slowness_cost --output docs/benchmarks.md

# About 20 minutes: a clean 3-rank data-parallel job of 10,017 steps, fingerprints and replica checks compared every 20,
# local gradient norms checked every step (docs/divergence.md, docs/sdc.md).
divergence-clean: install debian-packages
	DIVERGENCE_CLEAN_EPOCHS=477 $(BIN)/python -m pytest -q -s tests/integration/test_divergence.py -k clean

# About 15 minutes: /metrics hammered by wrk during training, and a 20,000-step soak; rewrites docs/reliability.md.
reliability: install debian-packages
	@command -v wrk >/dev/null && command -v nginx >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light >/dev/null)
	$(BIN)/python -m benchmarks.reliability --output docs/reliability.md

clean:
	rm -rf $(VENV) .venv-mindformers .mindformers2 .venv-py39 .venv-py312 monitor_output .pytest_cache
