"""raybench: the ECG-InterpBench sparse-autoencoder audit of frozen ECG foundation models on Ray.

Data flows one way: cohorts -> encoders -> sae -> analysis.
"""

__version__ = "0.1.0"
