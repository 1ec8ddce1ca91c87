"""Training checkpoints: one save and one load for every DeepSpeed group (policy, critic), written atomically,
found again on resume, on the same placement or on another GPU count.

Layout under ``--ckpt_path`` (one directory per checkpoint; the driver and every rank must see it: a shared
file system on more than one node)::

    latest                 the tag of the newest checkpoint, replaced atomically after it is in place
    global_step<N>/        a checkpoint; it appears under this name only once complete (renamed into place)
        policy/            DeepSpeed's files of the policy group (each rank's zero_pp_rank_<r>_* files)
        critic/            the critic group's (PPO with GAE)
        client_state.json  the trainer's own state: step, optimizer steps, sampler position, reward normaliser
        hf/                --save_hf_ckpt: the policy in Hugging Face format
        COMPLETE           the completion marker, written last: each group's world size and files with sizes
        universal/<group>/ DeepSpeed's universal checkpoint of a group, made once by the first resume on another
                           GPU count (or with --use_ds_universal_ckpt) and kept for the next one
    <tag>/                 a checkpoint saved under a name of its own (``Checkpoints.save("best")``): the
                           same layout, replaced atomically when saved again, never ``latest``, never pruned
    .tmp-<tag>-<id>/       a checkpoint being written; one left behind by a job that ended mid-write is skipped
                           on resume and removed by the next save

Writing: every rank writes its DeepSpeed files into the temporary directory and fsyncs them; the driver adds
the client state and the marker (fsync'd), fsyncs the directory, renames it into place, fsyncs ``--ckpt_path``
and only then replaces ``latest`` (write, fsync, rename). A job killed at any point leaves either the previous
checkpoints untouched or the new one complete. Resuming takes the newest complete checkpoint: one without the
marker, with a rank's file missing or cut short, is skipped with a line that names it and why.

Another GPU count: a group's ZeRO files say how many ranks saved it (one ``zero_pp_rank_<r>_*optim_states.pt``
per rank). When that differs from the group's world size now, the group's files are converted once with
DeepSpeed's ``ds_to_universal`` (a Ray task on the node of the group's first rank, into a temporary directory
renamed into ``universal/<group>``) and every rank loads that universal checkpoint: parameters and Adam moments
re-partitioned over the new ranks.

Test hook: ``RLRUN_TEST_CHECKPOINT_PAUSE=TAG:SECONDS`` makes the save of checkpoint TAG pause SECONDS after every
rank's files are written and before the marker, printing one line first, so a test can kill the job inside the
write at a known point (tests/integration/test_train_loop.py). Nothing else reads it.

Only the standard library at import: rlrun reads checkpoints on the controller (``rlrun submit --resume``)
without torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.files import TMP_PREFIX, fsync_path, fsync_tree, replace_dir, replace_file, write_file

LATEST = "latest"
MARKER = "COMPLETE"
CLIENT_STATE = "client_state.json"
UNIVERSAL = "universal"
STEP_TAG = re.compile(r"^global_step(\d+)$")
PAUSE_ENV = "RLRUN_TEST_CHECKPOINT_PAUSE"
#: A group's ZeRO optimizer file of one rank: (bf16_)zero_pp_rank_<dp rank>_mp_rank_<mp rank>_optim_states.pt
_ZERO_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_?optim_states\.pt$")
MARKER_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or loaded, in one line naming it and why."""


# --- what is on disk -------------------------------------------------------------------------------------------


