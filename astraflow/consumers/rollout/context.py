"""What a workflow sees: the episode context, token-level conversations and their drafts.

A workflow is ``async def workflow(ctx: EpisodeContext, task: Task, **kwargs)`` returning one
:class:`Draft` or a list of them (one per policy turn-set). It builds conversations:

>>> conv = ctx.conversation(task.prompt)            # policy: ctx.policy unless given
>>> gen = await conv.generate(temperature=0.7)      # an assistant turn, tokens masked 1
>>> conv.add(ChatMessage(role="tool", content="4")) # other turns, tokens masked 0
>>> return conv.finish(await ctx.reward(gen.text))

A :class:`Conversation` keeps the exact token sequence the model saw and produced, so the loss
mask covers exactly the generated tokens, logprobs are the behaviour logprobs, and versions are
the policy versions per generated token. Messages added later are rendered with the tokenizer's
chat template and only the new text is tokenized (the tokens already there never change).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from astraflow.consumers.rollout.engines.base import GenRequest, GenResult
from astraflow.consumers.rollout.rewards.base import Score, score
from astraflow.consumers.rollout.tools import ToolResult, call_tool
from astraflow.core.errors import AstraflowError
from astraflow.core.records import ChatMessage, Task, TurnSpan
from astraflow.models.prompt import encode, render

if TYPE_CHECKING:
    from astraflow.consumers.rollout.runtime import Runtime

SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "stop", "stop_token_ids")


class WorkflowError(AstraflowError):
    """A workflow used the context wrongly (unknown policy, bad sampling argument, ...)."""


def as_messages(messages: Sequence[ChatMessage | Mapping[str, Any]] | str) -> list[ChatMessage]:
    if isinstance(messages, str):
        return [ChatMessage(role="user", content=messages)]
    out = []
    for m in messages:
        if isinstance(m, ChatMessage):
            out.append(m)
        else:
            out.append(ChatMessage(role=str(m["role"]), content=str(m["content"]),
                                   name=m.get("name")))
    return out


@dataclass
class Draft:
    """One trajectory before the worker stamps ids, task, worker and timings on it."""

    policy: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    prompt_len: int
    spans: list[TurnSpan]
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    finish_reason: str = "stop"
    error: str | None = None


@dataclass
class Generation:
    """One assistant turn: its text (special tokens removed), tokens and how it ended."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    conversation: Conversation


class Conversation:
    """The token-level transcript of one policy's view of an episode."""

    def __init__(self, ctx: EpisodeContext, policy: str, messages: Sequence[ChatMessage]) -> None:
        self.ctx = ctx
        self.policy = policy
        self.tokenizer = ctx.runtime.tokenizer(policy)
        self.messages: list[ChatMessage] = list(messages)
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.spans: list[TurnSpan] = []
        self.finish_reason = "stop"
        self.generations = 0
        self.text, ids = ctx.runtime.prompt(policy, self.messages)
        self._append(ids, "prompt")
        self.prompt_len = len(ids)

    def _append(self, ids: Sequence[int], role: str, result: GenResult | None = None) -> None:
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(int(i) for i in ids)
        if result is None:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.versions.extend([-1] * len(ids))
        else:
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(result.logprobs)
            self.versions.extend(result.versions)
        self.spans.append(TurnSpan(start=start, end=len(self.token_ids), role=role))

    async def generate(self, **sampling: Any) -> Generation:
        """Generate an assistant turn continuing the conversation (tokens masked 1)."""
        result = await self.ctx._generate(self.policy, self.token_ids, sampling)
        self._append(result.token_ids, "assistant", result)
        raw = self.tokenizer.decode(result.token_ids, skip_special_tokens=False)
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        self.text += raw
        self.messages.append(ChatMessage(role="assistant", content=text))
        self.finish_reason = result.finish_reason
        self.generations += 1
        return Generation(text, list(result.token_ids), list(result.logprobs),
                          list(result.versions), result.finish_reason, self)

    def add(self, *messages: ChatMessage | Mapping[str, Any]) -> list[int]:
        """Append messages the model did not write (tool results, user turns), masked 0, with
        the generation prompt of the next assistant turn. Returns the new token ids."""
        new = as_messages(list(messages))
        full = render(self.tokenizer, self.messages + new, generation_prompt=True)
        if full.startswith(self.text):
            delta = full[len(self.text):]
        else:  # the template writes the generated turn differently (e.g. drops special tokens)
            prev = render(self.tokenizer, self.messages, generation_prompt=False)
            delta = full[len(prev):] if full.startswith(prev) else render(
                self.tokenizer, new, generation_prompt=True)
        ids = encode(self.tokenizer, delta, special=False) if delta else []
        self._append(ids, new[0].role if len({m.role for m in new}) == 1 else "other")
        self.messages.extend(new)
        self.text += delta
        return list(ids)

    @property
    def last_text(self) -> str:
        """The content of the last assistant message ("" if none)."""
        for m in reversed(self.messages):
            if m.role == "assistant":
                return m.content
        return ""

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def finish(self, reward: float | Score = 0.0, *, rewards: Mapping[str, float] | None = None,
               finish_reason: str | None = None, error: str | None = None) -> Draft:
        """The trajectory of this conversation with its reward."""
        comps = dict(reward.components) if isinstance(reward, Score) else {}
        comps.update(rewards or {})
        return Draft(policy=self.policy, token_ids=list(self.token_ids),
                     loss_mask=list(self.loss_mask), logprobs=list(self.logprobs),
                     versions=list(self.versions), prompt_len=self.prompt_len,
                     spans=list(self.spans), reward=float(reward), rewards=comps,
                     finish_reason=finish_reason or self.finish_reason, error=error)


