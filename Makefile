# The kit's user interface. Every target that runs Python sets up .venv first when needed.
#
#   make lectures        execute every lecture notebook (build/lectures/: notebooks + HTML)
#   make test            run the test suite
#   make lab             JupyterLab on the kit, for live teaching
#   make bench           benchmarks: tables on screen, JSON under build/bench/
#   make setup           create .venv and install the kit (a second run takes seconds)
#   make strip           remove outputs from stored notebooks before committing
#   make clean           remove build artefacts (make distclean also removes .venv)
#
# Knobs: DEVICE=cpu|cuda (lectures), B=<name> and QUICK=1 (bench), PYTEST_ARGS=... (test).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Tools installed in the venv (jupyter, nbgrader, alembic, torchrun) must be found by subprocesses.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup lab lectures bench test strip clean distclean

help:
	@sed -n '2,13p' Makefile | sed 's/^# \{0,1\}//'

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -e .
	@touch $(STAMP)
	@echo "kit installed in $(VENV)"

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root)

lectures: setup
	$(PY) -m helpers.notebooks run lectures --out build/lectures $(if $(DEVICE),-p device=$(DEVICE))

bench: setup
	$(PY) -m tests.bench --out build/bench $(if $(B),--only $(B)) $(if $(QUICK),--quick)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

strip: setup
	$(PY) -m helpers.notebooks strip lectures $(wildcard assignments/source)

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# Data-parallel training of LeNet under torchrun on this machine (NPROC processes; DDP_ARGS=... passes options).
NPROC ?= 2
.PHONY: ddp-demo
ddp-demo: setup
	$(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) -m helpers.ddp_train $(DDP_ARGS)
