"""The trainer's memory per rank: a pure function of the model's shape and the trainer's setup.

Model states follow ZeRO's 16 bytes per trained parameter (mixed-precision AdamW), on every rank
under ``ddp`` and divided by the ranks under ``fsdp``; LoRA, a KL reference model, CPU offload
and one micro-batch's activations are added as docs/trainer.md#memory-per-rank derives them.
Estimates for planning (fragmentation, CUDA context and buffers not counted): keep ~10% of the
GPU free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: trained parameter: 16-bit weights 2 + 16-bit grads 2 + fp32 master, momentum, variance 12
STATE_BYTES = 16
ACT_BYTES = 34  # per token, layer and hidden unit kept for the backward pass (16-bit)
LOGIT_BYTES = 12  # per token and vocabulary entry: fp32 logits, log-softmax, gradient
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """A llama/qwen-style decoder (grouped KV heads, gated MLP)."""

    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 0  # 0: hidden // heads
    tied: bool = False  # input and output embeddings shared

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one block."""
        h, q, kv, i = self.hidden, self.heads * self.hd, self.kv_heads * self.hd, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def block_params(self) -> int:
        return sum(a * b for a, b in self.linears().values()) + 2 * self.hidden

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return embed + self.layers * self.block_params + self.hidden

    def lora_params(self, r: int, targets: tuple[str, ...] = ALL_LINEAR) -> int:
        lin = self.linears()
        unknown = sorted(set(targets) - set(lin))
        if unknown:
            raise ValueError(f"unknown LoRA target modules {unknown}; valid: {', '.join(lin)}")
        return self.layers * sum(r * (lin[t][0] + lin[t][1]) for t in targets)

    @classmethod
    def from_config(cls, cfg: dict[str, object]) -> ModelShape:
        """From a Hugging Face config.json (``text_config`` when it has one)."""
        text = cfg.get("text_config")
        c: dict[str, object] = text if isinstance(text, dict) else cfg

        def num(key: str, default: int = 0) -> int:
            v = c.get(key)
            return int(v) if isinstance(v, int | float | str) and str(v) else default

        h = num("hidden_size")
        heads = num("num_attention_heads", 1)
        return cls(hidden=h, layers=num("num_hidden_layers"), vocab=num("vocab_size"),
                   heads=heads, kv_heads=num("num_key_value_heads", heads),
                   intermediate=num("intermediate_size", 4 * h), head_dim=num("head_dim"),
                   tied=bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings",
                                                                  False))))


#: the model sizes of the table in docs/trainer.md (the shapes of Qwen2.5 0.5B-32B and
#: Llama-3 70B, from their config.json)
SIZES: dict[str, ModelShape] = {
    "0.5B": ModelShape(896, 24, 151936, 14, 2, 4864, tied=True),
    "1.5B": ModelShape(1536, 28, 151936, 12, 2, 8960, tied=True),
    "7B": ModelShape(3584, 28, 152064, 28, 4, 18944),
    "14B": ModelShape(5120, 48, 152064, 40, 8, 13824),
    "32B": ModelShape(5120, 64, 152064, 40, 8, 27648),
    "70B": ModelShape(8192, 80, 128256, 64, 8, 28672),
}


@dataclass(frozen=True)
class TrainerSetup:
    """What decides the trainer's memory besides the model."""

    parallel: str = "ddp"  # "ddp" | "fsdp"
    ranks: int = 1
    mixed_precision: bool = True  # bf16 compute; False: fp32 throughout
    lora_r: int | None = None  # None: full fine-tuning
    lora_targets: tuple[str, ...] = ALL_LINEAR
    offload: bool = False  # fsdp: sharded states in host memory
    micro_batch_tokens: int = 4096
    activation_checkpointing: bool = False
    reference: bool = False  # loss.kl: a frozen fp32 copy of the model (LoRA: none, the base)


@dataclass(frozen=True)
class TrainerMemory:
    """Bytes per rank, by what holds them; ``device`` is what the GPU must hold."""

    params: int  # the model's parameters
    trained: int  # parameters with gradients and optimizer state
    states: int  # weights, gradients, master weights and moments held by this rank
    working: int  # fsdp: unsharded blocks being computed
    activations: int
    offloaded: int = 0  # states held in host memory instead (offload)
    notes: tuple[str, ...] = field(default=())

    @property
    def device(self) -> int:
        return self.states + self.working + self.activations


