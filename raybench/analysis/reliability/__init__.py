"""How far each reported number can be trusted: raybench's metric reliability audit (docs/protocol.md §11).

Cheap parts (training-seed variance decomposition, interval bias, minimum reliable differences from the existing
seeds) run in every analyze; heavy parts (evaluation reseeds, the ground-truth SAE panel, snapshots through
training) run as Ray tasks when `reliability.enabled` or through `raybench reliability` (run.py).
"""
