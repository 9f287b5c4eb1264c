"""Cross-cohort comparison of two finished runs of one protocol (`raybench compare`, docs/protocol.md §8.9):
metric leaders preserved or not, rank agreement of the model profiles and per-model AUC differences, each with
an interval from independent patient bootstraps of the two runs.

run.py (tables, pure given the two runs' profile draws; the loader that makes those draws), figures.py, section.py
(the HTML report), cli.py (the command).
"""
