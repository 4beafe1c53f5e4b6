# Garrison: `make demo` runs a local cluster and a real job end to end; `make test` runs the whole suite.
# The distribution's /usr/bin/python3 where it is 3.11 or newer and can make a venv with pip: Debian builds it
# with profile-guided optimisation, and it starts and runs ~20% faster than an interpreter built without
# (callgrind: a bare `-I -S -c pass` is 20.9 M instructions on Debian's 3.11 against 27.7 M on pyenv's 3.11,
# and every command, daemon and test pays that); jobs running as other users can also read it, where an
# interpreter under /root they cannot. Anything else: python3 from PATH. `make PYTHON=...` chooses.
SYSTEM_PYTHON := $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; ensurepip.version(); sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo /usr/bin/python3)
PYTHON ?= $(or $(SYSTEM_PYTHON),python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint typecheck protos protos-check bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py nodeagent/supervisor/_rankexec.c $(wildcard bin/*)
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
