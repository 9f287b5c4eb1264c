"""The report's browsable "Feature dashboards" section, rendered from figures/dashboards/index.json.

Every model x concept dashboard is a hidden block; a model and a concept selector (a few lines of vanilla JS)
show one at a time, and the URL fragment (`#features/<model>/<concept>`) selects and scrolls to one, so a
dashboard can be linked. Images are files referenced relatively (`figures/dashboards/...`), lazy-loaded: a
hidden dashboard's images carry their address in `data-src` only, which the script moves to `src` when the
dashboard is shown (browsers may fetch hidden `loading="lazy"` images), so opening the report fetches the
images of one dashboard, and report.html stays small. Each
image marks itself `data-loaded="1"` once it has loaded (the report's headless-browser test reads that).
"""

from __future__ import annotations

import html
from typing import Any

from raybench.analysis.api import Context, Section
from raybench.analysis.features.dashboards import weak_r_note
from raybench.analysis.features.figures import KIND_LABELS, dashboards_enabled, read_index
from raybench.analysis.summary.headline import cohort_text, weights_text

PREFIX = "figures/dashboards/"

SCRIPT = """<script>
(function () {
  var model = document.getElementById('fd-model'), concept = document.getElementById('fd-concept');
  if (!model || !concept) return;
  function show(scroll) {
    document.querySelectorAll('#features .fd').forEach(function (el) {
      var on = el.dataset.model === model.value && (el.dataset.concept === concept.value || !el.dataset.concept);
      el.hidden = !on;
      if (on) el.querySelectorAll('img[data-src]').forEach(function (img) {
        img.src = img.dataset.src;
        img.removeAttribute('data-src');
      });
    });
    if (scroll) document.getElementById('fd-view').scrollIntoView();
  }
  function fromHash() {
    var parts = decodeURIComponent(location.hash).split('/');
    if (parts[0] !== '#features' || parts.length < 2) return false;
    model.value = parts[1];
    if (parts.length > 2) concept.value = parts[2];
    return true;
  }
  function change() { history.replaceState(null, '', '#features/' + model.value + '/' + concept.value); show(false); }
  model.addEventListener('change', change);
  concept.addEventListener('change', change);
  window.addEventListener('hashchange', function () { show(fromHash()); });
  show(fromHash());
})();
</script>"""


def _e(value: Any) -> str:
    """Any value from index.json or run.yaml as HTML text: a run folder may come from someone else."""
    return html.escape(str(value))


def _img(rel: str, alt: str, cls: str = "") -> str:
    return (f'<img class="{cls}" loading="lazy" alt="{html.escape(alt)}" data-src="{html.escape(PREFIX + rel)}" '
            'onload="this.dataset.loaded=\'1\'">')


def _record(pick: dict[str, Any], concept: str) -> str:
    value = "–" if pick.get("value") is None else f"{pick['value']:.4g}"
    alt = f"record {pick['ecg_id']}"
    return (f"<figure class='fd-rec'>{_img(pick['image'], alt)}<figcaption>"
            f"<b>{_e(KIND_LABELS.get(pick['kind'], pick['kind']))}</b>: record {_e(pick['ecg_id'])}, "
            f"activation {pick['activation']:.3f}, {html.escape(concept)} = {value}</figcaption></figure>")


def _concept_block(model: dict[str, Any], c: dict[str, Any], threshold: float | None = None) -> str:
    weak = weak_r_note(float(c["r"]), threshold) if threshold is not None else None
    head = (f"<h3>{_e(model['label'])} · {_e(c['concept'])}: latent {_e(c['latent'])}</h3>"
            f"<p class='note'>r = {c['r']:+.3f} on the test split (the value behind the cell's accessibility), "
            f"fires on {c['firing_rate']:.1%} of {_e(model['n_test'])} test records.</p>"
            + (f"<p class='badge warn'>{html.escape(weak.capitalize())}.</p>" if weak else ""))
    return (f"<div class='fd' hidden data-model='{html.escape(model['model'])}' "
            f"data-concept='{html.escape(c['concept'])}'>{head}{_img(c['panel'], c['concept'] + ' panel', 'fd-panel')}"
            + "".join(_record(p, c["concept"]) for p in c["picks"]) + "</div>")


