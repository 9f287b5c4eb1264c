"""Feature dashboards: what each concept's selected SAE latent responds to, drawn on ECG paper.

    dashboards.py  the data: the chosen cell per model, selected latents on the test split, records to draw
    ecg_paper.py   a 12-lead record on the paper grid (25 mm/s, 10 mm/mV, 3 x 4 + rhythm strip)
    figures.py     the report's figures/dashboards/ folder, and one dashboard as one figure
    section.py     the report's browsable section (model / concept selector, lazy-loaded images)
    cli.py         `raybench features --run-dir R --model M --concept C`
"""
