"""docs/after-the-run.md, done as the page says: the page's own code blocks and commands, run on
a final model folder. Quick: folders exported from a tiny model's checkpoints (full weights and
a LoRA adapter). Slow: what a real `astraflow run` leaves on the quickstart's tiny model, and a
LoRA checkpoint of SmolLM2-135M-Instruct exported as a run's end exports it. `vllm serve` is not run (vLLM is not installed here): the
files it reads are checked instead."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_helpers import check_finished, run_astraflow

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "after-the-run.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)

# the paths and the question the page's blocks are written with
SMOL_FINAL = "runs/smollm2_chain_sum/final/default"
QUICK_FINAL = "runs/quickstart/final/default"
EVAL_OUT = "runs/quickstart-final-eval"
SMOL_QUESTION = "State the final answer to the following arithmetic problem: 8 - 3 ="
# what the files of a final folder must be for transformers and `vllm serve`
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja"}
# the page's bound on peft's logits against the merged folder's (float32 rounding)
APART_ATOL = 5e-4


def page_block(lang: str, containing: str) -> str:
    """The one ``lang`` code block of the page that contains ``containing``."""
    found = [body for kind, body in FENCE.findall(PAGE.read_text())
             if kind == lang and containing in body]
    assert len(found) == 1, f"{len(found)} {lang} blocks of {PAGE.name} contain {containing!r}"
    return found[0]


def substituted(block: str, subs: dict[str, str]) -> str:
    """``block`` with each of the page's strings replaced by the test's (each must be there)."""
    for old, new in subs.items():
        assert old in block, f"the page's block no longer has {old!r}:\n{block}"
        block = block.replace(old, new)
    return block


def run_python(block: str) -> dict[str, Any]:
    """Execute a page's Python block; returns its variables."""
    names: dict[str, Any] = {"__name__": "after_the_run_page"}
    exec(compile(block, str(PAGE), "exec"), names)  # noqa: S102 - the page's own code
    return names


def astraflow_lines(block: str) -> Iterator[list[str]]:
    """The ``astraflow`` commands of a bash block, as argv run by this Python."""
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line)
        if argv and argv[0] == "astraflow":
            yield [sys.executable, "-m", "astraflow.cli.app", *argv[1:]]


def shell(line: str) -> str:
    """One bash line of the page (this Python first on PATH); returns its stdout."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def generate(folder: Path, question: str, max_new_tokens: int) -> dict[str, Any]:
    """The page's transformers block on ``folder``, asked ``question``."""
    block = page_block("python", "AutoTokenizer.from_pretrained(folder)")
    subs = {SMOL_FINAL: str(folder)}
    if question != SMOL_QUESTION:
        subs[SMOL_QUESTION] = question
    if max_new_tokens != 16:
        subs["max_new_tokens=16"] = f"max_new_tokens={max_new_tokens}"
    return run_python(substituted(block, subs))


def check_prompt_is_the_roles(names: dict[str, Any]) -> None:
    """The page's prompt ids are those the roles render (astraflow.models.prompt)."""
    from astraflow.core.records import ChatMessage
    from astraflow.models.prompt import render_prompt

    messages = [ChatMessage(role=m["role"], content=m["content"]) for m in names["messages"]]
    _, ids = render_prompt(names["tokenizer"], messages)
    assert names["inputs"]["input_ids"][0].tolist() == ids


def vllm_reads(folder: Path, architecture: str) -> None:
    """What the page says `vllm serve` reads from a final folder is there and is what
    transformers loaded."""
    assert {f.name for f in folder.iterdir()} >= MODEL_FILES, sorted(folder.iterdir())
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert (folder / "chat_template.jinja").read_text().strip()
    assert "eos_token_id" in json.loads((folder / "generation_config.json").read_text())
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}, dtypes


