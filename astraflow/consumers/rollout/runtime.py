"""The shared, per-worker part of every episode: engines (behind batchers) by policy, the
reward, tool and sampling settings, and the workflow registry lookup. Build one with
:meth:`Runtime.create` inside the event loop; :func:`run_episode` runs one workflow episode on
it (the worker does this for every task sample; tests and benchmarks may too)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from astraflow.consumers.rollout.batcher import Batcher, batchers_for
from astraflow.consumers.rollout.context import Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.engines.base import Engine, GenRequest
from astraflow.consumers.rollout.rewards import REWARDS
from astraflow.consumers.rollout.rewards.base import RewardFn
from astraflow.consumers.rollout.rewards.extract import with_extract
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.core.records import ChatMessage, Task
from astraflow.core.registry import RegistryError
from astraflow.models.prompt import render_prompt

PROMPT_CACHE = 4096  # rendered prompts kept (a task's samples render it once)
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64,
                                    "stop": (), "stop_token_ids": ()}
TRUNCATED = ("score", "zero")  # rollout.reward.truncated


@dataclass
class Runtime:
    engines: dict[str, Engine]
    reward_fn: RewardFn
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_timeout: float = 30.0
    tool_timeout: float = 10.0
    sampling: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))
    default_workflow: str = "single_turn"
    workflow_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    allow_workflow_paths: bool = False  # a task may name any module:function (trusted tasks)
    #: rollout.reward.truncated: "score" (a cut reply is scored like any other) or "zero" (a
    #: trajectory with a cut reply scores 0); applied by Conversation.finish
    truncated: str = "score"
    batchers: dict[str, Batcher] = field(default_factory=dict)
    _prompts: OrderedDict[tuple[Any, ...], tuple[str, list[int]]] = field(
        default_factory=OrderedDict)
    _defaults: tuple[dict[str, Any], tuple[Any, ...]] | None = None

    @classmethod
    def create(cls, engines: Mapping[str, Engine], *, reward: str | RewardFn = "exact_match",
               reward_kwargs: Mapping[str, Any] | None = None, reward_timeout: float = 30.0,
               tool_timeout: float = 10.0, sampling: Mapping[str, Any] | None = None,
               default_workflow: str = "single_turn",
               workflow_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
               engine_latency: Any = None, allow_workflow_paths: bool = False,
               extract: str | Callable[[str], str] | None = "none",
               truncated: str = "score") -> Runtime:
        """``extract``: the answer extractor (``rollout.reward.extract``) the reward sees the
        completion through; ``none``: the completion as is. ``truncated``: what a trajectory
        with a reply cut at ``max_new_tokens`` scores (``rollout.reward.truncated``): ``score``
        (what the reward says) or ``zero``."""
        if not engines:
            raise WorkflowError("a rollout runtime needs at least one engine (policy)")
        if truncated not in TRUNCATED:
            raise WorkflowError(f"unknown truncated rule {truncated!r}; valid: "
                                f"{', '.join(TRUNCATED)}")
        fn = with_extract(REWARDS.resolve(reward) if isinstance(reward, str) else reward, extract)
        return cls(engines=dict(engines), reward_fn=fn, reward_kwargs=dict(reward_kwargs or {}),
                   reward_timeout=reward_timeout, tool_timeout=tool_timeout,
                   sampling={**DEFAULT_SAMPLING, **dict(sampling or {})},
                   default_workflow=default_workflow,
                   workflow_kwargs={k: dict(v) for k, v in (workflow_kwargs or {}).items()},
                   allow_workflow_paths=allow_workflow_paths, truncated=truncated,
                   batchers=batchers_for(dict(engines), latency=engine_latency))

    @property
    def policies(self) -> list[str]:
        return list(self.engines)

    @property
    def default_policy(self) -> str:
        return next(iter(self.engines))

    def check_policy(self, policy: str) -> None:
        if policy not in self.engines:
            raise WorkflowError(f"policy {policy!r} has no engine in this worker; hosted: "
                                f"{', '.join(self.engines)} (set rollout.policies)")

    def tokenizer(self, policy: str) -> Any:
        self.check_policy(policy)
        return self.engines[policy].tokenizer

    def prompt(self, policy: str, messages: Sequence[ChatMessage]) -> tuple[str, list[int]]:
        """The rendered text and token ids of a conversation's start, cached: the n samples of
        a task share one prompt."""
        key = (policy, *((m.role, m.content, m.name) for m in messages))
        hit = self._prompts.get(key)
        if hit is None:
            hit = self._prompts[key] = render_prompt(self.tokenizer(policy), messages)
            if len(self._prompts) > PROMPT_CACHE:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        return hit[0], list(hit[1])

    def default_request(self, prompt_ids: Sequence[int]) -> GenRequest:
        """A request for ``prompt_ids`` with the configured sampling (no overrides); the
        parameters are converted once, not per call."""
        cached = self._defaults
        if cached is None or cached[0] != self.sampling:
            p = dict(self.sampling)
            cached = self._defaults = (p, (
                int(p["max_new_tokens"]), float(p["temperature"]), float(p["top_p"]),
                tuple(p["stop"]), tuple(p["stop_token_ids"])))
        return GenRequest(list(prompt_ids), *cached[1])

    def batcher(self, policy: str) -> Batcher:
        self.check_policy(policy)
        return self.batchers[policy]

    def workflow(self, name: str) -> Callable[..., Any]:
        """The workflow function of a task whose ``workflow`` is ``name`` (empty: the default).

        A task is data from the bus, so it may name a registered workflow or one the config
        names (the default, a key of the workflow kwargs); any other ``module:function`` only
        when ``allow_workflow_paths`` (``rollout.workflow.allow_task_paths``). Otherwise, and
        for a path that is not an async function, raises :class:`RegistryError` before the
        module is imported or the function called (the worker dead-letters the task)."""
        name = name or self.default_workflow
        if name in WORKFLOWS:
            return WORKFLOWS.resolve(name)
        trusted = name == self.default_workflow or name in self.workflow_kwargs
        if not (trusted or self.allow_workflow_paths):
            raise RegistryError(
                f"workflow {name!r} is not registered; valid: {', '.join(WORKFLOWS.names())}. "
                "A task may name a module path only if the config names it "
                "(rollout.workflow.default or a key of rollout.workflow.kwargs), or registers "
                "it from a module in rollout.workflow.modules, or sets "
                "rollout.workflow.allow_task_paths: true (imports and runs code any task names)")
        fn = WORKFLOWS.resolve(name)
        if not _is_async(fn):
            raise RegistryError(f"workflow {name!r} is a {type(fn).__name__}, not an async "
                                "function: a workflow is `async def workflow(ctx, task, "
                                "**kwargs)`")
        return fn

    async def close(self) -> None:
        for b in self.batchers.values():
            await b.close()


def _is_async(fn: Any) -> bool:
    """An ``async def`` function (or a partial of one, or an object whose ``__call__`` is)."""
    return inspect.iscoroutinefunction(fn) or (
        callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


@dataclass
class EpisodeOutcome:
    drafts: list[Draft]
    ctx: EpisodeContext
    seconds: float
    error: str | None = None  # the workflow raised (drafts then hold one failed draft)
    timed_out: bool = False


def failed_draft(policy: str, finish_reason: str, error: str, agent: str = "") -> Draft:
    return Draft(policy=policy, token_ids=[], loss_mask=[], logprobs=[], versions=[],
                 prompt_len=0, spans=[], reward=0.0, finish_reason=finish_reason, error=error,
                 agent=agent)


async def run_episode(runtime: Runtime, task: Task, sample_index: int, *,
                      timeout: float | None = None,
                      ctx: EpisodeContext | None = None) -> EpisodeOutcome:
    """Run the task's workflow once. Never raises (except on cancellation): a workflow that
    raises gives one failed draft (``finish_reason="error"``) per (policy, role) it used or
    declared; one past ``timeout`` gives, per (policy, role), its first conversation that
    generated tokens so far (``finish_reason="timeout"``, reward 0; see
    :func:`timed_out_drafts`). ``ctx``: the episode's context when the caller made it (the
    worker's drain reads its tokens' versions while it runs); default: a new one."""
    if ctx is None:
        ctx = EpisodeContext(runtime, task, sample_index)
    start = time.monotonic()
    try:
        fn = runtime.workflow(task.workflow)
        kwargs = runtime.workflow_kwargs.get(task.workflow or runtime.default_workflow, {})
        coro = fn(ctx, task, **kwargs)
        if not inspect.isawaitable(coro):
            raise WorkflowError(f"workflow {task.workflow!r} is not an async function")
        out = await (asyncio.wait_for(coro, timeout) if timeout else coro)
        drafts = _drafts(out, task.workflow)
        return EpisodeOutcome(drafts, ctx, time.monotonic() - start)
    except TimeoutError:
        msg = f"episode timed out after {timeout:g} s"
        return EpisodeOutcome(timed_out_drafts(ctx, msg), ctx, time.monotonic() - start, msg,
                              True)
    except Exception as e:  # noqa: BLE001 - one failing episode is a failed record, not a dead worker
        msg = f"{type(e).__name__}: {e}"
        return EpisodeOutcome([failed_draft(p, "error", msg, a) for p, a in _slots(ctx)], ctx,
                              time.monotonic() - start, msg)


def timed_out_drafts(ctx: EpisodeContext, msg: str) -> list[Draft]:
    """The records of a timed-out episode: at most one per (policy, role), so a sample still
    gives each policy's group one trajectory per role (a ``solver_selector`` cut off after
    its k candidates gives one solver record, not k). Per (policy, role), the first
    conversation that generated tokens, ``finish_reason="timeout"``; where there is none, an
    empty ``"timeout"`` record (so that role's group still hears of the sample); if the
    episode generated nothing at all, empty ``"error"`` records. A conversation whose
    role is unknown while its policy plays declared roles (one policy, two roles, and the
    workflow did not say which) is left out rather than trained as the wrong role."""
    first: dict[tuple[str, str], Draft] = {}
    for c in ctx.conversations:
        if c.generated_tokens and (c.policy, c.agent) not in first:
            first[(c.policy, c.agent)] = c.finish(0.0, finish_reason="timeout", error=msg)
    if not first:
        return [failed_draft(p, "error", msg, a) for p, a in _slots(ctx)]
    return [first.get((p, a)) or failed_draft(p, "timeout", msg, a) for p, a in _slots(ctx)]


def _slots(ctx: EpisodeContext) -> list[tuple[str, str]]:
    """The (policy, role) pairs a failed episode gives a record: every declared role, and
    every other (policy, role) a conversation was started for; at least the default policy."""
    slots = [(p, r) for r, p in ctx.roles.items()]
    played = set(ctx.roles.values())
    slots += [(c.policy, c.agent) for c in ctx.conversations if c.policy not in played]
    return list(dict.fromkeys(slots)) or [(ctx.policy, "")]


def _drafts(out: Any, workflow: str) -> list[Draft]:
    items: Sequence[Any] = [out] if isinstance(out, Draft) else (out or [])
    if not isinstance(items, (list, tuple)) or not all(isinstance(d, Draft) for d in items):
        raise WorkflowError(f"workflow {workflow!r} returned {type(out).__name__}; expected a "
                            "Draft or a list of Drafts (conversation.finish(reward))")
    if not items:
        raise WorkflowError(f"workflow {workflow!r} returned no trajectory")
    return list(items)
