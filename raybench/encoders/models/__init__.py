"""The six built-in adapters; importing this package registers them.

Each adapter is imported on its own, so one that cannot import (e.g. a missing optional dependency)
does not take the others down; its error is kept in IMPORT_ERRORS and reported by build_encoder.
"""

from __future__ import annotations

import importlib

BUILTIN = ("cardiac_fm", "csfm", "ecg_fm", "ecg_jepa", "hubert_ecg", "st_mem")
IMPORT_ERRORS: dict[str, str] = {}

for _name in BUILTIN:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ImportError as _err:  # pragma: no cover - depends on the environment
        IMPORT_ERRORS[_name] = f"{type(_err).__name__}: {_err}"
