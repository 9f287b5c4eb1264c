"""Ray Tune experiment folders of a run: finding them, and resuming their stacks without unpickling anything.

Experiments are `tune/grid-<config hash>[-<n>]` (raybench.sae.grid). Tune's own experiment state (`tuner.pkl`,
the trials' pickles) travels with the run folder, so anyone who can write there (a copied run, a shared bucket)
could plant a pickle that runs code on `Tuner.restore`; no stamp beside it can prove otherwise. So raybench never
restores a Tune experiment: a rerun starts a fresh one for the stacks still missing (finished cells are recognised
by their own files, raybench.sae.freshness), and a stack resumes from the newest in-trial checkpoint an earlier
experiment of the same config left for it: safetensors + JSON (raybench.sae.trial_state), nothing unpickled.
"""

from __future__ import annotations

import json
import logging
import tempfile
from typing import Any, NamedTuple

from raybench.sae.trial_state import STATE_JSON, STATE_TENSORS, load_trial_state

log = logging.getLogger(__name__)

RESUME_KEY = "resume_from"  # in a trial's config: stack key -> path of an earlier checkpoint of those cells
MAX_STATE_JSON = 64 << 20  # a state.json larger than this is not one raybench wrote: skipped


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
    import re

    from pyarrow import fs as pafs

    pattern = re.compile(rf"{re.escape(base)}(?:-(\d+))?")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(storage, allow_not_found=True)):
        m = pattern.fullmatch(info.base_name)
        if info.type == pafs.FileType.Directory and m:
            found.append(Experiment(int(m.group(1) or 1), fs_join(storage, info.base_name)))
    return sorted(found)


def stack_key(cell_ids: list[str]) -> str:
    """The key of the cells one in-trial checkpoint trains (the unfinished cells of one stack)."""
    return "\n".join(cell_ids)


def earlier_checkpoints(fs, experiments: list[Experiment]) -> dict[str, str]:
    """stack key -> path of the newest in-trial checkpoint of those cells in `experiments` (one config's).

    Only each checkpoint's state.json is read, as JSON; a folder without both state files (an older raybench's,
    or one cut short by a kill) is skipped."""
    from pyarrow import fs as pafs

    best: dict[str, tuple[int, str]] = {}
    for exp in experiments:
        infos = fs.get_file_info(pafs.FileSelector(exp.path, recursive=True, allow_not_found=True))
        files = {i.path: i for i in infos if i.type == pafs.FileType.File}
        for path, info in files.items():
            folder = path.rsplit("/", 1)[0]
            if (info.base_name != STATE_JSON or not folder.rsplit("/", 1)[-1].startswith("checkpoint_")
                    or fs_join(folder, STATE_TENSORS) not in files or (info.size or 0) > MAX_STATE_JSON):
                continue
            found = _summary(fs, path)
            if found is not None and found[1] > best.get(found[0], (-1, ""))[0]:
                best[found[0]] = (found[1], folder)
    return {key: folder for key, (_, folder) in best.items()}


def _summary(fs, path: str) -> tuple[str, int] | None:
    """(stack key, step) of a state.json written by raybench.sae.trial_state.save_trial_state; None otherwise."""
    try:
        with fs.open_input_stream(path) as f:
            meta = json.loads(f.read().decode())
        entries = dict(meta["state"]["dict"])
        ids, state = entries["cell_ids"], dict(entries["state"]["dict"])
        step = state["step"]
    except RecursionError:  # nested deeper than the parser goes: planted, never written by save_trial_state
        log.warning("skipping %s: nested deeper than any state.json raybench writes (not a raybench checkpoint); "
                    "delete it if you did not put it there", path)
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids) and isinstance(step, int)):
        return None
    return stack_key(ids), step


def earlier_state(config: dict[str, Any], cell_ids: list[str]) -> dict | None:
    """In a trial: the training state of `cell_ids` from an earlier experiment's checkpoint (the driver found it:
    `earlier_checkpoints`), read as safetensors + JSON; None when there is none or it cannot be read."""
    folder = (config.get(RESUME_KEY) or {}).get(stack_key(cell_ids))
    if not folder:
        return None
    remote = config.get("remote_uri")
    try:
        if remote:
            from raybench.infra.storage import arrow_filesystem

            fs = arrow_filesystem(f"{remote.rstrip('/')}/tune").fs
        else:
            from pyarrow import fs as pafs

            fs = pafs.LocalFileSystem()
        with tempfile.TemporaryDirectory() as tmp:
            for name in (STATE_JSON, STATE_TENSORS):
                with fs.open_input_stream(fs_join(folder, name)) as src, open(f"{tmp}/{name}", "wb") as dst:
                    dst.write(src.read())
            loaded = load_trial_state(tmp)
    except Exception as err:  # a damaged checkpoint costs the steps it held, not the trial
        log.warning("cannot read the earlier checkpoint %s (%s); its cells train from step 0", folder,
                    type(err).__name__)
        return None
    if not isinstance(loaded, dict) or loaded.get("cell_ids") != list(cell_ids):
        return None
    return loaded.get("state")
