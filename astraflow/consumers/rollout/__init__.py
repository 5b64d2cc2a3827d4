"""Rollout as a service: workers, engines, workflows, rewards (DESIGN.md §5)."""
