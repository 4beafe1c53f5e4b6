"""Which program may import which? The layer rules, checked over the real import graph.

The graph is read from the sources with ``ast``, not by importing them: every ``import`` and
``from ... import`` in every .py file under garrison/, controller/, nodeagent/, cli/ and protos/, wherever it
sits (module level, inside functions, under ``if TYPE_CHECKING:``), plus ``importlib.import_module`` and
``__import__`` calls with a literal name. Directories are mapped to the names they are installed under
(pyproject's [tool.setuptools] package-dir), and relative imports are resolved against those names.

The rules (one test each, each failure listing every offending ``file:line -> module``):

a. the scheduling core, garrison.controller.sched, imports only the standard library and garrison.model;
b. the CLI and the node agent never import the controller;
c. nothing outside the CLI imports the CLI;
d. the shared vocabulary (garrison/ itself: garrison.model, garrison.wire, config, auth...) imports none of
   the programs (controller, node agent, CLI);
e. the node agent and the CLI do not import each other;
f. garrison.model imports only the standard library and itself (no protobuf, grpc or SQLAlchemy);
g. nothing outside the node agent imports the node agent (the issue's "nothing imports the programs except
   their own entry points"; b, c and e leave the controller's simulator -> agent arrow unchecked).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Repository directory -> the package name it is installed as (pyproject.toml [tool.setuptools] package-dir).
INSTALL_NAMES: Mapping[str, str] = {
    "garrison": "garrison",
    "controller": "garrison.controller",
    "nodeagent": "garrison.nodeagent",
    "cli": "garrison.cli",
    "protos": "garrison.protos",
}

CONTROLLER = "garrison.controller"
SCHED = "garrison.controller.sched"
NODEAGENT = "garrison.nodeagent"
CLI = "garrison.cli"
PROTOS = "garrison.protos"
MODEL = "garrison.model"
PROGRAMS = (CONTROLLER, NODEAGENT, CLI)

# Removed by the layers work; must be empty.
# The arrows this branch still has, as (rule, "file -> module"): other parts of issue 14 are removing them
# in parallel with this test. test_every_known_offender_is_still_an_offence fails once one is gone, so the
# list can only shrink.
KNOWN_OFFENDERS: frozenset[tuple[str, str]] = frozenset()  # removed by the layers work; must stay empty


@dataclass(frozen=True)
class ImportEdge:
    """One import statement's arrow: ``importer`` (in ``file`` at ``line``) imports ``imported``."""

    file: str
    line: int
    importer: str
    imported: str

    def where(self) -> str:
        return f"{self.file}:{self.line} -> {self.imported}"

    def key(self) -> str:
        """How the allow-list names an arrow: without the line, which moves with every edit."""
        return f"{self.file} -> {self.imported}"


@dataclass(frozen=True)
class SourceModule:
    name: str
    path: Path
    is_package: bool


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_stdlib(module: str) -> bool:
    return module.split(".", 1)[0] in sys.stdlib_module_names


