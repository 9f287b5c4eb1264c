"""The README's "Audit your own encoder" example (examples/my_encoder): found through its `raybench.encoders` entry
point, and keeping the adapter contract of tests/encoders/models/test_conformance.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from test_conformance import _records, assert_seeded_and_deterministic

from raybench.encoders import base
from raybench.encoders.base import ENTRY_POINT_GROUP, EncoderSpec, build_encoder, worker_builder

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my_encoder"


@pytest.fixture
def installed_example(tmp_path, monkeypatch):
    """The example as pip would leave it, without pip: its package importable and a dist-info folder holding the
    entry points its pyproject.toml declares (importlib.metadata reads both from sys.path)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = tmp_path / f"my_encoder-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"][ENTRY_POINT_GROUP]
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n"
                                           + "".join(f"{k} = {v}\n" for k, v in points.items()))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # forget the plugin after the test
    return points


def test_example_is_found_by_its_entry_point_and_keeps_the_contract(installed_example):
    assert installed_example == {"my_encoder": "my_encoder.adapter:build"}
    build = lambda seed: build_encoder(EncoderSpec("my_encoder", size="demo", init_seed=seed))  # noqa: E731
    a, b, c = build(3), build(3), build(4)
    assert type(a).__module__ == "my_encoder.adapter" and a.name == "my_encoder"
    assert "my_encoder" in base.available_encoders()
    assert worker_builder("my_encoder") is None  # an entry-point plugin registers itself in every Ray worker
    assert not a.training and not any(p.requires_grad for p in a.parameters())
    records = _records(3) + [_records(1, fs=250, seconds=8.0)[0]]  # another rate and length: same native shape
    x = torch.from_numpy(np.stack([a.preprocess(r, 500) for r in records[:3]]
                                  + [a.preprocess(records[3], 250)]))
    s = a.layer_states(x)
    assert s.shape == (a.n_layers, 4, a.d) and torch.isfinite(s).all()
    assert_seeded_and_deterministic(a, b, c, x, s)


def test_example_loads_a_checkpoint_strictly(installed_example, tmp_path):
    model = build_encoder(EncoderSpec("my_encoder", size="demo", init_seed=1))
    path = tmp_path / "weights.pt"
    torch.save(model.state_dict(), path)
    again = build_encoder(EncoderSpec("my_encoder", size="demo", init_seed=2, checkpoint=str(path)))
    assert again.fingerprint() == model.fingerprint()
    torch.save({k: v for k, v in model.state_dict().items() if not k.startswith("stem")}, path)
    with pytest.raises(base.CheckpointError, match="missing"):
        build_encoder(EncoderSpec("my_encoder", size="demo", checkpoint=str(path)))
