"""Presets: named, reviewed trainer jobs as small YAML overrides of the trainer's defaults.

A preset file (``rlrun/presets/NAME.yaml``, or ``NAME.yaml`` in a user directory) holds::

    description: one line
    hardware: {accelerator: gpu|cpu, nodes: N, gpus_per_node: G}   # what the job expects
    make: {PATH: [model | dataset, ARGS...]}                     # optional: python -m trainer.tiny
    base: NAME                                                   # optional: a variant of NAME.yaml (same dir)
    config: {flag_name: value, ...}                              # TrainerConfig flags, nothing else

and is headed by comments stating the hardware and the batch arithmetic. A *variant* (``base: NAME``) is the
preset NAME of its own directory with its ``config`` laid over NAME's (and NAME's ``make`` unless it has its
own): the same job on other hardware says only what differs (``32b-rloo-1node``). ``config`` keys are the
trainer's flag names; a preset (with any ``--set key=value``) is validated by building the real
:class:`trainer.config.TrainerConfig`, so the trainer's own checks run and nothing is checked twice.
The result becomes the entrypoint ``python -m trainer.train_ppo_ray --flag value ...`` (rlrun/trainer_command.py).

String values may use three placeholders, expanded at submit time: ``{workdir}`` (the working
directory on this machine, absolute), ``{reward_url}`` (the inventory's reward services,
comma-separated) and ``{retriever_url}`` (the retrieval service of the node a process runs on:
``http://{node_ip}:<cluster__retriever_port>/retrieve``, ``{node_ip}`` left for the trainer to
replace; refused unless every Ray node runs one). Presets are found in the built-in directory, then ``$RLRUN_PRESETS_DIR``
(``:``-separated), then ``--presets-dir``; a later directory's preset shadows an earlier one of
the same name (``rlrun presets`` shows where each comes from).
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlrun.errors import RlrunError
from trainer.config import ConfigError, TrainerConfig
from trainer.config.fields import FlagSpec, derived_names, flag_specs, from_text, split_list

BUILTIN_DIR = Path(__file__).resolve().parent  # the built-in presets lie beside this loader
PRESET_KEYS = ("description", "hardware", "make", "base", "config")
HARDWARE_KEYS = ("accelerator", "nodes", "gpus_per_node")
PLACEHOLDERS = ("workdir", "reward_url", "retriever_url")
# Left as they are for the trainer, which replaces them in each process (``{node_ip}``: that process's node).
TRAINER_PLACEHOLDERS = ("node_ip",)
TRAINER_MODULE = "trainer.train_ppo_ray"
# What a preset's `make` may run: the subcommands of python -m trainer.tiny.
MAKE_KINDS = ("model", "dataset", "search", "python")
_PLACEHOLDER_RE = re.compile(r"\{(\w*)\}")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class PresetError(RlrunError):
    """A preset or an override that cannot make a valid job; the message lists every problem."""

    def __init__(self, where: str, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where}:\n{lines}")


@dataclass(frozen=True)
class Hardware:
    """What a preset expects of the cluster (its header says the same in words)."""

    accelerator: str  # "gpu" or "cpu"
    nodes: int
    gpus_per_node: int

    def __str__(self) -> str:
        if self.accelerator == "cpu":
            return f"{self.nodes} CPU node" + ("s" if self.nodes != 1 else "")
        return f"{self.nodes} x {self.gpus_per_node} GPUs"


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    description: str
    hardware: Hardware
    make: dict[str, tuple[str, ...]]  # path template -> trainer.tiny arguments
    values: dict[str, Any]  # config overrides as written (placeholders unexpanded), a base's included
    base: str | None = None  # the preset this one is a variant of

    @property
    def builtin(self) -> bool:
        return self.path.parent == BUILTIN_DIR

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


# --- finding presets ------------------------------------------------------------------------------------
def preset_dirs(extra: Iterable[str | os.PathLike] = ()) -> list[Path]:
    """Built-in directory, then $RLRUN_PRESETS_DIR entries, then ``extra`` (later ones win)."""
    dirs = [BUILTIN_DIR]
    dirs += [Path(p) for p in os.environ.get("RLRUN_PRESETS_DIR", "").split(os.pathsep) if p]
    dirs += [Path(p) for p in extra]
    for d in dirs[1:]:
        if not d.is_dir():
            raise RlrunError(f"presets directory {d} does not exist (from $RLRUN_PRESETS_DIR or --presets-dir)")
    return dirs


def discover(dirs: list[Path]) -> dict[str, Path]:
    """Preset name -> file; a later directory shadows an earlier one."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
            found[path.stem] = path
    return dict(sorted(found.items()))


