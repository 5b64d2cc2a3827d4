#!/usr/bin/env bash
# The whole test suite, set-up included: the virtual environment, Python packages, and the
# Kafka broker jars from Maven Central (the Kafka tests start a real broker themselves).
# Extra arguments go to pytest, e.g. scripts/test.sh -k conformance -x
# scripts/test.sh unit [ARGS]: the unit part alone (a contributor's inner loop): the quick tests
# of the package's own modules, leaving out tests/e2e (whole runs) and tests/bench.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# Bytecode caches are written (__pycache__/, git-ignored) even where the environment says not
# to: without them pytest rewrites the asserts of every test module anew in each of its seven
# processes of a CI run (~24 CPU-s a collection here against ~13 with the cache).
unset PYTHONDONTWRITEBYTECODE
echo "==> fetching the Kafka broker jars (cached after the first time)"
astraflow broker fetch
# tests/e2e/test_prometheus_dashboard.py runs the real Prometheus server against a run; it
# fails (it does not skip) where the server is missing.
if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing the Prometheus server (apt-get install prometheus)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "warning: the Prometheus server is not installed, so the dashboard test will fail:" \
         "sudo apt-get install prometheus, or a release from https://prometheus.io/download/" \
         "on PATH (or skip the slow tests: scripts/test.sh -m 'not slow and not gpu')" >&2
  fi
fi
# tests/bench/test_wan.py runs Toxiproxy (the emulated WAN, docs/wan.md) and skips without it.
# The script builds it with Go once into ~/.cache/astraflow/bin (later calls return at once).
if ! command -v toxiproxy-server >/dev/null && [ -z "${ASTRAFLOW_TOXIPROXY:-}" ]; then
  bash "$ROOT/scripts/install-toxiproxy.sh" || echo "warning: Toxiproxy could not be built, so the" \
      "emulated-WAN tests will skip (see the output above; retry: scripts/install-toxiproxy.sh)" >&2
fi
# A test that outlives its pytest-timeout limit by 120 s (stuck where that limit's signal
# cannot reach) leaves the stacks of its process here and the process exits; on SIGUSR1 every
# test process writes its stacks here too (tests/hangwatch.py). show_hangs prints them.
export ASTRAFLOW_TEST_HANG_DIR="${ASTRAFLOW_TEST_HANG_DIR:-$(mktemp -d -t astraflow-hangs.XXXXXX)}"
show_hangs() {
  local f
  for f in "$ASTRAFLOW_TEST_HANG_DIR"/hang-*.txt "$ASTRAFLOW_TEST_HANG_DIR"/stacks-*.txt; do
    [ -s "$f" ] || continue
    echo "==> a test process did not end in time ($f):"
    cat "$f"
  done
  rm -f "$ASTRAFLOW_TEST_HANG_DIR"/hang-*.txt "$ASTRAFLOW_TEST_HANG_DIR"/stacks-*.txt
}
if [ "${1:-}" = unit ]; then
  shift
  echo "==> running the unit part (not slow, not kafka, not gpu; not tests/e2e, tests/bench)"
  rc=0
  python -m pytest -m "not gpu and not slow and not kafka" --ignore=tests/e2e \
    --ignore=tests/bench -n 3 "$@" || rc=$?
  show_hangs
  exit "$rc"
fi
if [ "$#" -gt 0 ]; then
  echo "==> running the tests (all but gpu-marked ones): pytest -m 'not gpu' $*"
  rc=0
  python -m pytest -m "not gpu" "$@" || rc=$?
  show_hangs
  exit "$rc"
fi
# The whole suite (CI), in three parts:
#  1. the quick tests (not slow, no broker) in three processes: they often wait (sockets,
#     subprocesses, timeouts), so three at a time keep two cores busy (measured: 172 s at
#     three, ~208 s at two);
#  2. the slow and Kafka tests in three processes (pytest-xdist --dist loadgroup): training
#     runs bounded by steps, not seconds, so sharing the cores slows them without changing
#     what they check; with two, the cores were idle 7.7% of the time (a subset of the run
#     tests: 348 s at two, 322 s at three, 2% idle). The Kafka tests share one process (one
#     broker; tests/conftest.py), the
#     agentic example's two runs another (the Kafka one starts from the embedded one's warm
#     model); the quickstart's warm-up is made once for both processes (tests/e2e/conftest.py);
#  3. the tests marked `alone` (timed phases, rates over a slow link) one at a time, with
#     nothing else on the machine.
# Each part also has a wall-clock bound (`timeout`, several times what it takes here) behind
# the per-test limits, so that whatever hangs, the run ends and reports: SIGUSR1 first (the
# test processes write their stacks), SIGKILL 30 s later.
echo "==> running the quick tests (not slow, not kafka, not gpu) in three processes"
quick=0
timeout -s USR1 -k 30 900 python -m pytest -m "not gpu and not slow and not kafka" -n 3 || quick=$?
show_hangs
echo "==> running the slow and Kafka tests (not gpu, not alone) in three processes"
slow=0
# (--max-worker-restart: a worker ended by tests/hangwatch.py is replaced, and loadgroup gives
# the test it was running to the new one; a test that hangs every time is not tried forever)
timeout -s USR1 -k 30 2400 python -m pytest -m "not gpu and (slow or kafka) and not alone" -n 3 \
  --dist loadgroup --max-worker-restart 2 -v || slow=$?
show_hangs
echo "==> running the tests that measure wall-clock behaviour, alone"
alone=0
timeout -s USR1 -k 30 900 python -m pytest -m "not gpu and alone" -v || alone=$?
show_hangs
echo "==> quick tests: exit $quick; slow and Kafka tests: exit $slow; alone: exit $alone"
[ "$quick" = 0 ] && [ "$slow" = 0 ] && [ "$alone" = 0 ]
