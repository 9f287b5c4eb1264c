"""Frozen ECG encoders: one module per model, a registry, Ray Data extraction, the activation store."""

from raybench.encoders.base import ECGEncoder, EncoderSpec, available_encoders, build_encoder, register_encoder

__all__ = ["ECGEncoder", "EncoderSpec", "available_encoders", "build_encoder", "register_encoder"]
