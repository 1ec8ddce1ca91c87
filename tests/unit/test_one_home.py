"""One home for each rule, name and mechanism: a second copy, in Python or in a role's Jinja, fails here.

- A closed list a rule checks against (the reward service's extraction strategies, its leniencies, its prompt
  templates, the accelerator vendors) is written in its home only: no other list literal of the shipped code
  (rlrun/, trainer/, the roles' Python, tasks, vars, templates, the playbooks) holds two of its names.
- No role asserts in Jinja a variable rlrun's rules check (rlrun/checks/vocabulary.py's ``specific``): a role
  checks its inputs by asking those rules (``query('cluster_problems', ...)``, tests/integration/
  test_rules_once.py runs it). The roles that still assert some of them in Jinja are listed with why, and a
  listed role that no longer does fails too, so the list only shrinks.
- The names that once meant different things in different modules are defined once.
- Writing a file under a temporary name and renaming it, swapping a directory, reading /proc/PID/stat: each in
  its home only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from rlrun.checks import vocabulary as V
from rlrun.checks.node import VENDORS
from trainer.reward.extract import STRATEGIES
from trainer.reward.forms import LENIENCIES
from trainer.reward.server.dataset import PROMPT_TEMPLATES

ROOT = Path(__file__).resolve().parents[2]

# closed list -> (its names, the one file that writes them down)
VOCABULARIES = {
    "the reward service's extraction strategies": (tuple(STRATEGIES), "trainer/reward/extract.py"),
    "the reward service's leniencies": (LENIENCIES, "trainer/reward/forms.py"),
    "the reward service's prompt templates": (PROMPT_TEMPLATES, "trainer/reward/server/dataset.py"),
    "the accelerator vendors": (VENDORS, "rlrun/checks/node.py"),
}
# places whose literal holds names of a closed list for another purpose, and what
VOCABULARY_ELSEWHERE = {
    ("the accelerator vendors", "roles/preflight/library/preflight_node.py"):
        "how each GPU vendor's devices are found on the host (the module runs on the node's own Python, where "
        "rlrun is not installed); a vendor it cannot find GPUs of is rlrun's rule's, not this dict's",
}
# roles whose asserts still check in Jinja variables rlrun's rules check, and why
JINJA_LEFT = {
    "ray_node": "its resource and temp-dir checks differ from rlrun's (floats, a 60-character limit): issue 37 "
                "left them",
    "retriever": "its corpus-or-index check skips a teardown: issue 37 left it",
}
# names that once had a copy each with a behaviour of its own
ONE_DEFINITION = ("one_line", "command_error", "RequestError", "ConfigError", "ServiceConfigError", "Limits",
                  "alive", "_alive", "stat_fields", "write_atomic", "replace_file", "replace_dir", "coerce",
                  "from_text")
# mechanism -> (its homes, what finds a copy)
MECHANISMS = {
    "a file written under a temporary name and renamed": ("trainer/files.py",
                                                          "roles/rlrun_files/module_utils/rlrun_files.py"),
    "/proc/PID/stat read": ("trainer/procs.py",),
}
# places that use a mechanism for something else, and what
MECHANISM_ELSEWHERE = {
    "trainer/rollout/evaluate.py": "replaces the best checkpoint's symlink, not a file's content",
    "roles/preflight/library/preflight_node.py": "a module on the node's own Python (no trainer there) reading "
                                                 "sockets' owners",
}


def _python() -> list[Path]:
    files = [*ROOT.glob("rlrun/**/*.py"), *ROOT.glob("trainer/**/*.py"), *ROOT.glob("roles/**/*.py"),
             *ROOT.glob("playbooks/**/*.py")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _ansible() -> list[Path]:
    files = [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/vars/*.yml"), *ROOT.glob("roles/*/defaults/*.yml"),
             *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("roles/*/templates/**/*.j2"),
             *ROOT.glob("playbooks/*.yml"), ROOT / "site.yml"]
    return sorted(files)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _strings(node: ast.AST) -> list[str]:
    items = node.keys if isinstance(node, ast.Dict) else node.elts
    return [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _code(text: str) -> str:
    """YAML or Jinja without its comments."""
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.parametrize("what", sorted(VOCABULARIES))
def test_a_closed_list_is_written_in_its_home_only(what):
    names, home = VOCABULARIES[what]
    assert (ROOT / home).is_file()
    copies = []
    allowed = {f for w, f in VOCABULARY_ELSEWHERE if w == what}
    for path in _python():
        if _rel(path) == home:
            continue
        hits = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
                found = sorted(set(_strings(node)) & set(names))
                if len(found) >= 2:
                    hits.append(f"{_rel(path)}:{node.lineno}: {found}")
        if _rel(path) in allowed:
            assert hits, f"{_rel(path)} no longer holds {what}: drop it from VOCABULARY_ELSEWHERE"
            continue
        copies += hits
    for path in _ansible():
        for n, line in enumerate(_code(path.read_text(encoding="utf-8")).splitlines(), 1):
            for seq in re.findall(r"\[([^\[\]]*)\]", line):
                found = sorted({item.strip().strip("'\"") for item in seq.split(",")} & set(names))
                if len(found) >= 2:
                    copies.append(f"{_rel(path)}:{n}: {found}")
    assert not copies, f"{what} written again outside {home} (import them from there):\n" + "\n".join(copies)


def test_the_scan_finds_a_copy():
    """The scans above see a copy in Python and in Jinja (a scan that finds nothing proves nothing)."""
    tree = ast.parse("KNOWN = ('boxed', 'answer_tag')\nok = vendor in ['cpu', 'nvidia', 'amd']\n")
    found = [sorted(set(_strings(n)) & set(STRATEGIES) | set(_strings(n)) & set(VENDORS))
             for n in ast.walk(tree) if isinstance(n, ast.Tuple | ast.List)]
    assert found == [["answer_tag", "boxed"], ["amd", "cpu", "nvidia"]]
    line = _code("# [boxed, hash] in a comment\n- cluster__accelerator in ['cpu', 'nvidia', 'amd']")
    assert re.findall(r"\[([^\[\]]*)\]", line) == ["'cpu', 'nvidia', 'amd'"]


def _assert_variables(path: Path) -> set[str]:
    """The role variables the `that:` of the file's assert tasks name (a guard `X is defined` aside)."""
    found: set[str] = set()
    for task in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
        args = task.get("ansible.builtin.assert") if isinstance(task, dict) else None
        if not args:
            continue
        that = args.get("that")
        text = "\n".join(that) if isinstance(that, list) else str(that)
        text = re.sub(r"\b\w+ is (not )?defined\b", "", text)
        found |= set(re.findall(r"\b[a-z]+(?:_[a-z]+)*__[a-z0-9_]+\b", text))
    return found


