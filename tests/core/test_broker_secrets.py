"""A local broker's files that hold its SASL passwords (the state file, server.properties with
the JAAS line) are written 0600, whatever the umask; no JVM needed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from astraflow.core.broker import LocalBroker


def test_the_broker_files_holding_passwords_are_private(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path / "b", port=19092, controller_port=19093, sasl_port=19094,
                    sasl_users={"alice": "pw-5e1d"})
    old = os.umask(0)
    try:
        b.write_config()
        b._write_state(None)
    finally:
        os.umask(old)
    for f in (b.config_file, tmp_path / "b" / "broker.json"):
        assert "pw-5e1d" in f.read_text()
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert LocalBroker.attach(tmp_path / "b").sasl_users == {"alice": "pw-5e1d"}
