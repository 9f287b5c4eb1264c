"""Frozen ECG encoders: one module per model, a registry, Ray Data extraction, the activation store.

The names below load on first use (PEP 562), so importing a submodule that needs no torch (the encode stage's
completeness check on a rerun) does not import torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ECGEncoder", "EncoderSpec", "RegistrationError", "available_encoders", "build_encoder", "register_encoder"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("raybench.encoders.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
