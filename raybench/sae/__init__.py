"""BatchTopK sparse autoencoders: model, stacked trainer, per-cell evaluation, Ray Tune grid."""
