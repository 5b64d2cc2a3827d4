"""What `astraflow run` launches: the roles of an experiment, the SFT warm-up phase, and the
export of trained weights to a Hugging Face model directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from astraflow.config import ExperimentConfig
from astraflow.core.config import dump_split
from astraflow.core.gang import gang_argv
from astraflow.core.launcher import cli
from astraflow.core.secrets import keep_secrets
from astraflow.run.scaling import initial_workers
from astraflow.run.supervisor import RoleSpec

RL_CONFIG = "config-rl.yaml"  # in a run directory: the RL phase's config


def write_config(config: ExperimentConfig, path: Path) -> Path:
    """Write ``config`` to ``path`` with its secrets redacted (``***``: the dump is for people
    to read and share) and keep their real values in the run directory's 0600
    ``secrets.yaml``, from which every role reading ``path`` gets them back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text, secrets = dump_split(config)
    keep_secrets(path.parent, secrets)
    path.write_text(text)
    return path


def role_env(config: ExperimentConfig) -> dict[str, str]:
    quiet = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TOKENIZERS_PARALLELISM": "false"}
    n = config.launch.threads_per_role
    if n is None:
        return quiet
    return {**quiet, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}


def sharing_roles(config: ExperimentConfig) -> list[str]:
    """The roles of `astraflow run` that share the host's cores (``launch.share_cores``):
    each policy's trainer of one rank (it lends its share while it waits, and keeps its own
    threads) and the rollout workers of an ``hf`` engine (they lend and borrow); a role on a
    GPU opts out by itself: it never registers."""
    if not config.launch.share_cores:
        return []
    roles = []
    if config.launch.trainer_ranks == 1:
        roles += [f"trainer-{p}" for p in config.policies]
    if config.rollout.engine.type == "hf" and not config.rollout.engine.process:
        roles += [f"rollout-{i}" for i in range(initial_workers(config))]
    return roles


