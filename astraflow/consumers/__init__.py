"""Consumers of the dataflow: rollout workers, trainers, the scaler."""
