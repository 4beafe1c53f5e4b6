#!/usr/bin/env bash
# mypy over the installed package layout. setuptools maps garrison.controller -> controller/ (and so on)
# through an editable-install import hook that mypy does not follow, so copy the sources into a shadow
# tree with the installed names and check it there. Error paths read build/typing/garrison/<dir>/...,
# which is <dir>/... in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" - <<'PYEOF'
import shutil
from pathlib import Path

shadow = Path("build/typing/garrison")
shutil.rmtree(shadow.parent, ignore_errors=True)
shutil.copytree("garrison", shadow, ignore=shutil.ignore_patterns("__pycache__"))
for name in ("controller", "nodeagent", "cli", "protos"):
    shutil.copytree(name, shadow / name, ignore=shutil.ignore_patterns("__pycache__", "*.toml", "*.ini", "*.mako"))
PYEOF
cd build/typing
exec "$OLDPWD/${MYPY:-.venv/bin/mypy}" --config-file "$OLDPWD/pyproject.toml" garrison "$@"