def core_split(config: ExperimentConfig) -> tuple[int, int, list[str]]:
    """(cores, each role's share, the sharing roles): ``launch.cores`` (or this host's) split
    evenly, at least one core each."""
    from astraflow.core.cores import machine_cores

    roles = sharing_roles(config)
    cores = config.launch.cores or machine_cores()
    return cores, max(1, cores // max(1, len(roles))), roles


def share_env(config: ExperimentConfig, out: Path) -> dict[str, str]:
    """The environment that makes a role share the cores (empty when nothing is shared)."""
    from astraflow.core.cores import ENV, env_value

    cores, share, roles = core_split(config)
    if not roles:
        return {}
    return {ENV: env_value(out.resolve() / "cores", cores, share)}


def describe_split(config: ExperimentConfig) -> str:
    """What `astraflow run` prints of the core split it chose."""
    cores, share, roles = core_split(config)
    if not roles:
        why = ("launch.share_cores: false" if not config.launch.share_cores
               else "no role on this host's CPU shares them")
        n = config.launch.threads_per_role
        threads = str(n) if n else "the libraries' default"
        return f"cores: not shared ({why}); threads per role: {threads}"
    return (f"cores: {cores} shared by {', '.join(roles)} ({share} each); an idle role lends "
            "its share to the busy rollout workers, the trainer keeps its own threads "
            "(launch.share_cores)")


def rollout_args(config: ExperimentConfig, worker: int) -> list[str]:
    """The extra arguments of `astraflow rollout` for rollout worker number ``worker``: its
    own engine speed when ``launch.rollout_speeds`` gives one."""
    speed = config.launch.rollout_speed(worker)
    return [] if speed is None else ["--set", f"rollout.engine.speed={speed!r}"]


def rl_roles(config: ExperimentConfig, cfg_path: Path, out: Path) -> list[RoleSpec]:
    """Every role of the RL phase, one OS process each; with ``launch.metrics_port_base``,
    each serves its metrics on its own port (in this order, from the base up)."""
    c, o = str(cfg_path), str(out)
    restart = config.launch.restart
    env = role_env(config)
    shared = {**env, **share_env(config, out)}  # the roles that share the cores
    sharing = sharing_roles(config)
    roles = [RoleSpec("producer", cli("produce", c, "--out", o), restart=restart, env=env)]
    roles += [RoleSpec(f"rollout-{i}", cli("rollout", c, "--out", o, *rollout_args(config, i)),
                       restart=restart, env=shared if f"rollout-{i}" in sharing else env)
              for i in range(initial_workers(config))]
    if config.scale.enabled:  # the scaler itself runs in `astraflow run` (run/scaling.py)
        roles.append(RoleSpec("reporter", cli("report", c, "--out", o), restart=restart,
                              env=env))
    if config.data.pre_rollout:
        roles.append(RoleSpec("policy-pre", cli("policy", c, "pre_rollout", "--out", o),
                              restart=restart, env=env))
    roles.append(RoleSpec("policy-post", cli("policy", c, "post_rollout", "--out", o),
                          restart=restart, env=env))
    for p in config.policies:
        roles.append(RoleSpec(f"policy-batch-{p}",
                              cli("policy", c, "batch", "--policy", p, "--out", o),
                              restart=restart, env=env))
        train = cli("train", c, "--policy", p, "--out", o)
        ranks = config.launch.trainer_ranks
        roles.append(RoleSpec(f"trainer-{p}", gang_argv(ranks, train) if ranks > 1 else train,
                              restart=restart, terminal=True,
                              env=shared if f"trainer-{p}" in sharing else env))
        if config.launch.evaluate:
            roles.append(RoleSpec(f"evaluator-{p}", cli("evaluate", c, "--policy", p, "--out", o),
                                  restart=restart, env=env, nice=config.launch.eval_nice))
    if config.launch.evaluate and config.team_workflow() == "solver_verifier":
        # the team as a whole: the episode with every policy's newest weights, greedy
        roles.append(RoleSpec("evaluator-team", cli("evaluate", c, "--team", "--out", o),
                              restart=restart, env=env, nice=config.launch.eval_nice))
    base = config.launch.metrics_port_base
    if base is not None:
        for i, role in enumerate(roles):
            role.metrics_port = base + i
    return roles


def warmup_config(config: ExperimentConfig) -> ExperimentConfig:
    """The SFT phase's config: its own run (topics), the trainer in sft mode; a policy's own
    ``launch.warmup.policies.<policy>`` lr and steps become its ``trainers.<policy>`` (the RL
    phase's ``trainers`` overrides do not apply to the warm-up)."""
    w = config.launch.warmup
    data = config.model_dump()
    data["run"] = f"{config.run}-warmup"
    t = data["trainer"]
    # one process, single-file checkpoints: the warm-up's checks read each checkpoint's
    # model.safetensors (run/warmup_checks.py); lora=None: the warm-up fine-tunes the whole
    # model, RL's LoRA adapts the warm model
    t.update(mode="sft", parallel="ddp", max_steps=w.steps, checkpoint_every=w.steps,
             grad_clip=w.grad_clip, checkpoint_dir="{out}/checkpoints/warmup-{policy}",
             publish_initial=False, lora=None)
    banded = any(w.band(p) is not None for p in config.policies)
    if banded:
        # `astraflow run` measures each checkpoint while the trainer goes on; a few kept give
        # it time to pin one before the trainer prunes it (run/warmup.py)
        t.update(checkpoint_every=w.check_every, keep_checkpoints=max(4, t["keep_checkpoints"]))
    t["optimizer"]["lr"] = w.lr
    t["optimizer"]["warmup_steps"] = 0
    data["trainers"] = {}
    for p in config.policies:
        own: dict[str, Any] = {}
        if w.lr_of(p) != w.lr:
            own["optimizer"] = {"lr": w.lr_of(p)}
        if w.steps_of(p) != w.steps:
            own["max_steps"] = w.steps_of(p)
            if not banded:
                own["checkpoint_every"] = max(1, w.steps_of(p))
        if own:
            data["trainers"][p] = own
    data["launch"].update(evaluate=False, stop_at_accuracy=None)
    return ExperimentConfig.model_validate(data)


def produce_demonstrations(config: ExperimentConfig, warm: ExperimentConfig, policy: str,
                           out: Path, bus: Any) -> int:
    """The warm-up's SFT batches of ``policy``: the producer's train split with reference
    answers; for the policy playing a team's ``verifier`` role, right and wrong claims about
    that split (half each) with the verdict to give (:mod:`astraflow.producers.claims`); for
    a ``solver_verifier`` team's solver, also retries after a reject (one per
    ``launch.warmup.retry_every`` problems: a wrong first answer, the verifier's text as a
    right verifier writes it, the right answer), so the solver knows the protocol."""
    from dataclasses import replace

    from astraflow.models.tiny import load
    from astraflow.producers import split_specs, with_system
    from astraflow.producers.claims import claim_specs
    from astraflow.producers.demos import demo_batches, produce_demos
    from astraflow.run.resources import model_dir
    from astraflow.run.roles import verifier_turn

    _, tok = load(model_dir(config, policy, out))
    # the whole train split (not producer.arithmetic.count), each prompt as released
    pc = config.producer.model_copy(update={"arithmetic": config.producer.arithmetic.model_copy(
        update={"count": None})})
    specs: Any = (replace(s, prompt=with_system(s.prompt, pc.system_prompt))
                  for s in split_specs(pc, "train", out))
    extra: Any = iter(())
    role = config.role_of(policy)
    if role == "verifier":
        specs = claim_specs(specs, prompt=verifier_turn(config)[0], seed=config.seed,
                            work=config.launch.warmup.verifier_work)
    elif role == "solver" and config.team_workflow() == "solver_verifier" \
            and config.launch.warmup.retry_every:
        specs = list(specs)
        extra = retry_demonstrations(config, tok, specs[::config.launch.warmup.retry_every])
    elif config.workflow() == "multi_turn_tools":
        extra = tool_demonstrations(config, tok, list(specs))
        specs = iter(())
    w = config.launch.warmup
    return produce_demos(bus, warm.run, policy,
                         demo_batches(tok, specs, policy=policy, batch_size=w.batch_size,
                                      steps=w.steps_of(policy), extra=extra))


#: the tool that computes each arithmetic operator, for the tool-use demonstrations
OP_TOOLS = {"*": "mul", "+": "add"}


def tool_demonstrations(config: ExperimentConfig, tokenizer: Any, specs: list[Any]) -> list[Any]:
    """The ``multi_turn_tools`` warm-up: for each arithmetic problem ``a<op>b=``, the episode a
    tool user writes, laid out under the tokenizer's chat template as the workflow lays it
    out: the call ``<tool>TOOL(a,b)</tool>`` (trained; ``</tool>`` ends the turn, no
    ``<eos>``), the tool's real output as a ``tool`` message in the workflow's
    ``result_format`` (masked 0), the answer and ``<eos>`` (trained). The tool is the one
    :data:`OP_TOOLS` names for the operator; a problem with another operator, or whose tool
    the workflow's ``tools`` leaves out, is answered directly (one turn)."""
    import re

    from astraflow.consumers.rollout.tools import TOOLS
    from astraflow.consumers.rollout.workflows.multi_turn import CLOSE, OPEN
    from astraflow.core.records import ChatMessage
    from astraflow.producers.demos import Turn, turns_demonstration

    kw = config.workflow_kwargs()
    fmt = str(kw.get("result_format", "<result>{output}</result>"))
    allowed = kw.get("tools")
    out = []
    for spec in specs:
        problem = "".join(m.content for m in spec.prompt if m.role != "system")
        answer = Turn(ChatMessage(role="assistant", content=str(spec.reference["answer"])),
                      trained=True)
        m = re.fullmatch(r"\s*(-?\d+)\s*([*+])\s*(-?\d+)\s*=\s*", problem)
        tool = OP_TOOLS.get(m.group(2)) if m else None
        if tool is None or (allowed is not None and tool not in allowed):
            out.append(turns_demonstration(tokenizer, spec, [answer], kind="sft"))
            continue
        assert m is not None  # (a tool was found for it above)
        a, b = int(m.group(1)), int(m.group(3))
        output = str(TOOLS.resolve(tool)(a, b))
        out.append(turns_demonstration(tokenizer, spec, [
            Turn(ChatMessage(role="assistant", content=f"{OPEN}{tool}({a},{b}){CLOSE}"),
                 trained=True, eos=False),
            Turn(ChatMessage(role="tool", name=tool, content=fmt.format(output=output))),
            answer], kind="sft-tools"))
    return out


def retry_demonstrations(config: ExperimentConfig, tokenizer: Any, specs: list[Any]) -> Any:
    """A solver's retry demonstrations over ``specs`` (see :func:`produce_demonstrations`):
    the feedback is the workflow's retry prompt around the text a right verifier writes for a
    wrong claim (its work in ``launch.warmup.verifier_work``, then the reject word)."""
    import random

    from astraflow.consumers.rollout.workflows.solver_verifier import RETRY_PROMPT
    from astraflow.producers.claims import claim_specs, problem_of, wrong_answer
    from astraflow.producers.demos import retry_demonstration
    from astraflow.run.roles import verifier_turn

    template = str(config.team_kwargs().get("retry_prompt", RETRY_PROMPT))
    prompt = verifier_turn(config)[0]
    rng = random.Random(config.seed + 1)
    for spec in specs:
        right = str(spec.reference["answer"])
        wrong_claim = list(claim_specs([spec], prompt=prompt,
                                       work=config.launch.warmup.verifier_work))[1]
        feedback = template.format(verdict=wrong_claim.reference["answer"],
                                   problem=problem_of(spec))
        yield retry_demonstration(tokenizer, spec, first=wrong_answer(right, rng),
                                  feedback=feedback)


def newest_checkpoint(root: Path) -> Path | None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    return steps[-1] if steps else None


#: in the model directory exported from a LoRA checkpoint: the adapter, as peft saves one
ADAPTER_DIR = "adapter"


def write_peft_adapter(adapter: dict[str, Any], lora_scale: float, base_model: Path,
                       dest: Path) -> Path:
    """A LoRA checkpoint's adapter (the trainable tensors by the peft model's names) as peft
    saves one, into ``dest`` (created): ``adapter_model.safetensors`` (peft's names, without
    the adapter name ``.default``) and ``adapter_config.json`` (r read from the tensors, alpha
    = ``lora_scale`` · r, the target modules the tensors name, ``base_model`` as an absolute
    path). For using the adapter apart from the merged model: peft's
    ``PeftModel.from_pretrained`` and ``vllm serve --enable-lora --lora-modules``."""
    import json

    from safetensors.torch import save_file

    from astraflow.core.errors import WeightIntegrityError
    from astraflow.core.records import AdapterSpec
    from astraflow.weights.adapter import (
        adapter_config,
        fingerprint,
        is_adapter_tensor,
        module_pairs,
    )

    tensors = {n.replace(".default.", "."): t.contiguous() for n, t in adapter.items()
               if is_adapter_tensor(n.replace(".default.", "."))}
    pairs = module_pairs(set(tensors))
    if not pairs:
        raise WeightIntegrityError(f"the LoRA checkpoint exported to {dest.parent} holds no "
                                   "adapter tensors (lora_A / lora_B)")
    r = int(tensors[next(iter(pairs.values()))[0]].shape[0])  # lora_A: [r, in]
    spec = AdapterSpec(r=r, alpha=lora_scale * r,
                       target_modules=sorted({m.rsplit(".", 1)[-1] for m in pairs}),
                       base_model=str(base_model.resolve()),
                       base_fingerprint=fingerprint(base_model))
    dest.mkdir(parents=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})
    (dest / "adapter_config.json").write_text(json.dumps(adapter_config(spec), indent=1))
    return dest


