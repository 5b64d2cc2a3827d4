"""The HTTP API's request and response bodies (OpenAI's shapes), as pydantic models: FastAPI
validates requests with them and publishes them in the OpenAPI schema.

Unknown top-level request fields are refused (400, ``unknown_parameter``), as OpenAI's API
does; fields inside a message are read leniently (an SDK echoing a response message back may
add ``refusal``, ``annotations``, ...). Besides OpenAI's fields, the vLLM/SGLang extensions
that the ``openai`` rollout engine sends are taken (``return_token_ids``, ``stop_token_ids``,
``skip_special_tokens``, ``include_stop_str_in_output``, ...); sampling fields the engine cannot
honour with exact behaviour logprobs are taken only at their neutral value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import Strict as PydanticStrict

#: the largest integer a request's count, index or token id may be (the records hold 32 bits);
#: a larger one is a 400 naming the field, never an overflow deeper in
MAX_INT = 2**31 - 1
Int = Annotated[int, Field(ge=-MAX_INT - 1, le=MAX_INT)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- requests -----------------------------------------------------------------------------------

class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str


class ToolCall(Lenient):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(Lenient):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(Lenient):
    include_usage: bool | None = None


class Sampling(Strict):
    """Fields shared by both routes."""

    model: str | None = Field(None, description="a policy (or alias); absent: the first "
                                                "policy served")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=128)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: Int | None = None  # taken, not honoured: the engine has one generator
    user: str | None = None
    frequency_penalty: float | None = None  # 0 only
    presence_penalty: float | None = None  # 0 only
    # vLLM / SGLang extensions (what the `openai` rollout engine sends)
    top_k: Int | None = None  # -1 or 0 only
    min_p: float | None = None  # 0 only
    repetition_penalty: float | None = None  # 1 only
    stop_token_ids: list[Int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    no_stop_trim: bool | None = None
    return_token_ids: bool | None = None


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # taken; one call per turn (generation stops at it)
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionRequest(Sampling):
    prompt: str | list[Int] = Field(description="text, or token ids (token-in)")
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None  # false only
    suffix: str | None = None  # null only
    best_of: Int | None = None  # 1 only
    return_tokens_as_token_ids: bool | None = None


class SessionRequest(Strict):
    session_id: str | None = Field(None, description="default: a new random id")
    task_id: str | None = None
    group_id: str | None = None
    sample_index: int = Field(0, ge=0, le=MAX_INT)
    group_size: int | None = Field(None, ge=1, le=MAX_INT,
                                   description="samples in the group (absent: 1)")
    agent: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)


#: a reward: a finite JSON number (``true`` or ``"1.5"`` is a 400, not 1.0 or 1.5: a client
#: that sends those has a bug the trainer should not average over)
Number = Annotated[float, PydanticStrict(), Field(allow_inf_nan=False)]


class RewardRequest(Strict):
    reward: Number
    rewards: dict[str, Number] = Field(default_factory=dict)


class EndRequest(Strict):
    reward: Number | None = Field(None, description="the reward, if not given before")
    rewards: dict[str, Number] = Field(default_factory=dict)


# -- responses ----------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class SessionInfo(BaseModel):
    id: str
    task_id: str
    group_id: str
    sample_index: int
    group_size: int
    agent: str
    calls: int
    drift: int = Field(description="calls whose history differed from what was served "
                                   "(an edited reply or message): each one counted")
    branches: int = Field(0, description="calls that went back to an earlier call (a retry "
                                         "of a turn); the newest decides the trajectory")
    segments: dict[str, int]
    reward: float | None
    ended: bool
    done: bool
    end_reason: Literal["", "abandoned"] = Field(
        "", description="abandoned: ended by the gateway, idle past "
                        "gateway.session_idle_timeout_s")
    trajectories: int = 0
