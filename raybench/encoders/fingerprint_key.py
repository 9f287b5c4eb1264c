"""The cheap key of a built-in encoder's fingerprint, without torch: a rerun's completeness check (encoders/stage.py)
reads it for every model, and importing torch there doubled the time of a `raybench grid` with nothing to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raybench.core.models import BUILTIN


def fingerprint_key(spec: Any) -> str | None:
    """A cheap stand-in for a built-in encoder's fingerprint (which hashes its weights, so needs a build): the
    spec, the checkpoint file's size and mtime, the adapters' and the builder's source and the versions of
    the libraries that initialise weights. Stores record it beside the fingerprint, so a rerun's completeness
    check reads the fingerprint from a store whose key matches instead of rebuilding six encoders. None for
    encoders whose code lives outside raybench (plugins, run-time registrations): those are built."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    if spec.name not in BUILTIN:
        return None
    h = hashlib.sha256(repr((spec.name, spec.size, spec.checkpoint, spec.profile, spec.init_seed)).encode())
    if spec.checkpoint:
        ck = Path(spec.checkpoint).expanduser()
        st = ck.stat() if ck.exists() else None
        h.update(repr((str(ck.resolve()), st and st.st_size, st and st.st_mtime_ns)).encode())
    for lib in ("torch", "numpy", "transformers"):
        try:
            h.update(f"{lib}={version(lib)}".encode())
        except PackageNotFoundError:
            h.update(f"{lib}=-".encode())
    here = Path(__file__).parent  # what the fingerprint hashes comes from the adapters and the build in base.py
    for path in [here / "base.py", *sorted((here / "models").rglob("*.py"))]:
        h.update(path.relative_to(here).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