def load_all(dirs: list[Path]) -> list[Preset]:
    return [load_file(path) for path in discover(dirs).values()]


def load_preset(name: str, dirs: list[Path]) -> Preset:
    """The preset called ``name``, or an error naming the presets there are."""
    found = discover(dirs)
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise RlrunError(f"no preset '{name}'{hint}; presets: {', '.join(found) or 'none'} "
                         f"(in {', '.join(str(d) for d in dirs)})")
    return load_file(found[name])


def load_file(path: Path, _seen: tuple[str, ...] = ()) -> Preset:
    """Read and check one preset file (shape only: the values are checked by :func:`build_config`); a variant's
    base (``base: NAME``, NAME.yaml beside it) is read first and its config lies under the variant's."""
    where = f"preset {path}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PresetError(where, [f"not valid YAML: {exc}"]) from None
    except OSError as exc:
        raise RlrunError(f"cannot read preset {path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise PresetError(where, [f"expected a mapping with keys {', '.join(PRESET_KEYS)}, got {type(data).__name__}"])
    problems = [f"unknown key '{k}': a preset has {', '.join(PRESET_KEYS)} (trainer flags go under config:)"
                for k in data if k not in PRESET_KEYS]
    if not _NAME_RE.match(path.stem):
        problems.append(f"name '{path.stem}': expected letters, digits, '.', '_' or '-'")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        problems.append("description: expected one line of text")
    hardware, hw_problems = _hardware(data.get("hardware"))
    make, make_problems = _make(data.get("make") or {})
    config = data.get("config")
    if not isinstance(config, dict):
        problems.append("config: expected a mapping of trainer flag names to values")
        config = {}
    problems += hw_problems + make_problems + _unknown_keys(config, "config: ")
    values = {}
    for key, value in config.items():
        spec = _specs().get(key)
        if spec is None:
            continue
        value, expected = coerce(spec, value)
        values[key] = value
        if expected:
            problems.append(f"config: {key}: {value!r}: expected {expected}")
    problems += _placeholder_problems(values)
    base = data.get("base")
    if base is not None:
        base_preset, base_problems = _base(path, base, _seen)
        problems += base_problems
        if base_preset is not None:
            values = {**base_preset.values, **values}
            make = make if "make" in data else dict(base_preset.make)
    if problems:
        raise PresetError(where, problems)
    return Preset(path.stem, path, str(description).strip(), hardware, make, values, base)


def _base(path: Path, base: Any, seen: tuple[str, ...]) -> tuple[Preset | None, list[str]]:
    """The preset a variant names (``base: NAME``: NAME.yaml or .yml in the variant's directory)."""
    if not isinstance(base, str) or not _NAME_RE.match(base):
        return None, [f"base: {base!r}: expected the name of a preset in {path.parent}"]
    chain = (*seen, path.stem)
    if base in chain:
        return None, [f"base: {base}: a variant chain that comes back to itself ({' -> '.join((*chain, base))})"]
    found = next((p for p in (path.parent / f"{base}.yaml", path.parent / f"{base}.yml") if p.is_file()), None)
    if found is None:
        return None, [f"base: no preset '{base}' in {path.parent} (a variant's base lies beside it)"]
    try:
        return load_file(found, chain), []
    except PresetError as err:
        return None, [f"base {base}: {p}" for p in err.problems]


def _hardware(raw: Any) -> tuple[Hardware, list[str]]:
    default = Hardware("gpu", 1, 1)
    if not isinstance(raw, dict):
        return default, ["hardware: expected {accelerator: gpu|cpu, nodes: N, gpus_per_node: G}"]
    problems = [f"hardware: unknown key '{k}' (expected {', '.join(HARDWARE_KEYS)})" for k in raw
                if k not in HARDWARE_KEYS]
    acc, nodes, gpus = raw.get("accelerator"), raw.get("nodes"), raw.get("gpus_per_node", 0)
    if acc not in ("gpu", "cpu"):
        problems.append(f"hardware.accelerator {acc!r}: expected gpu or cpu")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        problems.append(f"hardware.nodes {nodes!r}: expected an integer >= 1")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < (1 if acc == "gpu" else 0):
        problems.append(f"hardware.gpus_per_node {gpus!r}: expected an integer >= {1 if acc == 'gpu' else 0}")
    if problems:
        return default, problems
    return Hardware(acc, nodes, gpus), []


def _make(raw: Any) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    if not isinstance(raw, dict):
        return {}, ["make: expected a mapping PATH: [model|dataset|search|python, ARGS...] (python -m trainer.tiny)"]
    out, problems = {}, []
    for path, args in raw.items():
        if (not isinstance(args, list) or not args or args[0] not in MAKE_KINDS
                or not all(isinstance(a, str) for a in args)):
            problems.append(f"make: {path}: expected [model|dataset|search|python, ARGS...] (strings), the arguments of "
                            "python -m trainer.tiny after the output path")
            continue
        out[str(path)] = tuple(args)
    problems += _placeholder_problems({"make": list(out)})
    return out, problems


# --- values: types, placeholders, overrides ---------------------------------------------------------------
def _specs() -> dict[str, FlagSpec]:
    return {s.name: s for s in flag_specs(TrainerConfig)}


def _unknown_keys(keys: Iterable[str], prefix: str) -> list[str]:
    known = sorted(_specs())
    derived = derived_names(TrainerConfig)
    problems = []
    for key in keys:
        if key in derived:
            problems.append(f"{prefix}{key} is derived by the trainer from other flags (see python -m "
                            f"{TRAINER_MODULE} --print-config); set those flags instead")
        elif key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{prefix}{key}: not a trainer flag{hint}; see python -m {TRAINER_MODULE} --help")
    return problems


def coerce(spec: FlagSpec, value: Any) -> tuple[Any, str | None]:
    """A YAML or command-line value in the flag's type, read as the trainer reads the flag's text
    (trainer.config.fields.from_text: '5e-7' -> 5e-07, 'none' -> None, 'a,b' -> a list), and what was expected
    when the text cannot be read as that type. A value YAML typed already is left as it is.

    Only the spelling is handled here: bounds, choices and cross-field rules are the trainer's.
    """
    if not isinstance(value, str):
        return value, None
    try:
        return from_text(spec, value), None
    except ValueError:
        return value, spec.describe_type()


def parse_sets(pairs: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` pairs -> typed overrides; every bad pair is reported at once."""
    specs = _specs()
    out: dict[str, Any] = {}
    problems: list[str] = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key:
            problems.append(f"--set {pair!r}: expected KEY=VALUE with KEY a trainer flag name, e.g. "
                            "--set train_batch_size=64")
            continue
        if key not in specs:
            problems += _unknown_keys([key], "--set ")
            continue
        value, expected = coerce(specs[key], text)
        if expected:
            problems.append(f"--set {key}={text}: expected {expected}")
        out[key] = value
    if problems:
        raise PresetError("bad --set", problems)
    return out


def _placeholder_problems(values: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, value in values.items():
        for text in value if isinstance(value, list | tuple) else [value]:
            if isinstance(text, str):
                for name in _PLACEHOLDER_RE.findall(text):
                    if name and name not in PLACEHOLDERS + TRAINER_PLACEHOLDERS:
                        problems.append(f"{key}: unknown placeholder {{{name}}} in {text!r} "
                                        f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}; "
                                        "{node_ip} is left for the trainer)")
    return problems


RETRIEVER_WHY = ("the inventory has no retrievers group (nor retriever__corpus / retriever__index_dir, with which "
                 "every Ray node runs one): add group retrievers (roles/retriever/README.md), or --set "
                 "retriever_url=URL")


def retriever_context(cluster) -> dict[str, str | None]:
    """``{retriever_url}`` of a cluster: its own node's service (``http://{node_ip}:PORT/retrieve``), only when
    every Ray node runs one (a job calls the service of the node it runs on); else None and why."""
    hosts = list(getattr(cluster, "retriever_hosts", []) or [])
    if not hosts:
        return {"retriever_url": None, "retriever_why": RETRIEVER_WHY}
    lacking = [n for n in cluster.nodes if n not in hosts]
    if lacking:
        return {"retriever_url": None,
                "retriever_why": f"the retrievers group lacks the Ray node{'s' if len(lacking) != 1 else ''} "
                                 f"{', '.join(lacking)}: a job calls the retrieval service of its own node, so every "
                                 "Ray node needs one (or --set retriever_url=URL)"}
    return {"retriever_url": cluster.retriever_job_url, "retriever_why": None}


def expand(values: Mapping[str, Any], context: Mapping[str, str | None]) -> dict[str, Any]:
    """Values with ``{workdir}`` / ``{reward_url}`` / ``{retriever_url}`` replaced (``{node_ip}`` is kept for the
    trainer); a placeholder without a value is an error."""
    problems = _placeholder_problems(values)
    out: dict[str, Any] = {}

    def sub(key: str, text: str) -> str:
        def one(match: re.Match) -> str:
            name = match.group(1)
            if name not in PLACEHOLDERS:
                return match.group(0)
            if not context.get(name):
                why = ("the inventory has no reward_servers group: --set remote_rm_url=URL or "
                       "--set reward_fn=NAME") if name == "reward_url" else \
                    (context.get("retriever_why") or RETRIEVER_WHY) if name == "retriever_url" else "no value"
                problems.append(f"{key} {text!r}: {{{name}}} has no value here ({why})")
                return match.group(0)
            return str(context[name])

        return _PLACEHOLDER_RE.sub(one, text)

    for key, value in values.items():
        if isinstance(value, str):
            out[key] = sub(key, value)
        elif isinstance(value, list | tuple):  # a placeholder may stand for several list items
            out[key] = tuple(part for v in value for part in (split_list(sub(key, v)) if isinstance(v, str) else [v]))
        else:
            out[key] = value
    if problems:
        raise PresetError("cannot expand the preset's placeholders", sorted(set(problems)))
    return out


# --- the job ------------------------------------------------------------------------------------------------
def build_config(preset: Preset, sets: Mapping[str, Any], context: Mapping[str, str | None]) -> TrainerConfig:
    """The validated TrainerConfig of ``preset`` with ``sets`` applied (the trainer's checks run)."""
    values = expand({**preset.values, **sets}, context)
    try:
        return TrainerConfig.from_dict(values)
    except ConfigError as err:
        via = " with " + " ".join(f"--set {k}" for k in sets) if sets else ""
        raise PresetError(f"preset {preset.name}{via} is not a valid trainer job "
                          f"({len(err.problems)} problem{'s' if len(err.problems) != 1 else ''})",
                          err.problems) from None


def differences(preset: Preset, sets: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(flag, preset value or trainer default, new value) for each ``--set`` that changes something."""
    specs = _specs()
    rows = []
    for key, new in sets.items():
        old = preset.values.get(key, specs[key].default)
        if _norm(old) != _norm(new):
            rows.append((key, old, new))
    return rows


def _norm(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def missing_artifacts(preset: Preset, context: Mapping[str, str | None]) -> list[tuple[Path, list[str]]]:
    """(path, command) for each of the preset's ``make`` entries whose path does not exist yet."""
    todo = []
    for template, args in preset.make.items():
        path = Path(expand({"make": template}, context)["make"])
        if not path.exists():
            todo.append((path, [sys.executable, "-m", "trainer.tiny", args[0], str(path), *args[1:]]))
    return todo


def make_artifacts(todo: list[tuple[Path, list[str]]], log=print) -> None:
    """Run the ``make`` commands (tiny model / data set); a failure names the command and its output."""
    for path, command in todo:
        log(f"making {path}: {' '.join(command[1:])}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RlrunError(f"making {path} failed (exit {done.returncode}): "
                             f"{(done.stderr or done.stdout).strip()[-500:]}")
