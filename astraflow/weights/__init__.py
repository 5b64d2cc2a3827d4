"""Weights: sparse bf16 delta codec, weight stores, publisher and syncer."""
