# The README's two commands: `make test` and `make demo`. Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser test demo screenshot lint clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Without CUDA, take the CPU build of PyTorch (a looser pin would pull a multi-GB CUDA build).
	if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# Headless Chromium for the report page's browser tests, a system package: only `make test` asks for it, saying so;
# where apt-get cannot install it, those tests are skipped (pytest names them and why).
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Chromium for the report page's browser tests (apt-get install chromium)"; \
		{ apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 || \
			echo "apt-get could not install Chromium: the browser tests will be skipped"; \
	else echo "no Chromium and no apt-get to install it: the browser tests will be skipped"; fi

test: $(STAMP) browser
	$(PY) -m ruff check .
	$(PY) -m elastic_bench.devtools.imports
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/elastic-bench demo

# docs/report-screenshot.png: the demo's report from its first section (`make demo` first), in headless Chromium.
screenshot: runs/demo/report/report.html
	sed '/^<h1>/,/^<h2 id="testbed">/{/^<h2 id="testbed">/!d}' $< > runs/demo/report/section.html
	chromium --headless --no-sandbox --hide-scrollbars --virtual-time-budget=5000 --window-size=1100,1470 \
		--screenshot=docs/report-screenshot.png "file://$(CURDIR)/runs/demo/report/section.html" 2>/dev/null

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m elastic_bench.devtools.imports

clean:
	rm -rf $(VENV) build *.egg-info
