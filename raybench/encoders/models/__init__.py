"""The six built-in adapters, one module each (the model list and facts: raybench.core.models), imported on
demand by raybench.encoders.base: building one model imports only its module (HuBERT-ECG pulls in transformers,
which the others do not need), listing them imports all.

Each adapter is imported on its own, so one that cannot import (e.g. a missing optional dependency) does not take
the others down; its error is kept and reported by build_encoder.
"""