def _unexplained_block(model: dict[str, Any], threshold: str) -> str:
    rows = "".join(
        f"<tr><td>{_e(u['latent'])}</td><td>{u['firing_rate']:.1%}</td><td>{_e(u['best_concept'])}</td>"
        f"<td>{u['best_r']:+.3f}</td><td>{_e(u['ecg_id'])}</td><td>{u['activation']:.3f}</td></tr>"
        for u in model["unexplained"])
    figs = "".join(f"<figure class='fd-rec'>{_img(u['image'], 'record ' + str(u['ecg_id']))}<figcaption>latent "
                   f"{_e(u['latent'])}: its strongest record {_e(u['ecg_id'])} (activation {u['activation']:.3f})"
                   "</figcaption></figure>" for u in model["unexplained"][:3])
    table = ("<table class='tbl'><tr><th>latent</th><th>firing rate</th><th>closest concept</th><th>r</th>"
             f"<th>top record</th><th>activation</th></tr>{rows}</table>") if rows else "<p>None.</p>"
    return (f"<div class='fd' hidden data-model='{html.escape(model['model'])}'><h3>Frequent latents that no "
            f"concept explains ({_e(model['label'])})</h3><p class='note'>The most frequently firing "
            f"latents on the test split whose |r| with every concept stays below {_e(threshold)} and that no concept "
            f"selected.</p>{table}{figs}</div>")


def features_body(ctx: Context) -> str:
    index = read_index(ctx.layout.root)
    enabled, why = dashboards_enabled(ctx.run)
    if not enabled:
        return f"<p class='note'>No dashboards in this report: {html.escape(why)}.</p>"
    if index is None or not index.get("models"):
        skipped = "; ".join(f"{m}: {r}" for m, r in (index or {}).get("skipped", {}).items())
        return ("<p class='note'>No dashboards in this run (figures/dashboards/ is empty: re-render with "
                "<code>raybench report</code>" + (f"; {html.escape(skipped)}" if skipped else "") + ").</p>")
    models = index["models"]
    concepts = [c["concept"] for c in models[0]["concepts"]]
    choice = index.get("choice", {})
    threshold = str((ctx.run or {}).get("protocol", {}).get("eval", {}).get("coverage_threshold", "the coverage "
                                                                                                    "threshold"))
    opts_m = "".join(f"<option value='{html.escape(m['model'])}'>{html.escape(m['label'])}</option>" for m in models)
    opts_c = "".join(f"<option value='{html.escape(c)}'>{html.escape(c)}</option>" for c in concepts)
    cells = ", ".join(f"{html.escape(m['label'])}: <code>{html.escape(m['cell']['cell_id'])}</code>" for m in models)
    about = f"{weights_text(ctx.layout, ctx.run)} {cohort_text(ctx.layout, ctx.run)}"
    out = [f"<p class='badge warn'>{html.escape(about)}</p>",
           f"<p class='intro'>What each concept's selected latent responds to, in one cell per model (E = "
           f"{_e(choice.get('expansion'))}, depth q = {_e(choice.get('depth'))}, "
           + (f"seed {_e(choice['seed'])}" if choice.get("seed") is not None else "lowest seed")
           + f"; {cells}): the top-activating test records on ECG paper (25 mm/s, 10 mm/mV), records near the "
           "median and near zero activation for contrast, the activation histogram and activation against the "
           "concept's raw value. Choose a model and a concept; images load when shown.</p>",
           f"<p id='fd-view'><label>Model <select id='fd-model'>{opts_m}</select></label> "
           f"<label>Concept <select id='fd-concept'>{opts_c}</select></label></p>"]
    try:
        cut = float(threshold)
    except ValueError:
        cut = None
    for m in models:
        out += [_concept_block(m, c, cut) for c in m["concepts"]]
        out.append(_unexplained_block(m, threshold))
    if index.get("skipped"):
        out.append("<p class='note'>Models without dashboards: " + "; ".join(
            f"{html.escape(k)}: {html.escape(v)}" for k, v in index["skipped"].items()) + "</p>")
    out.append("<noscript><p class='note'>The dashboards need JavaScript to be shown.</p></noscript>")
    out.append(SCRIPT)
    return "\n".join(out)


SECTIONS = (Section("features", "Feature dashboards", body=features_body),)
