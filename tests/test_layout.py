"""The package's layout as docs/architecture.md draws it, checked on the sources (no import needed): the layers
import only downwards, module-level imports form no cycle, modules stay small, a setting crosses module
boundaries as a ``Setting``, a module imports no private name (``_x``) or private module of another, and a trial's
status and reason are the enums of search/records.py."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# lower first; a module may import its own layer and those below (vidtune/_io.py and _compat.py: any layer)
LAYERS = {"model": 0, "kernels": 0, "techniques": 1, "search": 2, "integrator": 3, "vidtune": 4}
UTILITIES = {"vidtune._io", "vidtune._compat", "vidtune"}
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    """Every module of the package by its installed name (the package-dir mapping of pyproject.toml)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = {}
    for package, folder in tool["package-dir"].items():
        if package.count(".") != 1 and package != "vidtune":
            continue
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            if any(part.startswith(".") for part in rel.parts):
                continue
            if package == "vidtune" and rel.parts[0] in LAYERS:  # (a checkout's folders beside vidtune/)
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join((package, *parts))] = path
    return out


def _layer(module: str) -> int | None:
    if module in UTILITIES or module.startswith(("vidtune._io", "vidtune._compat")):
        return None
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS[parts[1]]
    return LAYERS["vidtune"]


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vidtune") and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("vidtune"))
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_layers_import_only_downwards_and_module_level_imports_form_no_cycle():
    modules = _modules()
    assert "vidtune.search.evaluator" in modules and "vidtune.techniques.setting" in modules
    upward = []
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        mine = _layer(name)
        for imported in _imports(path, module_level_only=False):
            target = _resolve(imported, modules)
            theirs = _layer(target) if target else None
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target}")
        graph[name] = {t for t in (_resolve(i, modules) for i in _imports(path, module_level_only=True))
                       if t and t != name and not name.startswith(t + ".") and t != "vidtune"}
    assert not upward, f"imports that run back up the layers: {upward}"
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack + [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            assert cycle is None, f"an import cycle: {' -> '.join(cycle[cycle.index(cycle[-1]):])}"


def test_modules_are_small_and_a_setting_is_typed_where_it_crosses_a_boundary():
    """Every module <= 450 lines; ``dict[str, dict[str, Any]]`` (a setting as a bare dict) is written only in
    techniques/setting.py, where ``KnobValues`` names the unvalidated form."""
    modules = _modules()
    long = {n: len(p.read_text().splitlines()) for n, p in modules.items()
            if len(p.read_text().splitlines()) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    bare = [f"{n}:{i}" for n, p in modules.items() if n != "vidtune.techniques.setting"
            for i, line in enumerate(p.read_text().splitlines(), 1) if "dict[str, dict[str, Any]]" in line]
    assert not bare, f"a setting as a bare dict: {bare}"


def test_reasons_and_statuses_are_written_as_the_enums():
    """A trial's ``reason`` and ``status`` are written through ``Reason`` and ``Status`` (search/records.py), never
    as string literals, so that a new reason is one place to add and the report's list of them stays whole."""
    literal = re.compile(r"""["']reason["']\s*[:,]\s*["'][a-z-]+["']|["']status["']\s*:\s*["'](ok|fail)["']"""
                         r"""|["']status["']\]\s*[!=]=\s*["'](ok|fail)["']""")
    found = [f"{n}:{i}: {line.strip()}" for n, p in _modules().items()
             for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not found, f"reasons or statuses as literals: {found}"


def test_no_module_imports_a_private_name_or_module_of_another():
    """A name that starts with ``_`` is its module's own: another module that needs it gets a public name (seen
    failing on ``from vidtune.techniques.parallelism._dist import _free_port`` and three others, 2026-12-08)."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vidtune")):
                continue
            target = _resolve(node.module, modules)
            if target == name:
                continue
            parts = node.module.split(".")
            # (a package's private module is its own modules': techniques/caching/_common.py for the caches)
            private_module = [p for i, p in enumerate(parts[1:], 1) if p.startswith("_") and p not in ("_io", "_compat")
                              and not name.startswith(".".join(parts[:i]) + ".")]
            private_names = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
            if private_module or private_names:
                found.append(f"{name}:{node.lineno} from {node.module} import {', '.join(a.name for a in node.names)}")
    assert not found, found
