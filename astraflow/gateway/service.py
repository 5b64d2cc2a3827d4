"""The gateway without HTTP: policies and their engines, sampling, sessions, idempotency and
capacity. :mod:`astraflow.gateway.app` puts routes on it; :mod:`astraflow.gateway.build`
makes one from the config.

A call: route ``model`` to a policy → check the request → render it to token ids → in a
session, :func:`~astraflow.gateway.session.plan` where it continues → generate ``n``
completions on the policy's engine → record the call (produced and flushed) → answer. Without
a session nothing is recorded. Calls, rewards and ends act for a client (``owner``); another
client's session is 404 to it. :meth:`Gateway.expire` ends idle sessions as abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import time
from array import array
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from astraflow.consumers.rollout.batcher import Batcher, batchers_for
from astraflow.consumers.rollout.engines.base import Engine, EngineError, GenRequest, GenResult
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import GatewayChoice, pack_f32, pack_i32
from astraflow.gateway.cache import SizedCache, array_bytes
from astraflow.gateway.config import DEFAULT_TOOLS_PROMPT
from astraflow.gateway.errors import GatewayError, bad_request, conflict, not_found, too_many
from astraflow.gateway.session import Plan, Session, plan
from astraflow.gateway.store import SessionStore

log = logging.getLogger("astraflow.gateway")

TEMPLATE_CACHE_BYTES = 64 << 20  # gateway.template_cache_bytes' default
SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64,
                                     "stop": (), "stop_token_ids": ()}


@dataclass
class Reply:
    """An answer: its JSON ``body`` and encoded ``raw`` bytes; ``pieces`` of each choice's
    text for a stream (None: a replayed answer, streamed whole)."""

    body: dict[str, Any]
    raw: bytes
    pieces: list[list[str]] | None = None


@dataclass
class Built:
    """What a route makes of its generations: the body, per-choice text pieces, and per
    choice the trailing tokens its text leaves out; then the choices as recorded."""

    body: dict[str, Any]
    pieces: list[list[str]]
    hidden: list[int]
    choices: list[GatewayChoice] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # per choice, the text it was served as


@dataclass
class CallSpec:
    """One call to run: the policy, the request rendered to ``ids``, its sampling."""

    route: str
    policy: str
    ids: list[int]
    n: int
    request: Callable[[list[int]], GenRequest]  # the engine request for a prompt
    build: Callable[[list[int], list[GenResult]], Built]
    n_messages: int = 0
    appended: Callable[[int], tuple[list[int], str] | None] | None = None
    role: Callable[[int], str] | None = None
    reply: Callable[[int], str | None] | None = None  # chat: message k's text if an assistant's
    prefix: Callable[[int], list[int]] | None = None  # chat: the first k messages rendered
    # completions: (the text of token ids, the token ids of a text)
    text: tuple[Callable[[list[int]], str], Callable[[str], list[int]]] | None = None
    keep: Callable[[], None] | None = None  # once served: cache what rendering it cost


Generate = Callable[[str, GenRequest], Awaitable[GenResult]]
"""``generate(policy, request)``: one generation on the policy's engine."""

Offload = Callable[[Callable[[], Plan]], Awaitable[Plan]]
"""``offload(fn)``: ``fn()`` run off the event loop (the app's tokenizer threads,
:class:`~astraflow.gateway.limits.Tokenizing`): planning a session call may tokenize (the
messages a drifted or served-text call adds, the prefix it compares), as long as the request."""


