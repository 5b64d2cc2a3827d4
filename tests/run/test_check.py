"""`astraflow check`: every problem of a config found before a role starts, each with its key
path; `astraflow run` starts nothing on a config that fails it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonl_files import write_jsonl

from astraflow.config import load_experiment
from astraflow.core.errors import AstraflowError
from astraflow.models.tiny import build_model, build_tokenizer, save
from astraflow.run.check import check_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer("arith")
    return save(build_model(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    train = write_jsonl(tmp_path / "train.jsonl",
                   [{"id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(5)])
    test = write_jsonl(tmp_path / "test.jsonl",
                  [{"id": f"h{i}", "prompt": f"{i}+2=", "answer": str(i + 2)} for i in range(5)])
    return train, test


def _config(tmp_path: Path, model: Path | str, train: Path, test: Path, *extra: str):
    return load_experiment(None, [
        f"models.default.path={model}", "producer.source=jsonl", f"producer.path=[{train}]",
        f"producer.test_path=[{test}]", "launch.warmup.steps=0", *extra])


def _problems(report) -> dict[str, str]:
    """key -> its problems' messages (joined by " | ")."""
    out: dict[str, str] = {}
    for f in report.problems:
        out[f.key] = f"{out[f.key]} | {f.message}" if f.key in out else f.message
    return out


def test_a_good_config_passes_with_a_rendered_prompt_and_a_memory_estimate(
        tmp_path: Path, tiny_dir: Path, data: tuple[Path, Path]) -> None:
    report = check_experiment(_config(tmp_path, tiny_dir, *data), tmp_path)
    assert report.ok, report.describe_problems()
    said = " | ".join(f"{f.key}: {f.message}" for f in report.findings)
    assert "train split: first task 't0'" in said
    assert "test split: first task 'h0'" in said
    assert "'exact_match' scores task 't0'" in said and "reference answer 1" in said
    assert "one prompt renders" in said
    assert "M parameters" in said and "GiB for the trainer" in said
    assert "trainer (ddp, 1 rank, full): " in said and "GiB per rank on the device" in said
    assert "fits a 80 GB GPU so: 1.5B" in said, said


