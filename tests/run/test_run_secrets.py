"""A run directory's config dumps hide their secrets (``***``); the real values live in one
0600 ``secrets.yaml`` beside them, which every role loading a dump reads; a dump whose
secrets cannot be found is refused, never loaded with ``***`` for a token."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.config import dump
from astraflow.core.errors import ConfigError
from astraflow.core.secrets import SECRETS_FILE
from astraflow.run.launch import RL_CONFIG, write_config
from astraflow.weights.server import make_server

SECRETS = ["gw-tok-5f1e", "sasl-pw-77aa", "url-pw-93bc", "store-tok-0d4c", "api-key-c3f2",
           "claims-tok-81ee"]


def secret_config(weights_url: str = "http://127.0.0.1:1") -> ExperimentConfig:
    gw, sasl, url_pw, store, api, claims = SECRETS
    return ExperimentConfig.model_validate({
        "bus": {"url": f"kafka://127.0.0.1:9092?sasl.password={url_pw}&client.id=x",
                "options": {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice",
                            "sasl.password": sasl},
                "claims": {"type": "http", "url": "http://127.0.0.1:2", "token": claims}},
        "gateway": {"token": gw},
        "weights": {"store": {"type": "http", "url": weights_url, "token": store}},
        "rollout": {"engine": {"type": "openai", "base_url": "http://127.0.0.1:3/v1",
                               "model": "m", "api_key": api}},
    })


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_dumps_are_redacted_and_the_secrets_file_is_private_from_creation(
        tmp_path: Path) -> None:
    config = secret_config()
    run = tmp_path / "run"
    old = os.umask(0)  # a permissive umask: the 0600 must come from how the file is created
    try:
        write_config(config, run / "config.yaml")
        write_config(config, run / RL_CONFIG)
    finally:
        os.umask(old)
    for name in ("config.yaml", RL_CONFIG):
        text = (run / name).read_text()
        assert not [s for s in SECRETS if s in text], name
        assert "sasl.password: '***'" in text and "token: '***'" in text
        assert "sasl.password=***&client.id=x" in text  # the URL keeps its other settings
        assert "sasl.username: alice" in text  # not a secret
    kept = (run / SECRETS_FILE).read_text()
    assert all(s in kept for s in SECRETS)
    assert mode(run / SECRETS_FILE) == 0o600
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # no temp left
    assert not [s for s in SECRETS if s in dump(config)]  # `astraflow config show` too


def test_a_dump_loads_with_its_real_secrets_and_is_refused_without_them(
        tmp_path: Path) -> None:
    config = secret_config()
    path = write_config(config, tmp_path / RL_CONFIG)
    assert load_experiment(path) == config
    copy = tmp_path / "elsewhere" / "config.yaml"  # a dump copied without its secrets
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    with pytest.raises(ConfigError) as e:
        load_experiment(copy)
    assert "gateway.token is redacted" in str(e.value) and "bus.url is redacted" in str(e.value)
    copy.write_text(copy.read_text().replace("sasl.password: '***'", "sasl.password: p"))
    fixed = load_experiment(copy, [f"{k}={v}" for k, v in [
        ("gateway.token", "t"), ("bus.url", "kafka://h:1"), ("bus.claims.token", "c"), ("weights.store.token", "s"), ("rollout.engine.api_key", "a")]])
    assert fixed.gateway.token == "t"


def test_a_value_changed_in_the_dump_stays_the_persons(tmp_path: Path) -> None:
    path = write_config(secret_config(), tmp_path / "config.yaml")
    path.write_text(path.read_text().replace("token: '***'", "token: mine", 1))
    loaded = load_experiment(path)
    assert "mine" in (loaded.bus.claims.token, loaded.gateway.token, loaded.weights.store.token)


ROLE = textwrap.dedent("""
    import sys
    from astraflow.cli.common import load_config
    from astraflow.weights.config import build_store
    cfg = load_config(sys.argv[1], [])  # what every role the supervisor starts does
    print(build_store(cfg.weights.store, sys.argv[2]).read("p/blob.afw").decode())
""")


def test_a_role_started_on_the_dump_reaches_a_server_with_the_real_token(
        tmp_path: Path) -> None:
    """A real weight server that wants the store token; a separate process loads the run's
    redacted ``config-rl.yaml`` the way roles do and reads a blob with it."""
    served = tmp_path / "served"
    (served / "p").mkdir(parents=True)
    (served / "p" / "blob.afw").write_bytes(b"weights!")
    srv = make_server(served, token=SECRETS[3])
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        run = tmp_path / "run"
        path = write_config(secret_config(srv.url), run / RL_CONFIG)
        assert SECRETS[3] not in path.read_text()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("ASTRAFLOW_WEIGHTS_TOKEN", None)
        got = subprocess.run([sys.executable, "-c", ROLE, str(path), str(run)], env=env,
                             capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == "weights!"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("url", "shown"), [
    ("http://alice:pw-1@host:8470/p", "http://alice:***@host:8470/p"),
    ("kafka://h:9092?ssl.key.password=k1&sasl.oauthbearer.client.secret=s2&acks=all",
     "kafka://h:9092?ssl.key.password=***&sasl.oauthbearer.client.secret=***&acks=all"),
    ("http://host:8470/p", "http://host:8470/p"),
    ("embedded:///abs/run%23/bus.db", "embedded:///abs/run%23/bus.db"),
])
def test_secret_parts_of_urls_are_redacted_and_restored(url: str, shown: str) -> None:
    from astraflow.core.secrets import redacted_paths, restore, split

    data, kept = split({"weights": {"store": {"url": url}}})
    assert data["weights"]["store"]["url"] == shown
    assert bool(redacted_paths(data)) == (url != shown)
    assert restore(data, kept)["weights"]["store"]["url"] == url


def test_the_gateways_client_keys_are_redacted_whatever_the_clients_are_called(
        tmp_path: Path) -> None:
    """``gateway.keys`` maps client names (any name) to API keys: every value is a secret."""
    config = ExperimentConfig.model_validate(
        {"gateway": {"keys": {"alice": "alice-key-6a1d", "ci-bot": "bot-key-2b7e"}}})
    path = write_config(config, tmp_path / RL_CONFIG)
    text = path.read_text()
    assert "alice-key-6a1d" not in text and "bot-key-2b7e" not in text
    assert "alice: '***'" in text and "ci-bot: '***'" in text  # the names stay readable
    assert "bot-key-2b7e" in (tmp_path / SECRETS_FILE).read_text()
    assert load_experiment(path).gateway.keys == {"alice": "alice-key-6a1d",
                                                  "ci-bot": "bot-key-2b7e"}
