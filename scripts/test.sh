#!/usr/bin/env bash
# The whole test suite, set-up included: the virtual environment, Python packages, and the
# Kafka broker jars from Maven Central (the Kafka tests start a real broker themselves).
# Extra arguments go to pytest, e.g. scripts/test.sh -k conformance -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
echo "==> fetching the Kafka broker jars (cached after the first time)"
astraflow broker fetch
echo "==> running the tests (all but gpu-marked ones)"
exec python -m pytest -m "not gpu" "$@"
