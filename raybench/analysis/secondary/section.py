"""Report sections of the secondary analyses: calibration ladder, input harmonization (model level, then the
concept-level tests) and intervention selectivity (docs/protocol.md §9). Each is optional: it shows only when
its analysis wrote a table or figure, or failed."""

from __future__ import annotations

import numpy as np

from raybench.analysis.api import Context, Section
from raybench.analysis.report.html import table_block
from raybench.analysis.report.plotting import model_label

SIG = 0.05


def harmonization_concepts_body(ctx: Context) -> str:
    con = ctx.tables["harmonization_concept_contrasts"]
    summ = con.groupby(["model", "protocol"], sort=True).agg(
        concepts=("concept", "size"), significant=("q_value_bh", lambda q: int((q < SIG).sum())),
        largest_abs_delta=("delta", lambda d: float(np.abs(d).max()))).reset_index()
    summ["model"] = summ.model.map(model_label)
    summ.columns = ["model", "protocol", "concepts", "BH-significant (q < .05)", "largest |Δ|r||"]
    return table_block("harmonization_concept_summary", summ, "Concept-level tests per model and protocol")


SECTIONS = (
    Section("calibration", "Calibration ladder",
            "Ridge probes vs single SAE / dense / random coordinates at E = 8. An encoder that carries the concepts "
            "should order dense ridge ≥ full-code ridge ≥ top-16 ≥ top-4 and learned single coordinates above "
            "random dictionaries; calibration_order says which steps hold per model (random-init demo encoders "
            "carry the concepts too weakly for the middle steps to separate).",
            figures=("calibration*",), tables=("calibration*",), optional=True),
    Section("harmonization", "Input harmonization",
            "Dense-coordinate accessibility and linear CKA under native, lead, temporal and joint harmonization.",
            figures=("harmonization*",), optional=True,  # concept-level tests: section harmonization_concepts
            tables=("harmonization", "harmonization_contrasts", "harmonization_rank", "harmonization_concepts")),
    Section("harmonization_concepts", "Input harmonization: concept-level tests",
           "Per concept, |r| under each harmonized protocol minus native (patient bootstrap), Benjamini–Hochberg "
           "adjusted across every concept-level comparison, separately from the model-level family.",
           body=harmonization_concepts_body, tables=("harmonization_concept_contrasts",), optional=True,
           claims=("harmonization_concept_contrasts",), needs=("harmonization_concept_contrasts",)),
    Section("intervention", "Intervention selectivity",
            "SAE vs dense (and, in the paper design, PCA and random-rotation) coordinates per candidate arm and k: "
            "matched target effect, off-target RMS and wrong-behavior index; BH per metric over every comparison.",
            figures=("intervention*",), tables=("intervention*",), optional=True),
)
