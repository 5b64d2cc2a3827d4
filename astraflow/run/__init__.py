"""Running an experiment on one host: the supervisor behind `astraflow run`, the metrics
collector that writes `metrics.jsonl`, the live view (`astraflow top`) and the end-of-run plots."""
