"""cell_counts: the example analysis of docs/architecture.md §4.1 (copy this folder to raybench/analysis/)."""
