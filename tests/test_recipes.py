"""The recipes of docs/recipes.md (examples/recipes/ and examples/gsm8k_gpu.yaml).

Each recipe passes `astraflow check` here, on every host it names with that host's --role.
The GPU ones cannot load their models here (no hub, no GPU, no vLLM): they are checked with
each model's config only, a folder with the model's published config.json and a stand-in
tokenizer, and ``--no-weights``; their memory, by the check's own estimate, fits the GPUs the
recipe gives each role. The JSONL recipe is run as a user runs it: its folder copied into a
fresh directory outside the checkout, `astraflow check`, then `astraflow run` on a short budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.config import load_experiment

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
GB = 1e9

#: the fields of each model's published config.json that the check reads (Qwen2.5 Instruct)
QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16", "bos_token_id": 151643,
        "eos_token_id": 151645}
MODELS = {
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960,
                                       num_hidden_layers=28, num_attention_heads=12,
                                       num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden_size=2048, intermediate_size=11008,
                                     num_hidden_layers=36, num_attention_heads=16,
                                     num_key_value_heads=2, vocab_size=151936,
                                     tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944,
                                     num_hidden_layers=28, num_attention_heads=28,
                                     num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False),
}

# The hosts of each GPU recipe, as its header starts them: (name, --role list or None for
# every role, extra --set overrides of that host). Region A of the WAN recipe reads Kafka and
# the weights directly.
REGION_A = ["bus.url=kafka://kafka.a.example:9092", "weights.fetch=null", "weights.fallback=null"]
HOSTS = {
    "gsm8k_gpu.yaml": [("the GPU host", None, [])],
    "recipes/lora_7b_1gpu.yaml": [("the GPU host", None, [])],
    "recipes/fsdp_8gpu.yaml": [
        ("the trainer host", ["train", "produce", "policy"], []),
        ("a rollout host", ["rollout"], []),
        ("the rollout host with the evaluator", ["rollout", "evaluate"], [])],
    "recipes/several_models_gpus.yaml": [("the 8-GPU host", None, [])],
    "recipes/wan_far_rollout.yaml": [
        ("region A's trainer host", ["train", "produce", "policy", "evaluate"], REGION_A),
        ("a region B rollout host", ["rollout"], [])],
}
#: what each recipe's check must say of its setup
SAYS = {
    "gsm8k_gpu.yaml": ["trainer (ddp, 1 rank, full)"],
    "recipes/lora_7b_1gpu.yaml": ["trainer (fsdp, 1 rank, LoRA r=16)", "7615.5M parameters"],
    "recipes/fsdp_8gpu.yaml": ["trainer (fsdp, 8 ranks, full)", "7615.5M parameters"],
    "recipes/several_models_gpus.yaml": ["trainer.solver.memory", "trainer.verifier.memory",
                                         "3085.8M parameters", "1543.7M parameters"],
    "recipes/wan_far_rollout.yaml": ["trainer (ddp, 1 rank, full)", "1543.7M parameters"],
}


@pytest.fixture(autouse=True)
def _user_code_dirs_stay_in_their_test(sys_path_restored: None) -> None:
    """A check run in this process puts the config's directory on sys.path and $PYTHONPATH
    (as for a user): undone after each test (tests/conftest.py)."""


@pytest.fixture(scope="module")
def configs_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each hub id -> a folder with its config.json and a stand-in tokenizer (the check loads
    a tokenizer and renders a prompt), no weights."""
    from astraflow.models.tiny import build_tokenizer

    root, tok = tmp_path_factory.mktemp("models"), build_tokenizer("ascii")
    folders = {}
    for hub_id, fields in MODELS.items():
        folder = root / hub_id.split("/")[1]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**QWEN, **fields}))
        tok.save_pretrained(folder)
        folders[hub_id] = folder
    return folders


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GSM8K-shaped DatasetDict saved to disk (data/gsm8k of the GPU recipes)."""
    datasets = pytest.importorskip("datasets")
    rows = [{"question": f"Tom has {i} apples and buys 3 more. How many now?",
             "answer": f"He has {i} + 3 = {i + 3} apples.\n#### {i + 3}"} for i in range(8)]
    path = tmp_path_factory.mktemp("data") / "gsm8k"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:6]),
                          "test": datasets.Dataset.from_list(rows[6:])}).save_to_disk(str(path))
    return path


def _recipe(name: str) -> Path:
    return ROOT / "examples" / name


def _model_sets(name: str, configs_only: dict[str, Path], gsm8k: Path) -> list[str]:
    """The --set overrides that point a recipe at the config-only folders and the data."""
    cfg = load_experiment(_recipe(name))
    sets = [f"producer.hf_datasets.path={gsm8k}"]
    for policy in cfg.policies:
        sets.append(f"models.{policy}.path={configs_only[cfg.model(policy).path]}")
    return sets


def _check(config: Path, *args: str) -> tuple[int, str]:
    from astraflow.cli.app import app

    result = CliRunner().invoke(app, ["check", str(config), *args])
    return result.exit_code, " ".join(result.output.split())


def test_every_recipe_is_covered_and_says_how_to_run_it() -> None:
    names = {f"recipes/{p.relative_to(RECIPES)}" for p in RECIPES.rglob("*.yaml")}
    assert names == {*HOSTS, "recipes/my_task/my_task.yaml"} - {"gsm8k_gpu.yaml"}
    for name in [*HOSTS, "recipes/my_task/my_task.yaml"]:
        header = _recipe(name).read_text().split("\nrun: ")[0]
        assert "astraflow check" in header, name
        assert "astraflow run" in header or "astraflow rollout" in header, name
        assert "What you should see" in header or name == "gsm8k_gpu.yaml", name
        cfg = load_experiment(_recipe(name))
        assert cfg.run and cfg.policies


@pytest.mark.parametrize(("name", "host", "roles", "extra"), [
    pytest.param(name, host, roles, extra, id=f"{name}: {host}")
    for name, hosts in HOSTS.items() for host, roles, extra in hosts])
def test_a_gpu_recipe_passes_its_check_on_each_host_with_its_models_config_only(
        name: str, host: str, roles: list[str] | None, extra: list[str], tmp_path: Path,
        configs_only: dict[str, Path], gsm8k: Path) -> None:
    sets = [*_model_sets(name, configs_only, gsm8k), *extra]
    args = [a for s in sets for a in ("--set", s)]
    args += [a for r in roles or [] for a in ("--role", r)]
    rc, said = _check(_recipe(name), *args, "--no-weights", "--out", str(tmp_path / "run"))
    assert rc == 0, f"{host}: {said}"
    assert "the config passes its check" in said and "weights not checked" in said
    for words in SAYS[name]:
        assert words in said, f"{host}: {words!r} not in {said}"
    cfg = load_experiment(_recipe(name), sets)
    assert cfg.rollout.engine.type == "vllm" and cfg.trainer.device == "cuda"
    if roles is not None:
        assert f"checked for a host that runs {', '.join(sorted(roles))}" in said


def test_a_gpu_recipe_as_shipped_asks_only_for_its_models_and_vllm_here(
        configs_only: dict[str, Path], gsm8k: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the config-only folders, a host with no hub (and no vLLM) is told exactly
    that: the hub id with how to bring the folder, and the engine's install."""
    from astraflow.models.source import describe_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not describe_model("Qwen/Qwen2.5-7B-Instruct").problems:
        pytest.skip("Qwen/Qwen2.5-7B-Instruct is in this host's Hugging Face cache")
    rc, said = _check(_recipe("recipes/lora_7b_1gpu.yaml"), "--set",
                      f"producer.hf_datasets.path={gsm8k}", "--out", str(tmp_path / "run"))
    assert rc == 1 and "Qwen/Qwen2.5-7B-Instruct" in said and "models.default.path" in said
    assert "hf download Qwen/Qwen2.5-7B-Instruct" in said
    import importlib.util

    n = 1 if importlib.util.find_spec("vllm") else 2
    assert f"{n} problem{'s' * (n > 1)}:" in said, said


