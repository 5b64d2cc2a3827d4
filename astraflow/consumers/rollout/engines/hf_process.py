"""The ``hf`` engine in a process of its own (``rollout.engine.process: true``).

On a CPU the tiny models' forward passes are Python-bound; in a process of its own the engine
decodes on one core while the worker's event loop uses another, instead of sharing one
interpreter lock. Both processes map the weights in shared memory, so the syncer's writes are
seen at once, and :meth:`ProcessEngine.update_weights` lands between decoding steps. A crashed
engine process fails its batches and is started again. CPU and static batching only
(docs/rollout.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import os
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import msgspec

from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.target import ModelTarget
from astraflow.weights.adapter import AdapterTarget, merging_target

log = logging.getLogger("astraflow.rollout.hf_process")

T = TypeVar("T")
ALIGN = 64
CTL_BYTES = 64  # int64 version at 0 (-1: none yet), int64 steps run at 16; lock bytes
TURN, STEP = 8, 9  # at TURN and STEP


class Call(msgspec.Struct, frozen=True):
    """Worker -> engine process: one batch."""

    requests: list[GenRequest]


class Reply(msgspec.Struct, frozen=True):
    """Engine process -> worker: the batch's results, or why it failed (the first reply,
    with neither, says the process is ready)."""

    results: list[GenResult] | None = None
    error: str | None = None


# -- shared weights ------------------------------------------------------------------------------
def layout(model: Any) -> list[dict[str, Any]]:
    """Where each distinct tensor of ``model.state_dict()`` lies in the shared file (tied
    tensors once, under their first name)."""
    entries, seen, offset = [], set(), 0
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        nbytes = t.numel() * t.element_size()
        entries.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."),
                        "shape": list(t.shape), "offset": offset, "nbytes": nbytes})
        offset += -(-nbytes // ALIGN) * ALIGN
    return entries


def _views(model: Any, buf: mmap.mmap, entries: list[dict[str, Any]], *, copy: bool) -> None:
    """Point each tensor of ``entries`` at its place in ``buf`` (copying its values there
    first when ``copy``); refuses a model whose tensors differ from ``entries``."""
    import torch

    tensors = model.state_dict(keep_vars=True)
    for e in entries:
        t = tensors.get(e["name"])
        if t is None or list(t.shape) != e["shape"] or str(t.dtype).removeprefix(
                "torch.") != e["dtype"]:
            raise EngineError(f"the engine process's model differs from the worker's at tensor "
                              f"{e['name']!r} (worker: {e['dtype']} {e['shape']}, engine "
                              f"process: {None if t is None else (t.dtype, list(t.shape))})")
        if e["nbytes"] == 0:
            continue
        view = torch.frombuffer(buf, dtype=getattr(torch, e["dtype"]),
                                count=t.numel(), offset=e["offset"]).view(t.shape)
        with torch.no_grad():
            if copy:
                view.copy_(t.detach())
            t.data = view


def share(model: Any) -> tuple[int, mmap.mmap, list[dict[str, Any]]]:
    """Move ``model``'s tensors into a new shared-memory file: (its fd, its map, the layout)."""
    entries = layout(model)
    size = max(sum(-(-e["nbytes"] // ALIGN) * ALIGN for e in entries), ALIGN)
    fd = os.memfd_create("astraflow-weights", 0)
    os.ftruncate(fd, size)
    buf = mmap.mmap(fd, size)
    _views(model, buf, entries, copy=True)
    return fd, buf, entries


def attach(model: Any, fd: int, entries: list[dict[str, Any]]) -> mmap.mmap:
    """Point ``model``'s tensors at the shared file ``fd`` laid out as ``entries``."""
    buf = mmap.mmap(fd, os.fstat(fd).st_size)
    _views(model, buf, entries, copy=False)
    return buf


# -- the version and the step locks --------------------------------------------------------------
class Control:
    """The shared version word and the two byte-range locks (POSIX record locks: held per
    process, so the worker's and the engine process's are exclusive of each other)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = mmap.mmap(fd, CTL_BYTES)

    @classmethod
    def create(cls, version: int | None) -> Control:
        fd = os.memfd_create("astraflow-engine-ctl", 0)
        os.ftruncate(fd, CTL_BYTES)
        ctl = cls(fd)
        ctl.version = version
        return ctl

    @property
    def version(self) -> int | None:
        (v,) = struct.unpack_from("<q", self.buf, 0)
        return None if v < 0 else int(v)

    @version.setter
    def version(self, v: int | None) -> None:
        struct.pack_into("<q", self.buf, 0, -1 if v is None else v)

    @property
    def steps(self) -> int:
        """Decoding steps the engine process has begun (it counts them as it goes)."""
        return int(struct.unpack_from("<q", self.buf, 16)[0])

    def count_step(self) -> None:
        struct.pack_into("<q", self.buf, 16, self.steps + 1)

    def _lock(self, byte: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, byte)

    def _unlock(self, byte: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, byte)

    # the worker's side
    def pause(self) -> None:
        """Return once no decoding step runs, and keep the next from starting."""
        self._lock(TURN)
        try:
            self._lock(STEP)
        except BaseException:
            self._unlock(TURN)
            raise

    def resume(self) -> None:
        self._unlock(STEP)
        self._unlock(TURN)

    # the engine process's side
    def enter(self) -> None:
        """Before a decoding step: wait out an update in progress, then hold the step."""
        self._lock(TURN)
        self._unlock(TURN)
        self._lock(STEP)
        self.count_step()

    def leave(self) -> None:
        self._unlock(STEP)


# -- frames ----------------------------------------------------------------------------------------
def write_frame(f: BinaryIO, data: bytes) -> None:
    f.write(struct.pack("<I", len(data)) + data)
    f.flush()


def read_frame(f: BinaryIO) -> bytes | None:
    """The next frame, or None at the end of the stream (the other side is gone)."""
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    data = f.read(n)
    return data if len(data) == n else None


# -- the worker's side -----------------------------------------------------------------------------
class ProcessEngine:
    """An :class:`~.base.Engine`: the ``hf`` engine's decoding in a child process on weights
    shared with this one. See the module docstring."""

    name = "hf"
    continuous = False
    pipeline_depth = 2  # the next batch waits in the engine process while one decodes

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "float32",
                 max_batch_size: int = 64, threads: int | None = None, seed: int = 0,
                 initial_version: int = 0, **_: Any) -> None:
        import torch

        if device != "cpu":
            raise EngineError(f"rollout.engine.process runs the hf engine on the CPU only "
                              f"(device is {device!r}); on a GPU the engine's forward does not "
                              "hold the interpreter, so run it in-process")
        if dtype == "auto":
            raise EngineError("rollout.engine.process needs an explicit rollout.engine.dtype "
                              "(float32, bfloat16 or float16), not auto")
        from astraflow.models.tiny import load

        torch.set_num_threads(1)  # this side only applies weights
        model, self.tokenizer = load(model_path, device="cpu", dtype=getattr(torch, dtype))
        self.model = model.eval()
        self._weights_fd, self._shared, self._layout = share(self.model)  # (the mmap, kept)
        self.target = ModelTarget(self.model)
        # LoRA versions: merged into the shared weights (weights/adapter.py)
        self._weights = merging_target(self.model, self.target)
        self.initial_version = initial_version
        self.max_batch_size = max_batch_size
        self.restarts = 0  # times the engine process was started again after it died
        self._ctl = Control.create(None)
        self.seed = seed  # of the first engine process; each restart takes the next
        self._args: dict[str, Any] = {
            "model_path": str(model_path), "dtype": dtype, "threads": threads,
            "max_batch_size": max_batch_size, "initial_version": initial_version,
            "layout": self._layout}
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(Reply)
        self._lock = threading.Lock()  # the child, its pipes and the order of the batches sent
        self._updates = threading.Lock()
        self._waiting: deque[Future[list[GenResult]]] = deque()  # sent, not answered: in order
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: BinaryIO | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self._start()

    # -- the child process ------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the engine process and its reader thread (under ``_lock``, or in __init__)."""
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        args = dict(self._args, seed=self.seed + self.restarts, fds=[
            req_r, res_w, self._weights_fd, self._ctl.fd])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, json.dumps(args)],
                pass_fds=(req_r, res_w, self._weights_fd, self._ctl.fd),
                stdin=subprocess.DEVNULL)
        finally:
            os.close(req_r)
            os.close(res_w)
        send, recv = os.fdopen(req_w, "wb"), os.fdopen(res_r, "rb")
        if read_frame(recv) is None:  # it says it is ready, or dies
            send.close()
            recv.close()
            raise EngineError(f"the hf engine process exited with code {proc.wait()} while "
                              "starting (its error is in this process's stderr above)")
        self._proc, self._send = proc, send
        self._reader = threading.Thread(target=self._read, args=(proc, recv), daemon=True,
                                        name=f"af-engine-process-{proc.pid}")
        self._reader.start()
        log.info("hf engine process %d ready (restart %d)", proc.pid, self.restarts)

    def _read(self, proc: subprocess.Popen[bytes], recv: BinaryIO) -> None:
        """The reader thread of one engine process: its replies, in the order of the batches;
        at its end (closed, or died) every batch still waiting fails."""
        with recv:
            while (frame := read_frame(recv)) is not None:
                reply = self._dec.decode(frame)
                fut = self._waiting.popleft()
                if reply.error is not None:
                    fut.set_exception(EngineError(reply.error))
                else:
                    fut.set_result(reply.results or [])
        code = proc.wait()
        with self._lock:
            if self._proc is proc:
                self._proc = None
                if self._send is not None:
                    with contextlib.suppress(OSError):
                        self._send.close()
                    self._send = None
            lost, self._waiting = list(self._waiting), deque()
        if lost or not self._closed:
            log.error("the hf engine process exited with code %s; %d batches in it fail, and "
                      "it starts again for the next batch", code, len(lost))
        for fut in lost:
            fut.set_exception(EngineError(f"the hf engine process exited with code {code}"))

    # -- the protocol -----------------------------------------------------------------------------
    @property
    def version(self) -> int:
        v = self.target.version
        return self.initial_version if v is None else v

    @property
    def steps(self) -> int:
        """Decoding steps (forward passes) the engine process has begun, across restarts."""
        return self._ctl.steps

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def weight_target(self) -> AdapterTarget:
        return self._weights

    def update_weights(self, fn: Callable[[], T]) -> T:
        with self._updates:
            self._ctl.pause()
            try:
                result = fn()
                self._ctl.version = self.target.version
            finally:
                self._ctl.resume()
        return result

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Send a batch and wait for its results; callable from several threads at once (up
        to ``pipeline_depth`` batches queue in the engine process, run in the order sent)."""
        fut: Future[list[GenResult]] = Future()
        with self._lock:
            if self._closed:
                raise EngineError("the hf engine is closed")
            if self._proc is None:
                self.restarts += 1
                self._start()
            assert self._send is not None
            self._waiting.append(fut)
            # if the process is gone, its reader fails this batch with the exit code
            with contextlib.suppress(OSError, ValueError):
                write_frame(self._send, self._enc.encode(Call(list(requests))))
        return fut.result()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, send, reader = self._proc, self._send, self._reader
            self._send = None
        if send is not None:  # end of requests: the engine process exits
            with contextlib.suppress(OSError):
                send.close()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if reader is not None:
            reader.join(timeout=10)


# -- the engine process ----------------------------------------------------------------------------
class _StepGate:
    """The in-process engine's StepGate, held across processes: a step runs between
    :meth:`Control.enter` and :meth:`Control.leave`."""

    def __init__(self, ctl: Control) -> None:
        self.ctl = ctl

    def acquire(self) -> None:
        self.ctl.enter()

    def boundary(self) -> None:
        self.ctl.leave()
        self.ctl.enter()

    def release(self) -> None:
        self.ctl.leave()


def main(argv: Sequence[str]) -> int:
    """The engine process: load, attach to the shared weights, say ready, serve batches until
    the worker closes the pipe."""
    import torch

    from astraflow.consumers.rollout.engines.hf import HFEngine
    from astraflow.models.tiny import load

    args = json.loads(argv[0])
    req_r, res_w, weights_fd, ctl_fd = args["fds"]
    if args["threads"] is not None:
        torch.set_num_threads(args["threads"])
    model, tok = load(args["model_path"], device="cpu", dtype=getattr(torch, args["dtype"]))
    attach(model, weights_fd, args["layout"])
    ctl = Control(ctl_fd)

    class SharedWeightsEngine(HFEngine):  # its version is the one the worker last staged
        @property
        def version(self) -> int:
            v = ctl.version
            return self.initial_version if v is None else v

    engine = SharedWeightsEngine(model=model, tokenizer=tok,
                                 max_batch_size=args["max_batch_size"], seed=args["seed"],
                                 initial_version=args["initial_version"])
    engine.gate = _StepGate(ctl)  # type: ignore[assignment]
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Call)
    try:
        with os.fdopen(req_r, "rb") as recv, os.fdopen(res_w, "wb") as send:
            write_frame(send, enc.encode(Reply()))
            while (frame := read_frame(recv)) is not None:
                call = dec.decode(frame)
                try:
                    reply = Reply(results=engine.generate(call.requests))
                except Exception as e:  # noqa: BLE001 - the batch fails, the process serves on
                    reply = Reply(error=f"{type(e).__name__}: {e}")
                write_frame(send, enc.encode(reply))
    except BrokenPipeError:  # the worker is gone (mid-batch): nobody to answer
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
