"""Continuous batching (iteration-level scheduling) for the ``hf`` engine.

One decode thread owns the model. A request (:meth:`ContinuousDecoder.submit`, which returns a
:class:`concurrent.futures.Future`) joins the running batch at the next decoding step: its KV
cache is merged into the running one (:func:`merge_caches`), each row keeping its own position
ids, and finished rows leave. Weight updates land only between steps (:class:`StepGate`), so
every token records the version that produced it; a failed step fails its rows' futures. Needs
transformers' ``DynamicCache`` of full-attention layers (else use ``continuous: false``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import Any

from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.sampling import StopChecker, sample

log = logging.getLogger("astraflow.rollout.hf")


class _Row:
    __slots__ = ("fut", "limit", "lps", "req", "stop", "toks", "vers")

    def __init__(self, req: GenRequest, fut: Future[GenResult], limit: int,
                 stop: StopChecker) -> None:
        self.req, self.fut, self.limit, self.stop = req, fut, limit, stop
        self.toks: list[int] = []
        self.lps: list[float] = []
        self.vers: list[int] = []


def _settle(fut: Future[GenResult], result: GenResult | None = None,
            error: BaseException | None = None) -> None:
    """Resolve ``fut`` unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass


def check_mergeable(cache: Any) -> None:
    """Raise an EngineError unless ``cache`` is a DynamicCache of plain full-attention layers."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    bad = [type(la).__name__ for la in layers or () if type(la) is not DynamicLayer]
    if not isinstance(cache, DynamicCache) or not layers or bad:
        import transformers

        raise EngineError(
            f"continuous batching cannot merge a {type(cache).__name__} "
            f"(layers: {sorted(set(bad)) or 'none'}) under transformers "
            f"{transformers.__version__}; it needs a DynamicCache of full-attention "
            "DynamicLayers (cache.layers[i].keys/.values); set rollout.engine.continuous: false")


def _pad_left(t: Any, width: int, dim: int) -> Any:
    import torch

    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge_caches(a: Any, b: Any) -> Any:
    """Rows of ``b`` appended to ``a`` (in place, returns ``a``): both right-aligned on the
    sequence axis, the narrower one left-padded with zeros (masked by the attention mask)."""
    check_mergeable(a)
    check_mergeable(b)
    if len(a.layers) != len(b.layers):
        raise EngineError(f"cannot merge caches of {len(a.layers)} and {len(b.layers)} layers")
    import torch

    for la, lb in zip(a.layers, b.layers, strict=True):
        width = max(la.keys.shape[-2], lb.keys.shape[-2])
        la.keys = torch.cat([_pad_left(la.keys, width, -2), _pad_left(lb.keys, width, -2)])
        la.values = torch.cat([_pad_left(la.values, width, -2),
                               _pad_left(lb.values, width, -2)])
    return a


def trim_cache(cache: Any, start: int) -> None:
    """Drop the first ``start`` sequence columns of every layer."""
    for la in cache.layers:
        la.keys = la.keys[:, :, start:, :]
        la.values = la.values[:, :, start:, :]


class ContinuousDecoder:
    """The decode thread of a continuous :class:`HFEngine` (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cv = threading.Condition()
        self._pending: deque[tuple[GenRequest, Future[GenResult]]] = deque()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.rows: list[_Row] = []
        self._cache: Any = None
        self._att: Any = None  # [B, W] attention mask of the cache (+ the fed token)
        self._pos: Any = None  # [B, 1] position id of each row's last fed token
        self._new: Any = None  # [B] last sampled token of each row (fed next step)
        self._temps: Any = None
        self._top_p: Any = None
        self.iterations = 0  # scheduler iterations (boundaries)
        self.max_rows = 0  # most rows ever decoded together (tests, metrics)
        self.joins = 0  # newcomers merged into a batch that was already running
        self.row_steps = 0  # rows summed over iterations (their mean: the mean batch)
        self.failures = 0  # steps whose forward failed (their rows failed)

    # -- the caller's side ---------------------------------------------------------------------
    def submit(self, req: GenRequest) -> Future[GenResult]:
        fut: Future[GenResult] = Future()
        eng = self.engine
        if not req.prompt_ids:
            fut.set_exception(EngineError("empty prompt: a request needs at least one token"))
            return fut
        if min(req.max_new_tokens, eng.max_positions - len(req.prompt_ids)) <= 0:
            fut.set_result(GenResult([], [], [], "length"))  # no room left in the context
            return fut
        with self._cv:
            if self._stop:
                fut.set_exception(EngineError(f"engine {eng.name} is closed"))
                return fut
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"af-decode-{eng.name}")
                self._thread.start()
            self._pending.append((req, fut))
            self._cv.notify_all()
        return fut

    def close(self, timeout: float = 60.0) -> None:
        """Stop the decode thread after its current step; fail what is pending or running."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("engine=%s decode thread still running %.0fs after close",
                            self.engine.name, timeout)
        self._fail_pending(EngineError(f"engine {self.engine.name} is closed"))

    # -- the decode thread ---------------------------------------------------------------------
    def _fail_pending(self, err: EngineError) -> None:
        with self._cv:
            pending, self._pending = list(self._pending), deque()
        for _, fut in pending:
            _settle(fut, error=err)

    def _run(self) -> None:
        import torch

        gate, held = self.engine.gate, False
        try:
            with torch.inference_mode():
                while True:
                    with self._cv:
                        idle = not self.rows and not self._pending
                    if idle and held:  # idle: updates run at once from now on
                        self.engine.busy(False)
                        gate.release()
                        held = False
                    with self._cv:
                        self._cv.wait_for(lambda: self._stop or self._pending or self.rows)
                        if self._stop:
                            break
                    if not held:
                        gate.acquire()
                        held = True
                        self.engine.busy(True)
                    self.iterations += 1
                    if self.engine.step_hook is not None:
                        self.engine.step_hook(self.iterations)
                    gate.boundary()  # weight updates land here, between two steps
                    newcomers = self._take(self.engine.max_batch_size - len(self.rows))
                    try:
                        self._step(newcomers)
                    except Exception as e:  # noqa: BLE001 - the step's requests fail, not the thread
                        self._fail_step(newcomers, e)
        finally:
            err = EngineError(f"engine {self.engine.name} is closed")
            for row in self.rows:
                _settle(row.fut, error=err)
            self.rows = []
            self._cache = None
            if held:
                self.engine.busy(False)
                gate.release()
            self._fail_pending(err)

    def _take(self, room: int) -> list[tuple[GenRequest, Future[GenResult]]]:
        out: list[tuple[GenRequest, Future[GenResult]]] = []
        with self._cv:
            while self._pending and len(out) < room:
                req, fut = self._pending.popleft()
                if not fut.cancelled():
                    out.append((req, fut))
        return out

    def _fail_step(self, newcomers: list[tuple[GenRequest, Future[GenResult]]],
                   e: Exception) -> None:
        self.failures += 1
        n = len(self.rows) + len(newcomers)
        log.warning("engine=%s continuous step failed, failing its %d requests: %r",
                    self.engine.name, n, e)
        err = e if isinstance(e, EngineError) else EngineError(
            f"engine {self.engine.name} step failed: {type(e).__name__}: {e}")
        for row in self.rows:
            _settle(row.fut, error=err)
        for _, fut in newcomers:
            _settle(fut, error=err)
        self.rows, self._cache = [], None

    def _step(self, newcomers: list[tuple[GenRequest, Future[GenResult]]]) -> None:
        import torch

        eng = self.engine
        version = eng.version
        self.row_steps += len(self.rows) + len(newcomers)
        logits_parts = []
        if self.rows:  # the running rows' decoding step
            self._att = torch.cat([self._att, torch.ones_like(self._att[:, :1])], dim=1)
            self._pos = self._pos + 1
            logits, self._cache = eng._forward(self._new[:, None], self._att, self._pos,
                                               self._cache)
            logits_parts.append(logits)
        if newcomers:
            logits = self._prefill(newcomers)
            logits_parts.append(logits)
        if not self.rows:
            return
        self.max_rows = max(self.max_rows, len(self.rows))
        logits = torch.cat(logits_parts) if len(logits_parts) > 1 else logits_parts[0]
        new, lp = sample(logits, self._temps, self._top_p, eng.generator)
        keep: list[int] = []
        for b, (row, tok, lpv) in enumerate(zip(self.rows, new.tolist(), lp.tolist(),
                                                strict=True)):
            row.toks.append(tok)
            row.lps.append(lpv)
            row.vers.append(version)
            if row.stop.hit(row.toks):
                _settle(row.fut, GenResult(row.toks, row.lps, row.vers, "stop"))
            elif len(row.toks) >= row.limit:
                _settle(row.fut, GenResult(row.toks, row.lps, row.vers, "length"))
            elif not row.fut.cancelled():
                keep.append(b)
        self._new = new
        if len(keep) < len(self.rows):
            self._select(keep)

    def _prefill(self, newcomers: list[tuple[GenRequest, Future[GenResult]]]) -> Any:
        import torch

        eng = self.engine
        dev = eng.device
        width = max(len(r.prompt_ids) for r, _ in newcomers)
        ids = torch.full((len(newcomers), width), eng.pad_id, dtype=torch.long)
        att = torch.zeros((len(newcomers), width), dtype=torch.long)
        for b, (r, _) in enumerate(newcomers):
            p = list(r.prompt_ids)
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            att[b, width - len(p):] = 1
        ids, att = ids.to(dev), att.to(dev)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits, cache = eng._forward(ids, att, pos, None)
        temps = torch.tensor([r.temperature for r, _ in newcomers], dtype=torch.float32,
                             device=dev)
        top_p = torch.tensor([r.top_p for r, _ in newcomers], dtype=torch.float32, device=dev)
        rows = [_Row(r, f, min(r.max_new_tokens, eng.max_positions - len(r.prompt_ids)),
                     StopChecker(eng._tok, r.stop, (*eng.eos, *r.stop_token_ids)))
                for r, f in newcomers]
        if self.rows:
            self._cache = merge_caches(self._cache, cache)
            w = max(self._att.shape[1], att.shape[1])
            self._att = torch.cat([_pad_left(self._att, w, 1), _pad_left(att, w, 1)])
            self._pos = torch.cat([self._pos, pos[:, -1:]])
            self._temps = torch.cat([self._temps, temps])
            self._top_p = torch.cat([self._top_p, top_p])
            self.joins += len(rows)
        else:
            check_mergeable(cache)
            self._cache, self._att, self._pos = cache, att, pos[:, -1:]
            self._temps, self._top_p = temps, top_p
        self.rows = self.rows + rows
        return logits

    def _select(self, keep: list[int]) -> None:
        import torch

        if not keep:
            self.rows, self._cache = [], None
            return
        sel = torch.tensor(keep, dtype=torch.long, device=self.engine.device)
        self._cache.batch_select_indices(sel)
        self._att, self._pos, self._new = self._att[sel], self._pos[sel], self._new[sel]
        self._temps, self._top_p = self._temps[sel], self._top_p[sel]
        self.rows = [self.rows[b] for b in keep]
        used = self._att.any(dim=0)
        start = int(used.int().argmax())  # first column some row attends to
        if start > 0:
            trim_cache(self._cache, start)
            self._att = self._att[:, start:]
