"""Decide before speculating: measure the costs of every way to run the target on this
machine, probe acceptance on the user's prompts, predict, check, recommend (``specdec
profile``; ``specdec generate --auto`` runs the recommendation)."""
