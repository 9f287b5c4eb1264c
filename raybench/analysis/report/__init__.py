"""Rendering: deterministic figures from tables (plotting.py, figures.py), the HTML pieces (html.py) and the
report itself (render.py), which walks the sections of every analysis in the registry."""
