"""Ray Tune experiment folders of a run: finding them, and the owner stamp that makes one safe to restore.

Experiments are `tune/grid-<config hash>[-<n>]` (raybench.sae.grid). In-trial checkpoints hold no pickle
(raybench.sae.trial_state), but `Tuner.restore` unpickles Tune's own experiment state, which can run arbitrary
code. raybench writes an owner stamp (`raybench_owner.json`) into each experiment folder it creates and refuses
to restore a folder without one. Never restore (or copy into a run's `tune/`) Tune state from an untrusted
source: delete such a folder instead; finished cells are kept and only unfinished stacks restart.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
from typing import NamedTuple

from raybench.errors import RaybenchError

OWNER_STAMP = "raybench_owner.json"  # written by raybench into every Tune experiment folder it creates


class UntrustedTuneState(RaybenchError, RuntimeError):
    """A Tune experiment folder that raybench did not create (no owner stamp): restoring it would unpickle it."""


def fs_join(base: str, name: str) -> str:
    """`base/name` on a pyarrow filesystem path (no Path: it may be a bucket key)."""
    return f"{base.rstrip('/')}/{name}"


class Experiment(NamedTuple):
    """One experiment folder of a config."""

    n: int
    """Its number: 1 for `<base>`, n for `<base>-<n>`."""
    path: str
    """Its path on the storage filesystem."""


def experiment_dirs(fs, storage: str, base: str) -> list[Experiment]:
    """The experiment folders `<base>` (n = 1) and `<base>-<n>` under `storage`, oldest first."""
    from pyarrow import fs as pafs

    pattern = re.compile(rf"{re.escape(base)}(?:-(\d+))?")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(storage, allow_not_found=True)):
        m = pattern.fullmatch(info.base_name)
        if info.type == pafs.FileType.Directory and m:
            found.append(Experiment(int(m.group(1) or 1), fs_join(storage, info.base_name)))
    return sorted(found)


def write_owner_stamp(fs, exp_dir: str, config_hash: str) -> None:
    """Mark `exp_dir` as created by raybench, before Tune writes anything into it."""
    import datetime

    stamp = {"owner": "raybench", "experiment": exp_dir.rstrip("/").rsplit("/", 1)[-1], "config_hash": config_hash,
             "token": secrets.token_hex(16), "host": socket.gethostname(),
             "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    fs.create_dir(exp_dir, recursive=True)
    with fs.open_output_stream(fs_join(exp_dir, OWNER_STAMP)) as out:
        out.write((json.dumps(stamp, indent=2, sort_keys=True) + "\n").encode())


def check_owner_stamp(fs, exp_dir: str, shown: str | None = None) -> None:
    """Refuse to restore (= unpickle) a Tune experiment folder that raybench's owner stamp does not mark as its own.

    `shown`: how to name the folder to the user (e.g. its s3:// URI)."""
    from pyarrow import fs as pafs

    path = fs_join(exp_dir, OWNER_STAMP)
    stamp = None
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as f, contextlib.suppress(ValueError):
            stamp = json.loads(f.read().decode())
    name = exp_dir.rstrip("/").rsplit("/", 1)[-1]
    if not isinstance(stamp, dict) or stamp.get("owner") != "raybench" or stamp.get("experiment") != name:
        raise UntrustedTuneState(
            f"refusing to restore the Ray Tune experiment in {shown or exp_dir}: it has no valid raybench owner stamp "
            f"({OWNER_STAMP}), so raybench did not create it (or an older raybench did). Restoring Tune state "
            "unpickles it, which can run arbitrary code, so Tune state from an untrusted source must never be "
            f"restored. Delete {shown or exp_dir} to start its trials fresh (finished cells are kept).")
