"""Secrets never shown: by their key's name and by their value's shape, in `astraflow config
show`, in a run directory's config dumps (and back from its secrets.yaml), in config errors
and in log lines; and no field of the configuration that is not a secret is hidden."""

from __future__ import annotations

import io
import logging
import re
import secrets
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.cli.config_cmd import reference_markdown
from astraflow.config import load_experiment
from astraflow.core.errors import ConfigError
from astraflow.core.redact import redact_log_handlers, secret_key
from astraflow.core.secrets import SECRETS_FILE, secret_at, split
from astraflow.run.launch import write_config

HF = "hf_" + "Qx7" * 12
OPENAI = "sk-proj-" + "Zr4k" * 8
BEARER = "Bearer " + "c0ffee" * 6
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.2dGKjQbW1p8vQeM0vNqLhM7Rk"
RANDOM = "aZ3" + "".join(secrets.choice("ABCDEFGHJKMNPQRSTVWXYZ0123456789") for _ in range(37))
#: the real secrets of the configuration's own fields (gateway.keys: a mapping of secrets); a
#: weight store's token wherever a store is configured
SECRET_FIELDS = {"rollout.engine.api_key", "gateway.token", "weights.store.token",
                 "weights.fetch.token", "weights.fallback.token", "bus.claims.token"}


def _config(tmp_path: Path) -> Path:
    """An experiment whose free-form sections carry secrets under common names and shapes,
    next to harmless values that must be shown as they are."""
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "run": "secrets-test",
        "rollout": {
            "engine": {"api_key": "plain-api-key-1", "max_new_tokens": 64,
                       "vllm_args": {"hf_token": "plain-hf-token-2", "tokenizer": "gpt2",
                                     "max_model_len": 512}},
            "workflow": {"kwargs": {"judge": {
                "openai_api_key": "plain-openai-3", "OPENAI_API_KEY": OPENAI,
                "headers": {"Authorization": "Basic dXNlcjpwYXNz", "X-Api-Key": "xk-4",
                            "X-Trace": BEARER},
                "note": f"ask with {HF} please", "session": JWT, "opaque": RANDOM,
                "password": 271828, "pad_token": "<pad>", "key": "task-id",
                "keys": 3, "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "revision": "0123456789abcdef0123456789abcdef01234567",
                "checkpoint": "SmolLM2_135M_Instruct_checkpoint_10000",
                "emphasis": "***bold***"}}}},
        "gateway": {"token": "plain-gw-5", "keys": {"alice": "plain-alice-6"}},
        "weights": {"store": {"type": "http", "url": "http://u:plain-url-pw-7@trainer:8470",
                              "token": "plain-store-8"}},
    }))
    return path


SHOWN_SECRETS = ["plain-api-key-1", "plain-hf-token-2", "plain-openai-3", OPENAI,
                 "dXNlcjpwYXNz", "xk-4", BEARER.split()[1], HF, JWT, RANDOM, "271828",
                 "plain-gw-5", "plain-alice-6", "plain-url-pw-7", "plain-store-8"]
KEPT = ["gpt2", "<pad>", "task-id", "HuggingFaceTB/SmolLM2-135M-Instruct",
        "0123456789abcdef0123456789abcdef01234567", "SmolLM2_135M_Instruct_checkpoint_10000",
        "***bold***", "secrets-test", "max_new_tokens: 64", "keys: 3", "max_model_len: 512"]


def test_only_the_real_secret_fields_of_the_configuration_reference_are_secrets() -> None:
    keys = re.findall(r"^\| `([^`]+)` \|", reference_markdown(), re.MULTILINE)
    assert len(keys) > 200  # the whole reference was read
    hidden = {k for k in keys if secret_at(tuple(k.split(".")))}
    assert hidden == SECRET_FIELDS
    # and the defaults, dumped as `config show` does, hide nothing at all
    assert split(load_experiment(None, []).model_dump(mode="json"))[1] == []
    # the common names of secrets are secrets, the names next to them are not
    for name in ("hf_token", "openai_api_key", "OPENAI_API_KEY", "Authorization", "X-Api-Key",
                 "aws_secret_access_key", "access_token", "refreshToken", "db_password",
                 "client_secret", "sasl.password", "private_key", "Cookie"):
        assert secret_key(name), name
    for name in ("max_tokens", "key", "keys", "tokenizer", "micro_batch_tokens", "pad_token",
                 "eos_token", "token_file", "auth_timeout_s", "record_key", "stop_token_ids",
                 "max_tokenizing", "allow_unauthenticated"):
        assert not secret_key(name), name


