"""The six built-in adapters; importing this package registers them."""

from raybench.encoders.models import (  # noqa: F401
    cardiac_fm,
    csfm,
    ecg_fm,
    ecg_jepa,
    hubert_ecg,
    st_mem,
)
