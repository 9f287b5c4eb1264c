"""The `Stage` contract every step of `raybench grid` follows (in the spirit of NeMo Curator's stages, which
declare their resources and setup beside the work they do).

A stage names itself, the run-folder inputs it needs, answers whether its outputs already mark it complete,
and runs. Its Ray workers size their own CPU and GPU shares when they start, from the connected cluster
(`raybench.infra.resources`): a share declared before the cluster is known would be a guess. The stages live
beside the code they drive (`raybench.cohorts.stage`, `raybench.encoders.stage`, `raybench.sae.stage`,
`raybench.analysis.stage`); `raybench.app.pipeline` only sequences them. A stage raises `RaybenchError`s for
bad input, never click exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raybench.core.config import RunConfig


def _no_check(cfg: RunConfig) -> None:
    return None


@dataclass(frozen=True)
class Stage:
    """One step of the run.

    name: the progress display's label. inputs: run-folder parts (RunLayout attribute names) the stage reads.
    is_complete(cfg): the outputs that mark it complete exist and match cfg (the pipeline then skips it).
    run(cfg, remote): does the work on the local run folder (remote: the s3:// run it mirrors, or None) and
    returns the progress display's summary line.
    check(cfg): cheap validation of the stage's external inputs, run for every stage before Ray starts; raises
    a RaybenchError naming the file and the fix.
    """

    name: str
    inputs: tuple[str, ...]
    is_complete: Callable[[RunConfig], bool]
    run: Callable[[RunConfig, str | None], str | None]
    check: Callable[[RunConfig], None] = _no_check
