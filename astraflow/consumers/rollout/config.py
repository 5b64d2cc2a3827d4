"""Config section ``rollout``: the engine, workflow, reward, tools, concurrency, weight sync and
drain settings of rollout workers (docs/rollout.md has the full reference).

Only pydantic here: this module is imported by ``astraflow.config``, which ``astraflow --help``
loads, so it must stay light.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from astraflow.core.config import Section
from astraflow.core.errors import ConfigError
from astraflow.core.topics import check_group, group_name

SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "stop", "stop_token_ids")


class EngineConfig(Section):
    """The inference engine a worker hosts (one instance per policy it serves) and the default
    sampling parameters of every generation (a workflow may override them per call)."""

    @pydantic.field_validator("latency")
    @classmethod
    def _latency(cls, value: Any) -> Any:
        from astraflow.consumers.rollout.latency import parse_latency

        try:
            parse_latency(value, where="rollout.engine.latency")
        except ConfigError as e:  # reported with the section's other problems, at once
            raise ValueError("; ".join(getattr(e, "problems", None) or [str(e)])) from None
        return value

    type: Literal["hf", "vllm", "openai"] = pydantic.Field(
        "hf", description="hf: transformers in-process; vllm: in-process vLLM; openai: any "
                          "OpenAI-compatible /v1/completions server")
    temperature: float = pydantic.Field(
        1.0, ge=0.0, description="0 = greedy; the behaviour logprob is taken under the "
                                 "temperature-scaled (and top-p renormalised) distribution")
    top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    max_new_tokens: int = pydantic.Field(64, ge=1, description="per generation call")
    stop: list[str] = pydantic.Field(
        default_factory=list, description="stop strings (kept in the output, tokens and text)")
    stop_token_ids: list[int] = pydantic.Field(
        default_factory=list, description="extra stop token ids (the tokenizer's EOS always is)")
    device: str = pydantic.Field("cpu", description="hf/vllm: cpu, cuda, cuda:1, ...")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = pydantic.Field(
        "float32", description="dtype the model runs in (auto: the checkpoint's)")
    mixed_precision: Literal["no", "bf16"] = pydantic.Field(
        "no", description="hf: the forward under bf16 autocast (the weights stay in `dtype`, "
                          "the logits and logprobs fp32); on a CPU with bf16 matrix units it "
                          "can decode faster than fp32 where bf16 weights (`dtype: bfloat16`) "
                          "do not (bench/cpu_throughput.py measures autocast on a model)")
    adapters: list[str] = pydantic.Field(
        default_factory=list, description="hf: policies served as LoRA adapters of one shared "
        "base by one engine (their models the same base, their trainers trainer.lora): the "
        "base is loaded once, each request goes to its policy's adapter at that adapter's "
        "own version, rows of several adapters share a forward pass; the other policies get "
        "an engine each as before (docs/tutorials/several-models.md)")
    max_batch_size: int = pydantic.Field(
        64, ge=1, description="hf/vllm: sequences per batched forward; openai: requests in "
                              "flight to the server")
    threads: int | None = pydantic.Field(
        None, ge=1, description="torch intra-op threads for the hf engine on CPU (None: "
                                "torch's default; 1 is fastest for tiny models)")
    continuous: bool = pydantic.Field(
        False, description="hf: continuous batching (iteration-level scheduling): a request "
                           "joins the running batch at the next decoding step instead of "
                           "waiting for the batch to finish (episodes back from a tool call)")
    process: bool = pydantic.Field(
        False, description="hf on the CPU, static batching: decode in a process of its own, "
        "on weights shared with the worker's process, so that the worker's Python (episodes, "
        "records, the bus) does not take turns with the engine's under one interpreter lock "
        "(bench/rollout.py measures it); weight updates still land between decoding steps")
    latency: Any = pydantic.Field(
        None, description="emulated extra seconds per generate request, waited before the "
        "request reaches the engine without holding a core (a latency spec: a number, or "
        "{type: fixed|uniform|lognormal|trace|phases, ...} as for tool_latency): stands for a "
        "slower or remote inference server, e.g. to try the scaler on a laptop "
        "(bench/elastic.py); null: none")
    speed: float = pydantic.Field(
        1.0, gt=0.0, le=1.0, allow_inf_nan=False,
        description="run the engine at this fraction of its speed, standing in for a weaker "
        "GPU (heterogeneous workers): after each computation of t seconds (a batch; a decoding "
        "step of a continuous engine; a request of the openai engine) the engine stays busy, "
        "asleep, another t*(1/speed - 1) s; 1: full speed. Per worker under `astraflow run`: "
        "launch.rollout_speeds")
    seed: int = pydantic.Field(0, description="sampling seed of the engine")
    initial_version: int = pydantic.Field(
        0, description="policy version recorded for tokens generated before any weights were "
                       "received from weights.<policy>")
    model: str | None = pydantic.Field(
        None, description="model directory; default: the policy's models.<policy>.path")
    # openai engine
    base_url: str = pydantic.Field("http://127.0.0.1:8000",
                                   description="openai: server URL (without /v1)")
    served_model: str | None = pydantic.Field(
        None, description="openai: the `model` field of requests (default: not sent; the "
                          "server then uses its base model)")
    api_key: str | None = pydantic.Field(None, description="openai: bearer token")
    request_timeout: float = pydantic.Field(120.0, gt=0, description="openai: seconds")
    server: Literal["auto", "vllm", "sglang"] = pydantic.Field(
        "auto", description="openai: the server's kind (auto: GET /v1/models owned_by); "
                            "decides the server-specific request fields and logprob check")
    check_logprobs: bool = pydantic.Field(
        True, description="openai: fail a request whose logprobs the server reports under "
                          "another distribution than the sampling one (vLLM without "
                          "--logprobs-mode processed_logprobs; SGLang with top_p < 1); "
                          "false: warn once")
    admin: Literal["none", "sglang", "vllm", "custom"] = pydantic.Field(
        "none", description="openai: how new weights reach the server: none (server weights "
                            "are fixed), sglang (POST /update_weights_from_disk), vllm "
                            "(dev-mode /collective_rpc reload_weights, /reset_prefix_cache, "
                            "/update_weight_version), custom (POST admin_path with admin_body)")
    admin_path: str | None = pydantic.Field(
        None, description="openai, admin=custom: the endpoint path (required)")
    admin_timeout: float = pydantic.Field(
        1800.0, gt=0, description="openai: seconds a weight load may take (SGLang's waits for "
                                  "the requests in flight)")
    admin_body: dict[str, Any] = pydantic.Field(
        default_factory=lambda: {"weight_dir": "{path}"},
        description="openai, admin=custom: JSON body; '{path}' and '{version}' in string "
                    "values are replaced by the checkpoint directory and version")
    checkpoint_dir: str = pydantic.Field(
        "{out}/rollout-weights/{policy}",
        description="openai: where weight versions are written for the server to load "
                    "(must be readable by the server)")
    # vllm engine
    gpu_memory_utilization: float = pydantic.Field(0.85, gt=0, le=1, description="vllm")
    vllm_args: dict[str, Any] = pydantic.Field(default_factory=dict,
                                               description="vllm: extra vllm.LLM(...) arguments")
    update_chunk_mb: float = pydantic.Field(
        256.0, gt=0, description="vllm: at most this many MB of changed weights per "
                                 "collective_rpc call of a weight update (one larger tensor "
                                 "goes alone); bounds the host memory an update holds")


class RewardConfig(Section):
    """The reward: a registered name or a user's ``module.path:function``, with kwargs."""

    name: str = pydantic.Field("exact_match",
                               description="exact_match, numeric_match, math, code, "
                                           "reasoning_gym, or 'module:function'")
    kwargs: dict[str, Any] = pydantic.Field(default_factory=dict)
    timeout: float = pydantic.Field(
        30.0, gt=0, description="seconds; a reward that times out or raises scores 0 and "
                                "is counted (reward_failures)")
    extract: str = pydantic.Field(
        "none", description="answer extractor applied to the completion before the reward (the "
                            "trajectory keeps the whole completion): none, last_number, "
                            "first_word, first_line, last_line, answer_tag (inside the last "
                            "<answer>...</answer>), boxed (the last \\boxed{...}), or "
                            "'module:function' (text -> text)")
    truncated: Literal["score", "zero"] = pydantic.Field(
        "score", description="a trajectory with a reply the engine cut (finish reason "
        "`length`: max_new_tokens, or the model's context, reached before EOS or a stop "
        "string): score: the reward scores the cut text like any other (an extractor such as "
        "last_number takes whatever the cut text ends with); zero: the trajectory scores 0, "
        "whatever the reward says (overlong replies punished, as DAPO does), also when it is "
        "an earlier turn of a multi-turn episode that was cut (every generated token of a "
        "trajectory is trained on its reward; with turn_rewards, the cut turns' entries are "
        "0). Either way the trajectory's rewards carry truncated=1 and the worker counts the "
        "cut replies (replies_truncated, truncated_fraction). Default score: the reward runs "
        "gave before this option existed; the held-out evaluation scores the text either way")

    @pydantic.field_validator("extract")
    @classmethod
    def _extract(cls, value: str) -> str:
        from astraflow.consumers.rollout.rewards.extract import check_extractor

        return check_extractor(value)


