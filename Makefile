# The README's two commands: `make test` and `make demo`. Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo lint clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Without CUDA, take the CPU build of PyTorch (a looser pin would pull a multi-GB CUDA build).
	if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e ".[test]"
	# Headless Chromium for the report page's test (skipped without it); never fails the install where apt-get can't.
	command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 || true
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m elastic_bench.devtools.imports
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/elastic-bench demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m elastic_bench.devtools.imports

clean:
	rm -rf $(VENV) build *.egg-info