def test_a_model_folder_without_tokenizer_files_is_a_problem(tmp_path: Path, gsm8k: Path,
                                                             configs_only: dict[str, Path]
                                                             ) -> None:
    """config.json alone is not a model's config for the check: transformers builds an empty
    tokenizer where a folder has no tokenizer files, which rendered every prompt as 0 tokens
    and passed."""
    bare = tmp_path / "config-json-only"
    bare.mkdir()
    shutil.copy(configs_only["Qwen/Qwen2.5-7B-Instruct"] / "config.json", bare)
    rc, said = _check(_recipe("recipes/lora_7b_1gpu.yaml"), "--no-weights", "--set",
                      f"models.default.path={bare}", "--set",
                      f"producer.hf_datasets.path={gsm8k}", "--out", str(tmp_path / "run"))
    assert rc == 1 and f"the tokenizer of {bare} is empty" in said, said


def _per_rank(name: str, policy: str, sets: list[str]) -> tuple[float, float, float]:
    """(the trainer's bytes per rank with the publisher's snapshot, one engine's bytes, the
    evaluator's bytes), as the check estimates them."""
    from astraflow.run.memory import estimate

    cfg = load_experiment(_recipe(name), sets)
    fields = {**QWEN, **MODELS[load_experiment(_recipe(name)).model(policy).path]}
    est = estimate(fields, cfg, policy)
    return est.trainer_bytes / est.setup.ranks, est.engine_bytes, est.evaluator_bytes


