# tinylearn — every target creates .venv on first use (make setup).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# installs go through uv when it can be had (~30 s instead of ~200 s for the dependency set), else pip
INSTALL := tools/pip_install.sh $(PY)
EXTRAS ?= notebooks,kernels,dist,dev,serve,tune
# pytest-xdist workers for the unit tests (auto = one per core; 0 = in-process, no xdist). The notebooks run two at
# a time (NB_JOBS=2, tools/nbval_run.py: --dist loadfile keeps each notebook's cells in order on one kernel) except
# those the topic table marks notebook_exclusive (asserts on multi-process or core-capacity measurements), which run
# alone first; a notebook that fails beside another is rerun alone and named. NB_JOBS=1: one at a time
JOBS ?= auto
XDIST := -n $(JOBS)
# one OpenMP / torch / BLAS thread per xdist worker (the workers already fill the cores): two workers x two threads on
# two cores made every OpenMP barrier wait for a time slice (a 0.2 ms flash-attention call took 17 ms). Tests that
# exercise the threaded paths pass threads= explicitly or set OMP_NUM_THREADS in their child's environment.
XDIST_ENV := $(if $(filter-out 0,$(JOBS)),OMP_NUM_THREADS=1,)
NB_JOBS ?= 2
STAMP := $(VENV)/.tinylearn-installed

.PHONY: setup system-deps lab bench test test-tests test-exercises test-notebooks test-portable test-lab wheel-smoke exercises \
	notebooks build lint clean

setup: system-deps $(STAMP)

# clang (tinygrad's CPU device), Open MPI, g++, python3-venv: apt-get as root, else sudo -n, else the exact command
system-deps:
	@tools/system_deps.sh

$(STAMP): pyproject.toml constraints.txt CMakeLists.txt | system-deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(INSTALL) -q --upgrade pip
	$(INSTALL) -q -c constraints.txt scikit-build-core pybind11 cmake ninja
	$(INSTALL) -q -c constraints.txt --no-build-isolation -e ".[$(EXTRAS)]"
	$(PY) -c "import tinylearn._C"
	@touch $(STAMP)

build: $(STAMP)  ## rebuild tinylearn._C after editing cpp_src/
	tools/build.sh

lab: setup
	tools/lab.sh

bench: setup
	$(PY) -m tinylearn bench

test: setup test-tests test-exercises test-notebooks

test-tests: $(STAMP)
	$(XDIST_ENV) $(PY) -m pytest tests/ -q $(XDIST) -m "not timing"
	$(XDIST_ENV) $(PY) -m pytest tests/ -q -m timing

test-exercises: $(STAMP)
	$(PY) -m pytest exercises/ --impl=reference -q

test-notebooks: $(STAMP)
	$(PY) tools/nbval_run.py --jobs $(NB_JOBS)

# the suites again with other numeric paths forced (torch ATEN_CPU_CAPABILITY, OPENBLAS_CORETYPE, numpy
# NPY_DISABLE_CPU_FEATURES, TINYLEARN_CPU_FEATURES); prints and verifies the paths of each run (tools/portable.py).
# Tests marked path_independent are not run again; the first forced run's notebooks run in JupyterLab in headless
# Chromium (Run All, plots, widgets) and are compared with the committed outputs by nbval's rules: the browser test
# and the forced-path nbval run in one execution (nbval instead when no browser: PORTABLE_ARGS=--notebooks-via lab
# makes a missing browser an error, as CI does)
test-portable: $(STAMP)
	$(PY) tools/portable.py $(PORTABLE_ARGS)

# a real JupyterLab in headless Chromium: Run All on every notebook, no error cells, plots and widgets rendered,
# one screenshot per notebook under build/lab-test/ (tools/lab_test.py; skips with the install command if no browser)
test-lab: $(STAMP)
	$(PY) tools/lab_test.py $(LAB_ARGS)

# pip wheel . -> fresh venv outside the repo -> import, one op per topic, cuda sources, bench, check in a copy
wheel-smoke: $(STAMP)
	tools/wheel_smoke.sh

exercises: setup  ## the learner's run: your stubs in exercises/*/stubs.py
	-$(PY) -m pytest exercises/ -q --tb=line

notebooks: setup  ## re-execute every notebook from notebooks/src and write clean outputs (commit them)
	$(PY) tools/nb.py build --all
	$(PY) tools/nb.py check

# lint needs only ruff and import-linter (pinned), so CI can fail fast before the full setup
# (before apt: the system tools are installed only if python3 cannot make a venv without them)
$(VENV)/bin/ruff:
	@test -x $(PY) || python3 -m venv $(VENV) || (rm -rf $(VENV) && tools/system_deps.sh && python3 -m venv $(VENV))
	$(INSTALL) -q -c constraints.txt ruff import-linter

lint: $(VENV)/bin/ruff
	$(VENV)/bin/ruff check tinylearn tests exercises tools notebooks/src
	$(VENV)/bin/ruff format --check tinylearn tests exercises tools notebooks/src
	@test -x $(VENV)/bin/lint-imports || $(INSTALL) -q -c constraints.txt import-linter
	$(VENV)/bin/lint-imports --no-cache  # the layering contracts in .importlinter (docs/ARCHITECTURE.md)

clean:
	rm -rf build $(VENV) .pytest_cache
