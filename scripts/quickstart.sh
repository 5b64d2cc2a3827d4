#!/usr/bin/env bash
# The main job, set-up included. Until the RL quickstart lands this is the bus demo: a
# producer and three worker processes on the embedded bus, one of them killed midway.
# Extra arguments go to `astraflow demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec astraflow demo "$@"
