"""cell_counts' figure, drawn from tables/cell_counts.parquet only (so `raybench report` redraws it)."""

from __future__ import annotations

from matplotlib.figure import Figure

from raybench.analysis.report.plotting import FigureSpec, Tables, model_label


def _median_r2(tables: Tables) -> Figure | None:
    df = tables["cell_counts"]
    df = df[df.arm == "primary"]
    if df.empty:
        return None  # nothing to draw: the report shows the table alone
    fig = Figure(figsize=(4, 2.5))
    ax = fig.subplots()
    ax.bar([model_label(m) for m in df.model], df.median_val_r2)
    ax.set_ylabel("median validation R²")
    ax.tick_params(axis="x", labelrotation=30)
    return fig


FIGURES = (FigureSpec("cell_counts", ("cell_counts",), _median_r2,
                      "Median validation R² of each model's ok primary cells (the example analysis)."),)
