"""The reward and version arithmetic the policies share (astraflow.policies.env)."""

from __future__ import annotations

import pytest
from policy_helpers import traj

from astraflow.core.errors import SchemaError
from astraflow.policies.env import token_versions


def test_token_versions_span_the_generated_tokens() -> None:
    ts = [traj("g", 0, 1.0, version=3), traj("g", 1, 0.0, version=7)]
    assert token_versions(ts) == (3, 7)
    assert token_versions([traj("g", 0, 1.0, prompt=12)]) == (-1, -1)  # nothing generated


@pytest.mark.parametrize("garbled", [b"\x01\x02\x03", b"\x00" * 13], ids=["3B", "13B"])
def test_a_garbled_versions_buffer_is_refused_by_the_records_check(garbled: bytes) -> None:
    """A ``versions`` buffer that is no whole number of int32 (set after the record was
    built, so its own check never saw it) is refused with the records' SchemaError, not read
    as a shorter array."""
    t = traj("g", 0, 1.0, version=2)
    t.versions = garbled
    with pytest.raises(SchemaError, match=r"packed array of \d+ bytes is not a whole number "
                                          "of <i4"):
        token_versions([t])
