# provisioner — the two commands: `make demo` (try it all on a local lab) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROV := $(BIN)/provisioner
LAB_INVENTORY = $$($(PROV) lab up --json | $(BIN)/python -c 'import json,sys; print(json.load(sys.stdin)["inventory"])')

.PHONY: help install lint typecheck unit e2e test lab lab-down demo bench bench-doctor bench-install bench-smoke clean prereqs \
	reliability-check reliability-table goldens soak reference

help:
	@echo "make install   virtualenv in $(VENV), editable install, torch pinned to the CPU build"
	@echo "make demo      lab up, image build, cluster up, train PPO, plots, down"
	@echo "make test      ruff, mypy, unit tests, end-to-end tests on the lab"
	@echo "make lab       start a 3-node lab (make lab-down removes it)"
	@echo "make bench     benchmarks side by side (results in bench-results/)"
	@echo "make bench-smoke     the bench harness on its smallest sizes (not in make test)"
	@echo "make bench-install   the control machine's venv: pip install . vs .[playbooks]"
	@echo "make soak      one long training run under a storm of faults (bench-results/soak.json)"
	@echo "make reliability-table   docs/reliability.md's table from the last e2e run's record"
	@echo "make reference docs/reference.md from the CLI itself (make test fails when it is stale)"
	@echo "make goldens   recapture the doctor's golden facts from a lab"

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { echo "missing: $(PYTHON) (Python >= 3.11); on Debian: apt-get install -y python3 python3-venv"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python >= 3.11 is required: $(PYTHON) is $$($(PYTHON) --version)"; exit 1; }
	$(PYTHON) -m venv $(VENV) || { echo "cannot create a virtualenv; on Debian: apt-get install -y python3-venv"; exit 1; }

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --upgrade --quiet pip
	# torch is pinned to 2.13.0, the CPU build; an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed
	@# the editable install's bytecode, as `pip install .` writes it for an installed
	@# package: without it (PYTHONDONTWRITEBYTECODE set) every command compiles
	@# provisioner's modules again, a tenth of a second of each start
	@$(BIN)/python -m compileall -q provisioner

prereqs:
	@bash scripts/system-setup.sh

lint: install
	$(BIN)/ruff check provisioner tests scripts playbooks
	$(BIN)/ruff format --check provisioner tests scripts playbooks

typecheck: install
	$(BIN)/mypy

# two workers (pytest-xdist): the RLlib runs of the playbook tests overlap the others
unit: install
	$(BIN)/pytest -q -n 2 --dist loadgroup tests/unit

# The e2e tests record what each fault and security scenario observed (build/reliability.json,
# started afresh); docs/reliability.md's table must be what that record renders.
# Two pytest processes side by side: the tests on the `e2e` lab, and (marked `apart`, output
# in build/e2e-apart.log, shown at the end) those on the host-mode and SLURM labs.
e2e: install prereqs
	rm -f build/reliability.json
	mkdir -p build
	@$(BIN)/pytest -q -m "e2e and apart and not bench" --durations=15 --junitxml=build/e2e-apart.xml tests/e2e > build/e2e-apart.log 2>&1 & apart=$$!; \
	trap 'kill $$apart 2>/dev/null' INT TERM; \
	echo "e2e: the host-mode and SLURM labs' tests run beside these (build/e2e-apart.log)"; \
	$(BIN)/pytest -q -m "e2e and not apart and not bench" --durations=40 --junitxml=build/e2e-main.xml tests/e2e; main=$$?; \
	wait $$apart; rc=$$?; \
	echo "=== the host-mode and SLURM labs' tests (build/e2e-apart.log) ==="; \
	cat build/e2e-apart.log; \
	exit $$(( main != 0 || rc != 0 ))

reliability-check: install
	$(BIN)/python scripts/reliability_table.py --check

reference: install
	$(BIN)/python scripts/reference.py --write

reliability-table: install
	$(BIN)/python scripts/reliability_table.py --write

# `make test`: ruff, mypy and the unit tests while the cluster image (the e2e tests' pin)
# builds beside them (build/image-build.log; the e2e fixture's own build then finds it
# cached, or builds it again and shows why it failed); then the e2e tests; then the
# reliability table's check.
test: prereqs install
	@mkdir -p build; \
	$(PROV) image build --images-dir images > build/image-build.log 2>&1 & build=$$!; \
	trap 'kill $$build 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory lint typecheck unit; rc=$$?; \
	wait $$build || echo "the image build beside the unit tests failed: build/image-build.log"; \
	[ $$rc -eq 0 ] && $(MAKE) --no-print-directory e2e reliability-check

# The doctor's golden facts (tests/unit/golden/doctor/), captured from a real lab.
goldens: install prereqs
	$(BIN)/python scripts/capture_goldens.py

lab: install prereqs
	$(PROV) lab up --nodes 3

lab-down: install
	$(PROV) lab down

demo: prereqs install
	$(BIN)/python scripts/demo.py

BENCH_ARGS ?= --rows all
bench: install prereqs
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

# A storm of faults on one long run (about 20 minutes; not part of `make test`):
# the record goes to bench-results/soak.json.
SOAK_ARGS ?=
soak: install prereqs
	$(BIN)/python scripts/soak.py $(SOAK_ARGS)

LAB ?= lab
# the bench harness on its smallest sizes, on a lab of its own (tests/e2e/test_bench_smoke.py):
# out of `make test` for the suite's time; run it after changing scripts/bench*.py
bench-smoke: install prereqs
	$(BIN)/pytest -q -m e2e tests/e2e/test_bench_smoke.py

# the control machine's venv, `pip install .` against `.[playbooks]` (bench-results/install.json)
bench-install: install
	$(BIN)/python scripts/bench_install.py

bench-doctor: install prereqs
	$(PROV) lab up --name $(LAB) >/dev/null
	$(BIN)/python scripts/bench_doctor.py --lab $(LAB)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
