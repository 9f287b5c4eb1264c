"""The report's summary: the release audit's verdict, the best model per metric, the fidelity gate. A view: it
computes nothing and draws nothing (section.py)."""
