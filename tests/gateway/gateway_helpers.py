"""Helpers of the gateway tests: a served gateway, its records on the bus, error checks and the
teacher-forced logprobs of a trajectory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from astraflow.core.bus import Bus
from astraflow.core.bus.reader import read_all
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import GatewayCall, Trajectory, decode, unpack
from astraflow.core.topics import run_topics, topic_name
from astraflow.gateway.app import create_app
from astraflow.gateway.limits import Limits
from astraflow.gateway.server import ServerThread
from astraflow.gateway.service import Gateway
from astraflow.gateway.store import SessionStore

ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class Served:
    url: str
    gw: Gateway
    bus: Bus
    run: str
    srv: ServerThread
    # one client for the test's calls, its connections kept open (a new connection per call
    # cost the tests' CPU, nothing the gateway is tested on); thread-safe
    http: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def client(self, session: str | None = None, **kwargs: Any) -> Any:
        """The official SDK pointed at the gateway (a session's base URL when given)."""
        import openai

        base = f"{self.url}/sessions/{session}/v1" if session else f"{self.url}/v1"
        return openai.OpenAI(base_url=base, api_key="-", max_retries=0, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, json=body, **kwargs)

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def events(self, session: str | None = None, kind: str | None = None) -> list[GatewayCall]:
        """The gateway topic's events (of ``session``, of ``kind``), in order."""
        out = [decode(m.value, GatewayCall) for m in
               read_all(self.bus, topic_name(self.run, "gateway"))]
        return [e for e in out if (session is None or e.session_id == session)
                and (kind is None or e.kind == kind)]  # type: ignore[union-attr]

    def trajectories(self) -> list[Trajectory]:
        return sorted((decode(m.value, Trajectory) for m in  # type: ignore[misc]
                       read_all(self.bus, topic_name(self.run, "trajectories"))),
                      key=lambda t: t.id)

    def stop(self) -> None:
        self.http.close()
        self.srv.stop()


def start(engines: Any, *, bus: Bus, run: str = "r", store_kwargs: Mapping[str, Any] | None = None,
          limits: Limits | None = None, metrics: bool = False,
          keys: Mapping[str, str] | None = None, token: str | None = None,
          **kwargs: Any) -> Served:
    """A gateway over ``engines`` on ``bus``, served on a free port (started: sessions rebuilt)
    within ``limits`` (default: the config's defaults), behind ``token`` and ``keys`` when
    given; ``metrics``: with a MetricsEmitter (its counters: ``served.gw.metrics.counters``)."""
    engines = engines if isinstance(engines, Mapping) else {"default": engines}
    bus.create_topics(run_topics(run, list(engines)))
    emitter = MetricsEmitter(bus, run=run, role="gateway", interval=60) if metrics else None
    store = SessionStore(bus, run=run, metrics=emitter, **dict(store_kwargs or {}))
    gw = Gateway(engines, store, metrics=emitter, **kwargs)
    app = create_app(gw, limits=limits, token=token, keys=dict(keys or {}))
    srv = ServerThread(app, limits=limits).start()
    return Served(srv.url, gw, bus, run, srv)


def check_error(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """``resp`` is an OpenAI-style error with ``status`` (and ``code``); returns its error."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def arrays(t: Trajectory) -> tuple[list[int], list[int], list[float], list[int]]:
    return (unpack(t.token_ids, "<i4").tolist(), unpack(t.loss_mask, "u1").tolist(),
            unpack(t.logprobs, "<f4").tolist(), unpack(t.versions, "<i4").tolist())


def teacher_forced(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) under ``model`` at temperature 1 (position 0: 0.0)."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [0.0] + [lp[i - 1, t].item() for i, t in enumerate(ids) if i > 0]
