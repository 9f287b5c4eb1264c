"""docs/architecture.md §4.2 followed as a newcomer would: the example adapter (docs/examples/builtin_encoder/
my_conv.py) copied into a copy of raybench/encoders/models/, the ModelInfo line the docs give added to REGISTRY.
The seventh encoder then builds at both sizes with the registry's sizes and keeps the adapter contract, and every
preset still audits the published six: 450 + 90 cells, the same config hashes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raybench.analysis.completeness import expected_cells
from raybench.core.config import RUN_PRESETS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "architecture.md"
EXAMPLE = REPO / "docs" / "examples" / "builtin_encoder" / "my_conv.py"

CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])  # the checkout's tests/ (the conformance contract)
from raybench.analysis.completeness import expected_cells
from raybench.core.config import RUN_PRESETS, demo_run
from raybench.core.models import BUILTIN, DEMO_WIDTH, INFO, MODELS, PUBLISHED_MODELS
from raybench.encoders.base import EncoderSpec, build_encoder
from raybench.encoders.models.my_conv import MyConv
from encoders.models.test_conformance import test_demo_adapter_contract

test_demo_adapter_contract("my_conv", "native")  # the contract the six keep, read from the registry
demo = build_encoder(EncoderSpec("my_conv", size="demo"))
full = build_encoder(EncoderSpec("my_conv", size="full"))
import dataclasses
cfg = demo_run()
grid7 = dataclasses.replace(cfg.protocol.grid, models=(*PUBLISHED_MODELS, "my_conv"))
print(json.dumps({
    "models": list(MODELS), "builtin": list(BUILTIN),
    "demo": [demo.n_layers, demo.d], "full": [full.n_layers, full.d], "info": [INFO["my_conv"].layers,
    INFO["my_conv"].d, INFO["my_conv"].demo_layers, DEMO_WIDTH],
    "presets": {name: [list(make().protocol.grid.models), len(expected_cells(make().protocol.grid)),
                       make().config_hash()] for name, make in RUN_PRESETS.items()},
    "cells7": len(expected_cells(grid7)),
}))
"""


def _docs_registry_line() -> str:
    """The ModelInfo line §4.2 tells the reader to add (the one naming my_conv)."""
    lines = [ln.strip() for ln in DOCS.read_text().splitlines() if re.match(r'\s*ModelInfo\("my_conv"', ln)]
    assert len(lines) == 1, "docs/architecture.md §4.2 gives exactly one ModelInfo line for the example"
    return lines[0]


@pytest.mark.slow
def test_the_encoder_walkthrough_adds_a_seventh_model_and_keeps_the_paper_preset(tmp_path):
    tree = tmp_path / "checkout"
    shutil.copytree(REPO / "raybench", tree / "raybench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(EXAMPLE, tree / "raybench" / "encoders" / "models" / "my_conv.py")
    models = tree / "raybench" / "core" / "models.py"
    text = models.read_text()
    end = text.index("\n)\n", text.index("REGISTRY: tuple[ModelInfo, ...] = ("))
    models.write_text(text[:end] + "\n    " + _docs_registry_line() + text[end:])

    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHECK, str(REPO / "tests")], env=env, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])

    assert got["models"][-1] == "my_conv" and "my_conv" in got["builtin"]
    layers, d, demo_layers, width = got["info"]
    assert got["demo"] == [demo_layers, width] and got["full"] == [layers, d]
    for name, make in RUN_PRESETS.items():  # this process: the checkout as it is, six built-ins
        models_, cells, config_hash = got["presets"][name]
        assert models_ == list(make().protocol.grid.models) and "my_conv" not in models_
        assert cells == len(expected_cells(make().protocol.grid)) == 540  # 450 primary + 90 sensitivity
        assert config_hash == make().config_hash()
    assert got["cells7"] == 630  # listed in grid.models, the seventh joins: 525 + 105
