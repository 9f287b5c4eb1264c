"""The report section: the decision table it prints is the code's and docs/protocol.md's, and after the cheap
part alone (what a plain `raybench grid` runs) it names the missing evidence classes and reads no metric
"reliable", even a perfect one."""

from __future__ import annotations

import html
import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.api import Context
from raybench.analysis.reliability import seeds
from raybench.analysis.reliability.run import _summary
from raybench.analysis.reliability.section import reliability_body
from raybench.analysis.reliability.verdicts import TABLE
from raybench.core.config import ReliabilityConfig
from raybench.core.paths import RunLayout

PROTOCOL = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def _docs_table() -> list[tuple[str, str]]:
    text = PROTOCOL.read_text()
    sec = text[text.index("### 11.8"):text.index("## 12.")]
    return [(m.group(1), m.group(2).strip()) for m in re.finditer(r"^\| \*\*(.+?)\*\* \| (.+) \|$", sec, re.M)]


def _cheap_rel() -> pd.DataFrame:
    """The summary of the cheap part on a grid whose metric is perfect: 6 models far apart, tiny seed noise."""
    rng = np.random.default_rng(0)
    long = pd.DataFrame([("reconstruction", f"m{i}", q, e, str(s), 0.5 + 0.05 * i + 1e-4 * rng.normal())
                         for i, q, e, s in itertools.product(range(6), (0.0, 0.5, 1.0), (1, 8), (1, 2, 3))],
                        columns=seeds.LONG_COLUMNS)
    noise = seeds.profile_noise(seeds.seed_profiles(long, [1, 8])).set_index("metric")
    out = {"reliability_outside": pd.DataFrame(columns=["metric"])}
    return _summary(out, noise, long, {}, ReliabilityConfig())[0]


def test_the_decision_table_in_the_docs_and_the_report_is_the_codes(tmp_path):
    assert _docs_table() == list(TABLE)
    rel = _cheap_rel()
    body = reliability_body(Context(layout=RunLayout.at(tmp_path), tables={"reliability": rel}, figures={}, run=None,
                                    audit=None))
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", body)]
    for verdict, when in TABLE:
        assert [verdict, when] in [cells[i:i + 2] for i in range(len(cells) - 1)], verdict


def test_cheap_evidence_alone_reads_incomplete_and_names_what_is_missing(tmp_path):
    rel = _cheap_rel()
    row = rel.iloc[0]
    assert row.verdict == "incomplete" and row.class_signal == "pass"
    assert row.class_stability == "not assessed" and row.class_validity == "not assessed"
    body = reliability_body(Context(layout=RunLayout.at(tmp_path), tables={"reliability": rel}, figures={}, run=None,
                                    audit=None))
    assert "<b>stability</b> not assessed for reconstruction" in body
    assert "<b>validity</b> not assessed for reconstruction" in body
    assert "raybench reliability --run-dir R" in body
    verdict_cells = re.findall(r"<tr>\s*<td>reconstruction</td>\s*<td>([^<]*)</td>", body)
    assert verdict_cells[0] == "incomplete"  # the criteria table's verdict (the numbers table follows)
    assert not re.search(r"<td>reconstruction</td>\s*<td>reliable</td>", body)
