# tinylearn — every target creates .venv on first use (make setup).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRAS ?= notebooks,kernels,dist,dev
NBVAL := --nbval notebooks/ --nbval-sanitize-with notebooks/sanitize.cfg
STAMP := $(VENV)/.tinylearn-installed

.PHONY: setup lab bench test test-tests test-exercises test-notebooks exercises notebooks build lint clean check-clang

setup: $(STAMP) check-clang

$(STAMP): pyproject.toml constraints.txt CMakeLists.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt scikit-build-core pybind11 cmake ninja
	$(PIP) install -q -c constraints.txt --no-build-isolation -e ".[$(EXTRAS)]"
	$(PY) -c "import tinylearn._C"
	@touch $(STAMP)

check-clang:
	@command -v clang >/dev/null || echo "note: clang not found — tinygrad's CPU device needs it (sudo apt-get install clang); tinygrad columns will read 'n/a: clang not found'."

build: $(STAMP)  ## rebuild tinylearn._C after editing cpp_src/
	tools/build.sh

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

bench: setup
	$(PY) -m tinylearn bench

test: setup test-tests test-exercises test-notebooks

test-tests: $(STAMP)
	$(PY) -m pytest tests/ -q

test-exercises: $(STAMP)
	$(PY) -m pytest exercises/ --impl=reference -q

test-notebooks: $(STAMP)
	$(PY) -m pytest $(NBVAL) -q

exercises: setup  ## the learner's run: your stubs in exercises/*/stubs.py
	-$(PY) -m pytest exercises/ -q --tb=line

notebooks: setup  ## re-execute every notebook from notebooks/src and write clean outputs (commit them)
	$(PY) tools/nb.py build --all
	$(PY) tools/nb.py check

lint: setup
	$(VENV)/bin/ruff check tinylearn tests exercises tools
	$(VENV)/bin/ruff format --check tinylearn tests exercises tools

clean:
	rm -rf build $(VENV) .pytest_cache
