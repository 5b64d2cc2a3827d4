"""What a workflow sees: the episode context, token-level conversations and their drafts.

A workflow is ``async def workflow(ctx: EpisodeContext, task: Task, **kwargs)`` returning one
:class:`Draft` or a list of them (one per policy turn-set). It builds conversations:

>>> conv = ctx.conversation(task.prompt)            # policy: ctx.policy unless given
>>> gen = await conv.generate(temperature=0.7)      # an assistant turn, tokens masked 1
>>> conv.add(ChatMessage(role="tool", content="4")) # other turns, tokens masked 0
>>> return conv.finish(await ctx.reward(gen.text))

A :class:`Conversation` keeps the exact token sequence the model saw and produced, with the
behaviour logprobs and policy versions of its generated tokens; later messages are rendered with
the chat template and only the new text is tokenized.
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
from astraflow.core.records import ChatMessage, Task, TurnSpan, assistant_turns
from astraflow.models.prompt import appended, decode

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
    agent: str = ""  # the workflow role that produced it (Trajectory.agent); "": single role
    turn_rewards: list[float] = field(default_factory=list)  # Trajectory.turn_rewards


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

    def __init__(self, ctx: EpisodeContext, policy: str, messages: Sequence[ChatMessage],
                 agent: str = "") -> None:
        self.ctx = ctx
        self.policy = policy
        self.agent = agent  # the role this conversation is played in; "": unknown / one role
        self.tokenizer = ctx.runtime.tokenizer(policy)
        self.messages: list[ChatMessage] = list(messages)
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.spans: list[TurnSpan] = []
        self.finish_reason = "stop"
        self.generations = 0
        #: replies the engine cut (finish reason ``length``), and the indices among the
        #: assistant turns of those that made a turn (an empty reply makes none)
        self.truncated = 0
        self.cut_turns: list[int] = []
        self.text, ids = ctx.runtime.prompt(policy, self.messages)
        self._append(ids, "prompt")
        self.prompt_len = len(ids)

    def _append(self, ids: Sequence[int], role: str, result: GenResult | None = None) -> None:
        if not ids:
            return
        start = len(self.token_ids)
        n = len(ids)
        self.token_ids += map(int, ids)
        if result is None:
            self.loss_mask += [0] * n
            self.logprobs += [0.0] * n
            self.versions += [-1] * n
        else:
            self.loss_mask += [1] * n
            self.logprobs += result.logprobs
            self.versions += result.versions
        self.spans.append(TurnSpan(start=start, end=len(self.token_ids), role=role))

    async def generate(self, **sampling: Any) -> Generation:
        """Generate an assistant turn continuing the conversation (tokens masked 1)."""
        result = await self.ctx._generate(self.policy, self.token_ids, sampling)
        cut = result.finish_reason == "length"
        self.ctx.replies += 1
        if cut:
            self.ctx.replies_truncated += 1
            self.truncated += 1
            if result.token_ids:
                self.cut_turns.append(assistant_turns(self.spans))
        self._append(result.token_ids, "assistant", result)
        ids = result.token_ids if type(result.token_ids) is list else list(result.token_ids)
        raw = decode(self.tokenizer, ids, skip_special=False)
        text = decode(self.tokenizer, ids, skip_special=True)
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
        # falls back to the rendering without the generated turn where the template writes it
        # differently (e.g. drops special tokens)
        delta, ids = appended(self.tokenizer, self.messages, new, text=self.text)
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
               finish_reason: str | None = None, error: str | None = None,
               agent: str | None = None,
               turn_rewards: Sequence[float] | None = None) -> Draft:
        """The trajectory of this conversation with its reward; ``agent`` (default: the
        conversation's) is the role it is trained as; ``turn_rewards``: one reward per
        assistant turn, to train each turn on its own (``Trajectory.turn_rewards``).

        Where the engine cut one of its turns (finish reason ``length``), ``rewards`` gets
        ``truncated = 1`` and, under ``rollout.reward.truncated: zero``, the trajectory scores
        0 (and so do the cut turns' ``turn_rewards``) whatever ``reward`` says."""
        comps = dict(reward.components) if isinstance(reward, Score) else {}
        comps.update(rewards or {})
        turns = assistant_turns(self.spans)
        if turn_rewards and len(turn_rewards) != turns:
            raise WorkflowError(
                f"turn_rewards has {len(turn_rewards)} entries but the conversation has {turns} "
                "assistant turns (a generation that returned no tokens makes no turn); give "
                "one reward per turn")
        value, per_turn = float(reward), [float(r) for r in turn_rewards or ()]
        if self.truncated:
            comps["truncated"] = 1.0
            if self.ctx.runtime.truncated == "zero":
                value = 0.0
                for i in self.cut_turns:
                    if i < len(per_turn):
                        per_turn[i] = 0.0
        return Draft(policy=self.policy, token_ids=list(self.token_ids),
                     loss_mask=list(self.loss_mask), logprobs=list(self.logprobs),
                     versions=list(self.versions), prompt_len=self.prompt_len,
                     spans=list(self.spans), reward=value, rewards=comps,
                     finish_reason=finish_reason or self.finish_reason, error=error,
                     agent=self.agent if agent is None else agent, turn_rewards=per_turn)


class EpisodeContext:
    """Everything one episode may use: engines by policy, tools, the reward, its task."""

    def __init__(self, runtime: Runtime, task: Task, sample_index: int) -> None:
        self.runtime = runtime
        self.task = task
        self.sample_index = sample_index
        self.policy = runtime.default_policy
        # role -> policy of a multi-role workflow (set by declare_roles); {}: one role
        self.roles: dict[str, str] = {}
        self.conversations: list[Conversation] = []
        self.timings: dict[str, float] = {"generate": 0.0, "reward": 0.0, "tools": 0.0}
        self.counters: dict[str, float] = {}
        # the assistant turns generated, and those the engine cut (finish reason ``length``)
        self.replies = 0
        self.replies_truncated = 0

    @property
    def policies(self) -> list[str]:
        return self.runtime.policies

    def count(self, name: str, n: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + n

    def declare_roles(self, roles: Mapping[str, str]) -> None:
        """Say which policy plays each role of this episode (role -> policy). The runtime
        then gives a failed or timed-out episode one record per role, and a conversation of
        a policy that plays one role is that role's unless told otherwise."""
        self.roles = dict(roles)

    def agent_of(self, policy: str, agent: str | None) -> str:
        """The role of a new conversation of ``policy``: ``agent`` (checked against the
        declared roles), else the one role ``policy`` plays, else "" (unknown)."""
        if agent is None:
            played = [r for r, p in self.roles.items() if p == policy]
            return played[0] if len(played) == 1 else ""
        if agent and self.roles and self.roles.get(agent) != policy:
            raise WorkflowError(f"role {agent!r} is not played by policy {policy!r} in this "
                                f"episode; roles: " + ", ".join(
                                    f"{r}={p}" for r, p in self.roles.items()))
        return agent

    def conversation(self, messages: Sequence[ChatMessage | Mapping[str, Any]] | str | None = None,
                     *, policy: str | None = None, agent: str | None = None) -> Conversation:
        """Start a conversation (default messages: the task's prompt) for ``policy``, played
        as role ``agent`` (see :meth:`agent_of`)."""
        policy = policy or self.policy
        self.runtime.check_policy(policy)
        conv = Conversation(self, policy, as_messages(self.task.prompt if messages is None
                                                      else messages),
                            agent=self.agent_of(policy, agent))
        self.conversations.append(conv)
        return conv

    async def generate(self, *, policy: str | None = None,
                       messages: Sequence[ChatMessage | Mapping[str, Any]] | str | None = None,
                       agent: str | None = None, **sampling: Any) -> Generation:
        """One assistant turn for ``messages`` (default: the task's prompt) by ``policy`` as
        role ``agent``; continue it with ``gen.conversation``."""
        return await self.conversation(messages, policy=policy,
                                       agent=agent).generate(**sampling)

    async def call_tool(self, name: str,
                        arguments: Mapping[str, Any] | Sequence[Any] | None = None, *,
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
        if overrides:
            p = self.sampling(overrides)
            req = GenRequest(prompt_ids=list(prompt_ids),
                             max_new_tokens=int(p["max_new_tokens"]),
                             temperature=float(p["temperature"]), top_p=float(p["top_p"]),
                             stop=tuple(p["stop"]), stop_token_ids=tuple(p["stop_token_ids"]))
        else:  # the configured defaults, converted once per runtime
            req = self.runtime.default_request(prompt_ids)
        start = time.monotonic()
        result = await self.runtime.batcher(policy).generate(req)
        self.timings["generate"] += time.monotonic() - start
        return result
