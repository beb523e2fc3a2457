"""The installed package holds every subpackage of the source tree (setuptools' explicit ``packages`` list)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_listed_for_installation():
    """A folder with an ``__init__.py`` under a mapped source root must be in ``[tool.setuptools] packages``: an
    editable install finds it anyway (so the tests pass without it), a built wheel would not ship it."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, roots = set(tool["packages"]), tool["package-dir"]
    found = set()
    for package, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            found.add(".".join((package, *rel.parts)))
    assert found - listed == set(), f"source packages not installed: {sorted(found - listed)}"
