"""Evaluation scripts (multi-turn MATH-500)."""
