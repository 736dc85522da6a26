"""Prompt templates of the three turns."""
