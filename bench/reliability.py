"""The metric reliability audit (docs/protocol.md §11): its wall time on a finished run, and a paper-scale sizing.

Runs `raybench reliability` (cheap + heavy parts) on --run-dir in place (it writes only tables/reliability*,
figures/reliability_* and re-renders report.html) and prints each part's seconds and the total. Then sizes the
paper-scale audit from measured unit costs: one SAE step and one cell evaluation at the published sizes
(d = 768, B = 256, ~17k train / 2k val / 2k test records, 49 concepts), times the audit's counts.

    python bench/reliability.py --run-dir runs/demo        # target at demo scale: <= 180 s on 2 CPU cores
    python bench/reliability.py --sizing-only              # only the paper-scale estimate
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace


def run_audit(run_dir: str) -> dict[str, float]:
    from raybench.analysis.reliability.run import run_reliability
    from raybench.analysis.stage import render_report
    from raybench.core.run_state import recorded_run_config
    from raybench.infra import ray_session

    cfg, _ = recorded_run_config(run_dir)
    t0 = time.perf_counter()
    ray_session.init_ray(cfg.resources)
    start = time.perf_counter() - t0
    res = run_reliability(run_dir, cfg.protocol, cfg.reliability, heavy=True)
    t1 = time.perf_counter()
    render_report(run_dir)
    secs = {"ray start": start, **res.seconds, "report": time.perf_counter() - t1,
            "total": time.perf_counter() - t0}
    from raybench.analysis.reliability.run import closing_note

    print(closing_note(res.tables["reliability"]))
    return secs


def unit_costs(expansions: tuple[int, ...], d: int = 768, batch: int = 256, steps: int = 3) -> dict[str, float]:
    """CPU seconds (one torch thread; process time, so a busy shared machine does not inflate it) per SAE step of a
    stack of 3 seeds at each E, and per cell evaluation, at the published sizes."""
    import numpy as np
    import torch

    from raybench.core.config import paper_protocol
    from raybench.sae.evaluate import evaluate_cell
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    torch.set_num_threads(1)
    p = paper_protocol()
    rng = np.random.default_rng(0)
    acts = {"train": rng.normal(size=(17000, d)).astype(np.float32),
            "val": rng.normal(size=(2000, d)).astype(np.float32), "test": rng.normal(size=(2000, d)).astype(np.float32)}
    concepts = {s: rng.normal(size=(len(a), 49)).astype(np.float32) for s, a in acts.items()}
    out = {}
    for e in expansions:
        cfgs = [SAECellConfig.from_protocol(replace(p.sae, steps=steps, batch_size=batch), d, e * d, d // 8, s)
                for s in (1, 2, 3)]
        train_stack(acts["train"][:2048], [replace(c, steps=1) for c in cfgs], implementation="auto")  # warm-up
        t = time.process_time()
        res = train_stack(acts["train"][:4096], cfgs, implementation="auto")
        out[f"step_E{e}"] = (time.process_time() - t) / steps
        t = time.process_time()
        evaluate_cell(res.sae, res.normalizer, acts, concepts, np.arange(2000) % 1700, np.arange(4096), p.eval,
                      n_patients=1700)
        out[f"eval_E{e}"] = time.process_time() - t
    return out


def paper_sizing() -> None:
    from raybench.analysis.reliability.sampling import sample_points
    from raybench.core.config import ReliabilityConfig, paper_protocol

    p, r = paper_protocol(), ReliabilityConfig()
    points = sample_points(p, r.sample_points)
    costs = unit_costs(tuple(sorted({e for _, e in points})))
    n_models, n_seeds, steps = len(p.grid.models), len(p.grid.seeds), p.sae.steps
    train = sum(n_models * (steps * costs[f"step_E{e}"] + n_seeds * len(r.fractions) * costs[f"eval_E{e}"])
                for _, e in points)
    reseed = sum(n_models * n_seeds * r.reseeds * costs[f"eval_E{e}"] for _, e in points)
    print(f"paper scale, sampled points (q, E) {points}, CPU seconds: "
          + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))
    print(f"  training curves: {train / 3600:.2f} CPU-core hours ({n_models * len(points)} stacks x {n_seeds} seeds "
          f"x {steps} steps + {len(r.fractions)} snapshot evaluations per cell)")
    print(f"  evaluation reseeds: {reseed / 3600:.2f} CPU-core hours ({n_models * len(points) * n_seeds} cells x "
          f"{r.reseeds} reseeds)")
    print("  ground-truth panel: as at demo scale (its size does not depend on the run)")
    print("  intervals: one more patient bootstrap (bench/bootstrap.py: ~12 s) + a P x P jackknife GEMM")
    print(f"  total heavy ~ {(train + reseed) / 3600:.2f} CPU-core hours; the Ray tasks spread it over the cluster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/demo", help="a finished run folder (raybench grid)")
    ap.add_argument("--sizing-only", action="store_true", help="skip the audit; print the paper-scale estimate")
    ap.add_argument("--no-sizing", action="store_true", help="skip the paper-scale estimate")
    args = ap.parse_args()
    if not args.sizing_only:
        secs = run_audit(args.run_dir)
        print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in secs.items()))
    if not args.no_sizing:
        paper_sizing()


if __name__ == "__main__":
    main()
