"""Evaluation: metrics, judges, win rates, KL, reports and plots."""
