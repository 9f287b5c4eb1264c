"""The built-in encoders' registry: one line per model, and every other module asks it.

Each entry holds what the rest of raybench needs to know about a built-in model besides its adapter: its id
(the grid's model list, in this order), the label figures and the report show, the name the published code
uses (it hashes that name into the permutation-floor seeds: docs/protocol.md §8), and the seconds of signal
its preprocessing keeps under each profile (the harmonization audit crops to it: docs/protocol.md §9.2).
It also holds the sizes each adapter promises (audited layers and state width at full size, layers at demo
size): the conformance tests read them from here, so a new line is checked like the six.
The adapter itself is `raybench/encoders/models/<id>.py` (it registers the class); a seventh built-in encoder
is that file plus one line here (docs/architecture.md §4.2). A new line does not change any preset: the presets
audit `PUBLISHED_MODELS`, the published six, so the paper's grid stays 450 + 90 cells; a run audits the new
model when its config lists it in `protocol.grid.models`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """One built-in encoder. window_s: seconds of signal kept by the native and the published preprocessing
    (the published profile of the wav2vec2-style and HuBERT adapters resamples the whole record); layers / d:
    the audited layers and state width of the full-size (published) architecture; demo_layers: the audited layers
    of the demo size, whose width is DEMO_WIDTH."""

    name: str
    label: str
    published_name: str
    native_window_s: float
    published_window_s: float
    layers: int = 12
    d: int = 768
    demo_layers: int = 6


DEMO_WIDTH = 64
"""State width of every demo-size encoder (a shared width keeps the demo's SAEs comparable and small)."""

REGISTRY: tuple[ModelInfo, ...] = (
    ModelInfo("csfm", "CSFM", "CSFM", 10.0, 10.0, layers=6, demo_layers=6),
    ModelInfo("cardiac_fm", "CARDIAC-FM", "CARDIAC-FM", 10.0, 10.0),
    ModelInfo("ecg_fm", "ECG-FM", "ECG-FM", 5.0, 10.0),
    ModelInfo("ecg_jepa", "ECG-JEPA", "ECG-JEPA", 10.0, 10.0, demo_layers=12),
    ModelInfo("hubert_ecg", "HuBERT-ECG", "HuBERT-ECG", 5.0, 10.0),
    ModelInfo("st_mem", "ST-MEM", "ST-MEM", 9.0, 9.0, demo_layers=12),
)

MODELS: tuple[str, ...] = tuple(m.name for m in REGISTRY)
"""Every built-in encoder, in registry order (a seventh line here adds to it)."""
PUBLISHED_MODELS: tuple[str, ...] = ("csfm", "cardiac_fm", "ecg_fm", "ecg_jepa", "hubert_ecg", "st_mem")
"""The six encoders of the published atlas (docs/protocol.md §5.2), in the grid's order: the default of
protocol.grid.models and so of every preset. Pinned here, not derived from REGISTRY, so adding an encoder never
changes the paper preset's grid or config hash."""
INFO: dict[str, ModelInfo] = {m.name: m for m in REGISTRY}
PUBLISHED_MODEL_ORDER: tuple[str, ...] = ("cardiac_fm", "csfm", "ecg_fm", "ecg_jepa", "hubert_ecg", "st_mem")
"""The published analysis scripts' MODEL_ORDER (docs/protocol.md §8.8): where models tie in a ranking they keep
this order, and a pairwise contrast is (left, right) with left earlier in it. The grid order MODELS is raybench's
own (cell naming, scheduling) and decides neither; a model not in it (a seventh encoder) goes last."""
BUILTIN: tuple[str, ...] = tuple(sorted(MODELS))
"""The built-in adapters' ids (raybench.encoders.models), alphabetical."""
LABELS: dict[str, str] = {m.name: m.label for m in REGISTRY}
PUBLISHED_NAMES: dict[str, str] = {m.name: m.published_name for m in sorted(REGISTRY, key=lambda m: m.name)}
WINDOW_SECONDS: dict[tuple[str, str], float] = {
    (m.name, profile): seconds for m in REGISTRY
    for profile, seconds in (("native", m.native_window_s), ("published", m.published_window_s))}


def model_label(model: str) -> str:
    """The display label of `model` (its id when it is not built in, e.g. a plugin encoder)."""
    return LABELS.get(model, model)
