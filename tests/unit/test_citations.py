"""What the code cites, the project ships: every Markdown file a source, script or role file names (in a comment,
a docstring or a message) is a file of this checkout. Notes kept beside the project (../shared/notes/) are not
shipped, so the code may not send a reader there: the facts it relies on live in docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:[\w.-]+/)+[\w.-]+\.md)\b")
SOURCES = re.compile(r"\.(py|sh|yml|yaml|j2|toml|cfg)$|(^|/)Makefile$")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if SOURCES.search(p) and (ROOT / p).is_file()]


def test_every_markdown_file_the_code_cites_is_in_the_project():
    missing = []
    cited = 0
    for path in _tracked():
        # mkdocs.yml names its pages relative to its docs_dir, docs/ (mkdocs build --strict checks them too)
        base = ROOT / "docs" if path == ROOT / "mkdocs.yml" else ROOT
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for ref in CITATION.findall(line):
                cited += 1
                if ref.startswith("../") or not (base / ref).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {ref}")
    assert cited > 10, "the scan found almost no citations: is the pattern still right?"
    assert not missing, "cited but not in the project:\n" + "\n".join(missing)


def test_no_code_sends_a_reader_to_the_notes_beside_the_project():
    found = [f"{path.relative_to(ROOT)}:{n}" for path in _tracked()
             for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if re.search(r"(?<![\w-])notes/[\w.-]+\.md", line)]
    assert not found, f"cites the unshipped ../shared/notes (move the facts into docs/): {found}"
