# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv, install what they need (torch as the CPU wheel 2.13.0), and run.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test data venv lint typecheck contracts bench-smoke clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[fl,dev,flower]'
	touch $(STAMP)

venv: $(STAMP)

# Fashion-MNIST ships as a Debian package; install it when it is missing and we may.
data:
	@if [ ! -d /usr/share/datasets/fashion-mnist ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null)); \
	  else echo "note: install the Debian package dataset-fashion-mnist for Fashion-MNIST runs"; fi; \
	fi

# The demo: five runs (FedAvg, FedShift, CLIMB, Ratio Loss, FedAvg with Dubhe's selection), each
# statistic through its secure sum and every model update through masking; the leakage audit;
# one self-contained HTML page of both (its path is the last line printed).
demo: venv data
	$(BIN)/secure-fl run experiments/demo.toml
	$(BIN)/secure-fl audit --methods fedavg,fedshift,climb,ratio_loss,dubhe --protocols plain,masking --out runs/audit
	$(BIN)/secure-fl report experiments/demo.toml --html runs/demo-report.html --audit runs/audit

test: venv data
	$(MAKE) typecheck
	$(MAKE) contracts
	$(BIN)/python -m pytest -q
	$(MAKE) bench-smoke

# The boundaries between parties and layers (pyproject.toml's [tool.importlinter] contracts).
contracts: venv
	$(BIN)/lint-imports

# Strict mypy over what pyproject.toml's [tool.mypy] files names: protocols and secure_fl.
typecheck: venv
	$(BIN)/python -m mypy

lint: venv
	$(BIN)/ruff check secure_fl protocols tests bench experiments

bench-smoke: venv
	cd bench && ../$(BIN)/asv machine --yes >/dev/null && \
	  SECURE_FL_BENCH_SMALL=1 ../$(BIN)/asv run --python=same --quick --dry-run --show-stderr

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
