"""Every conditional list item in the project's Ansible YAML (assert's `that`, `when`, `failed_when`,
`changed_when`, `until`) is a string or a boolean: a plain YAML scalar holding ': ' reads as a mapping,
which ansible-core 2.19 refuses only when the task runs ("Conditional expressions must be strings"),
as molecule multinode's last assert did."""

from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
KEYS = ("that", "when", "failed_when", "changed_when", "until")


def _bad(node, where, found):
    if isinstance(node, dict):
        for key, value in node.items():
            items = value if isinstance(value, list) else [value]
            if key in KEYS:
                found += [(where, key, item) for item in items if not isinstance(item, (str, bool, type(None)))]
            _bad(value, where, found)
    elif isinstance(node, list):
        for item in node:
            _bad(item, where, found)
    return found


def test_conditionals_are_strings():
    files = [p for d in ("molecule", "roles", "playbooks") for p in (PROJECT / d).rglob("*.yml")]
    files.append(PROJECT / "site.yml")
    assert len(files) > 50
    found = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            _bad(doc, str(path.relative_to(PROJECT)), found)
    assert found == [], found


def test_the_check_finds_a_colon_in_a_plain_scalar():
    doc = yaml.safe_load("- assert:\n    that:\n      - out is search(job ~ ': SUCCEEDED')\n")
    assert _bad(doc, "x", []) != []
