"""`raybench`'s public API (raybench/__init__.py): every listed name resolves to the object its module defines,
`import raybench` alone stays cheap (no torch, no Ray), and an unknown name is an AttributeError."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import raybench


@pytest.mark.parametrize("name", sorted(raybench._PUBLIC))
def test_each_public_name_is_its_modules_object(name):
    assert getattr(raybench, name) is getattr(importlib.import_module(raybench._PUBLIC[name]), name)
    assert name in dir(raybench)


def test_importing_raybench_loads_neither_torch_nor_ray():
    code = "import sys, raybench; print('torch' in sys.modules, 'ray' in sys.modules, raybench.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["False", "False"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        raybench.nope  # noqa: B018
