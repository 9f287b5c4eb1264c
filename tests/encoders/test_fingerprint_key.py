"""fingerprint_key: the same key as before its move out of base.py, computed without importing torch (a rerun of
`raybench grid` with every stage complete checks it for every model)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from raybench.encoders.base import EncoderSpec
from raybench.encoders.fingerprint_key import fingerprint_key

NO_TORCH = """
import sys
from types import SimpleNamespace
from raybench.encoders.fingerprint_key import fingerprint_key
import raybench.encoders.stage  # the completeness check's module
spec = SimpleNamespace(name="csfm", size="demo", checkpoint=None, profile="native", init_seed=0)
print(fingerprint_key(spec))
assert "torch" not in sys.modules, "fingerprint_key imported torch"
"""


def test_the_key_needs_no_torch_and_follows_the_spec(tmp_path):
    spec = EncoderSpec("csfm", size="demo")
    fields = SimpleNamespace(name="csfm", size="demo", checkpoint=None, profile="native", init_seed=0)
    assert (spec.name, spec.size, spec.checkpoint, spec.profile, spec.init_seed) == (
        fields.name, fields.size, fields.checkpoint, fields.profile, fields.init_seed)
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == fingerprint_key(spec) == fingerprint_key(fields)
    assert fingerprint_key(EncoderSpec("csfm", size="full")) != fingerprint_key(spec)
    ck = tmp_path / "w.pt"
    ck.write_bytes(b"1")
    with_ck = fingerprint_key(EncoderSpec("csfm", size="demo", checkpoint=str(ck)))
    ck.write_bytes(b"22")  # another size: another key
    assert fingerprint_key(EncoderSpec("csfm", size="demo", checkpoint=str(ck))) != with_ck
    assert fingerprint_key(SimpleNamespace(name="not_builtin")) is None  # plugins are built, not keyed
