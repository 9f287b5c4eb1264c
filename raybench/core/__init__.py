"""The leaf layer: protocol, run config and its YAML, paths, atomic writes, errors, privacy, shared statistics.

Nothing here imports from any other raybench layer (checked by import-linter, .importlinter).
"""
