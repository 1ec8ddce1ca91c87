"""Report whether each module named on the command line imports, with its version.

Run with the venv's python: `python import_check.py MOD...`. Prints one JSON object:
{"versions": {mod: version}, "problems": {mod: error}} as its last line. Never installs anything.
"""

import importlib
import json
import sys
import warnings
from importlib import metadata

warnings.simplefilter("ignore")

out = {"versions": {}, "problems": {}}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is what this reports
        out["problems"][name] = f"{type(exc).__name__}: {exc}"
    else:
        try:
            out["versions"][name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out["versions"][name] = str(getattr(module, "__version__", None) or "ok")
print(json.dumps(out))
