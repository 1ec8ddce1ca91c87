"""The README stays a front page: short, the two set-up commands as the Makefile has them, and links that land.

`mkdocs build --strict` (make lint) checks the pages under docs/: every page in the nav, every relative link and
anchor. The README is not one of the site's pages, so its links are checked here, against both slug rules a
reader meets: GitHub's (the README read on the forge) and MkDocs' (the same heading on the site)."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _heading_text(line: str) -> str:
    text = HEADING.match(line).group(1)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading reads as its text
    return text.replace("`", "")


def _github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc.slugify, the one MkDocs uses."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _headings(path: Path) -> list[str]:
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and HEADING.match(line):
            lines.append(_heading_text(line))
    return lines


def test_readme_is_a_front_page_of_at_most_15_kb():
    size = README.stat().st_size
    assert size <= 15_000, f"README.md is {size} bytes; the detail belongs in a page under docs/"


def test_readme_shows_the_two_set_up_commands_the_makefile_runs():
    readme = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no target {target}"
        assert re.search(rf"^make {target}\s+#", readme, re.M), f"README.md does not show `make {target}`"


def test_every_relative_link_of_the_readme_lands_on_a_file_and_heading():
    readme = README.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t)]
    assert len(targets) > 10, "the scan found almost no links: is the pattern still right?"
    problems = []
    for target in targets:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        if not file.is_file():
            problems.append(f"{target}: no file {path}")
            continue
        if anchor:
            texts = _headings(file)
            for rule, slug in (("GitHub", _github_slug), ("MkDocs", _mkdocs_slug)):
                if anchor not in {slug(t) for t in texts}:
                    problems.append(f"{target}: no heading of {path} has the {rule} slug {anchor!r}")
    assert not problems, "README.md links that do not land:\n" + "\n".join(problems)


def test_the_diagram_and_the_contracts_table_are_one_click_from_the_readme():
    readme = README.read_text(encoding="utf-8")
    page = ROOT / "docs" / "inventories.md"
    text = page.read_text(encoding="utf-8")
    for heading, marker in (("Architecture: the layers, and where each contract lives", "site.yml → playbooks/"),
                            ("The contracts", "| contract | its one home | who reads it |")):
        section = text.split(f"## {heading}\n", 1)
        assert len(section) == 2, f"docs/inventories.md has no section {heading!r}"
        assert marker in section[1].split("\n## ", 1)[0], f"section {heading!r} no longer holds {marker!r}"
        assert f"(docs/inventories.md#{_mkdocs_slug(heading)})" in readme, f"README.md does not link {heading!r}"


def test_make_lint_builds_the_site_strictly_and_the_strict_build_checks_links_anchors_and_the_nav():
    recipe = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout
    assert re.search(r"^(\S+=\S+ )*mkdocs build --strict", recipe, re.M), f"make lint builds no site:\n{recipe}"
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    # MkDocs 1.6 reports these as info unless told otherwise, and --strict fails on warnings only.
    assert config["validation"]["nav"]["omitted_files"] == "warn"
    assert config["validation"]["links"]["not_found"] == "warn"
    assert config["validation"]["links"]["anchors"] == "warn"
    site_dir = config.get("site_dir", "site")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{site_dir}/index.html"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"the site's build dir {site_dir}/ is not git-ignored"
