"""A seventh model plugs in without editing raybench: by `register_encoder`, or by an entry point."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from raybench.core.config import MODELS
from raybench.core.models import DEMO_WIDTH, INFO
from raybench.encoders import base
from raybench.encoders.base import ECGEncoder, EncoderSpec, available_encoders, build_encoder, register_encoder


@pytest.fixture(autouse=True)
def builtin_package(monkeypatch):
    """Each test gets a private copy of the registry, with every built-in adapter registered first (they import on
    demand, base.load_builtin)."""
    base.load_builtin()
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))


class Toy(ECGEncoder):
    """Two linear 'layers' over per-lead means: enough to check the registry contract end to end."""

    name = "toy"
    n_layers = 2
    d = 4

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 4)
        self.b = nn.Linear(4, 4)

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        return signal.mean(axis=1, dtype=np.float32)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        h1 = self.a(x)
        return torch.stack([h1, self.b(h1)])


def test_building_one_builtin_imports_only_its_adapter():
    """HuBERT-ECG's transformers import is paid only by HuBERT-ECG (Ray actors start faster)."""
    code = ("import sys; from raybench.encoders.base import build_encoder, EncoderSpec; "
            "build_encoder(EncoderSpec('ecg_jepa', size='demo')); "
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('raybench.encoders.models.')), "
            "'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "False" and "hubert_ecg" not in out and "ecg_jepa" in out, out


def test_register_encoder_from_a_test_module():
    @register_encoder("toy_registered")
    def factory(spec: EncoderSpec) -> ECGEncoder:
        return Toy()

    assert "toy_registered" in available_encoders()
    assert set(MODELS) <= set(available_encoders())
    model = build_encoder(EncoderSpec("toy_registered", profile="published", init_seed=7))
    assert not model.training and not any(p.requires_grad for p in model.parameters())  # frozen
    assert model.profile == "published"
    again = build_encoder(EncoderSpec("toy_registered", init_seed=7))
    assert torch.equal(model.a.weight, again.a.weight)  # seeded from spec.init_seed
    x = torch.from_numpy(model.preprocess(np.ones((12, 50), np.float32), 500))[None]
    assert model.layer_states(x).shape == (2, 1, 4)


def _write_plugin(root, dist: str, module: str, entries: dict[str, str], body: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{base.ENTRY_POINT_GROUP}]\n{lines}\n")


def test_entry_point_plugin(tmp_path, monkeypatch):
    _write_plugin(tmp_path, "raybench_toy_plugin", "raybench_toy_plugin",
                  {"toy_plugin": "raybench_toy_plugin:build", "csfm": "raybench_toy_plugin:build"},
                  """
                  from torch import nn
                  import torch
                  from raybench.encoders.base import ECGEncoder

                  class Plugged(ECGEncoder):
                      name = "toy_plugin"
                      n_layers = 3
                      d = 5

                      def __init__(self):
                          super().__init__()
                          self.proj = nn.Linear(12, 5)

                      def preprocess(self, signal, fs):
                          return signal[:, :10].astype("float32")

                      def layer_states(self, x):
                          h = self.proj(x.mean(-1))
                          return torch.stack([h, 2 * h, 3 * h])

                  def build(spec):
                      return Plugged()
                  """)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    names = available_encoders()
    assert "toy_plugin" in names and set(MODELS) <= set(names)
    model = build_encoder(EncoderSpec("toy_plugin"))
    assert type(model).__name__ == "Plugged" and not model.training
    x = torch.from_numpy(model.preprocess(np.ones((12, 100), np.float32), 500))[None]
    assert model.layer_states(x).shape == (3, 1, 5)
    # a plugin cannot shadow a built-in adapter of the same name
    assert type(build_encoder(EncoderSpec("csfm"))).__module__ == "raybench.encoders.models.csfm"
    monkeypatch.delitem(sys.modules, "raybench_toy_plugin", raising=False)


def test_unknown_encoder_names_the_plugin_group():
    with pytest.raises(KeyError, match=base.ENTRY_POINT_GROUP):
        build_encoder(EncoderSpec("no_such_model"))


@pytest.mark.parametrize("name", MODELS)
def test_builtin_demo_encoders_share_width(name):
    model = build_encoder(EncoderSpec(name))
    info = INFO[name]  # the sizes the registry promises (raybench.core.models)
    assert (model.name, model.d, model.n_layers) == (name, DEMO_WIDTH, info.demo_layers)
    assert (type(model).n_layers, type(model).d) == (info.layers, info.d)  # the full-size contract
    rng = np.random.default_rng(0)
    x = torch.from_numpy(model.preprocess(rng.standard_normal((12, 5000)).astype(np.float32), 500))[None]
    states = model.layer_states(x)
    assert states.shape == (model.n_layers, 1, DEMO_WIDTH) and torch.isfinite(states).all()


def test_a_second_encoder_under_a_taken_name_is_refused():
    """A name holds one factory (issue 39): a built-in's name, or another module's registration, is refused with
    both factories named; the same definition again (a reload) and replace=True are allowed."""
    from raybench.encoders.base import RegistrationError

    with pytest.raises(RegistrationError, match=r"'csfm' is already registered \(raybench\.encoders\.models\.csfm"):
        register_encoder("csfm")(lambda spec: Toy())

    def first(spec: EncoderSpec) -> ECGEncoder:
        return Toy()

    register_encoder("toy_once")(first)
    register_encoder("toy_once")(first)  # the same factory: a no-op

    def reloaded(spec: EncoderSpec) -> ECGEncoder:  # a module reloaded defines the factory anew, same name
        return Toy()

    reloaded.__qualname__ = first.__qualname__
    register_encoder("toy_once")(reloaded)
    assert base._REGISTRY["toy_once"] is reloaded

    def other(spec: EncoderSpec) -> ECGEncoder:
        return Toy()

    with pytest.raises(RegistrationError, match="toy_once.*pick another name, or pass replace=True"):
        register_encoder("toy_once")(other)
    assert base._REGISTRY["toy_once"] is reloaded
    register_encoder("toy_once", replace=True)(other)
    assert base._REGISTRY["toy_once"] is other
