"""The trainer: GRPO-family RL and SFT as bus consumers (DESIGN.md §7)."""
