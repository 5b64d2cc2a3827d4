"""Settings of the property-based fuzz tests (hypothesis), shared by every ``test_fuzz_*``.

CI runs each target with its own small example count, derandomized (the same cases on every
run, no example database), so a failure reproduces and the suite's time stays put. A long
local run multiplies every count and draws fresh cases each time::

    ASTRAFLOW_FUZZ_SCALE=10 .venv/bin/pytest tests -k fuzz --hypothesis-show-statistics

(``--hypothesis-show-statistics`` prints the cases each target ran.) A failure prints the
falsifying example and a ``@reproduce_failure`` blob; keep the example as an ``@example``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE_ENV = "ASTRAFLOW_FUZZ_SCALE"
SCALE = max(1, int(os.environ.get(SCALE_ENV, "1") or 1))


def fuzz(examples: int) -> settings:
    """Hypothesis settings for a target with ``examples`` cases in CI (times
    ``ASTRAFLOW_FUZZ_SCALE`` in a long run, which is not derandomized: each explores anew)."""
    return settings(
        max_examples=examples * SCALE,
        derandomize=SCALE == 1,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much,
                               HealthCheck.function_scoped_fixture],
    )
