"""This run beside the paper (docs/protocol.md §10): every number the paper prints (raybench.analysis.published)
next to the run's own value of the same quantity, and whether it agrees at the printed precision."""
