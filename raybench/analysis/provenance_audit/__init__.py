"""The provenance audit (docs/protocol.md §12): does an encoder carry how an ECG was recorded (device, site),
and does a linear head on its embedding rely on it? Recover (probes.py), Stress (stress.py), Intervene
(intervene.py), Verify (verdict.py) on one embedding (audit.py); SAE latents that carry provenance
(features.py); Ray tasks per model x depth (run.py); figures, report section, `raybench provenance` (cli.py).

Not to be confused with raybench.sae.freshness (whether a trained cell matches its inputs).
"""
