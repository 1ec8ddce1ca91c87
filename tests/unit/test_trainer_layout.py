"""The layout of trainer/: three packages with narrow doors (rollout/, learn/, weights/) that import each other
downward only, wired by trainer/loop.py, which hands each part what it needs and never the trainer itself, and no
module that reaches into another object's private state."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
PACKAGES = ("rollout", "learn", "weights")
# rollout's engines reserve placement groups with learn's helpers and decode weights with weights' format; the
# learners send weights; weights takes the engines and the policy group as they are handed in
MAY_IMPORT = {"rollout": {"learn", "weights"}, "learn": {"weights"}, "weights": set()}
# what the loop wires: the parts below import none of it
WIRING = {"trainer.loop"}
# attributes of other libraries' objects that have no public spelling (torch's ProcessGroupNCCL.Options)
PRIVATE_ALLOWED = {
    ("weights/broadcast.py", "opts", "_timeout"),
    # vllm_compat is where the trainer adapts to vLLM's internals; warm_model_info falls back to vLLM's own path
    ("rollout/vllm_compat.py", "registry", "_run_in_subprocess"),
    ("rollout/vllm_compat.py", "registry.ModelRegistry", "_try_inspect_model_cls"),
}


def _imports(path: Path) -> set[str]:
    """The trainer modules ``path`` imports (anywhere: functions and TYPE_CHECKING blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("trainer.")}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else None


def test_the_three_packages_import_each_other_downward_only():
    edges = set()
    wrong = []
    for pkg in PACKAGES:
        for path in sorted((TRAINER / pkg).rglob("*.py")):
            for module in _imports(path):
                other = _package(module)
                if other and other != pkg:
                    edges.add((pkg, other))
                    if other not in MAY_IMPORT[pkg]:
                        wrong.append(f"{path.relative_to(TRAINER.parent)} imports {module}")
    assert ("rollout", "weights") in edges and ("learn", "weights") in edges  # the scan sees real edges
    assert not wrong, "an import up or sideways between trainer's packages:\n" + "\n".join(wrong)


def test_only_the_entry_point_reaches_the_loop():
    """trainer.train_ppo_ray loads trainer.loop by name; no module imports it (the parts cannot reach the trainer)."""
    found = [str(p.relative_to(TRAINER.parent)) for p in sorted(TRAINER.rglob("*.py")) if _imports(p) & WIRING]
    assert not found, f"import trainer.loop, which only wires the parts: {found}"


def test_the_loop_hands_no_part_the_trainer():
    """In trainer/loop.py no call gets ``self`` as an argument: each part is handed what it needs."""
    tree = ast.parse((TRAINER / "loop.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert len(calls) > 20  # the scan sees the loop's calls
    handed = [f"line {c.lineno}: {ast.unparse(c.func)}(...)" for c in calls
              if any(isinstance(a, ast.Name) and a.id == "self" for a in [*c.args, *(k.value for k in c.keywords)])]
    assert not handed, f"the trainer handed to a part: {handed}"


def test_no_module_reaches_into_another_objects_private_state():
    """``other._x`` (a single leading underscore, not ``self``'s or ``cls``'s) in the loop, the warm-up, the run's
    state and the three packages."""
    paths = [TRAINER / "loop.py", TRAINER / "warmup.py", TRAINER / "run_state.py",
             *(p for pkg in PACKAGES for p in sorted((TRAINER / pkg).rglob("*.py")))]
    found = []
    for path in paths:
        rel = str(path.relative_to(TRAINER))
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = ast.unparse(node.value)
            if owner in ("self", "cls") or (rel, owner, node.attr) in PRIVATE_ALLOWED:
                continue
            found.append(f"trainer/{rel}:{node.lineno}: {owner}.{node.attr}")
    assert not found, "reaches into another object's private state:\n" + "\n".join(found)
