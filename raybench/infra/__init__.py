"""Infrastructure the stages use: the Stage contract, the Ray session, live progress, storage and its mirror,
the run lock and GPU shares. It knows no stage (checked by import-linter, .importlinter).
"""
