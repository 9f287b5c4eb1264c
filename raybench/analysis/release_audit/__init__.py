"""The release audit: every expected cell present and ok, every matched block whole, no failed secondary analysis
(run.py), and the grid's denominators (section.py). It is computed at render time from the cells table (cheap),
so `raybench report` refreshes it too."""
