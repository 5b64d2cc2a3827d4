#!/usr/bin/env bash
# The main job, set-up included: `astraflow run examples/quickstart.yaml` on the embedded bus.
# A tiny model built here learns two-digit addition: an SFT warm-up through the bus, then GRPO
# through the full dataflow (producer, gate, a rollout process, assembler, batcher, trainer,
# evaluator). Extra arguments go to `astraflow run` (e.g. --bus kafka://127.0.0.1:9092,
# --set trainer.max_steps=100, --out runs/mine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec astraflow run examples/quickstart.yaml "$@"
