from __future__ import annotations

from pathlib import Path

import pytest
import torch

from astraflow.core.errors import ConfigError
from astraflow.models.tiny import build_model, build_tokenizer, load, save


def test_tokenizer_is_character_level_with_bos_and_clean_decoding() -> None:
    tok = build_tokenizer("arith")
    assert len(tok) == 17
    ids = tok("12+7=")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 6
    assert tok.decode(ids, skip_special_tokens=True) == "12+7="
    batch = tok(["1+1=", "10+10="], padding=True)["input_ids"]
    assert batch[0][0] == tok.pad_token_id  # left padding
    text = tok.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False)
    assert text == "3+4="


def test_ascii_tokenizer_round_trips_text_with_spaces() -> None:
    tok = build_tokenizer("ascii")
    s = 'call {"x": 1}\nok'
    assert tok.decode(tok(s)["input_ids"], skip_special_tokens=True) == s
    with pytest.raises(ConfigError, match="distinct"):
        build_tokenizer("aab")


def test_model_generates_and_round_trips_through_disk(tmp_path: Path) -> None:
    tok = build_tokenizer("arith")
    model = build_model(tok, seed=0)
    assert 400_000 < sum(p.numel() for p in model.parameters()) < 700_000
    save(model, tok, tmp_path / "m")
    model2, tok2 = load(tmp_path / "m")
    enc = tok(["1+1=", "22+33="], return_tensors="pt", padding=True)
    out1 = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    out2 = model2.generate(**enc, max_new_tokens=3, do_sample=False,
                           pad_token_id=tok2.pad_token_id)
    assert torch.equal(out1, out2)
    with pytest.raises(ConfigError, match="config.json"):
        load(tmp_path / "nothing")


def test_a_saved_tokenizer_loads_as_saved_spaces_and_newlines_included(tmp_path: Path) -> None:
    # AutoTokenizer would pick Qwen2's class and its byte-level pre-tokenizer: " " and "\n"
    # then encoded to nothing, so a verifier taught "46\nno" learned "46no"
    from astraflow.models.prompt import encode
    from astraflow.models.tiny import build_model, build_tokenizer, load, save

    for alphabet, text in (("team", "46\nno"), ("ascii", "a b\nc")):
        tok = build_tokenizer(alphabet)
        save(build_model(tok, seed=0), tok, tmp_path / alphabet)
        _, loaded = load(tmp_path / alphabet)
        ids = encode(loaded, text, special=False)
        assert ids == encode(tok, text, special=False)
        assert len(ids) == len(text)
        assert loaded.decode(ids) == text


def test_a_tiny_build_is_made_once_into_the_cache_and_copied_into_each_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from astraflow.models.config import ModelConfig, model_dir

    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    mc = ModelConfig(path="{out}/models/{policy}", build="tiny-arith", seed=3)
    first = model_dir(mc, "default", tmp_path / "run1")
    (entry,) = (tmp_path / "cache" / "models" / "tiny").iterdir()
    assert entry.name.startswith("tiny-arith-seed3-")
    built_at = (entry / "model.safetensors").stat().st_mtime_ns
    second = model_dir(mc, "default", tmp_path / "run2")
    assert (entry / "model.safetensors").stat().st_mtime_ns == built_at  # copied, not rebuilt
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in entry.iterdir())
    for f in entry.iterdir():
        assert (first / f.name).read_bytes() == (second / f.name).read_bytes() == f.read_bytes()
    # the copy is what a build in place makes
    tok = build_tokenizer("arith")
    fresh = save(build_model(tok, seed=3), tok, tmp_path / "fresh")
    m1, m2 = load(first)[0], load(fresh)[0]
    for (k, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    # another seed is another entry
    model_dir(ModelConfig(path="{out}/m", build="tiny-arith", seed=4), "default", tmp_path / "r3")
    assert len(list((tmp_path / "cache" / "models" / "tiny").iterdir())) == 2


def test_without_a_writable_cache_the_tiny_model_is_built_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from astraflow.models.config import ModelConfig, model_dir

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache would go")
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(blocked))
    path = model_dir(ModelConfig(path="{out}/m", build="tiny-arith"), "default", tmp_path / "r")
    assert (path / "config.json").exists() and load(path)[0] is not None
    assert "tiny model cache unavailable" in caplog.text