class SandboxConfig(Section):
    """What the code sandbox (``code`` reward, ``python`` tool) accepts; limits: reward kwargs.

    Also read by the evaluator, which runs the reward too."""

    allow_same_uid: bool = pydantic.Field(
        False, description="run untrusted code as the worker's own uid where the sandbox "
        "cannot give it one of its own (a worker that is not root; as root, an interpreter "
        "other users cannot read), with a warning; false: such a run raises SandboxError (a "
        "counted reward failure). The code then still sees only its own root (system "
        "directories read-only, its work directory), not the run directory")


class WorkflowConfig(Section):
    default: str = pydantic.Field(
        "single_turn", description="workflow of tasks whose `workflow` is empty")
    kwargs: dict[str, dict[str, Any]] = pydantic.Field(
        default_factory=dict,
        description="keyword arguments per workflow name, e.g. multi_turn_tools: {max_turns: 4}")
    modules: list[str] = pydantic.Field(
        default_factory=list, description="modules imported at start (they may register "
                                          "workflows, rewards and tools by name)")
    allow_task_paths: bool = pydantic.Field(
        False, description="let a task's `workflow` name any 'module:function' (imports and "
                           "runs code the tasks topic names: only for trusted task sources); "
                           "false: registered names and the ones this section names")


class WeightSyncConfig(Section):
    """Whether and how often a worker looks at ``weights.<policy>``; where blobs come from
    (store, fetch, cache, rate limit) is the ``weights`` section's."""

    enabled: bool = True
    poll_interval: float = pydantic.Field(0.5, gt=0, description="seconds between looks at "
                                                                 "the weights topic")


