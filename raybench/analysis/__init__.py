"""Analysis: metrics, bootstraps on Ray, statistics, tables, figures, HTML report, release audit."""