def test_several_policies_are_checked_against_the_hosts_memory_together(
        tmp_path: Path, tiny_dir: Path, data: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # each policy alone fits; the run's roles of both (a trainer and an evaluator each, every
    # worker an engine of each) do not: a two-policy SmolLM2 run was killed by the kernel
    # while each policy's own check passed
    from astraflow.run.memory import MemoryEstimate, run_host_bytes

    train, test = data
    config = load_experiment(None, [
        "policies=[solver,verifier]", f"models.solver.path={tiny_dir}",
        f"models.verifier.path={tiny_dir}", "producer.source=jsonl", f"producer.path=[{train}]",
        f"producer.test_path=[{test}]", "launch.warmup.steps=0", "launch.rollout_workers=2"])
    report = check_experiment(config, tmp_path)
    assert report.ok, report.describe_problems()
    said = {f.key: f.message for f in report.findings}
    assert "roles of the 2 policies on this host need about" in said["policies"], said
    # (parameters, trainer, engine, workers, evaluator bytes, device)
    each = [MemoryEstimate(10, 100, 7, 2, 5, "cpu"), MemoryEstimate(10, 200, 11, 2, 3, "cpu")]
    # trainers 300, two workers holding both engines 36, evaluators 8 (with a team's: 16)
    assert run_host_bytes(each, team_evaluator=False) == 344
    assert run_host_bytes(each, team_evaluator=True) == 352
    # a host between one policy's roles and both policies' roles
    from astraflow.run.memory import estimate

    model = json.loads((tiny_dir / "config.json").read_text())
    real = [estimate(model, config, p) for p in config.policies]
    alone, both = real[0].host_bytes, run_host_bytes(real, team_evaluator=False)
    assert both > 1.5 * alone
    monkeypatch.setattr(MemoryEstimate, "available_bytes", lambda self: (alone + both) // 2)
    problems = _problems(check_experiment(config, tmp_path))
    assert set(problems) == {"policies"}, problems
    assert "more than its" in problems["policies"] and "micro_batch_tokens" in problems[
        "policies"]


def test_every_problem_is_listed_at_once_with_its_key_path(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    train, _ = data
    cfg = load_experiment(None, [
        f"models.default.path={tmp_path / 'no-such-model'}", "producer.source=jsonl",
        f"producer.path=[{train}]", f"producer.test_path=[{tmp_path / 'missing.jsonl'}]",
        "rollout.reward.name=no_such_module_xyz:reward", "launch.warmup.steps=0",
        "rollout.workflow.modules=[no_such_module_abc]"])
    problems = _problems(check_experiment(cfg, tmp_path))
    assert "no-such-model" in problems["models.default.path"]
    assert "missing.jsonl" in problems["producer.test_path"]
    assert "test split" in problems["producer.test_path"]
    assert "no_such_module_xyz" in problems["rollout.reward.name"]
    assert "no_such_module_abc" in problems["rollout.workflow.modules[0]"]


def test_a_hub_id_with_no_hub_is_named_with_how_to_bring_the_folder(
        tmp_path: Path, data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # this machine reaches no hub; CI neither
    problems = _problems(check_experiment(
        _config(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", *data), tmp_path))
    message = problems["models.default.path"]
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message
    assert "astraflow models import" in message, message


def test_a_reward_that_raises_on_its_sample_is_caught(
        tmp_path: Path, tiny_dir: Path, data: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_reward_mod.py").write_text(
        "def reward(completion, reference):\n"
        "    return float(reference['label'])  # a key the tasks do not have\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _problems(check_experiment(
        _config(tmp_path, tiny_dir, *data, "rollout.reward.name=bad_reward_mod:reward"),
        tmp_path))
    assert list(problems) == ["rollout.reward"]
    assert "KeyError" in problems["rollout.reward"] and "'t0'" in problems["rollout.reward"]


def test_a_broken_data_file_and_a_missing_extractor_are_problems_not_crashes(
        tmp_path: Path, tiny_dir: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "train.json").write_text("{not json at all")
    cfg = load_experiment(None, [
        f"models.default.path={tiny_dir}", "producer.source=hf_datasets",
        f"producer.hf_datasets.data_files={tmp_path / 'broken' / 'train.json'}",
        "producer.test_fraction=0.5", "launch.warmup.steps=0",
        "rollout.reward.extract=no_such_extractor_mod:fn"])
    problems = _problems(check_experiment(cfg, tmp_path))
    assert "train split" in problems["producer.hf_datasets"]
    assert "no_such_extractor_mod" in problems["rollout.reward.extract"]


def test_a_warm_up_without_reference_answers_is_refused(
        tmp_path: Path, tiny_dir: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "tests": "assert True"}])
    cfg = load_experiment(None, [
        f"models.default.path={tiny_dir}", "producer.source=jsonl", f"producer.path=[{train}]",
        "producer.test_fraction=0", "launch.evaluate=false", "launch.warmup.steps=10",
        "rollout.reward.name=code"])
    problems = _problems(check_experiment(cfg, tmp_path))
    assert "reference answers" in problems["launch.warmup.steps"]


def test_astraflow_run_starts_nothing_on_a_config_that_fails(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    train, test = data
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.app", "run", str(ROOT / "examples" /
                                                             "quickstart.yaml"),
         "--out", str(out), "--no-live", "--set", "producer.source=jsonl",
         "--set", f"producer.path=[{tmp_path / 'nothing.jsonl'}]",
         "--set", f"producer.test_path=[{test}]"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "producer.path" in proc.stderr and "nothing.jsonl" in proc.stderr
    assert not (out / "bus.db").exists()  # no role started: no bus was even opened


def test_astraflow_check_exits_non_zero_and_lists_the_keys(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    train, test = data
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.app", "check",
         str(ROOT / "examples" / "quickstart.yaml"), "--out", str(tmp_path / "run"),
         "--set", "rollout.reward.name=nowhere_mod:fn"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rollout.reward.name" in proc.stderr and "1 problem" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.app", "check",
         str(ROOT / "examples" / "quickstart.yaml"), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "passes its check" in ok.stderr


#: Qwen2.5-1.5B-Instruct's config.json (the fields the check reads), as published with it
QWEN25_1P5B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
    "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 151643,
    "eos_token_id": 151645}


def test_the_gpu_recipe_passes_its_check_with_the_models_config_only(tmp_path: Path) -> None:
    """examples/gsm8k_gpu.yaml as a GPU user runs it, checked here with the model's config (and
    a stand-in tokenizer: the check renders a prompt) and a GSM8K-shaped dataset on disk."""
    import datasets

    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_1P5B))
    build_tokenizer("ascii").save_pretrained(model)
    rows = [{"question": f"Tom has {i} apples and buys 3 more. How many now?",
             "answer": f"He has {i} + 3 = {i + 3} apples.\n#### {i + 3}"} for i in range(8)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:6]),
                          "test": datasets.Dataset.from_list(rows[6:])}
                         ).save_to_disk(str(tmp_path / "gsm8k"))
    cfg = load_experiment(ROOT / "examples" / "gsm8k_gpu.yaml", [
        f"models.default.path={model}", f"producer.hf_datasets.path={tmp_path / 'gsm8k'}"])
    assert cfg.rollout.engine.type == "vllm" and cfg.trainer.mixed_precision == "bf16"
    # without weights the folder is refused; the recipe checked for its config only passes
    problems = _problems(check_experiment(cfg, tmp_path))
    problems.pop("rollout.engine.type", None)  # where vllm is not installed (a CPU host)
    assert list(problems) == ["models.default.path"], problems
    assert "no *.safetensors weights" in problems["models.default.path"]
    report = check_experiment(cfg, tmp_path, weights=False)
    assert report.ok, report.describe_problems()
    said = " | ".join(f"{f.key}: {f.message}" for f in report.findings)
    assert "weights not checked" in said
    assert "'numeric_match' scores task" in said and "reference answer 1" in said
    assert "1543.7M parameters" in said, said
    assert "(cuda)" in said  # a GPU run: no comparison with this host's memory
    # the answer regex took GSM8K's final number out of the worked answer
    from astraflow.producers import split_specs

    first = next(split_specs(cfg.producer, "train", tmp_path))
    assert first.reference["answer"] == "3"


