"""No pickle on the wire or in checkpoints loaded from elsewhere
(docs/results/faults.md#limits-and-hardening): no module imports a pickle-based loader, torch.load and numpy.load are not called with pickling allowed,
and models are loaded from safetensors only (a pytorch_model.bin is refused, not unpickled)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "astraflow"
PICKLERS = {"pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(f: ast.expr) -> str:
    return ast.unparse(f)


def test_no_module_loads_pickles() -> None:
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""])
                bad = [m for m in mods if m.split(".")[0] in PICKLERS]
                if bad:
                    problems.append(f"{path}:{node.lineno} imports {bad}")
        for call in _calls(tree):
            name = _name(call.func)
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
            if name.endswith("torch.load") and kw.get("weights_only") != "True":
                problems.append(f"{path}:{call.lineno} torch.load without weights_only=True")
            if name.endswith(("np.load", "numpy.load")) and kw.get("allow_pickle") == "True":
                problems.append(f"{path}:{call.lineno} numpy.load(allow_pickle=True)")
            # a gguf file (gguf_file=...) is read by the gguf package: no pickle in it
            if (name.endswith("AutoModelForCausalLM.from_pretrained")
                    and kw.get("use_safetensors") != "True" and "gguf_file" not in kw):
                problems.append(f"{path}:{call.lineno} a model loaded without "
                                "use_safetensors=True (a .bin checkpoint is a pickle)")
    assert not problems, "\n".join(problems)


def test_a_pickled_checkpoint_is_refused_not_loaded(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from astraflow.models.tiny import build_model, build_tokenizer, load, save

    src = tmp_path / "m"
    tok = build_tokenizer()
    model = build_model(tok, hidden=16, layers=1, heads=2, intermediate=32)
    save(model, tok, src)
    load(src)  # safetensors: fine
    for f in src.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), src / "pytorch_model.bin")  # a pickle
    with pytest.raises(OSError, match="safetensors"):
        load(src)