def source_modules(root: Path, install_names: Mapping[str, str]) -> list[SourceModule]:
    """Every .py file under the mapped directories, with the module name it is installed as."""
    modules = []
    for directory, install_name in install_names.items():
        base = root / directory
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base)
            if "__pycache__" in relative.parts:
                continue
            parts = list(relative.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules.append(SourceModule(".".join([install_name, *parts]), path, is_package))
    return modules


def _resolve_relative(module: SourceModule, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def _literal_dynamic_import(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports_of(module: SourceModule, known_modules: set[str]) -> Iterator[tuple[int, str]]:
    # ast.walk visits every node, so imports inside functions, classes and TYPE_CHECKING blocks count too.
    for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, node.level, node.module) if node.level else str(node.module)
            for alias in node.names:
                # `from garrison import cli` imports the module garrison.cli; `from x import name` a name of x.
                submodule = f"{base}.{alias.name}"
                yield node.lineno, submodule if submodule in known_modules else base
        elif isinstance(node, ast.Call) and (dynamic := _literal_dynamic_import(node)):
            yield node.lineno, dynamic


def import_graph(root: Path, install_names: Mapping[str, str] = INSTALL_NAMES) -> list[ImportEdge]:
    modules = source_modules(root, install_names)
    known = {module.name for module in modules}
    edges = {
        ImportEdge(module.path.relative_to(root).as_posix(), line, module.name, imported)
        for module in modules
        for line, imported in _imports_of(module, known)
    }  # a set: `from x import a, b` is one arrow, not two
    return sorted(edges, key=lambda edge: (edge.file, edge.line, edge.imported))


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    applies_to: Callable[[ImportEdge], bool]
    allowed: Callable[[ImportEdge], bool]

    def violations(self, edges: Iterable[ImportEdge]) -> list[ImportEdge]:
        return [edge for edge in edges if self.applies_to(edge) and not self.allowed(edge)]


def _is_vocabulary(module: str) -> bool:
    return in_package(module, "garrison") and not any(in_package(module, p) for p in (*PROGRAMS, PROTOS))


RULES: Mapping[str, Rule] = {rule.name: rule for rule in (
    Rule("a", "the scheduling core imports only the standard library and garrison.model",
         lambda e: in_package(e.importer, SCHED),
         lambda e: is_stdlib(e.imported) or in_package(e.imported, MODEL) or in_package(e.imported, SCHED)),
    Rule("b", "the CLI and the node agent never import the controller",
         lambda e: in_package(e.importer, CLI) or in_package(e.importer, NODEAGENT),
         lambda e: not in_package(e.imported, CONTROLLER)),
    Rule("c", "nothing outside the CLI imports the CLI",
         lambda e: not in_package(e.importer, CLI),
         lambda e: not in_package(e.imported, CLI)),
    Rule("d", "the shared vocabulary imports none of the programs",
         lambda e: _is_vocabulary(e.importer),
         lambda e: not any(in_package(e.imported, program) for program in PROGRAMS)),
    Rule("e", "the node agent and the CLI do not import each other",
         lambda e: in_package(e.importer, CLI) or in_package(e.importer, NODEAGENT),
         lambda e: not (in_package(e.importer, CLI) and in_package(e.imported, NODEAGENT)
                        or in_package(e.importer, NODEAGENT) and in_package(e.imported, CLI))),
    Rule("f", "garrison.model imports only the standard library and garrison.model",
         lambda e: in_package(e.importer, MODEL),
         lambda e: is_stdlib(e.imported) or in_package(e.imported, MODEL)),
    Rule("g", "nothing outside the node agent imports the node agent",
         lambda e: not in_package(e.importer, NODEAGENT),
         lambda e: not in_package(e.imported, NODEAGENT)),
)}


def _report(rule: Rule, offenders: list[ImportEdge]) -> str:
    lines = "\n".join(f"  {edge.where()}" for edge in offenders)
    return f"rule {rule.name} ({rule.description}) is broken by {len(offenders)} import(s):\n{lines}"


_GRAPH: list[ImportEdge] = []


def real_graph() -> list[ImportEdge]:
    if not _GRAPH:
        _GRAPH.extend(import_graph(REPO))
    return _GRAPH


def _check(rule_name: str) -> None:
    rule = RULES[rule_name]
    offenders = [edge for edge in rule.violations(real_graph()) if (rule_name, edge.key()) not in KNOWN_OFFENDERS]
    assert not offenders, _report(rule, offenders)


def test_a_the_scheduling_core_imports_only_the_stdlib_and_the_model() -> None:
    _check("a")


def test_b_the_cli_and_the_agent_never_import_the_controller() -> None:
    _check("b")


def test_c_nothing_outside_the_cli_imports_the_cli() -> None:
    _check("c")


def test_d_the_vocabulary_imports_none_of_the_programs() -> None:
    _check("d")


def test_e_the_agent_and_the_cli_do_not_import_each_other() -> None:
    _check("e")


def test_f_the_model_imports_only_the_stdlib_and_itself() -> None:
    _check("f")


def test_g_nothing_outside_the_agent_imports_the_agent() -> None:
    _check("g")


def test_every_known_offender_is_still_an_offence() -> None:
    """An arrow that has been removed leaves the allow-list too, so the list only shrinks to empty."""
    live = {(name, edge.key()) for name, rule in RULES.items() for edge in rule.violations(real_graph())}
    stale = sorted(KNOWN_OFFENDERS - live)
    assert not stale, "no longer offending, remove from KNOWN_OFFENDERS:\n" + "\n".join(f"  {s}" for s in stale)


def test_the_graph_covers_every_program() -> None:
    importers = {edge.importer for edge in real_graph()}
    for package in (*PROGRAMS, SCHED, MODEL, "garrison.wire"):
        assert any(in_package(importer, package) for importer in importers), package


# -- the checker itself, on a synthetic tree -----------------------------------------------------------------


def _write(root: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    _write(tmp_path, {
        "garrison/__init__.py": "",
        "garrison/model/__init__.py": "",
        "garrison/model/domain.py": "import dataclasses\nfrom google.protobuf import message\n",
        "garrison/config.py": "def load():\n    from garrison.cli import up\n",
        "controller/__init__.py": "",
        "controller/engine.py": "from garrison.model import domain\n",
        "controller/sched/__init__.py": "",
        "controller/sched/cycle.py": (
            "from typing import TYPE_CHECKING\nfrom . import helpers\nfrom ..engine import run\n"
            "if TYPE_CHECKING:\n    import sqlalchemy\n"
        ),
        "controller/sched/helpers.py": "from garrison.model.domain import Job\n",
        "nodeagent/__init__.py": "",
        "nodeagent/agent.py": "import importlib\nimportlib.import_module('garrison.cli.parsing')\n",
        "cli/__init__.py": "",
        "cli/up.py": "from garrison import nodeagent\nfrom garrison.controller import engine\n",
        "cli/parsing.py": "from .up import main\n",
        "protos/__init__.py": "",
    })
    edges = import_graph(tmp_path)
    found = {name: sorted(edge.where() for edge in rule.violations(edges)) for name, rule in RULES.items()}
    assert found == {
        "a": ["controller/sched/cycle.py:3 -> garrison.controller.engine",
              "controller/sched/cycle.py:5 -> sqlalchemy"],
        "b": ["cli/up.py:2 -> garrison.controller.engine"],
        "c": ["garrison/config.py:2 -> garrison.cli.up",
              "nodeagent/agent.py:2 -> garrison.cli.parsing"],
        "d": ["garrison/config.py:2 -> garrison.cli.up"],
        "e": ["cli/up.py:1 -> garrison.nodeagent",
              "nodeagent/agent.py:2 -> garrison.cli.parsing"],
        "f": ["garrison/model/domain.py:2 -> google.protobuf"],
        "g": ["cli/up.py:1 -> garrison.nodeagent"],
    }


def test_the_report_lists_every_offender_with_file_and_line(tmp_path: Path) -> None:
    _write(tmp_path, {"cli/__init__.py": "", "cli/up.py": "import garrison.controller.main\nimport garrison.controller\n"})
    rule = RULES["b"]
    report = _report(rule, rule.violations(import_graph(tmp_path)))
    assert "cli/up.py:1 -> garrison.controller.main" in report and "cli/up.py:2 -> garrison.controller" in report