def export_model(checkpoint: Path, base_model: Path, dest: Path,
                 lora_scale: float | None = None) -> Path:
    """A Hugging Face model directory: the base's config and tokenizer, the checkpoint's
    weights (atomically: built aside, then renamed over ``dest``). ``lora_scale`` (alpha / r of
    a ``trainer.lora`` checkpoint, which holds the adapter only): the base's weights with the
    adapter merged, and the adapter apart in ``dest/adapter`` (:func:`write_peft_adapter`).
    Its files get the umask's permissions, as any other file the user writes."""
    from astraflow.models.importer import open_up

    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base_model.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    if (checkpoint / "model.safetensors").exists():
        weights_file = checkpoint / "model.safetensors"
    else:  # a sharded (fsdp) checkpoint: its whole weights
        from safetensors.torch import save_file

        from astraflow.consumers.trainer.sharded_checkpoint import full_weights

        weights_file = tmp / "whole.safetensors"
        save_file(full_weights(checkpoint / "dcp"), str(weights_file))
    if lora_scale is None:
        if weights_file.parent == tmp:
            weights_file.rename(tmp / "model.safetensors")
        else:
            shutil.copy2(weights_file, tmp / "model.safetensors")
    else:
        from safetensors.torch import load_file, save_file

        from astraflow.weights.adapter import merged_weights

        base: dict[str, Any] = {}
        for f in sorted(base_model.glob("*.safetensors")):
            base.update(load_file(str(f)))
        adapter = load_file(str(weights_file))
        save_file(merged_weights(base, adapter, lora_scale), str(tmp / "model.safetensors"))
        write_peft_adapter(adapter, lora_scale, base_model, tmp / ADAPTER_DIR)
        if weights_file.parent == tmp:
            weights_file.unlink()
    open_up(tmp)  # safetensors and a checkpoint's files are 0600
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest

