# Garrison: `make demo` runs a local cluster and a real job end to end; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint typecheck protos protos-check bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# editable_mode=compat: a plain path line, not setuptools' import-hook finder, which costs every Python
	# process ~17 ms to import (garrison/__init__.py maps the checkout's directories to their package names)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]' --config-settings editable_mode=compat
	# Bytecode, as a wheel install writes it: where PYTHONDONTWRITEBYTECODE is set, every CLI call would
	# otherwise compile the modules it imports again (~15 ms of a ~90 ms gsub).
	$(PY) -m compileall -q garrison cli controller nodeagent protos > /dev/null
	# Slurm's command names for `export PATH="$$(garrison slurm-path):$$PATH"` (garrison/slurmpath.py)
	$(VENV)/bin/garrison slurm-path > /dev/null
	touch $(STAMP)

demo: venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

test: venv
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_launchers.py --check
	$(VENV)/bin/ruff check .
	bash scripts/typecheck.sh
	$(PY) -m pytest -q

test-fast: venv
	$(PY) -m pytest -q -m "not slow"

lint: venv
	$(VENV)/bin/ruff check .
	bash scripts/typecheck.sh

protos: venv
	$(PY) scripts/gen_protos.py

protos-check: venv
	$(PY) scripts/gen_protos.py --check

bench: venv
	$(PY) tests/benchmarks/e2e_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