class RolloutConfig(Section):
    """Rollout workers: engine, workflow, reward, sandbox, tools, concurrency, weights, drain."""

    engine: EngineConfig = EngineConfig()
    workflow: WorkflowConfig = WorkflowConfig()
    reward: RewardConfig = RewardConfig()
    sandbox: SandboxConfig = SandboxConfig()
    tools: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra tools: name -> 'module:function'")
    tool_timeout: float = pydantic.Field(10.0, gt=0, description="default seconds per tool call")
    policies: list[str] | None = pydantic.Field(
        None, description="policies this worker hosts engines for (default: all policies)")
    max_concurrent_episodes: int = pydantic.Field(
        32, ge=1, description="episodes (task samples) in flight in one worker")
    episode_timeout: float | None = pydantic.Field(
        600.0, gt=0, description="seconds; an episode past it ends as finish_reason=timeout")
    session_timeout: float = pydantic.Field(
        10.0, gt=0, description="seconds without a heartbeat before the group gives this "
                                "worker's partitions to the others")
    drain_timeout: float = pydantic.Field(
        30.0, ge=0, description="on SIGTERM: seconds to finish in-flight episodes; the rest "
                                "are released (not committed) for another worker")
    poll_timeout: float = pydantic.Field(0.1, gt=0, description="seconds per poll of `tasks`")
    commit_interval: float = pydantic.Field(
        0.2, gt=0, description="seconds between flush+commit of finished tasks")
    metrics_interval: float = pydantic.Field(2.0, gt=0, description="seconds between heartbeats")
    group: str | None = pydantic.Field(
        None, description="consumer group on `tasks`; null: the run's rollout group "
                          "af.<run>.rollout (two runs on one cluster never share it)")
    weights: WeightSyncConfig = WeightSyncConfig()

    @pydantic.field_validator("group")
    @classmethod
    def _group(cls, group: str | None) -> str | None:
        try:
            return None if group is None else check_group(group)
        except ConfigError as e:  # pydantic collects ValueErrors with the key's path
            raise ValueError("; ".join(e.problems)) from None

    def group_for(self, run: str) -> str:
        """The consumer group the workers of run ``run`` join on `tasks`."""
        return self.group or group_name(run, "rollout")
