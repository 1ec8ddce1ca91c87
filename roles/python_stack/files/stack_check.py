"""Report whether a virtualenv holds rlrun with every requirement satisfied.

Run with the venv's python: `python stack_check.py EXTRA`. Prints one JSON
object: {"ok": bool, "problems": [...], "editable_from": path|null,
"versions": {...}}. Never installs anything.
"""

import json
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

extra = sys.argv[1] if len(sys.argv) > 1 else ""
out = {"ok": False, "problems": [], "editable_from": None, "versions": {}}
try:
    dist = metadata.distribution("rlrun")
except metadata.PackageNotFoundError:
    out["problems"].append("rlrun is not installed")
    print(json.dumps(out))
    sys.exit(0)

out["versions"]["rlrun"] = dist.version
direct = dist.read_text("direct_url.json")
if direct:
    info = json.loads(direct)
    if info.get("dir_info", {}).get("editable"):
        out["editable_from"] = info["url"].removeprefix("file://")

for line in dist.requires or []:
    req = Requirement(line)
    env = {"extra": extra}
    if req.marker is not None and not req.marker.evaluate(env):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        out["problems"].append(f"{req.name} missing (wanted {req.specifier})")
        continue
    out["versions"][req.name] = have
    # Local labels (2.13.0+cpu) satisfy ==2.13.0.
    if not req.specifier.contains(Version(have), prereleases=True):
        out["problems"].append(f"{req.name} {have} does not satisfy {req.specifier}")
out["ok"] = not out["problems"]
print(json.dumps(out))
