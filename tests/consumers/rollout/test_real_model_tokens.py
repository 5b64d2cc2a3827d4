"""Token-exact trajectories with a real BPE tokenizer and chat template (SmolLM2-135M-Instruct,
imported from its gguf once per machine): what the engine sampled is what the trainer trains,
turn after turn, and the engine's logprobs are the trainer model's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any, Path]:
    import torch

    from astraflow.models.importer import cached_shortcut
    from astraflow.models.tiny import load

    folder = cached_shortcut("smollm2-135m-instruct")
    torch.set_num_threads(2)
    model, tok = load(folder)
    return model.eval(), tok, folder


def _episode(model: Any, tok: Any) -> Any:
    """Two assistant turns with a user turn between them, sampled at temperature 1."""
    from astraflow.consumers.rollout.engines.hf import HFEngine
    from astraflow.consumers.rollout.runtime import Runtime
    from astraflow.core.records import ChatMessage, Task

    engine = HFEngine(model=model, tokenizer=tok, max_batch_size=4, seed=3)
    task = Task(id="t", dataset="d", prompt=[ChatMessage(role="user",
                                                         content="What is 3 + 4?")],
                reference={"answer": "7"}, workflow="single_turn", n_samples=1)

    async def go() -> Any:
        from astraflow.consumers.rollout.context import EpisodeContext

        rt = Runtime.create({"default": engine},
                            sampling={"temperature": 1.0, "max_new_tokens": 12})
        try:
            ctx = EpisodeContext(rt, task, 0)
            conv = ctx.conversation()
            first = await conv.generate()
            added = conv.add(ChatMessage(role="user", content="Are you sure? Only the number."))
            second = await conv.generate()
            return conv, first, added, second, conv.finish(1.0)
        finally:
            await rt.close()

    return asyncio.run(go())


def test_a_multi_turn_episode_trains_exactly_the_rendered_and_sampled_tokens(
        smollm2: tuple[Any, Any, Path]) -> None:
    from astraflow.core.records import ChatMessage
    from astraflow.models.prompt import render_prompt

    model, tok, _ = smollm2
    conv, first, added, second, draft = _episode(model, tok)
    _, prompt_ids = render_prompt(tok, [ChatMessage(role="user", content="What is 3 + 4?")])
    # the trainer's tokens: the rendered prompt, the sampled ids, the appended user turn's
    # ids, the sampled ids again; only the sampled ones are trained
    assert draft.token_ids == prompt_ids + first.token_ids + added + second.token_ids
    assert draft.loss_mask == ([0] * len(prompt_ids) + [1] * len(first.token_ids)
                               + [0] * len(added) + [1] * len(second.token_ids))
    assert draft.prompt_len == len(prompt_ids)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == eos
    # the appended turn is laid out as the chat template lays it out: it closes the first
    # assistant turn (with <|im_end|> when the model did not write it itself), opens the user
    # turn, and ends with the generation prompt of the next assistant turn
    text = tok.decode(added, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n"), text
    assert "<|im_start|>user\nAre you sure? Only the number.<|im_end|>" in text
    if first.token_ids[-1] == eos:
        assert not text.startswith("<|im_end|>")
    else:  # cut at max_new_tokens: the template's end of turn is added (masked 0)
        assert text.startswith("<|im_end|>")
    # and the whole conversation decodes to the chat template's own rendering of it when
    # every turn ended with the end-of-turn token
    if first.token_ids[-1] == eos and second.token_ids[-1] == eos:
        rendered = tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in conv.messages], tokenize=False)
        assert tok.decode(draft.token_ids, skip_special_tokens=False) == rendered.rstrip("\n")


def test_the_engine_logprobs_are_a_teacher_forced_forward_of_the_trainer_model(
        smollm2: tuple[Any, Any, Path]) -> None:
    import torch

    from astraflow.models.tiny import load

    model, tok, folder = smollm2
    *_, draft = _episode(model, tok)
    trainer_model, _ = load(folder)  # the trainer loads the same folder on its own
    ids = torch.tensor([draft.token_ids])
    with torch.no_grad():
        logits = trainer_model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    sampled = [i for i, m in enumerate(draft.loss_mask) if m]
    assert len(sampled) >= 2
    got = torch.tensor([draft.logprobs[i] for i in sampled])
    want = logp[[i - 1 for i in sampled]]
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
    assert all(v == 0 for v in (draft.versions[i] for i in sampled))  # version 0
