"""The inference machinery the analyses share: packed per-patient statistics, the patient and crossed bootstraps
and their random streams, the recorded randomness, AUC weights, metrics and statistics (docs/protocol.md §8)."""
