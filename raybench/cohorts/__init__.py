"""Cohorts: readers for PTB-XL (+PTB-XL+), MIMIC-IV-ECG and the synthetic cohort; the manifest."""