def tiny_checkpoint(tmp_path: Path, *, lora: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """A tiny arithmetic model's folder and a trainer checkpoint of it (:func:`checkpoint_of`);
    returns (base folder, checkpoint)."""
    from astraflow.models.tiny import build_model, build_tokenizer, save

    base = tmp_path / "base"
    tok = build_tokenizer("arith")
    save(build_model(tok, seed=0), tok, base)
    return base, checkpoint_of(tmp_path, base, lora)


def checkpoint_of(tmp_path: Path, base: Path, lora: dict[str, Any] | None) -> Path:
    """A trainer checkpoint of ``base`` with its trained weights moved as a step would move
    them (a LoRA one: its adapter, moved off zero)."""
    import torch

    from astraflow.consumers.trainer.build import build_train_state
    from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointMeta
    from astraflow.consumers.trainer.config import TrainerConfig

    state = build_train_state(TrainerConfig(device="cpu", lora=lora), base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in state.model.named_parameters():
            if p.requires_grad and (lora is None or "lora_B" in name):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return CheckpointDir(tmp_path / "ck", run="r", policy="default").save(
        state.model, state.optimizer, CheckpointMeta(version=1))


def test_the_page_loads_and_generates_with_a_tiny_final_folder(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from astraflow.run.launch import export_model

    base, ck = tiny_checkpoint(tmp_path)
    final = export_model(ck, base, tmp_path / "final" / "default")
    vllm_reads(final, "Qwen2ForCausalLM")
    names = generate(final, "12+34=", 4)
    check_prompt_is_the_roles(names)
    assert isinstance(names["reply"], str) and set(names["reply"]) <= set("0123456789+-*=")
    assert type(names["tokenizer"]).__name__ == "Qwen2Tokenizer"  # AutoTokenizer's choice...
    exact = PreTrainedTokenizerFast.from_pretrained(final)
    assert exact(names["text"]).input_ids == names["inputs"]["input_ids"][0].tolist()  # ...same ids
    loaded = run_python(substituted(page_block("python", "astraflow.models.load"),
                                    {QUICK_FINAL: str(final)}))
    assert loaded["tokenizer"].padding_side == "left"
    assert loaded["model"].config.architectures == ["Qwen2ForCausalLM"]


def test_autotokenizer_drops_the_newline_of_a_tiny_team_model(tmp_path: Path) -> None:
    """The page's caveat: the tiny models whose alphabet has a newline lose it under
    AutoTokenizer; PreTrainedTokenizerFast takes the tokenizer as saved."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from astraflow.models.tiny import build_model, build_tokenizer, save

    tok = build_tokenizer("team")
    folder = save(build_model(tok), tok, tmp_path / "team")
    text = "12+34=46\nno"
    exact = PreTrainedTokenizerFast.from_pretrained(folder)
    assert exact(text).input_ids == tok(text).input_ids
    assert exact.decode(exact(text).input_ids, skip_special_tokens=True) == text
    auto = AutoTokenizer.from_pretrained(folder)
    assert auto.decode(auto(text).input_ids, skip_special_tokens=True) == "12+34=46no"


def test_a_lora_export_keeps_the_adapter_apart_beside_the_merged_model(
        tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from astraflow.run.launch import export_model

    r, alpha = 4, 8.0
    base, ck = tiny_checkpoint(tmp_path, lora={"r": r, "alpha": alpha,
                                               "target_modules": ["q_proj", "v_proj"]})
    old = os.umask(0o022)
    try:
        final = export_model(ck, base, tmp_path / "final" / "default", lora_scale=alpha / r)
    finally:
        os.umask(old)
    adapter = final / "adapter"
    assert {f.name for f in adapter.iterdir()} == {"adapter_model.safetensors",
                                                   "adapter_config.json"}
    # readable by a server run as another user, like every file the user writes
    assert {oct(f.stat().st_mode & 0o777) for f in final.rglob("*") if f.is_file()} == {"0o644"}
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]) == (r, alpha, ["q_proj", "v_proj"])
    assert cfg["base_model_name_or_path"] == str(base.resolve())
    # the page's line that finds the base for `vllm serve --enable-lora`
    line = next(x for x in page_block("bash", "--enable-lora").splitlines() if "BASE=" in x)
    out = shell(substituted(line, {SMOL_FINAL: str(final)}) + '\necho "$BASE"')
    assert out.strip() == str(base.resolve())

    names = run_python(substituted(page_block("python", "PeftModel.from_pretrained"),
                                   {f"{SMOL_FINAL}/adapter": str(adapter)}))
    merged = AutoModelForCausalLM.from_pretrained(final).eval()
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    ids = torch.tensor([[1, 4, 5, 13, 6, 7, 16]])
    with torch.no_grad():
        apart = names["model"].eval()(input_ids=ids).logits
        got, untouched = merged(input_ids=ids).logits, plain(input_ids=ids).logits
    assert (apart - got).abs().max() < 1e-5
    assert (untouched - got).abs().max() > 1e-3  # the adapter is in both, not in neither


@pytest.mark.slow  # a 2-step quickstart run and an evaluation: 93-100 s on 2 busy shared cores
@pytest.mark.timeout(600)
def test_a_quickstart_run_leaves_a_model_to_load_describe_and_evaluate(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["trainer.max_steps=2", "launch.warmup.steps=0", "launch.evaluate=false"]
    rc, output = run_astraflow(
        ["run", str(ROOT / "examples" / "quickstart.yaml"), "--out", str(out), "--no-live",
         *[a for s in sets for a in ("--set", s)]], out, timeout=400)
    check_finished(out, rc, output, steps=2, per_step=64 * 8)
    final = out / "final" / "default"
    vllm_reads(final, "Qwen2ForCausalLM")
    assert not (final / "adapter").exists()

    names = generate(final, "12+34=", 4)
    check_prompt_is_the_roles(names)
    assert isinstance(names["reply"], str)

    (describe,) = astraflow_lines(substituted(page_block("bash", "models describe"),
                                              {QUICK_FINAL: str(final)}))
    said = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert said.returncode == 0, said.stderr
    assert " ".join(said.stdout.split()) == (f"model folder {final}, Qwen2ForCausalLM, 0.5M "
                                             "parameters")

    evaluate = substituted(page_block("bash", "astraflow evaluate"),
                           {QUICK_FINAL: str(final), EVAL_OUT: str(tmp_path / "eval")})
    outputs = []
    for argv in astraflow_lines(evaluate):
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert re.search(r"^version 0: accuracy [01]\.\d{4} \(500 problems, [\d.]+s\)$",
                     outputs[-1], re.M), outputs[-1]


@pytest.mark.slow  # SmolLM2 loaded three times (trainer, merged, apart): 28 s here
@pytest.mark.timeout(600)
def test_a_smollm2_lora_export_leaves_the_adapter_merged_and_apart(tmp_path: Path) -> None:
    """The page's LoRA command's trainer settings on SmolLM2-135M-Instruct, its checkpoint
    (the adapter moved off zero, as a step would) exported as `astraflow run` exports it at
    the end; then the page's code on the folder. The run itself is the LoRA e2e test's (tiny
    model) and the SmolLM2 e2e test's (the same roles on this model)."""
    import torch

    from astraflow.config import load_experiment
    from astraflow.models.importer import cached_shortcut
    from astraflow.run.launch import export_model

    smollm2 = cached_shortcut("smollm2-135m-instruct")  # imported once per machine
    (command,) = astraflow_lines(page_block("bash", "astraflow run"))
    sets = [a for f, a in zip(command, command[1:], strict=False) if f == "--set"]
    config = Path(command[4])
    lora = load_experiment(ROOT / config, sets).trainer_for("default").lora
    assert lora is not None and (lora.r, lora.alpha) == (8, 16.0)
    ck = checkpoint_of(tmp_path, smollm2, lora.model_dump())
    final = export_model(ck, smollm2, tmp_path / "final" / "default",
                         lora_scale=lora.alpha / lora.r)
    vllm_reads(final, "LlamaForCausalLM")

    names = generate(final, SMOL_QUESTION, 16)
    check_prompt_is_the_roles(names)
    assert names["tokenizer"].decode(names["inputs"]["input_ids"][0]).startswith(
        "<|im_start|>system\n")
    assert isinstance(names["reply"], str) and names["reply"]
    merged = names["model"].eval()
    inputs = names["inputs"]
    del names

    adapter = final / "adapter"
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(smollm2.resolve())
    assert (cfg["r"], cfg["lora_alpha"]) == (8, 16.0) and cfg["r"] <= 16  # vLLM's default max
    assert cfg["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    line = next(x for x in page_block("bash", "--enable-lora").splitlines() if "BASE=" in x)
    out_base = shell(substituted(line, {SMOL_FINAL: str(final)}) + '\necho "$BASE"')
    assert out_base.strip() == str(smollm2.resolve())

    apart = run_python(substituted(page_block("python", "PeftModel.from_pretrained"),
                                   {f"{SMOL_FINAL}/adapter": str(adapter)}))["model"].eval()
    with torch.no_grad():
        got = merged(**inputs).logits
        with apart.disable_adapter():
            base_logits = apart(**inputs).logits
        apart_logits = apart(**inputs).logits
    diff = (apart_logits - got).abs().max().item()
    moved = (base_logits - got).abs().max().item()
    print(f"SmolLM2 LoRA: |apart - merged| {diff:.3g}, |base - merged| {moved:.3g}")
    assert diff < APART_ATOL, diff
    assert moved > 100 * APART_ATOL, moved  # the adapter moved the model: the check means something
    assert type(merged).__name__ == "LlamaForCausalLM"  # the merged folder: a model of its own