def test_each_gpu_recipes_roles_fit_the_gpus_it_gives_them() -> None:
    """By the check's estimate, with 10% of an 80 GB GPU kept free: vLLM takes
    gpu_memory_utilization of its GPU whatever it needs."""
    gpu = 0.9 * 80 * GB
    # one GPU: the LoRA trainer beside vLLM (no evaluator)
    cfg = load_experiment(_recipe("recipes/lora_7b_1gpu.yaml"))
    trainer, engine, evaluator = _per_rank("recipes/lora_7b_1gpu.yaml", "default", [])
    util = cfg.rollout.engine.gpu_memory_utilization * 80 * GB
    assert evaluator == 0 and engine < util and trainer + util < gpu
    # eight trainer ranks, one GPU each; the evaluator alone on a GPU; vLLM alone on each
    trainer, engine, evaluator = _per_rank("recipes/fsdp_8gpu.yaml", "default", [])
    assert trainer < gpu and evaluator < gpu and engine < 0.85 * 80 * GB
    # a GPU per trainer; both evaluators on one GPU; two engines share a GPU
    team = [_per_rank("recipes/several_models_gpus.yaml", p, []) for p in ("solver", "verifier")]
    assert all(t < gpu for t, _, _ in team)
    assert sum(e for _, _, e in team) < gpu
    assert all(e < 0.4 * 80 * GB for _, e, _ in team)
    # region A: the trainer and the evaluator each on a GPU
    trainer, engine, evaluator = _per_rank("recipes/wan_far_rollout.yaml", "default", REGION_A)
    assert trainer < gpu and evaluator < gpu and engine < 0.85 * 80 * GB


# the JSONL recipe, run ------------------------------------------------------------------------

def _astraflow(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """``astraflow *args`` in ``cwd`` (a user's directory), its environment without the
    checkout's directories on $PYTHONPATH; a run still going at ``timeout`` is stopped with
    every role (their process groups, processes.json)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    log = cwd / f"astraflow-{args[0]}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "astraflow.cli.app", *args], cwd=cwd,
                                env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)
                with contextlib.suppress(OSError, ValueError):
                    pids = json.loads((cwd / "runs" / "my_task" / "processes.json").read_text())
                    for pid in pids.values():
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(int(pid), signal.SIGKILL)
    return rc, log.read_text()


@pytest.mark.slow
def test_the_jsonl_recipe_checks_and_trains_in_a_directory_of_its_own(tmp_path: Path) -> None:
    """The user's directory: examples/recipes/my_task copied out of the checkout; the
    config's data paths are relative to it and my_reward is found there."""
    home = tmp_path / "my_task"
    shutil.copytree(RECIPES / "my_task", home)
    rc, said = _astraflow(["check", "my_task.yaml"], home, timeout=120)
    assert rc == 0, said
    said = " ".join(said.split())
    assert "the config passes its check" in said
    assert "'my_reward:score' scores task 'sub-0000''s reference answer 1" in said
    assert "test split: first task 'held-0000'" in said
    # a short budget: no warm-up, three GRPO steps, the evaluator on 20 held-out problems
    sets = ["launch.warmup.steps=0", "trainer.max_steps=3", "data.batch_size=16",
            "launch.eval_problems=20", "launch.eval_every=3", "launch.timeout_s=150",
            "launch.restart=false"]
    rc, output = _astraflow(["run", "my_task.yaml", "--no-live",
                             *[a for s in sets for a in ("--set", s)]], home, timeout=240)
    assert rc == 0, output[-4000:]
    out = home / "runs" / "my_task"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 3 and summary["failed_roles"] == [], summary
    assert summary["accounting"]["unaccounted"] == 0
    assert summary["accounting"]["trained_twice"] == 0
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
             if "eval_accuracy" in x]
    assert evals and {e["task"] for e in evals} == {"my_task"}
    # the trajectories were scored by my_reward (its "exact" component)
    rc, shown = _astraflow(["inspect", "af.my_task.trajectories", "--out", str(out),
                            "--limit", "5"], home, timeout=120)
    assert rc == 0 and shown.count('"exact":') >= 5, shown[-2000:]