def test_config_show_hides_secrets_by_name_and_by_shape(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["config", "show", str(_config(tmp_path))])
    assert r.exit_code == 0, r.output
    for value in SHOWN_SECRETS:
        assert value not in r.output, value
    for value in KEPT:
        assert value in r.output, value
    shown = yaml.safe_load(r.output)
    judge = shown["rollout"]["workflow"]["kwargs"]["judge"]
    assert judge["headers"] == {"Authorization": "***", "X-Api-Key": "***",
                                "X-Trace": "Bearer ***"}
    assert judge["note"] == "ask with *** please"
    assert judge["password"] == "***"
    assert shown["weights"]["store"]["url"] == "http://u:***@trainer:8470"


def test_a_run_directory_keeps_the_new_secrets_private_and_loads_them_back(
        tmp_path: Path) -> None:
    cfg = load_experiment(_config(tmp_path), [])
    run = tmp_path / "run"
    run.mkdir()
    write_config(cfg, run / "config.yaml")
    text = (run / "config.yaml").read_text()
    for value in SHOWN_SECRETS:
        assert value not in text, value
    kept = run / SECRETS_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert "plain-hf-token-2" in kept.read_text() and HF in kept.read_text()
    back = load_experiment(run / "config.yaml", [])
    assert back.model_dump() == cfg.model_dump()  # every secret back, the number a number
    kept.unlink()
    with pytest.raises(ConfigError, match="hf_token is redacted"):
        load_experiment(run / "config.yaml", [])


@pytest.mark.parametrize(("text", "overrides", "secret"), [
    ("gateway: {token: 8675309123}\n", [], "8675309123"),
    ("gateway: {keys: {alice: 4242424242}}\n", [], "4242424242"),
    ("rollout: {engine: {api_key: [31337, 2]}}\n", [], "31337"),
    ('gateway:\n  token: "unterminated-s3cret\n', [], "unterminated-s3cret"),
    ("gateway: {token: abc}\n", ["gateway.token.inner=sub-s3cret"], "sub-s3cret"),
    ("run: r\n", [f"rollout.engine.max_new_tokens={OPENAI}"], OPENAI),
])
def test_config_errors_never_quote_a_secret(tmp_path: Path, text: str, overrides: list[str],
                                            secret: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_experiment(path, overrides)
    assert secret not in str(e.value)
    r = CliRunner().invoke(app, ["config", "show", str(path),
                                 *(a for o in overrides for a in ("--set", o))])
    assert r.exit_code == 1, r.output
    assert secret not in r.output


def test_log_lines_and_tracebacks_hide_secrets() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("astraflow.test_secrets")
    root = logging.getLogger("test_secrets_root")  # stands for the root logger a CLI sets up
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    logger.parent = root
    logger.setLevel(logging.INFO)
    try:
        redact_log_handlers(root)
        redact_log_handlers(root)  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logger.info("calling judge with headers=%s", {"Authorization": BEARER})
        logger.info("sent %s", BEARER)
        logger.info("retry url=%s token=%s", "http://u:pw-9@h/x", "tok-10")
        try:
            raise RuntimeError(f"server refused {OPENAI}")
        except RuntimeError:
            logger.exception("call failed for api_key=%s", 12345)
        logger.info("loaded %s", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nProc-Type: 4,"
                    "ENCRYPTED\nMIIBpem+body/Q==\n-----END ENCRYPTED PRIVATE KEY-----")
        logger.info("max_tokens=64 key=task-7")
    finally:
        root.removeHandler(handler)
        logger.parent = logging.getLogger("astraflow")
    out = stream.getvalue()
    for value in (BEARER.split()[1], "pw-9", "tok-10", OPENAI, "12345", "MIIBpem+body"):
        assert value not in out, value
    assert "headers={'Authorization': '***" in out and "sent Bearer ***" in out
    assert "RuntimeError: server refused ***" in out and "api_key=***" in out
    assert "max_tokens=64 key=task-7" in out