def test_a_rollout_host_is_not_checked_for_the_producers_data(
        tmp_path: Path, tiny_dir: Path, data: tuple[Path, Path]) -> None:
    """deploy.md's rollout host has the model, not the producer's files: `--role rollout`
    checks what a rollout worker loads, and a data file that only the trainer host has is no
    problem there (it is one where the producer runs)."""
    _, test = data
    cfg = _config(tmp_path, tiny_dir, tmp_path / "only-on-the-trainer-host.jsonl", test)
    assert "producer.path" in _problems(check_experiment(cfg, tmp_path))
    assert "producer.path" in _problems(check_experiment(cfg, tmp_path, roles=["produce"]))
    report = check_experiment(cfg, tmp_path, roles=["rollout"])
    assert report.ok, report.describe_problems()
    said = " | ".join(f"{f.key}: {f.message}" for f in report.findings)
    assert "roles: checked for a host that runs rollout" in said
    assert "producer.path: not read here" in said
    assert "models.default.path" in said  # the model a worker loads is checked
    assert "M parameters" in said
    # a host of the producer and the policy stages only loads no model
    report = check_experiment(cfg, tmp_path, roles=["policy"])
    assert report.ok and not any(f.key.startswith("models.") for f in report.findings)
    with pytest.raises(AstraflowError, match="unknown role.*'trainer'.*valid: produce"):
        check_experiment(cfg, tmp_path, roles=["trainer"])


def test_the_vllm_engine_without_vllm_is_a_problem_naming_its_install(
        tmp_path: Path, tiny_dir: Path, data: tuple[Path, Path]) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    cfg = _config(tmp_path, tiny_dir, *data, "rollout.engine.type=vllm")
    problems = _problems(check_experiment(cfg, tmp_path))
    assert list(problems) == ["rollout.engine.type"], problems
    assert "pip install vllm" in problems["rollout.engine.type"]
    assert _problems(check_experiment(cfg, tmp_path, roles=["rollout"])) == problems
    assert check_experiment(cfg, tmp_path, roles=["train", "produce"]).ok  # no engine there
    assert check_experiment(cfg, tmp_path, weights=False).ok  # checked away from its hosts


def test_astraflow_check_takes_the_roles_of_the_host(tmp_path: Path,
                                                      data: tuple[Path, Path]) -> None:
    from typer.testing import CliRunner

    from astraflow.cli.app import app

    quickstart = str(ROOT / "examples" / "quickstart.yaml")
    missing = ["--set", "producer.source=jsonl",
               "--set", f"producer.path=[{tmp_path / 'nothing.jsonl'}]",
               "--set", f"producer.test_path=[{data[1]}]", "--out", str(tmp_path / "run")]
    everything = CliRunner().invoke(app, ["check", quickstart, *missing])
    assert everything.exit_code == 1 and "producer.path" in everything.output
    rollout = CliRunner().invoke(app, ["check", quickstart, *missing, "--role", "rollout"])
    assert rollout.exit_code == 0, rollout.output
    assert "passes its check" in rollout.output
    bad = CliRunner().invoke(app, ["check", quickstart, "--role", "trainer"])
    assert bad.exit_code == 2 and "valid: produce, policy, rollout" in " ".join(
        bad.output.split())