class Gateway:
    """Engines by policy (the ``model`` field routes to one), sessions in ``store`` (whose
    ``retry_after_s`` every 429 carries). Generations go through a batcher per engine made at
    :meth:`start`, or through ``generate`` when given: an engine already batched by someone
    else (a rollout worker's batchers; two batchers must not share an engine)."""

    def __init__(self, engines: Mapping[str, Engine], store: SessionStore, *,
                 on_drift: str = "continue", aliases: Mapping[str, str] | None = None,
                 sampling: Mapping[str, Any] | None = None, max_inflight: int = 256,
                 max_n: int = 16, context_length: int | None = None,
                 tools_prompt: str = DEFAULT_TOOLS_PROMPT,
                 tool_result_format: str = "<result>{output}</result>",
                 followers: Sequence[Any] = (), metrics: MetricsEmitter | None = None,
                 generate: Generate | None = None,
                 template_cache_bytes: int = TEMPLATE_CACHE_BYTES) -> None:
        if not engines:
            raise ConfigError("the gateway needs the engine of at least one policy")
        unknown = {a: p for a, p in (aliases or {}).items() if p not in engines}
        if unknown:
            raise ConfigError(f"gateway.aliases {unknown} name policies not served "
                              f"({', '.join(engines)}); map each alias to one of them")
        self.engines = dict(engines)
        self.store = store
        self.on_drift = on_drift
        self.aliases = dict(aliases or {})
        self.sampling = {**SAMPLING_DEFAULTS, **dict(sampling or {})}
        self.max_inflight = max_inflight
        self.max_n = max_n
        self.context_length = context_length
        self.tools_prompt = tools_prompt
        self.tool_result_format = tool_result_format
        self.followers = list(followers)
        self.metrics = metrics
        self.created = int(time.time())
        self.inflight = 0
        self.generate = generate
        # (policy, hash of a conversation) -> its rendered token ids (calls.Renders)
        self.templates: SizedCache[array[int]] = SizedCache(template_cache_bytes,
                                                               array_bytes)
        # a session's own sampling defaults over ``sampling`` (set by whoever opened it)
        self.session_sampling: dict[str, dict[str, Any]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop serving it, once started
        self._batchers: dict[str, Batcher] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Rebuild the open sessions from the bus, then start heartbeats."""
        self.loop = asyncio.get_running_loop()
        await self.store.on_bus(self.store.rebuild)
        if self.generate is None:
            self._batchers = batchers_for(dict(self.engines))
        if self.metrics is not None:
            self._ticker = asyncio.create_task(self._tick(), name="gateway-metrics")
        if self.store.idle_timeout_s is not None:
            self._reaper = asyncio.create_task(self._reap(self.store.idle_timeout_s),
                                               name="gateway-idle")

    async def _reap(self, timeout: float) -> None:
        while True:
            await asyncio.sleep(min(max(timeout / 4, 0.05), 5.0))
            await self.expire()

    async def expire(self, now: float | None = None) -> int:
        """End the sessions idle at ``now`` (default: now) as abandoned (and forget those
        closed past their retention); how many ended."""
        now = time.time() if now is None else now
        self.store.forget_closed(now)
        n = 0
        for s in self.store.idle(now):
            try:
                n += await self.store.abandon(s, now)
            except Exception as e:  # noqa: BLE001 - one session's failure must not stop the rest
                self.count("errors.expire")
                log.warning("session=%s could not be ended as abandoned: %s", s.id, e)
        return n

    async def _tick(self) -> None:
        assert self.metrics is not None
        loop = asyncio.get_running_loop()
        while True:
            self.metrics.set("open_sessions", self.store.open_count)
            self.metrics.set("inflight", self.inflight)
            for p, e in self.engines.items():
                self.metrics.set(f"version.{p}", e.version)
            await loop.run_in_executor(None, self.metrics.tick)
            await asyncio.sleep(min(1.0, self.metrics.interval))

    async def aclose(self) -> None:
        for task in (self._ticker, self._reaper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for b in self._batchers.values():
            await b.close()
        for f in self.followers:
            await asyncio.get_running_loop().run_in_executor(None, f.close)
        self.store.close()
        if self.metrics is not None:
            self.metrics.close()

    def count(self, name: str, n: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, n)

    # -- routing -------------------------------------------------------------------------------
    @property
    def policies(self) -> list[str]:
        return list(self.engines)

    def sampling_of(self, sid: str | None) -> dict[str, Any]:
        """The sampling defaults of a call in session ``sid``."""
        own = self.session_sampling.get(sid) if sid is not None else None
        return self.sampling if own is None else {**self.sampling, **own}

    def policy_for(self, model: str | None) -> str:
        if model is None:
            return self.policies[0]
        policy = self.aliases.get(model, model)
        if policy not in self.engines:
            raise not_found(f"The model `{model}` does not exist; served: "
                            f"{', '.join([*self.engines, *self.aliases])}", param="model",
                            code="model_not_found")
        return policy

    def context_of(self, policy: str) -> int | None:
        return self.context_length or getattr(self.engines[policy], "max_positions", None)

    def check_context(self, policy: str, ids: Sequence[int]) -> int:
        """Tokens left for the completion; 400 context_length_exceeded when none."""
        ctx = self.context_of(policy)
        if ctx is None:
            return 1 << 30
        if len(ids) >= ctx:
            raise bad_request(f"This model's maximum context length is {ctx} tokens; the "
                              f"prompt has {len(ids)} tokens, leaving none for the completion. "
                              "Shorten the messages.", param="messages",
                              code="context_length_exceeded")
        return ctx - len(ids)

    # -- calls -----------------------------------------------------------------------------------
    async def call(self, spec: CallSpec, *, sid: str | None, meta: Mapping[str, Any],
                   key: str | None, owner: str | None = None,
                   offload: Offload | None = None, request: bytes = b"") -> Reply:
        """Run ``spec`` (once per Idempotency-Key ``key``) in session ``sid`` (None: none) of
        client ``owner``; where it continues in the session is planned through ``offload``
        (None: here, on the caller's thread). Without a session, a key is the caller's own:
        a retry is replayed only to the same client sending the same ``request`` (its
        body)."""
        if not key:
            return await self._call(spec, sid, meta, None, owner, offload)
        key = f"{spec.route}:{key}"  # scoped (see scoped())
        if sid is None:
            key = loose_key(key, owner, request)
        while True:
            hit = self.store.replay(sid, key, owner)
            if hit is not None:
                self.count("replays")
                return Reply(msgspec.json.decode(hit), hit)
            with self.store.claim(sid, key) as running:
                if running is None:
                    return await self._call(spec, sid, meta, key, owner, offload)
            await asyncio.wait([running])  # the first with this key answered (or failed)

    async def _call(self, spec: CallSpec, sid: str | None, meta: Mapping[str, Any],
                    key: str | None, owner: str | None, offload: Offload | None) -> Reply:
        if sid is None:
            built = await self._generate(spec, spec.ids)
            if spec.keep is not None:
                spec.keep()
            raw = msgspec.json.encode(built.body)
            if key:
                self.store.remember(key, raw)
            self.count("calls_unrecorded")
            return Reply(built.body, raw, built.pieces)
        s, _ = await self.store.open(sid, meta, owner=owner)
        if s.ended:
            raise conflict(f"session {sid!r} has ended; start a new session for more calls",
                           code="session_ended")
        # plan only reads the session (calls are added to it, never changed): safe on a
        # thread while this loop records another call of it
        planning = functools.partial(plan, s, spec.policy, spec.ids, on_drift=self.on_drift,
                                     appended=spec.appended, reply=spec.reply,
                                     prefix=spec.prefix, text=spec.text,
                                     **({"role": spec.role} if spec.role else {}))
        s.busy += 1  # not abandoned while it is planned and generates
        try:
            p = planning() if offload is None else await offload(planning)
            built = await self._generate(spec, p.prompt)
            raw = msgspec.json.encode(built.body)
            await self._record(s, spec, p, built, raw, key)
        finally:
            s.busy -= 1
        if spec.keep is not None:
            spec.keep()
        return Reply(built.body, raw, built.pieces)

    async def _generate(self, spec: CallSpec, prompt: list[int]) -> Built:
        room = self.check_context(spec.policy, prompt)
        if self.inflight + spec.n > self.max_inflight:
            self.count("rejected_busy")
            raise too_many(f"{self.inflight} generations are running, the most this gateway "
                           "takes at once (gateway.max_inflight); retry later",
                           self.store.retry_after_s)
        self.inflight += spec.n
        try:
            req = spec.request(prompt)
            if req.max_new_tokens > room:  # capped to what the context has left
                req = dataclasses.replace(req, max_new_tokens=room)
            if self.generate is not None:
                gens = [self.generate(spec.policy, req) for _ in range(spec.n)]
            else:
                gens = [self._batchers[spec.policy].generate(req) for _ in range(spec.n)]
            results = await asyncio.gather(*gens)
        except EngineError as e:
            self.count("engine_errors")
            raise GatewayError(500, f"generation failed: {e}", type="server_error",
                               code="engine_error") from None
        finally:
            self.inflight -= spec.n
        self.count("tokens", sum(len(r.token_ids) for r in results))
        built = spec.build(prompt, list(results))
        built.choices = choices_of(results, built.hidden, built.texts)
        return built

    async def _record(self, s: Session, spec: CallSpec, p: Plan, built: Built, raw: bytes,
                      key: str | None) -> None:
        async with self.store.lock(s.id):
            if s.done:
                raise conflict(f"session {s.id!r} closed while this call ran; it was not "
                               "recorded", code="session_closed")
            await self.store.record(
                s, kind="call", policy=spec.policy, call_id=key or "",
                route=spec.route,
                segment=p.segment if p.segment is not None else s.next_segment(spec.policy),
                parent=p.parent, parent_choice=p.parent_choice, prompt_ids=pack_i32(p.tail),
                prompt_role=p.role, prompt_len=len(p.prompt), n_messages=spec.n_messages,
                drift=p.drift, branch=p.branch, view_drop=p.drop,
                view_ids=b"" if p.view is None else pack_i32(p.view),
                choices=built.choices, response=raw)
        self.count("calls")
        self.count("drift", p.drift)
        self.count("branches", p.branch)

    # -- sessions ----------------------------------------------------------------------------------
    async def reward(self, sid: str, reward: float, rewards: Mapping[str, float], *,
                     key: str | None, owner: str | None = None) -> bytes:
        key = scoped("reward", key)

        async def record(s: Session) -> bytes:
            if s.reward is not None:
                raise conflict(f"session {sid!r} already has its reward ({s.reward}); a "
                               "reward is given once", code="reward_already_set")
            raw = msgspec.json.encode({**self.store.info(s), "reward": reward,
                                       "done": s.ended})
            await self.store.record(s, kind="reward", reward=reward, rewards=dict(rewards),
                                    call_id=key or "", response=raw)
            return raw

        return await self._keyed(sid, key, record, owner)

    async def end(self, sid: str, reward: float | None, rewards: Mapping[str, float], *,
                  key: str | None, owner: str | None = None) -> bytes:
        key = scoped("end", key)

        async def record(s: Session) -> bytes:
            if s.ended:
                raise conflict(f"session {sid!r} has already ended", code="session_ended")
            if reward is not None:
                if s.reward is not None:
                    raise conflict(f"session {sid!r} already has its reward ({s.reward})",
                                   code="reward_already_set")
                await self.store.record(s, kind="reward", reward=reward, rewards=dict(rewards))
            raw = msgspec.json.encode({**self.store.info(s), "ended": True,
                                       "done": s.reward is not None})
            await self.store.record(s, kind="end", call_id=key or "", response=raw)
            return raw

        return await self._keyed(sid, key, record, owner)

    async def _keyed(self, sid: str, key: str | None,
                     record: Callable[[Session], Awaitable[bytes]],
                     owner: str | None = None) -> bytes:
        """``record(session)`` under the session's lock, then its trajectories if it is done;
        once per Idempotency-Key ``key``: a retry (also once the session is closed) is
        answered the recorded response."""
        hit = self.store.closed_key(sid, key, owner) if key else None
        if hit is not None:
            return hit
        s = self.store.get(sid, owner)
        async with self.store.lock(sid):
            if key and key in s.keys:
                return s.keys[key]
            raw = await record(s)
            await self.store.finish(s)
        return raw


def scoped(route: str, key: str | None) -> str | None:
    """An Idempotency-Key as recorded: per route (``chat:KEY``, ``reward:KEY``, ...), so one
    key sent to two routes answers each its own response."""
    return f"{route}:{key}" if key else None


def loose_key(key: str, owner: str | None, request: bytes) -> str:
    """The Idempotency-Key of a call without a session as kept: its client's and its
    request's (a hash of the body), so one client's answer is never replayed to another, nor
    to a different request that happens to reuse the key."""
    digest = hashlib.blake2b(request, digest_size=16).hexdigest()
    return f"{owner or ''}\x00{digest}\x00{key}"


def choices_of(results: Sequence[GenResult], hidden: Sequence[int],
               texts: Sequence[str] = ()) -> list[GatewayChoice]:
    """The recorded form of ``results`` (their tokens exactly as generated, and the text each
    was served as)."""
    texts = list(texts) or [""] * len(results)
    return [GatewayChoice(token_ids=pack_i32(list(r.token_ids)),
                          logprobs=pack_f32(list(r.logprobs)),
                          versions=pack_i32(list(r.versions)), finish_reason=r.finish_reason,
                          hidden=h, text=t)
            for r, h, t in zip(results, hidden, texts, strict=True)]