class EpisodeContext:
    """Everything one episode may use: engines by policy, tools, the reward, its task."""

    def __init__(self, runtime: Runtime, task: Task, sample_index: int) -> None:
        self.runtime = runtime
        self.task = task
        self.sample_index = sample_index
        self.policy = runtime.default_policy
        self.conversations: list[Conversation] = []
        self.timings: dict[str, float] = {"generate": 0.0, "reward": 0.0, "tools": 0.0}
        self.counters: dict[str, float] = {}

    @property
    def policies(self) -> list[str]:
        return self.runtime.policies

    def count(self, name: str, n: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + n

    def conversation(self, messages: Sequence[ChatMessage | Mapping[str, Any]] | str | None = None,
                     *, policy: str | None = None) -> Conversation:
        """Start a conversation (default messages: the task's prompt) for ``policy``."""
        policy = policy or self.policy
        self.runtime.check_policy(policy)
        conv = Conversation(self, policy, as_messages(self.task.prompt if messages is None
                                                      else messages))
        self.conversations.append(conv)
        return conv

    async def generate(self, *, policy: str | None = None,
                       messages: Sequence[ChatMessage | Mapping[str, Any]] | str | None = None,
                       **sampling: Any) -> Generation:
        """One assistant turn for ``messages`` (default: the task's prompt) by ``policy``;
        continue it with ``gen.conversation``."""
        return await self.conversation(messages, policy=policy).generate(**sampling)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *,
                        timeout: float | None = None) -> ToolResult:
        """Call a registered tool; never raises (failures come back as ``ok=False``)."""
        res = await call_tool(name, arguments,
                              timeout=timeout if timeout is not None else self.runtime.tool_timeout)
        self.timings["tools"] += res.seconds
        self.count("tool_calls")
        if not res.ok:
            self.count("tool_timeouts" if res.timed_out else "tool_failures")
        return res

    async def reward(self, completion: str, reference: Mapping[str, Any] | None = None,
                     **kwargs: Any) -> Score:
        """Score ``completion`` with the configured reward against ``reference`` (default: the
        task's). Never raises: a failure scores 0 with ``failed`` set, and is counted."""
        start = time.monotonic()
        res = await score(self.runtime.reward_fn, completion,
                          self.task.reference if reference is None else reference,
                          timeout=self.runtime.reward_timeout,
                          **{**self.runtime.reward_kwargs, **kwargs})
        self.timings["reward"] += time.monotonic() - start
        if res.failed:
            self.count("reward_failures")
        return res

    def sampling(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The sampling parameters of a call: the configured defaults, then ``overrides``."""
        params = dict(self.runtime.sampling)
        for key, value in overrides.items():
            key = "max_new_tokens" if key == "max_tokens" else key
            if key not in SAMPLING_KEYS:
                raise WorkflowError(f"unknown sampling argument {key!r}; valid: "
                                    f"{', '.join(SAMPLING_KEYS)}")
            params[key] = value
        return params

    async def _generate(self, policy: str, prompt_ids: Sequence[int],
                        overrides: Mapping[str, Any]) -> GenResult:
        p = self.sampling(overrides)
        req = GenRequest(prompt_ids=list(prompt_ids), max_new_tokens=int(p["max_new_tokens"]),
                         temperature=float(p["temperature"]), top_p=float(p["top_p"]),
                         stop=tuple(p["stop"]), stop_token_ids=tuple(p["stop_token_ids"]))
        start = time.monotonic()
        result = await self.runtime.batcher(policy).generate(req)
        self.timings["generate"] += time.monotonic() - start
        return result
