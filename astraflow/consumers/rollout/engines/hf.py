"""The ``hf`` engine: a transformers causal LM in-process (CPU or GPU), batched sampling.

Decoding is our own token-by-token loop over the KV cache (not ``generate()``), so a new weight
version lands between two decoding steps (:meth:`HFEngine.update_weights`): sequences in
flight continue on the new weights and every token records the version that produced it. LoRA
versions are merged from the pristine base weights (:mod:`astraflow.weights.adapter`). Batches
are left-padded; finished rows leave. With ``continuous=True`` the engine batches itself
(:meth:`HFEngine.submit`, :mod:`astraflow.consumers.rollout.engines.hf_continuous`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.sampling import StopChecker, eos_ids, sample
from astraflow.consumers.rollout.engines.target import ModelTarget
from astraflow.weights.adapter import AdapterTarget, merging_target

_ENGINES = itertools.count()  # tells a process's engines apart in the cores folder


class Decoding:
    """Wall seconds during which at least one engine of this process decoded: a worker with
    an engine per policy decodes with both at once, and the sum of their busy seconds would
    count those stretches twice (a worker of a two-policy team: 979 engine-seconds in 701 s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._total = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.monotonic()
            self._active += 1

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._total += time.monotonic() - self._since

    def seconds(self) -> float:
        """The total so far, the running stretch included."""
        with self._lock:
            return self._total + (time.monotonic() - self._since if self._active else 0.0)


#: this process's engines decoding (``time.generate_s`` of its rollout worker)
DECODING = Decoding()

log = logging.getLogger("astraflow.rollout.hf")

T = TypeVar("T")


class _Update:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller of update_weights
            self.error = e
        finally:
            self.done.set()


class StepGate:
    """Runs weight updates only where no decoding step is using the weights.

    ``generate`` holds the gate for a whole batch and calls :meth:`boundary` between steps;
    :meth:`update` runs its function at once when the engine is idle, else queues it for the
    next boundary and waits for it.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._busy = False
        self._pending: list[_Update] = []

    def acquire(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._busy)
            self._busy = True

    def release(self) -> None:
        while True:
            with self._cv:
                todo, self._pending = self._pending, []
                if not todo:
                    self._busy = False
                    self._cv.notify_all()
                    return
            for u in todo:
                u.run()

    def boundary(self) -> None:
        if not self._pending:  # racy read is fine: a late update runs at the next boundary
            return
        with self._cv:
            todo, self._pending = self._pending, []
        for u in todo:
            u.run()

    def update(self, fn: Callable[[], T]) -> T:
        u = _Update(fn)
        with self._cv:
            run_now = not self._busy
            if run_now:
                self._busy = True
            else:
                self._pending.append(u)
        if run_now:
            try:
                u.run()
            finally:
                self.release()
        else:
            u.done.wait()
        if u.error is not None:
            raise u.error
        return u.result


class HFEngine:
    """A Hugging Face causal LM with batched, cache-based sampling. See the module docstring."""

    name = "hf"
    continuous = False

    def __init__(self, model_path: str | Path | None = None, *, model: Any = None,
                 tokenizer: Any = None, device: str = "cpu", dtype: str = "float32",
                 max_batch_size: int = 64, threads: int | None = None, seed: int = 0,
                 initial_version: int = 0, continuous: bool = False,
                 mixed_precision: str = "no", adapters: Sequence[str] = (), **_: Any) -> None:
        import torch

        if mixed_precision not in ("no", "bf16"):
            raise EngineError(f"rollout.engine.mixed_precision: 'no' or 'bf16', got "
                              f"{mixed_precision!r}")
        # bf16 autocast: the forward's matrix products in bf16, the weights as loaded, the
        # logits back in fp32 before sampling (and the behaviour logprobs)
        self.autocast = mixed_precision == "bf16"

        if threads is not None:
            torch.set_num_threads(threads)  # process-wide: a worker hosts its engines alone
        # the machine's cores shared with the trainer (`astraflow run` on a CPU host,
        # core/cores.py): busy while decoding, threads checked before every decoding step
        self.cores: Any = None
        if device == "cpu":
            from astraflow.core.cores import from_env

            self.cores = from_env(f"rollout-{os.getpid()}-{next(_ENGINES)}")
        self.busy_s = 0.0  # seconds spent decoding (where a worker's time goes)
        self._busy_since: float | None = None
        if model is None:
            if model_path is None:
                raise EngineError("the hf engine needs model_path (a Hugging Face model "
                                  "directory) or a model object")
            from astraflow.models.tiny import load

            torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
            model, tok = load(model_path, device=device, dtype=torch_dtype)
            tokenizer = tokenizer or tok
        elif tokenizer is None:
            raise EngineError("pass the tokenizer with a model object")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._tok = copy.deepcopy(tokenizer)  # the decode thread's own (fast tokenizers and
        # concurrent use from two threads do not mix)
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.initial_version = initial_version
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.eos = eos_ids(tokenizer, model.config, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(
            self.eos, default=0)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.target = ModelTarget(model)
        # LoRA versions (weights/adapter.py): adapter tensors stay on the host and are merged
        # into the model from a pristine copy of the targeted base weights at each version
        self._weights = merging_target(model, self.target)
        self.gate = StepGate()
        self.steps = 0  # decoding steps run (forward passes), for tests and metrics
        # called at each step boundary: tests, and engines/speed.py paces a continuous engine here
        self.step_hook: Callable[[int], None] | None = None
        import inspect

        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        # policies served as LoRA adapters of this base, a slot each (engines/adapters.py)
        self.adapters: Any = None
        if adapters:
            if continuous:
                raise EngineError("rollout.engine.adapters needs continuous: false (the "
                                  "continuous decoder does not route rows to adapters)")
            from astraflow.consumers.rollout.engines.adapters import AdapterBank

            self.adapters = AdapterBank(model, list(adapters))
        self.continuous = continuous
        self.decoder: Any = None  # the ContinuousDecoder when continuous
        if continuous:
            from astraflow.consumers.rollout.engines.hf_continuous import ContinuousDecoder

            self.decoder = ContinuousDecoder(self)

    # -- the protocol --------------------------------------------------------------------------
    @property
    def version(self) -> int:
        v = self.target.version
        return self.initial_version if v is None else v

    def weight_target(self) -> AdapterTarget:
        return self._weights

    def update_weights(self, fn: Callable[[], T]) -> T:
        return self.gate.update(fn)

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
        if self.cores is not None:
            self.cores.close()

    def busy(self, on: bool) -> None:
        """The engine starts (``on``) or stops decoding: its busy seconds, its core share."""
        now = time.monotonic()
        if on and self._busy_since is None:
            self._busy_since = now
            DECODING.enter()
            if self.cores is not None:
                self.cores.enter()
        elif not on and self._busy_since is not None:
            self.busy_s += now - self._busy_since
            self._busy_since = None
            DECODING.leave()
            if self.cores is not None:
                self.cores.leave()

    def busy_seconds(self) -> float:
        """Seconds spent decoding so far, the running stretch included."""
        since = self._busy_since
        return self.busy_s + (time.monotonic() - since if since is not None else 0.0)

    def submit(self, request: GenRequest) -> Future[GenResult]:
        """Continuous engines: queue ``request`` to join the running batch at the next step
        boundary; the future resolves to its result (or an EngineError)."""
        if self.decoder is None:
            raise EngineError("submit needs the hf engine built with continuous=True "
                              "(rollout.engine.continuous: true)")
        return self.decoder.submit(request)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        import torch

        if self.decoder is not None:  # continuous: each request joins the running batch
            return [f.result() for f in [self.decoder.submit(r) for r in requests]]
        self.gate.acquire()
        self.busy(True)
        try:
            with torch.inference_mode():
                return self._generate(list(requests))
        finally:
            if self.adapters is not None:
                self.adapters.route([])
            self.busy(False)
            self.gate.release()

    def _versions(self, adapters: list[str]) -> list[int]:
        """The weight version of each row's model now: its adapter's, else the engine's."""
        bank = self.adapters
        if bank is None:
            return [self.version] * len(adapters)
        own = self.version
        return [bank.version(a, self.initial_version) if a else own for a in adapters]

    # -- decoding ------------------------------------------------------------------------------
    def _forward(self, ids: Any, att: Any, pos: Any, cache: Any) -> tuple[Any, Any]:
        kw: dict[str, Any] = {"use_cache": True}
        if cache is not None:
            kw[self._cache_kw] = cache
        if self._keep_kw:
            kw[self._keep_kw] = 1
        if self.cores is not None:
            self.cores.adjust()
        with self._precision():
            out = self.model(input_ids=ids, attention_mask=att, position_ids=pos, **kw)
        new_cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        self.steps += 1
        logits = out.logits[:, -1, :]
        return (logits.float() if self.autocast else logits), new_cache

    def _precision(self) -> Any:
        """bf16 autocast around the forward (``mixed_precision: bf16``), else nothing."""
        if not self.autocast:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        import torch

        results: list[GenResult | None] = [None] * len(reqs)
        rows: list[int] = []  # request index of each batch row
        limits: list[int] = []
        for i, r in enumerate(reqs):
            if not r.prompt_ids:
                raise EngineError("empty prompt: a request needs at least one token")
            if r.adapter and (self.adapters is None or r.adapter not in self.adapters.slots):
                raise EngineError(f"request for adapter {r.adapter!r}, which this engine does "
                                  "not serve (rollout.engine.adapters)")
            limit = min(r.max_new_tokens, self.max_positions - len(r.prompt_ids))
            if limit <= 0:  # no room left in the context: nothing to generate
                results[i] = GenResult([], [], [], "length")
                continue
            rows.append(i)
            limits.append(limit)
        if not rows:
            return results  # type: ignore[return-value]
        dev = self.device
        width = max(len(reqs[i].prompt_ids) for i in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for b, i in enumerate(rows):
            p = list(reqs[i].prompt_ids)
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            att[b, width - len(p):] = 1
        ids, att = ids.to(dev), att.to(dev)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([reqs[i].temperature for i in rows], dtype=torch.float32, device=dev)
        top_p = torch.tensor([reqs[i].top_p for i in rows], dtype=torch.float32, device=dev)
        stops = [StopChecker(self._tok, reqs[i].stop, (*self.eos, *reqs[i].stop_token_ids))
                 for i in rows]
        toks: list[list[int]] = [[] for _ in rows]
        lps: list[list[float]] = [[] for _ in rows]
        vers: list[list[int]] = [[] for _ in rows]
        live = list(range(len(rows)))  # batch row -> index into rows/toks
        adapters = [reqs[i].adapter for i in rows]  # "" where no adapter serves the row
        if self.adapters is not None:
            self.adapters.route(adapters)
        versions = self._versions(adapters)
        logits, cache = self._forward(ids, att, pos, None)
        last_pos = pos[:, -1:]
        step = 0
        while True:
            new, lp = sample(logits, temps, top_p, self.generator)
            new_l, lp_l = new.tolist(), lp.tolist()
            keep: list[int] = []
            for b, k in enumerate(live):
                toks[k].append(new_l[b])
                lps[k].append(lp_l[b])
                vers[k].append(versions[b])
                if stops[k].hit(toks[k]):
                    results[rows[k]] = GenResult(toks[k], lps[k], vers[k], "stop")
                elif len(toks[k]) >= limits[k]:
                    results[rows[k]] = GenResult(toks[k], lps[k], vers[k], "length")
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(live):
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(sel)
                new, att, last_pos = new[sel], att[sel], last_pos[sel]
                temps, top_p = temps[sel], top_p[sel]
                live = [live[b] for b in keep]
                if self.adapters is not None:
                    self.adapters.route([adapters[k] for k in live])
            step += 1
            if self.step_hook is not None:
                self.step_hook(step)
            self.gate.boundary()  # weight updates land here, between two steps
            versions = self._versions([adapters[k] for k in live])
            att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
            last_pos = last_pos + 1
            logits, cache = self._forward(new[:, None], att, last_pos, cache)
        return results  # type: ignore[return-value]


def build(model_path: str | Path | None = None, *, process: bool = False, **kwargs: Any) -> Any:
    """The ``hf`` engine factory: in-process, or with ``process`` (``rollout.engine.process``)
    decoding in a process of its own (:mod:`~.hf_process`)."""
    if not process:
        return HFEngine(model_path, **kwargs)
    if kwargs.get("continuous"):
        raise EngineError("rollout.engine.process and rollout.engine.continuous do not go "
                          "together: the continuous engine schedules itself in-process")
    if kwargs.get("adapters"):
        raise EngineError("rollout.engine.process and rollout.engine.adapters do not go "
                          "together: the adapters' slots live in the engine's process")
    if model_path is None:
        raise EngineError("rollout.engine.process needs a model directory (model_path)")
    from astraflow.consumers.rollout.engines.hf_process import ProcessEngine

    return ProcessEngine(model_path, **kwargs)