@dataclass
class Found:
    """One checkpoint directory under --ckpt_path, complete or not."""

    path: Path
    step: int | None  # from the marker, else from a global_step<N> name
    problem: str | None = None  # why it cannot be resumed from; None: complete
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # the marker's groups

    @property
    def tag(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        return self.problem is None

    def saved_world_size(self, group: str) -> int | None:
        """How many ranks saved ``group``, from its own files: one ZeRO optimizer file per rank (None without
        ZeRO optimizer files, i.e. ZeRO stage 0, whose files load on any number of ranks)."""
        ranks = {int(m.group(1)) for p in (self.path / group).glob("*optim_states.pt") if (m := _ZERO_OPTIM.match(p.name))}
        return len(ranks) or None


def inspect(path: Path) -> Found:
    """Whether ``path`` is a complete checkpoint: its marker, then every file the marker lists with its size,
    then the client state. Reads only names, sizes and two small JSON files."""
    m = STEP_TAG.match(path.name)
    step = int(m.group(1)) if m else None
    if path.name.startswith(TMP_PREFIX):
        return Found(path, step, "an unfinished write (the job ended while writing it)")
    marker = path / MARKER
    if not marker.is_file():
        return Found(path, step, f"no completion marker ({MARKER}): torn, or not written by this trainer")
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        step = int(info["step"])
        groups = dict(info["groups"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Found(path, step, f"unreadable completion marker ({type(exc).__name__}: {exc})")
    for name, group in groups.items():
        for rel, size in group.get("files", {}).items():
            file = path / name / rel
            try:
                actual = file.stat().st_size
            except OSError:
                return Found(path, step, f"{name}/{rel} is missing (saved by {group.get('world_size', '?')} ranks)",
                             groups)
            if actual != size:
                return Found(path, step, f"{name}/{rel} has {actual} bytes, the marker says {size}", groups)
    if not (path / CLIENT_STATE).is_file():
        return Found(path, step, f"{CLIENT_STATE} is missing", groups)
    return Found(path, step, None, groups)


def scan(root: Path) -> list[Found]:
    """Every checkpoint under ``root`` that resuming could take (``global_step<N>``, the tag ``latest`` names)
    and every unfinished write, oldest first; named tags other than ``latest``'s are not resume points."""
    if not root.is_dir():
        return []
    names = {p.name for p in root.iterdir() if p.is_dir() and (STEP_TAG.match(p.name) or p.name.startswith(TMP_PREFIX))}
    latest = read_latest(root)
    if latest and (root / latest).is_dir():
        names.add(latest)
    found = [inspect(root / n) for n in names]
    return sorted(found, key=lambda f: (f.step if f.step is not None else -1, f.tag))


def read_latest(root: Path) -> str | None:
    """The tag ``latest`` names (None without one)."""
    try:
        tag = (root / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return tag if tag and "/" not in tag and tag not in (".", "..") else None


def newest(root: Path, log: Callable[[str], None] | None = print) -> Found | None:
    """The newest complete checkpoint under ``root`` (the highest step; ``latest`` is not trusted alone: a job
    may have ended between renaming a checkpoint into place and updating it), None without one. Every
    incomplete one is named through ``log`` with the reason it is skipped."""
    found = scan(root)
    for f in found:
        if not f.complete and log is not None:
            log(f"checkpoint {f.path} skipped: {f.problem}")
    complete = [f for f in found if f.complete]
    return complete[-1] if complete else None


def describe(root: Path) -> list[str]:
    """One line per checkpoint under ``root``, oldest first (``python -m trainer.checkpoint DIR``)."""
    latest = read_latest(root)
    lines = []
    for f in scan(root):
        mark = " (latest)" if f.tag == latest else ""
        state = "complete" if f.complete else f"skipped on resume: {f.problem}"
        ranks = ", ".join(f"{g} x{info.get('world_size', '?')}" for g, info in f.groups.items())
        lines.append(f"{f.tag}{mark}: step {f.step if f.step is not None else '?'}"
                     + (f", {ranks}" if ranks else "") + f"; {state}")
    return lines


# --- saving (driver side) --------------------------------------------------------------------------------------


def save(root: Path, tag: str, groups: dict[str, Any], client: dict[str, Any], *, hf: Any = None,
         latest: bool = True, keep: int | None = None, log: Callable[[str], None] = print) -> Path:
    """Write checkpoint ``tag`` of ``groups`` (name -> ActorGroup of workers with :class:`CheckpointWorker`)
    and the ``client`` state (JSON-serialisable) under ``root``, atomically (see the module's docstring).

    ``hf``: an ActorGroup whose ``save_hf`` also writes the Hugging Face model (``hf/``). ``latest``: the new
    checkpoint becomes ``latest`` (False for a named tag such as ``best``). ``keep``: afterwards, only the
    newest ``keep`` ``global_step<N>`` checkpoints stay (never the one ``latest`` names, never a named tag).
    Returns the checkpoint's directory."""
    if not tag or "/" in tag or tag.startswith(".") or tag == LATEST:
        raise CheckpointError(f"checkpoint tag {tag!r}: expected a plain directory name (not {LATEST!r}, no '/', "
                              "not starting with '.')")
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{TMP_PREFIX}*"):  # a job that ended mid-write left it: nothing will finish it
        if stale.is_dir():
            log(f"removing {stale}: an unfinished checkpoint write of an earlier job")
            shutil.rmtree(stale, ignore_errors=True)
        else:  # a `latest` being replaced
            stale.unlink(missing_ok=True)
    tmp = root / f"{TMP_PREFIX}{tag}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write(tmp, tag, groups, client, hf, log)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind (a killed one: the next save)
        raise
    target = root / tag
    replace_dir(tmp, target)
    if latest:
        replace_file(root / LATEST, tag)
    if keep:
        prune(root, keep, log)
    return target


def _write(tmp: Path, tag: str, groups: dict[str, Any], client: dict[str, Any], hf: Any,
           log: Callable[[str], None]) -> None:
    """Everything of checkpoint ``tag`` into ``tmp``: the ranks' files, the HF model, the client state, and
    last the marker; all fsync'd."""
    import ray

    refs = {name: group.async_run("save_checkpoint", str(tmp), name) for name, group in groups.items()}
    marker: dict[str, Any] = {"version": MARKER_VERSION, "tag": tag, "step": int(client.get("step", 0)),
                              "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "groups": {}}
    for name, group_refs in refs.items():
        files: dict[str, int] = {}
        for rank_files in ray.get(group_refs):
            files.update(rank_files)
        marker["groups"][name] = {"world_size": len(group_refs), "files": dict(sorted(files.items()))}
    if hf is not None:
        hf.run("save_hf", str(tmp / "hf"))
        fsync_tree(tmp / "hf")
    _test_pause(tag, tmp, log)
    write_file(tmp / CLIENT_STATE, json.dumps(client, indent=1, sort_keys=True))
    write_file(tmp / MARKER, json.dumps(marker, indent=1))
    fsync_path(tmp)


def _test_pause(tag: str, tmp: Path, log: Callable[[str], None]) -> None:
    """The test hook of the module's docstring."""
    want, _, seconds = os.environ.get(PAUSE_ENV, "").partition(":")
    if want and want == tag:
        log(f"checkpoint {tag}: every rank's files are in {tmp}; pausing {float(seconds or 0):g} s before the "
            f"completion marker ({PAUSE_ENV})")
        sys.stdout.flush()
        time.sleep(float(seconds or 0))


def prune(root: Path, keep: int, log: Callable[[str], None] = print) -> list[Path]:
    """Remove ``global_step<N>`` checkpoints beyond the newest ``keep`` complete ones (incomplete ones older than
    the newest complete one go too). The one ``latest`` names and named tags are never removed. Returns what
    was removed."""
    found = [f for f in scan(root) if STEP_TAG.match(f.tag)]
    protected = read_latest(root)
    complete = [f for f in found if f.complete]
    kept = {f.tag for f in complete[-keep:]} | {protected}
    newest_step = complete[-1].step if complete else None
    removed = []
    for f in found:
        if f.tag in kept or (not f.complete and (newest_step is None or (f.step or 0) > newest_step)):
            continue
        shutil.rmtree(f.path, ignore_errors=True)
        removed.append(f.path)
    if removed:
        log(f"checkpoints: removed {', '.join(p.name for p in removed)} (--max_ckpt_num {keep})")
    return removed


# --- loading (driver side) -------------------------------------------------------------------------------------


def load(found: Found, groups: dict[str, Any], *, universal: bool = False,
         log: Callable[[str], None] = print) -> dict[str, Any]:
    """Load checkpoint ``found`` into ``groups`` (name -> ActorGroup) and return its client state. A group saved
    by another number of ranks than it has now (or every group, with ``universal``) loads DeepSpeed's universal
    checkpoint, converted once and kept under ``universal/<group>``."""
    import ray

    missing = [name for name in groups if name not in found.groups]
    if missing:
        raise CheckpointError(f"checkpoint {found.path} has no {' or '.join(missing)} (it holds "
                              f"{', '.join(found.groups) or 'nothing'}): it was saved by a run without that model")
    refs = []
    for name, group in groups.items():
        saved = found.saved_world_size(name)
        now = group.spec.world_size
        if saved is not None and (universal or saved != now):  # None: ZeRO stage 0, whole on every rank
            source = ensure_universal(found, name, group)
            log(f"checkpoint {found.tag}: {name} saved by {saved or '?'} rank(s), loading on {now} from DeepSpeed's "
                f"universal checkpoint {source}")
            refs += group.async_run("load_checkpoint", str(source.parent), source.name, universal=True)
        else:
            refs += group.async_run("load_checkpoint", str(found.path), name)
    ray.get(refs)
    return json.loads((found.path / CLIENT_STATE).read_text(encoding="utf-8"))


def ensure_universal(found: Found, name: str, group: Any) -> Path:
    """``universal/<name>`` of checkpoint ``found``: converted now (once) when it is not there yet."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    out = found.path / UNIVERSAL / name
    if (out / MARKER).is_file():
        return out
    # A Ray task on the node of the group's first rank (which reads these files anyway), with no resources of
    # its own so that it runs beside the idle ranks; its memory peak is one rank's optimizer file.
    task = ray.remote(num_cpus=0)(to_universal).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group.pg, placement_group_bundle_index=0))
    t0 = time.perf_counter()
    ray.get(task.remote(str(found.path / name), str(out)))
    print(f"checkpoint {found.tag}: {name} converted to a universal checkpoint in {time.perf_counter() - t0:.1f} s "
          f"({out})", flush=True)
    return out


def to_universal(src: str, out: str) -> None:
    """DeepSpeed's ``ds_to_universal`` of the group checkpoint ``src`` into ``out``, atomically: converted into a
    temporary directory beside ``out``, marked complete, renamed into place."""
    import argparse
    import contextlib
    import io

    from deepspeed.checkpoint import ds_to_universal

    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp_root = dst.parent / f"{TMP_PREFIX}{dst.name}-{uuid.uuid4().hex[:8]}"
    tmp_root.mkdir()
    tmp = tmp_root / dst.name  # ds_to_universal also writes 'latest_universal' beside its output folder
    args = argparse.Namespace(input_folder=src, output_folder=str(tmp), num_extract_workers=1, num_merge_workers=1,
                              keep_temp_folder=False, strict=True, inject_missing_state=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines; failures raise
            ds_to_universal.main(args)
        write_file(tmp / MARKER, json.dumps({"version": MARKER_VERSION, "source": src}))
        fsync_tree(tmp)
        replace_dir(tmp, dst)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


# --- the workers' side -----------------------------------------------------------------------------------------


def rank_files(directory: Path, rank: int) -> Iterable[Path]:
    """The files of ``directory`` (one group's DeepSpeed checkpoint) that ``rank`` wrote: its
    ``zero_pp_rank_<rank>_*`` files, and for rank 0 also the shared ones (``mp_rank_*_model_states.pt``)."""
    mine = f"zero_pp_rank_{rank}_"
    for p in sorted(directory.iterdir()):
        if p.is_file() and (mine in p.name or (rank == 0 and "zero_pp_rank_" not in p.name)):
            yield p


class CheckpointWorker:
    """What a DeepSpeed worker (``self.engine``, ``self.rank``) needs to be checkpointed: mixed into the policy
    and critic workers. Every rank of a group calls each method."""

    engine: Any
    rank: int

    def save_checkpoint(self, directory: str, name: str) -> dict[str, int]:
        """This rank's DeepSpeed state (parameters, optimizer, step) under ``directory/name``, fsync'd; returns
        the files it wrote (relative name -> bytes) for the completion marker."""
        self.engine.save_checkpoint(directory, tag=name, client_state={}, save_latest=False)
        group_dir = Path(directory) / name
        files = {}
        for p in rank_files(group_dir, self.rank):
            fsync_path(p)
            files[p.name] = p.stat().st_size
        if self.rank == 0:
            fsync_path(group_dir)
        return files

    def load_checkpoint(self, directory: str, name: str, universal: bool = False) -> None:
        """Load ``directory/name``; ``universal``: a universal checkpoint (re-partitioned over this group's ranks,
        whatever their number when it was saved)."""
        config = self.engine._config
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = universal  # DeepSpeed reads it at load time only
        try:
            path, _ = self.engine.load_checkpoint(directory, tag=name)
        finally:
            config.load_universal_checkpoint = before
        if path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint {name!r} in {directory}")


def main(argv: list[str]) -> int:
    """``python -m trainer.checkpoint DIR [--json]``: the checkpoints under DIR and which one a resume takes."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer.checkpoint", description=main.__doc__)
    parser.add_argument("directory", type=Path, help="a --ckpt_path")
    parser.add_argument("--json", action="store_true", help="one JSON object: the checkpoints and the newest")
    args = parser.parse_args(argv)
    found = scan(args.directory)
    best = next((f for f in reversed(found) if f.complete), None)
    if args.json:
        print(json.dumps({"directory": str(args.directory), "newest": best.tag if best else None,
                          "newest_step": best.step if best else None,
                          "checkpoints": [{"tag": f.tag, "step": f.step, "problem": f.problem} for f in found]}))
        return 0
    for line in describe(args.directory):
        print(line)
    print(f"resume takes: {best.tag} (step {best.step})" if best else f"no complete checkpoint in {args.directory}")
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
