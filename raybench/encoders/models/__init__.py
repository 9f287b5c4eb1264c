"""The six built-in adapters, imported on demand: building one model imports only its module (HuBERT-ECG
pulls in transformers, which the others do not need), listing them imports all.

Each adapter is imported on its own, so one that cannot import (e.g. a missing optional dependency)
does not take the others down; its error is kept in IMPORT_ERRORS and reported by build_encoder.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from raybench.core.models import BUILTIN  # the registry: one line per built-in model

IMPORT_ERRORS: dict[str, str] = {}


def load_builtin(names: Iterable[str] = BUILTIN) -> None:
    """Import (and so register) the named built-in adapters; failures land in IMPORT_ERRORS."""
    for name in names:
        if name not in BUILTIN:
            continue
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ImportError as err:  # pragma: no cover - depends on the environment
            IMPORT_ERRORS[name] = f"{type(err).__name__}: {err}"
