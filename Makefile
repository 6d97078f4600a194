# loadline developer entry points. Everything a target needs, it installs itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: help venv tools test unit lint typecheck e2e cluster-up cluster-down demo demo-down crds bench clean

help:
	@echo "make demo        the main job: local cluster, CRDs, operator, examples planned and running"
	@echo "make demo-down   stop the demo operator and the local cluster"
	@echo "make test        lint, type-check, unit tests, then e2e tests on a local control plane"
	@echo "make unit        fast tests only (no cluster)"
	@echo "make e2e         e2e tests (brings the local control plane up if needed)"
	@echo "make tools       build or unpack every e2e binary into the cache (~/.cache/loadline) and list them"
	@echo "make cluster-up  start the local control plane (kube-apiserver, etcd, KWOK GPU nodes)"
	@echo "make crds        regenerate crds/ from the pydantic models"
	@echo "make bench       print benchmark figures"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(VENV)/bin/ruff check operator tests e2e benchmarks scripts
	$(VENV)/bin/ruff format --check operator tests e2e benchmarks scripts

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/pytest tests

test: lint typecheck unit e2e

crds: venv
	$(VENV)/bin/loadline crds --split crds/
	$(VENV)/bin/loadline crds --split charts/loadline/crds/

bench: venv
	$(PY) benchmarks/plan_1000.py
	$(PY) benchmarks/plan_catalog.py
	$(PY) benchmarks/plan_fleet.py
	$(PY) benchmarks/windows.py

demo: venv tools cluster-up
	@for f in examples/*.yaml; do echo "== loadline plan $$f"; $(VENV)/bin/loadline plan $$f || exit 1; done
	e2e/demo.sh

demo-down: venv
	$(PY) e2e/chart.py down
	e2e/cluster-down.sh

cluster-up: venv
	PYTHON=$(PY) e2e/cluster-up.sh

cluster-down:
	e2e/cluster-down.sh

# Everything the e2e tests run (Kubernetes, etcd, KWOK, Helm, the LeaderWorkerSet controller, KEDA, Prometheus)
# is built or unpacked into the cache here, with a line per component saying what was installed.
tools:
	e2e/install-tools.sh

# Stops the cluster afterwards when it started it (a running one is kept): see e2e/run.sh.
e2e: venv tools
	PYTHON=$(PY) e2e/run.sh
