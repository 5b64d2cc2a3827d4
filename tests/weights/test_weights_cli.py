"""`astraflow weights diff/apply/inspect/bench` on real .safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from weights_helpers import mutate

from astraflow.cli.weights import app
from astraflow.weights.safetensors_io import read_safetensors, write_safetensors

runner = CliRunner()


def save(path: Path, model: dict) -> Path:
    write_safetensors(path, model, {"format": "pt"})
    return path


def test_diff_apply_inspect_roundtrip(tmp_path: Path, model_factory) -> None:
    v0 = model_factory()
    rng = np.random.default_rng(1)
    v1 = {n: (d, mutate(rng, b, 0.05)) for n, (d, b) in v0.items()}
    old, new = save(tmp_path / "old.safetensors", v0), save(tmp_path / "new.safetensors", v1)
    r = runner.invoke(app, ["diff", str(old), str(new), "-o", str(tmp_path / "d.afw"),
                            "--base-version", "7", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert (summary["kind"], summary["version"], summary["base_version"]) == ("delta", 8, 7)
    r = runner.invoke(app, ["apply", str(old), str(tmp_path / "d.afw"),
                            "-o", str(tmp_path / "out.safetensors")])
    assert r.exit_code == 0, r.output
    out, meta = read_safetensors(tmp_path / "out.safetensors")
    assert meta == {"format": "pt"}
    assert all(out[n][1].tobytes() == v1[n][1].tobytes() and out[n][1].shape == v1[n][1].shape
               for n in v1)
    r = runner.invoke(app, ["inspect", str(tmp_path / "d.afw"), "--json", "--tensors"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    changed = sum(int(np.count_nonzero(v0[n][1] != v1[n][1])) for n in v0)
    assert info["changed"] == changed and info["tensors"] == len(v0)
    assert info["changed_fraction"] == pytest.approx(changed / info["elements"])
    assert {t["name"] for t in info["tensor_list"]} == set(v0)
    r = runner.invoke(app, ["inspect", str(new)])
    assert r.exit_code == 0 and "safetensors" in r.output


def test_output_loads_in_the_safetensors_library(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(7),
               "c": torch.randn(2, 2).half(), "d": torch.tensor(1.0).to(torch.bfloat16)}
    st.save_file(tensors, str(tmp_path / "ref.safetensors"))
    ours, _ = read_safetensors(tmp_path / "ref.safetensors")
    write_safetensors(tmp_path / "ours.safetensors", ours)
    back = st.load_file(str(tmp_path / "ours.safetensors"))
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape
        assert back[k].view(torch.uint8).equal(t.view(torch.uint8)) if t.dim() else \
            back[k].reshape(1).view(torch.uint8).equal(t.reshape(1).view(torch.uint8))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("norm"), "tensor 'norm'"),
    (lambda m: m.update(embed=("bfloat16", m["embed"][1].reshape(33, 97))), "tensor 'embed'"),
    (lambda m: m.update(half=("bfloat16", m["half"][1])), "tensor 'half'"),
])
def test_mismatched_files_fail_naming_the_tensor(tmp_path: Path, model_factory, change,
                                                message) -> None:
    v0 = model_factory()
    other = dict(v0)
    change(other)
    a, b = save(tmp_path / "a.safetensors", v0), save(tmp_path / "b.safetensors", other)
    out = tmp_path / "d.afw"
    r = runner.invoke(app, ["diff", str(a), str(b), "-o", str(out)])
    assert r.exit_code == 1 and message in r.output
    assert not out.exists()
    # a delta between compatible files applied to the mismatched base
    runner.invoke(app, ["diff", str(a), str(a), "-o", str(out)])
    result = tmp_path / "out.safetensors"
    r = runner.invoke(app, ["apply", str(b), str(out), "-o", str(result)])
    assert r.exit_code == 1 and message in r.output
    assert not result.exists() and not list(tmp_path.glob(".out*"))


def test_apply_refuses_a_wrong_base_and_a_corrupt_delta(tmp_path: Path, model_factory) -> None:
    v0 = model_factory()
    rng = np.random.default_rng(2)
    v1 = {n: (d, mutate(rng, b, 0.1)) for n, (d, b) in v0.items()}
    a, b = save(tmp_path / "a.safetensors", v0), save(tmp_path / "b.safetensors", v1)
    runner.invoke(app, ["diff", str(a), str(b), "-o", str(tmp_path / "d.afw")])
    r = runner.invoke(app, ["apply", str(b), str(tmp_path / "d.afw"), "-o",
                            str(tmp_path / "o.safetensors")])
    assert r.exit_code == 1 and "not the one this delta was made against" in r.output
    data = (tmp_path / "d.afw").read_bytes()
    (tmp_path / "bad.afw").write_bytes(data[: len(data) - 10])
    r = runner.invoke(app, ["apply", str(a), str(tmp_path / "bad.afw"), "-o",
                            str(tmp_path / "o.safetensors")])
    assert r.exit_code == 1 and "truncated" in r.output
    assert not (tmp_path / "o.safetensors").exists()


def test_bench_runs_small(tmp_path: Path) -> None:
    r = runner.invoke(app, ["bench", "--params", "300000", "--unchanged", "0.99", "--repeat", "1",
                            "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)
    assert row["unchanged"] == pytest.approx(0.99, abs=1e-3)
    assert row["vs_dense"] > 20 and row["vs_floor"] >= 1.0