def trainer_memory(model: ModelShape | int, setup: TrainerSetup = TrainerSetup(), *,
                   params: int | None = None) -> TrainerMemory:
    """The trainer's bytes per rank (module docstring: the formula and its sources). ``model``:
    a shape, or a bare parameter count (then no LoRA, no activations, no working set);
    ``params``: the exact count where known (the safetensors headers), else the shape's."""
    if setup.parallel not in ("ddp", "fsdp"):
        raise ValueError(f"unknown parallel {setup.parallel!r}; valid: ddp, fsdp")
    if setup.ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {setup.ranks}")
    shape = model if isinstance(model, ModelShape) else None
    params = params or (model.params if isinstance(model, ModelShape) else int(model))
    if setup.lora_r is not None and shape is None:
        raise ValueError("LoRA needs the model's shape (its linear layers), not a count")
    wbytes = 2 if setup.mixed_precision else 4
    if setup.lora_r is None:
        trained, frozen_bytes = params, 0
    else:
        assert shape is not None
        trained = shape.lora_params(setup.lora_r, setup.lora_targets)
        frozen_bytes = params * wbytes  # the base: weights only
    states = trained * STATE_BYTES + frozen_bytes
    if setup.reference and setup.lora_r is None:  # LoRA's reference is its own base
        states += params * 4  # the KL reference: fp32 weights, sharded like the model
    working = 0
    n = setup.ranks if setup.parallel == "fsdp" else 1
    if setup.parallel == "fsdp":
        states = -(-states // n)
        if shape is not None:  # two blocks gathered (one computed, one prefetched) + grads
            grads = 1 if setup.lora_r is None else 0
            working = 2 * shape.block_params * wbytes * (1 + grads)
    offloaded = 0
    if setup.offload:
        if setup.parallel != "fsdp":
            raise ValueError("CPU offload is FSDP's (trainer.parallel: fsdp)")
        offloaded, states = states, 0
    acts = 0
    if shape is not None:
        t, h = setup.micro_batch_tokens, shape.hidden
        scale = 1 if setup.mixed_precision else 2
        if setup.activation_checkpointing:
            acts = (2 * t * h * shape.layers + ACT_BYTES * t * h) * scale
        else:
            acts = ACT_BYTES * t * h * shape.layers * scale
        acts += LOGIT_BYTES * t * shape.vocab
    return TrainerMemory(params=params, trained=trained, states=states, working=working,
                         activations=acts, offloaded=offloaded)


def largest_fitting(gpu_bytes: int, setup: TrainerSetup, *, margin: float = 0.9
                    ) -> tuple[str, ModelShape] | None:
    """The largest of :data:`SIZES` whose trainer fits ``margin`` of a GPU of ``gpu_bytes``
    under ``setup`` (None: not even the smallest)."""
    fits = [(name, s) for name, s in SIZES.items()
            if trainer_memory(s, setup).device <= margin * gpu_bytes]
    return max(fits, key=lambda e: e[1].params, default=None)


def max_params(gpu_bytes: int, setup: TrainerSetup, *, margin: float = 0.9) -> int:
    """The most parameters whose model states fit ``margin`` of the GPU (full fine-tuning,
    activations and working set left out: a bound for a model of unknown shape)."""
    per = STATE_BYTES / (setup.ranks if setup.parallel == "fsdp" else 1)
    return int(margin * gpu_bytes / per) if not setup.offload else 0


def gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def table(ranks: tuple[int, ...] = (1, 8, 64), micro_batch_tokens: int = 4096,
          lora_r: int = 16) -> str:
    """The markdown table of docs/trainer.md: GiB per rank on the GPU for each size × full /
    LoRA × ranks, under FSDP (1 rank: the same as DDP's, without FSDP's working set)."""
    head = ["model", "params", "tuning"] + [f"{n} GPU{'s' * (n > 1)}" for n in ranks]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, shape in SIZES.items():
        for tuning, r in (("full", None), (f"LoRA r={lora_r}", lora_r)):
            cells = []
            for n in ranks:
                setup = TrainerSetup(parallel="fsdp" if n > 1 else "ddp", ranks=n,
                                     lora_r=r, micro_batch_tokens=micro_batch_tokens,
                                     activation_checkpointing=True)
                cells.append(gib(trainer_memory(shape, setup).device))
            rows.append(f"| {name} | {shape.params / 1e9:.2f}B | {tuning} | "
                        + " | ".join(cells) + " |")
    return "\n".join(rows)



if __name__ == "__main__":  # python -m astraflow.run.trainer_memory: the table of the docs
    print(table())
