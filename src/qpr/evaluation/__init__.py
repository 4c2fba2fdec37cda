"""Measuring a trained model: TREC files and measures, the baselines, the query sets,
the fusion and "no answer" choices made on validation, and evaluation on any file."""
