"""HTML pieces of the run report: the page template and style, figures embedded as data URIs, tables.

Everything is escaped here. The report is one file plus what it links relatively inside the run folder (the
full CSV of a table too long to inline, the lazy-loaded feature dashboards); `raybench export` copies those
links along, so the report works opened from the run folder or from an export.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

LARGE_TABLE_ROWS = 40  # longer tables go into a collapsed <details>
INLINE_TABLE_ROWS = 2000  # longer tables show their first PREVIEW_ROWS and link the full CSV (report size)
PREVIEW_ROWS = 100


def figure_html(stem: str, png: Path, caption: str) -> str:
    """A <figure> with the PNG inlined as base64 and its caption."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f'<figure id="fig-{html.escape(stem)}"><img alt="{html.escape(stem)}" '
            f'src="data:image/png;base64,{data}"><figcaption><b>{html.escape(stem)}</b>: '
            f"{html.escape(caption)}</figcaption></figure>")


def table_block(name: str, df: pd.DataFrame, title: str | None = None, href: str | None = None) -> str:
    """A titled table; one longer than LARGE_TABLE_ROWS rows is collapsed into <details>. One longer than
    INLINE_TABLE_ROWS shows its first PREVIEW_ROWS and links `href` (the table's file, relative to the report):
    the concept-level tables of a run hold tens of thousands of rows, which would make the report tens of MB."""
    label = html.escape(title or f"Table {name} ({len(df)} rows)")
    if df.empty:
        return f"<h3>{label}</h3><p class='note'>No rows.</p>"
    if len(df) > INLINE_TABLE_ROWS:
        where = (f"the whole table: <a href=\"{html.escape(href)}\">{html.escape(href)}</a>" if href
                 else "the whole table is in the run's tables/ folder")
        return (f"<details><summary>{label}</summary><p class='note'>First {PREVIEW_ROWS} of {len(df)} rows; "
                f"{where}.</p>{df_html(df.head(PREVIEW_ROWS))}</details>")
    table = df_html(df)
    if len(df) > LARGE_TABLE_ROWS:
        return f"<details><summary>{label}</summary>{table}</details>"
    return f"<h3>{label}</h3>{table}"


def df_html(df: pd.DataFrame) -> str:
    """Floats to 3 decimals; p-values keep 3 significant digits so small ones stay visible."""
    def fixed(v: float) -> str:
        return "–" if not np.isfinite(v) else f"{v:.3f}"

    def pval(v: float) -> str:
        return "–" if not np.isfinite(v) else f"{v:.3g}"

    pcols = {c: pval for c in df.columns if str(c) in ("p", "p_bh") or str(c).startswith("p_")}
    return df.to_html(index=False, border=0, classes="tbl", float_format=fixed, formatters=pcols, na_rep="–",
                      escape=True)


def kv_table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table class='tbl kv'>{cells}</table>"


CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#dfe3ea; --accent:#2458a6; --bg:#fbfcfd; }
* { box-sizing:border-box; }
body { margin:0; font:15px/1.5 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color:var(--fg);
       background:var(--bg); }
nav { position:fixed; top:0; left:0; bottom:0; width:210px; padding:18px 14px; border-right:1px solid var(--line);
      background:#fff; overflow-y:auto; }
nav .brand { font-weight:700; margin-bottom:12px; }
nav a { display:block; padding:3px 6px; color:var(--fg); text-decoration:none; border-radius:4px; font-size:14px; }
nav a:hover { background:#eef2f8; color:var(--accent); }
main { margin-left:210px; padding:20px 36px 60px; max-width:1280px; }
h1 { font-size:24px; margin:4px 0 14px; }
h2 { font-size:20px; border-bottom:2px solid var(--line); padding-bottom:4px; margin-top:36px; }
h3 { font-size:16px; margin:18px 0 6px; }
p.intro, p.note { color:var(--muted); max-width:900px; }
figure { margin:16px 0 22px; }
figure img { max-width:100%; height:auto; border:1px solid var(--line); background:#fff; }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
table.tbl { border-collapse:collapse; font-size:13px; margin:6px 0 14px; background:#fff; }
table.tbl th, table.tbl td { border-bottom:1px solid var(--line); padding:3px 10px; text-align:right; }
table.tbl th { background:#f1f4f8; text-align:center; position:sticky; top:0; }
table.tbl td:first-child, table.kv th { text-align:left; }
table.tbl tr:hover td { background:#f7f9fc; }
details { margin:10px 0; } details summary { cursor:pointer; font-weight:600; }
details > table { display:block; max-height:520px; overflow:auto; }
pre { background:#f4f6f9; border:1px solid var(--line); padding:10px; overflow:auto; max-height:480px; font-size:12px; }
.badge { display:inline-block; padding:6px 12px; border-radius:6px; font-weight:600; }
.badge.ok { background:#e3f4e8; color:#17652f; } .badge.bad { background:#fbe5e5; color:#9b1c1c; }
.badge.warn { background:#fff4d6; color:#7a5600; }
ul.ids { columns:3; font-size:13px; }
.fd img.fd-panel { max-width:100%; height:auto; border:1px solid var(--line); background:#fff; }
figure.fd-rec { margin:8px 0 16px; }
figure.fd-rec img { width:100%; max-width:1125px; aspect-ratio:1125/550; }
select { font:inherit; padding:2px 4px; }
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<nav><div class="brand">raybench</div>
{nav}
</nav>
<main>
<h1>{title}</h1>
{body}
</main>
</body>
</html>
"""
