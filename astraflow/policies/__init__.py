"""Data-algorithm policies: stream processors between topics (gate, GRESO, assembler, replay)."""
