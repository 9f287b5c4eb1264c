"""The atlas analyses (docs/protocol.md §8): the base tables (profiles, contrasts, curves, rank stability, crossed
bootstrap, depth x scale, sensitivity, reproducibility, concepts; run.py) and the paper's analyses built on the
same bootstrap draws (paper_run.py, paper_analyses.py), their figures (figures.py, paper_figures.py) and report
sections (section.py, paper_section.py), in the order the report shows them."""
