"""Hugging Face hub ids as model paths: found in the Hugging Face cache, or fetched with
``huggingface_hub.snapshot_download`` where a hub is reachable, or refused with what to do.

The probe (:func:`hub_status`) is one HTTP request with a short timeout, so ``astraflow
check`` can say in a second whether a hub id will resolve; nothing here downloads weights
except :func:`fetch`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

from astraflow.core.errors import ConfigError

log = logging.getLogger("astraflow.models.hub")

HubStatus = Literal["ok", "missing", "unreachable"]

#: the files a model needs (safetensors weights, configs, tokenizer, chat template); not the
#: .bin/.pt/.onnx/.gguf copies many repos also carry
PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]

_TRUE = {"1", "true", "yes", "on"}


def offline() -> bool:
    """Whether the environment forbids the hub (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def cached(repo_id: str) -> Path | None:
    """The folder of ``repo_id``'s snapshot in the Hugging Face cache (no network), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def hub_status(repo_id: str, *, timeout: float = 3.0) -> tuple[HubStatus, str]:
    """Whether ``repo_id`` can be fetched now: ``("ok", "")``, ``("missing", why)`` (the hub
    answered: no such model, or gated/private) or ``("unreachable", why)``. One request to
    ``$HF_ENDPOINT/api/models/<id>`` (proxies from the environment apply)."""
    import urllib.error
    import urllib.request

    if offline():
        return "unreachable", "HF_HUB_OFFLINE is set"
    url = f"{endpoint()}/api/models/{repo_id}"
    headers = {"User-Agent": "astraflow"}
    from huggingface_hub import get_token  # HF_TOKEN, or the token `hf auth login` saved

    token = get_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=timeout):
            return "ok", ""
    except urllib.error.HTTPError as e:
        if e.code in (401, 403, 404):
            return "missing", f"{endpoint()} answered {e.code} (no such model, or a gated or " \
                              "private one: set HF_TOKEN)"
        return "unreachable", f"{endpoint()} answered {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return "unreachable", f"no connection to {endpoint()}: {reason}"


def advice(repo_id: str, key: str | None = None) -> str:
    """How to bring a hub model to a machine without the hub."""
    return (f"download it on a machine with access (`hf download {repo_id} --local-dir DIR` "
            f"or `astraflow models import {repo_id} DIR`), copy DIR here and set "
            f"{key or 'models.<policy>.path'} to it; or import a .gguf file of it here with "
            "`astraflow models import FILE.gguf DIR`")


def fetch(repo_id: str, *, key: str | None = None, local_dir: Path | None = None) -> Path:
    """The folder of ``repo_id``: from the Hugging Face cache, else downloaded there (or into
    ``local_dir``). A :class:`ConfigError` naming the id, the config key (``key``, e.g.
    ``models.solver.path``) and what to do when the hub cannot be reached or does not have
    it."""
    where = f"{key}: " if key else ""
    if local_dir is None:
        found = cached(repo_id)
        if found is not None:
            return found
    status, why = hub_status(repo_id)
    if status == "missing":
        raise ConfigError(f"{where}{repo_id!r} is no local path, and the Hugging Face hub has "
                          f"no model by that id ({why}); give a local model folder, a .gguf "
                          "file or a hub id that exists")
    if status == "unreachable":
        raise ConfigError(f"{where}{repo_id!r} is no local path and looks like a Hugging Face "
                          f"hub id, but the hub is not reachable ({why}); "
                          + advice(repo_id, key))
    from huggingface_hub import snapshot_download

    log.info("fetching model=%s from=%s", repo_id, endpoint())
    try:
        folder = snapshot_download(repo_id, allow_patterns=PATTERNS,
                                   local_dir=str(local_dir) if local_dir else None)
    except Exception as e:  # the hub's many errors (network, auth, disk): one message
        raise ConfigError(f"{where}fetching {repo_id!r} from {endpoint()} failed "
                          f"({type(e).__name__}: {e}); " + advice(repo_id, key)) from e
    return Path(folder)
