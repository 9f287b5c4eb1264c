"""raybench: the ECG-InterpBench sparse-autoencoder audit of frozen ECG foundation models on Ray.

Data flows one way: cohorts -> encoders -> sae -> analysis.

The names below are the public API for scripts, notebooks and extensions (a new encoder, a new analysis:
docs/architecture.md §4); everything else is internal and may move. They load on first use (PEP 562), so
`import raybench` stays cheap (no torch, no Ray) until a name is touched.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    # run configs and the pipeline
    "RunConfig": "raybench.core.config", "load_run_config": "raybench.core.config",
    "dump_run_config": "raybench.core.config", "RUN_PRESETS": "raybench.core.config",
    "demo_run": "raybench.core.config", "paper_run": "raybench.core.config", "ConfigError": "raybench.core.config",
    "RunLayout": "raybench.core.paths", "RaybenchError": "raybench.core.errors",
    "run_pipeline": "raybench.app.pipeline",
    # encoders (§4.2)
    "ECGEncoder": "raybench.encoders.base", "EncoderSpec": "raybench.encoders.base",
    "register_encoder": "raybench.encoders.base", "RegistrationError": "raybench.encoders.base",
    "build_encoder": "raybench.encoders.base", "available_encoders": "raybench.encoders.base",
    "load_torch_checkpoint": "raybench.encoders.base", "load_state_dict_strict": "raybench.encoders.base",
    "ModelInfo": "raybench.core.models", "PUBLISHED_MODELS": "raybench.core.models",
    "DEMO_WIDTH": "raybench.core.models",
    # analyses (§4.1)
    "Analysis": "raybench.analysis.api", "Section": "raybench.analysis.api", "RunInputs": "raybench.analysis.api",
    "RenderInputs": "raybench.analysis.api", "Context": "raybench.analysis.api",
    "FigureSpec": "raybench.analysis.report.plotting", "draw_figures": "raybench.analysis.report.figures",
    "grid_cells": "raybench.analysis.run_inputs", "write_table": "raybench.core.atomic",
}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'raybench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