def test_no_role_asserts_in_jinja_what_rlruns_rules_check():
    owned = V.specific()
    by_role: dict[str, set[str]] = {}
    for path in ROOT.glob("roles/*/tasks/*.yml"):
        dup = _assert_variables(path) & owned
        if dup:
            by_role.setdefault(path.parts[-3], set()).update(dup)
    new = {role: sorted(names) for role, names in by_role.items() if role not in JINJA_LEFT}
    assert not new, f"role asserts check in Jinja what rlrun/checks checks (ask it: query('cluster_problems', " \
                    f"...)): {new}"
    gone = sorted(set(JINJA_LEFT) - set(by_role))
    assert not gone, f"no longer assert rlrun's variables in Jinja: take them off JINJA_LEFT: {gone}"
    assert {"reward_server", "python_stack"}.isdisjoint(by_role)


def test_each_of_these_names_is_defined_once():
    places: dict[str, list[str]] = {}
    files = _python() + sorted(ROOT.glob("tests/lab/*.py")) + sorted(ROOT.glob("bench/**/*.py"))
    for path in files:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # a module's functions and classes
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in ONE_DEFINITION:
                places.setdefault(node.name, []).append(f"{_rel(path)}:{node.lineno}")
    twice = {name: where for name, where in places.items() if len(where) > 1}
    assert not twice, f"defined more than once (one home, or names for what differs): {twice}"
    assert "Limits" not in places, f"Limits: say which (ConnectionLimits, RewardLimits, ...): {places['Limits']}"


def _mechanism(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "os" and node.func.attr in ("replace", "rename"):
            return "a file written under a temporary name and renamed"
        if isinstance(owner, ast.Name) and owner.id == "tempfile" and node.func.attr in ("mkstemp",
                                                                                         "NamedTemporaryFile"):
            return "a file written under a temporary name and renamed"
        if isinstance(owner, ast.Name) and re.search(r"tmp|temp|swap", owner.id) and \
                node.func.attr in ("replace", "rename") and len(node.args) == 1:
            return "a file written under a temporary name and renamed"
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if text.startswith("/proc/{}/stat"):
            return "/proc/PID/stat read"
    return None


def test_each_mechanism_has_one_home():
    copies = []
    for path in _python() + sorted(ROOT.glob("tests/lab/*.py")):
        rel = _rel(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            what = _mechanism(node)
            if what and rel not in MECHANISMS[what] and rel not in MECHANISM_ELSEWHERE:
                copies.append(f"{rel}:{node.lineno}: {what}")
    assert not copies, "\n".join(copies)
    assert _mechanism(ast.parse("os.replace(tmp, path)").body[0].value)
    assert _mechanism(ast.parse("tmp.replace(out / name)").body[0].value)
    assert _mechanism(ast.parse("f'/proc/{pid}/stat'").body[0].value)
    assert not _mechanism(ast.parse("text.replace('a', 'b')").body[0].value)
