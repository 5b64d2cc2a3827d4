"""The hf engine: behaviour logprobs equal a teacher-forced forward pass; stops, lengths, and a
weight version applied between two decoding steps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from astraflow.consumers.rollout.engines import GenRequest, build_engine
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.consumers.rollout.engines.sampling import StopChecker, sample
from astraflow.core.bus import Bus
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore

TOL = 1e-4  # fp32, batched + KV cache vs one unpadded forward


@pytest.fixture(scope="module")
def engine(arith_dir: Path) -> HFEngine:
    return build_engine("hf", model_path=arith_dir, threads=1, seed=1)  # type: ignore[return-value]


def teacher_forced(engine: HFEngine, prompt: list[int], tokens: list[int], temperature: float,
                   top_p: float) -> list[float]:
    """Logprob of each token under the sampling distribution, from one full forward pass."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    out = []
    for j, tok in enumerate(tokens):
        row = logits[len(prompt) - 1 + j]
        t = temperature if temperature > 0 else 1.0
        lp = torch.log_softmax(row / t, -1)
        if top_p < 1 and temperature > 0:
            probs, order = lp.exp().sort(descending=True)
            keep = order[(probs.cumsum(-1) - probs) < top_p]
            masked = torch.full_like(lp, float("-inf"))
            masked[keep] = lp[keep]
            lp = torch.log_softmax(masked, -1)
        out.append(lp[tok].item())
    return out


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8),
                                                    (0.0, 1.0)])
def test_logprobs_equal_teacher_forcing(engine: HFEngine, temperature: float,
                                        top_p: float) -> None:
    tok = engine.tokenizer
    prompts = [tok(t)["input_ids"] for t in ("1+1=", "12+34=", "987*6=", "5-55=", "3=")]
    reqs = [GenRequest(p, max_new_tokens=6, temperature=temperature, top_p=top_p)
            for p in prompts]
    results = engine.generate(reqs)
    assert len(results) == len(reqs)
    generated = 0
    for p, r in zip(prompts, results, strict=True):
        assert 1 <= len(r.token_ids) <= 6
        assert len(r.logprobs) == len(r.token_ids) == len(r.versions)
        ref = teacher_forced(engine, p, r.token_ids, temperature, top_p)
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < TOL
        generated += len(r.token_ids)
        if temperature == 0:  # greedy: each token is the argmax of the teacher-forced logits
            with torch.inference_mode():
                logits = engine.model(input_ids=torch.tensor([p + r.token_ids])).logits[0]
            argmax = logits[len(p) - 1:len(p) - 1 + len(r.token_ids)].argmax(-1).tolist()
            assert argmax == r.token_ids
    assert generated > len(prompts)


def test_top_p_samples_only_inside_the_nucleus() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]] * 4000)
    g = torch.Generator().manual_seed(0)
    toks, lps = sample(logits, torch.full((4000,), 1.0), torch.full((4000,), 0.7), g)
    probs = torch.softmax(logits[0], -1)
    assert probs[0] < 0.7 < probs[0] + probs[1]  # the nucleus is the two best tokens
    assert set(toks.tolist()) == {0, 1}
    renorm = probs[:2] / probs[:2].sum()
    assert torch.allclose(lps[toks == 0][0].exp(), renorm[0])
    assert torch.allclose(lps[toks == 1][0].exp(), renorm[1])


def test_max_tokens_and_context_limit(engine: HFEngine) -> None:
    tok = engine.tokenizer
    short = GenRequest(tok("1+1=")["input_ids"], max_new_tokens=1, stop_token_ids=())
    # the model has 64 positions: a 62-token prompt leaves room for 2 tokens
    long_prompt = tok("1" * 61)["input_ids"]
    assert len(long_prompt) == 62
    full = GenRequest(tok("1" * 63)["input_ids"], max_new_tokens=5)
    r_short, r_long, r_full = engine.generate(
        [short, GenRequest(long_prompt, max_new_tokens=50), full])
    assert len(r_short.token_ids) == 1
    assert len(r_long.token_ids) <= 2
    if len(r_long.token_ids) == 2:
        assert r_long.finish_reason == "length"
    assert r_full.token_ids == [] and r_full.finish_reason == "length"


