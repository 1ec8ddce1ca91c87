"""The layout of trainer/config/: its modules import each other without circles, and the facts that
several rules need (which models a config creates) are decided in one place."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trainer" / "config"


def _imports(path: Path) -> set[str]:
    """The trainer.config modules ``path`` imports (anywhere, TYPE_CHECKING blocks and functions included)."""
    names = {p.stem for p in PACKAGE.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "trainer.config":
                found |= {a.name for a in node.names if a.name in names} or {"__init__"}
            elif node.module.startswith("trainer.config."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("trainer.config.")}
    return found


def test_config_modules_import_without_circles():
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert "schema" in graph and "cli" in graph and "rules" in graph
    assert all("__init__" not in deps for deps in graph.values()), graph  # the package re-exports; no one uses it
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def _comparisons(path: Path, attribute: str) -> list[int]:
    """Line numbers where ``<x>.attribute`` is compared (==, !=, >, in ...) in the code of ``path``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == attribute for s in sides):
                lines.append(node.lineno)
    return lines


def test_which_models_exist_is_decided_once():
    # "gae needs a critic" / "a positive KL coefficient needs the reference": the estimator table and
    # rules.has_critic / rules.has_ref say so; no other code of the package compares those flags.
    for path in PACKAGE.glob("*.py"):
        assert not _comparisons(path, "advantage_estimator"), f"{path.name} compares the estimator name"
        if path.stem != "rules":
            assert not _comparisons(path, "init_kl_coef"), path.name
    assert len(_comparisons(PACKAGE / "rules.py", "init_kl_coef")) == 1
    rules = (PACKAGE / "rules.py").read_text()
    assert rules.count("def has_critic") == 1 and ".critic" in rules


def test_the_old_modules_are_gone():
    trainer = PACKAGE.parent
    assert not [p.name for p in trainer.glob("config_*.py")] and not (trainer / "config.py").exists()
