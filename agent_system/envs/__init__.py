"""Gym-like environments over the project's datasets, with the trainer's prompts and graders."""