def test_stop_strings_match_across_tokens(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    ids = tok("say <tool>x</tool", add_special_tokens=False)["input_ids"]
    checker = StopChecker(tok, ["</tool>"], [tok.eos_token_id])
    assert not checker.hit(ids)
    assert checker.hit(ids + tok(">", add_special_tokens=False)["input_ids"])
    assert checker.hit([*ids, tok.eos_token_id])
    # special tokens are not text: "<pad>" holds an "a" but does not stop at "a"
    assert not StopChecker(tok, ["a"], []).hit([tok.pad_token_id])
    assert StopChecker(tok, ["<pad>"], []).hit([tok.pad_token_id])


def test_stop_string_ends_generation(ascii_dir: Path) -> None:
    """Any stop string the random model happens to write ends its sequence right there."""
    engine = build_engine("hf", model_path=ascii_dir, threads=1, seed=3)
    tok = engine.tokenizer
    stops = ("a", "e", "o")
    rs = engine.generate([GenRequest(tok("hello")["input_ids"], max_new_tokens=40,
                                     stop=stops) for _ in range(16)])
    stopped = 0
    for r in rs:
        text = tok.decode(r.token_ids, skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s in text]
        if hits:  # the first stop string is at the very end: nothing generated after it
            assert min(hits) == len(text) - 1
            assert r.finish_reason == "stop"
            stopped += 1
    assert stopped > 0


def test_weight_update_between_steps_changes_later_versions_only(
        arith_dir: Path, bus: Bus, tmp_path: Path) -> None:
    """Version 1 is published while a batch decodes; it lands at a step boundary: tokens before
    it keep version 0, tokens after it carry version 1, and the model holds the new weights."""
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.models.tiny import load
    from astraflow.weights.syncer import Syncer

    engine = build_engine("hf", model_path=arith_dir, threads=1)
    trainer, _ = load(arith_dir)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    store = FileStore(tmp_path / "weights")
    follower = WeightFollower(Syncer(bus, run="w", policy="default", store=store,
                                     target=engine.weight_target()), engine=engine)
    pub = Publisher(bus, run="w", policy="default", store=store)
    pub.publish(trainer.state_dict(), 1)
    pub.flush()

    fired = threading.Event()
    syncing: list[threading.Thread] = []

    def hook(step: int) -> None:  # runs in the decode thread, between steps
        if step == 2 and not syncing:
            t = threading.Thread(target=follower.sync_now, kwargs={"timeout": 10})
            syncing.append(t)
            t.start()
            # wait until the update is queued for this boundary (no sleep for correctness)
            deadline = 100_000
            while not engine.gate._pending and deadline:
                deadline -= 1
                threading.Event().wait(0.001)
            fired.set()

    engine.step_hook = hook
    tok = engine.tokenizer
    reqs = [GenRequest(tok("11+22=")["input_ids"], max_new_tokens=6, stop_token_ids=(),
                       temperature=1.0) for _ in range(4)]
    # no stop at EOS would still stop; force long sequences by removing EOS from the stop set
    engine.eos = set()
    results = engine.generate(reqs)
    syncing[0].join(10)
    assert fired.is_set()
    for r in results:
        assert len(r.token_ids) == 6
        assert r.versions == [0, 0, 1, 1, 1, 1]  # steps 0 and 1 before, 2.. after
    assert engine.version == 1 and follower.syncer.version == 1
    for name, p in engine.model.state_dict().items():
        want = trainer.state_dict()[name].to(torch.bfloat16).float()
        assert torch.equal(p, want), name  # the rollout runs on the bf16-rounded weights
    follower.close()
    pub.close()


def test_the_eos_ids_include_the_generation_configs_end_of_turn_tokens() -> None:
    """An instruct model's generation config may name more stop tokens than its tokenizer
    (Qwen2.5-Instruct: <|im_end|> and <|endoftext|>); generation stops at any of them."""
    from types import SimpleNamespace

    from astraflow.consumers.rollout.engines.sampling import eos_ids

    tok = SimpleNamespace(eos_token_id=151645)
    assert eos_ids(tok, SimpleNamespace(eos_token_id=151643),
                   SimpleNamespace(eos_token_id=[151645, 151643])) == {151643, 151645}
    assert eos_ids(tok, None, SimpleNamespace(eos_token_id=None)) == {151645}


def test_decoding_time_counts_overlapping_engines_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker with an engine per policy decodes with both at once: its time.generate_s is
    # the wall time any of them decoded, not the sum of their busy seconds
    from astraflow.consumers.rollout.engines import hf

    clock = [100.0]
    monkeypatch.setattr(hf.time, "monotonic", lambda: clock[0])
    decoding = hf.Decoding()
    decoding.enter()           # t=100: the solver's engine starts
    clock[0] = 101.0
    decoding.enter()           # t=101: the verifier's too
    clock[0] = 103.0
    decoding.leave()           # t=103: one stops, the other goes on
    assert decoding.seconds() == 3.0
    clock[0] = 104.0
    decoding.leave()           # t=104: both idle
    clock[0] = 110.0
    decoding.enter()           # t=110..112: one alone
    clock[0] = 112.0
    decoding.leave()
    clock[0] = 120.0
    assert decoding.seconds() == 6.0  # 4 + 2, the idle stretches left out


def test_engines_of_one_process_share_its_decoding_time(engine: HFEngine) -> None:
    from astraflow.consumers.rollout.engines import hf

    before, mine = hf.DECODING.seconds(), engine.busy_seconds()
    engine.generate([GenRequest(prompt_ids=[1, 2, 3], max_new_tokens=4, temperature=0.0)])
    spent = engine.busy_seconds() - mine
    assert spent > 0 and hf.DECODING.seconds() - before == pytest.approx(spent, abs=0.05)


def test_bf16_autocast_decodes_in_bf16_and_samples_from_fp32_logits(arith_dir: Path) -> None:
    # rollout.engine.mixed_precision: bf16: the forward's products in bf16 (the weights stay
    # fp32), the logits back in fp32; its logprobs match a bf16-autocast teacher-forced pass
    with pytest.raises(Exception, match="'no' or 'bf16'"):
        build_engine("hf", model_path=arith_dir, mixed_precision="fp8")
    eng = build_engine("hf", model_path=arith_dir, threads=1, seed=1, mixed_precision="bf16")
    assert {p.dtype for p in eng.model.parameters()} == {torch.float32}
    seen: list[torch.dtype] = []
    hook = eng.model.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: seen.append(out.dtype))
    tok = eng.tokenizer
    prompts = [tok(t)["input_ids"] for t in ("1+1=", "12+34=", "987*6=")]
    try:
        results = eng.generate([GenRequest(p, max_new_tokens=5, temperature=1.0)
                                for p in prompts])
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    for p, r in zip(prompts, results, strict=True):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = eng.model(input_ids=torch.tensor([p + r.token_ids])).logits[0].float()
        want = [torch.log_softmax(logits[len(p) - 1 + j], -1)[t].item()
                for j, t in enumerate(r.token_ids)]
        assert r.logprobs == pytest.approx(want, abs=0.1)
