"""The policy loss against values computed by hand and by an independent scalar reference,
for every combination of switches, with masks and ragged lengths; gradients checked
numerically; the decoupled correction reduces exactly to on-policy GRPO."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from astraflow.consumers.trainer.losses import (
    LossSpec,
    kl_penalty,
    policy_loss,
    sft_loss,
    token_entropy,
    token_logprobs,
    token_weights,
)

# Three ragged sequences over 5 positions; masked positions hold garbage (large values) that
# must never leak into the loss.
MASK = [[0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]
LOGP = [[40.0, -1.10, -0.70, -2.30, -0.20], [-30.0, 50.0, -1.60, -0.90, 60.0],
        [0.0, -1.25, 99.0, -99.0, 7.0]]
PROX = [[0.0, -1.30, -0.40, -2.00, -0.60], [0.0, 0.0, -1.20, -1.35, 0.0],
        [0.0, -1.00, 0.0, 0.0, 0.0]]
BEHAV = [[0.0, -1.20, -1.10, -2.10, -0.50], [0.0, 0.0, -2.30, -1.40, 0.0],
         [0.0, -0.90, 0.0, 0.0, 0.0]]
REF = [[0.0, -1.00, -0.80, -2.50, -0.10], [0.0, 0.0, -1.50, -1.10, 0.0],
       [0.0, -1.40, 0.0, 0.0, 0.0]]
ENT = [[0.0, 1.10, 0.90, 2.00, 0.30], [0.0, 0.0, 1.70, 1.20, 0.0],
       [0.0, 0.60, 0.0, 0.0, 0.0]]
ADV = [0.8, -1.2, -0.5]


def t(x: list, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def reference(spec: LossSpec, logp=LOGP, prox=PROX, behav=BEHAV, ref=REF, ent=ENT, adv=ADV,
              mask=MASK) -> float:
    """The loss computed token by token with Python floats."""
    seq_sums, seq_counts = [], []
    for i, row in enumerate(mask):
        total, n = 0.0, 0
        for j, m in enumerate(row):
            if not m:
                continue
            a, lp = adv[i], logp[i][j]
            if spec.decoupled:
                w = math.exp(prox[i][j] - behav[i][j])
                if spec.behaviour_cap is not None and w > spec.behaviour_cap:
                    w = spec.behaviour_cap if spec.behaviour_cap_mode == "clip" else 0.0
                elif (spec.behaviour_cap_mode == "mask_both"
                      and w < 1.0 / spec.behaviour_cap):  # type: ignore[operator]
                    w = 0.0
                r = math.exp(lp - prox[i][j])
            else:
                w, r = 1.0, math.exp(lp - behav[i][j])
            c = min(max(r, 1 - spec.eps_low), 1 + spec.eps_high)
            pg = max(-a * r, -a * c)
            if spec.dual_clip is not None and a < 0:
                pg = min(pg, -spec.dual_clip * a)
            loss = pg * w
            if spec.kl == "k1":
                loss += spec.kl_coef * (lp - ref[i][j])
            elif spec.kl == "k3":
                d = ref[i][j] - lp
                loss += spec.kl_coef * (math.exp(d) - d - 1)
            loss -= spec.entropy_coef * ent[i][j]
            total += loss
            n += 1
        seq_sums.append(total)
        seq_counts.append(n)
    seqs = sum(1 for n in seq_counts if n)
    if spec.aggregation == "token-mean":
        return sum(seq_sums) / sum(seq_counts)
    if spec.aggregation == "seq-mean-token-mean":
        return sum(s / n for s, n in zip(seq_sums, seq_counts, strict=True) if n) / seqs
    length = spec.norm_length or max(seq_counts)
    return sum(seq_sums) / (length * seqs)


def run(spec: LossSpec, *, logp: torch.Tensor | None = None) -> torch.Tensor:
    return policy_loss(t(LOGP) if logp is None else logp, t(BEHAV), t(ADV), t(MASK), spec,
                       prox=t(PROX), ref_logp=t(REF), entropy=t(ENT)).loss


SWITCHES = list(itertools.product(
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
    [(0.2, 0.2), (0.2, 0.28)],  # symmetric / asymmetric clip
    [None, 3.0],  # dual clip
    [("none", 0.0), ("k1", 0.1), ("k3", 0.1)],
    [True, False],  # decoupled
    [(None, "clip"), (1.3, "clip"), (1.3, "mask"), (1.3, "mask_both")],  # behaviour cap
    [0.0, 0.05],  # entropy bonus
))


@pytest.mark.parametrize("agg,eps,dual,kl,decoupled,cap,ent", SWITCHES)
def test_loss_matches_scalar_reference(agg, eps, dual, kl, decoupled, cap, ent) -> None:
    spec = LossSpec(aggregation=agg, eps_low=eps[0], eps_high=eps[1], dual_clip=dual,
                    kl=kl[0], kl_coef=kl[1], decoupled=decoupled, behaviour_cap=cap[0],
                    behaviour_cap_mode=cap[1], entropy_coef=ent)
    got = run(spec)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(reference(spec), rel=1e-12, abs=1e-12)


def test_norm_length_constant() -> None:
    spec = LossSpec(aggregation="seq-mean-token-sum-norm", norm_length=8)
    assert run(spec).item() == pytest.approx(reference(spec), rel=1e-12)


def test_hand_computed_values() -> None:
    one = t([[0, 1]])
    zero_lp = t([[0.0, 0.0]])

    def loss(logp: float, adv: float, **kw: object) -> float:
        spec = LossSpec(decoupled=False, **kw)  # type: ignore[arg-type]
        return policy_loss(t([[0.0, logp]]), zero_lp, t([adv]), one, spec).loss.item()

    assert loss(0.0, 1.0) == pytest.approx(-1.0)  # ratio 1: -A
    assert loss(math.log(1.5), 1.0) == pytest.approx(-1.2)  # clipped at 1 + 0.2
    assert loss(math.log(1.5), 1.0, eps_high=0.28) == pytest.approx(-1.28)  # clip-higher
    assert loss(math.log(0.5), -1.0) == pytest.approx(0.8)  # max(0.5, 0.8)
    assert loss(math.log(5.0), -1.0) == pytest.approx(5.0)  # unclipped for A<0, r>1
    assert loss(math.log(5.0), -1.0, dual_clip=3.0) == pytest.approx(3.0)  # dual clip
    assert loss(math.log(0.5), 1.0) == pytest.approx(-0.5)  # min of the objective
    # decoupled: r = π/π_prox = 1, w = π_prox/π_behav = e^1 capped at 2
    spec = LossSpec(behaviour_cap=2.0)
    got = policy_loss(t([[0.0, -1.0]]), t([[0.0, -2.0]]), t([1.0]), one, spec).loss.item()
    assert got == pytest.approx(-2.0)
    masked = LossSpec(behaviour_cap=2.0, behaviour_cap_mode="mask")
    got = policy_loss(t([[0.0, -1.0]]), t([[0.0, -2.0]]), t([1.0]), one, masked).loss.item()
    assert got == 0.0
    # token-mean over 3 tokens vs seq-mean-token-mean over 2 sequences (lengths 2 and 1)
    mask = t([[1, 1], [1, 0]])
    adv = t([1.0, -2.0])
    lp = torch.zeros(2, 2, dtype=torch.float64)
    tm = policy_loss(lp, lp, adv, mask, LossSpec()).loss.item()
    sm = policy_loss(lp, lp, adv, mask, LossSpec(aggregation="seq-mean-token-mean")).loss.item()
    sn = policy_loss(lp, lp, adv, mask,
                     LossSpec(aggregation="seq-mean-token-sum-norm")).loss.item()
    assert tm == pytest.approx((-1 - 1 + 2) / 3)
    assert sm == pytest.approx(((-1 - 1) / 2 + 2 / 1) / 2)
    assert sn == pytest.approx((-2 + 2) / (2 * 2))
    # KL estimators: log π - log π_ref = 0.5
    assert kl_penalty(t([0.0]), t([-0.5]), "k1").item() == pytest.approx(0.5)
    assert kl_penalty(t([0.0]), t([-0.5]), "k3").item() == pytest.approx(
        math.exp(-0.5) + 0.5 - 1)


def test_sequence_level_behaviour_weight_is_the_product_over_the_loss_tokens() -> None:
    # one step per batch: prox = logp, so each token's weight is exp(logp - behav)
    logp = t([[-1.0, -0.5, -0.2, -3.0], [-0.1, -0.1, 0.0, 0.0]])
    behav = t([[-1.2, -0.9, -0.1, -0.0], [-0.4, -0.1, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])  # the last token of row 0 is not the policy's
    adv = t([1.0, -1.0])
    seq = LossSpec(behaviour_level="sequence", behaviour_cap=None)
    out = policy_loss(logp, behav, adv, mask, seq)
    w0 = math.exp(0.2 + 0.4 - 0.1)  # row 0's three loss tokens; the masked one counts not
    w1 = math.exp(0.3)
    assert out.stats["behav_weight_sum"] == pytest.approx(3 * w0 + 2 * w1)
    # token-mean of -A·w: the objective's value at ratio 1
    assert out.loss.item() == pytest.approx((-3 * w0 + 2 * w1) / 5)
    tok = policy_loss(logp, behav, adv, mask, LossSpec(behaviour_cap=None))
    assert tok.stats["behav_weight_sum"] == pytest.approx(
        math.exp(0.2) + math.exp(0.4) + math.exp(-0.1) + math.exp(0.3) + 1.0)
    # capped as a whole: clip to the cap, or drop the sequence
    clip = policy_loss(logp, behav, adv, mask,
                       LossSpec(behaviour_level="sequence", behaviour_cap=1.5))
    assert clip.stats["behav_weight_sum"] == pytest.approx(3 * 1.5 + 2 * w1)
    assert clip.stats["capped"] == 3.0
    drop = policy_loss(logp, behav, adv, mask, LossSpec(behaviour_level="sequence",
                                                        behaviour_cap=1.5,
                                                        behaviour_cap_mode="mask"))
    assert drop.loss.item() == pytest.approx(2 * w1 / 5)
    # a long sequence whose product overflows float64 gives a finite, capped weight
    n = 2000
    far = policy_loss(torch.zeros(1, n, dtype=torch.float64), t([[-1.0] * n]), t([1.0]),
                      torch.ones(1, n, dtype=torch.float64),
                      LossSpec(behaviour_level="sequence", behaviour_cap=5.0))
    assert far.stats["behav_weight_max"] == 5.0 and math.isfinite(far.loss.item())
    with pytest.raises(ValueError, match="behaviour_level"):
        LossSpec(behaviour_level="episode")


def test_token_weights_of_microbatches_add_up() -> None:
    mask = t(MASK)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = token_weights(mask, agg)
        parts = torch.cat([token_weights(mask[i:i + 1], agg, n_tokens=mask.sum().item(),
                                         n_seqs=3, norm_length=4) for i in range(3)])
        assert torch.allclose(whole, parts), agg
        if agg != "seq-mean-token-sum-norm":
            assert whole.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl", ["none", "k1", "k3"])
@pytest.mark.parametrize("decoupled,cap,dual", [(True, 1.3, 3.0), (False, None, 3.0),
                                                (True, None, None)])
def test_gradcheck(agg: str, kl: str, decoupled: bool, cap: float | None,
                   dual: float | None) -> None:
    spec = LossSpec(aggregation=agg, kl=kl, kl_coef=0.1 if kl != "none" else 0.0,
                    decoupled=decoupled, behaviour_cap=cap, dual_clip=dual, eps_high=0.28,
                    entropy_coef=0.05)
    logp = t(LOGP).requires_grad_()
    ent = t(ENT).requires_grad_()

    def f(lp: torch.Tensor, en: torch.Tensor) -> torch.Tensor:
        return policy_loss(lp, t(BEHAV), t(ADV), t(MASK), spec, prox=t(PROX),
                           ref_logp=t(REF), entropy=en).loss

    assert torch.autograd.gradcheck(f, (logp, ent), eps=1e-6, atol=1e-7)


def test_gradcheck_logprobs_entropy_and_sft() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).requires_grad_()
    targets = torch.tensor([[1, 4, 0], [2, 2, 3]])
    mask = t([[1, 1, 0], [0, 1, 1]])

    def lp(x: torch.Tensor) -> torch.Tensor:
        return token_logprobs(x, targets, temperature=0.7).double()

    def ent(x: torch.Tensor) -> torch.Tensor:
        return token_entropy(x, temperature=0.7).double()

    def sft(x: torch.Tensor) -> torch.Tensor:
        return sft_loss(lp(x), mask).loss

    # float32 internally: compare with a loose tolerance against float64 finite differences
    for fn in (lp, ent, sft):
        assert torch.autograd.gradcheck(fn, (logits,), eps=1e-3, atol=2e-3, rtol=2e-3)
    ref = torch.log_softmax(logits.detach() / 0.7, -1).gather(-1, targets.unsqueeze(-1))
    assert torch.allclose(lp(logits.detach()), ref.squeeze(-1), atol=1e-6)
    p = torch.softmax(logits.detach() / 0.7, -1)
    assert torch.allclose(ent(logits.detach()), -(p * p.log()).sum(-1), atol=1e-6)
    nll = -(ref.squeeze(-1) * mask).sum() / mask.sum()
    assert sft(logits.detach()).item() == pytest.approx(nll.item(), abs=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_decoupled_reduces_exactly_to_on_policy_grpo(agg: str) -> None:
    """behaviour = proximal = current policy: weight exactly 1, ratio exactly 1, and the loss
    and its gradient are those of plain clipped GRPO against the rollout's logprobs."""
    spec = LossSpec(aggregation=agg, behaviour_cap=1.3, dual_clip=3.0, eps_high=0.28)
    current = t(LOGP)
    grads = []
    values = []
    for decoupled in (True, False):
        logp = current.clone().requires_grad_()
        out = policy_loss(logp, current, t(ADV), t(MASK),
                          LossSpec(**{**spec.__dict__, "decoupled": decoupled}))
        out.loss.backward()
        grads.append(logp.grad)
        values.append(out.loss.detach())
        assert out.stats["behav_weight_max"] == 1.0
        assert out.stats["capped"] == out.stats["clip_low"] == out.stats["clip_high"] == 0
    assert torch.equal(values[0], values[1])
    assert torch.equal(grads[0], grads[1])
    # on-policy GRPO: loss = Σ -A·ω, gradient -A·ω
    w = token_weights(t(MASK), agg)
    expected = -(t(ADV).unsqueeze(-1) * w)
    assert torch.allclose(grads[0], expected, atol=1e-15)
    assert values[0].item() == pytest.approx(expected.sum().item(), abs=1e-15)


def test_stale_data_is_corrected() -> None:
    """With behaviour ≠ proximal the weight moves the loss away from the on-policy value."""
    spec = LossSpec()
    on = policy_loss(t(LOGP), t(PROX), t(ADV), t(MASK), spec, prox=t(PROX)).loss
    off = policy_loss(t(LOGP), t(BEHAV), t(ADV), t(MASK), spec, prox=t(PROX)).loss
    assert not torch.isclose(on, off)


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        LossSpec(aggregation="mean")
    with pytest.raises(ValueError, match="dual_clip"):
        LossSpec(dual_clip=0.5)
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(t(LOGP), t(BEHAV), t(ADV), t(MASK), LossSpec(kl="k1", kl_coef=0.1))


def test_the_two_sided_mask_and_the_geometric_mean_level() -> None:
    """IcePop's two-sided mask (weight 0 outside [1/cap, cap]) and the sequence-level
    geometric mean of the ratios (every token of a sequence gets exp(mean log w))."""
    logp = t([[-1.0, -0.5, -0.2, -3.0], [-0.1, -0.1, 0.0, 0.0]])
    behav = t([[-1.2, -0.9, -0.1, -0.0], [-0.4, -0.1, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv = t([1.0, -1.0])
    # token weights exp(0.2), exp(0.4), exp(-0.1) | exp(0.3), 1: with cap 1.3 the two-sided
    # mask drops exp(0.4) = 1.49 and keeps exp(-0.1) = 0.905 (above 1/1.3 = 0.77) ...
    both = policy_loss(logp, behav, adv, mask,
                       LossSpec(behaviour_cap=1.3, behaviour_cap_mode="mask_both"))
    assert both.stats["capped"] == 2.0  # exp(0.4) and exp(0.3)
    assert both.stats["behav_weight_sum"] == pytest.approx(math.exp(0.2) + math.exp(-0.1) + 1)
    # ... and a weight below 1/cap is dropped as well: behav above the policy by 0.5
    low = policy_loss(t([[0.0, -1.0]]), t([[0.0, -0.5]]), t([1.0]), t([[0, 1]]),
                      LossSpec(behaviour_cap=1.5, behaviour_cap_mode="mask_both"))
    assert low.stats["capped"] == 1.0 and low.loss.item() == 0.0
    one_sided = policy_loss(t([[0.0, -1.0]]), t([[0.0, -0.5]]), t([1.0]), t([[0, 1]]),
                            LossSpec(behaviour_cap=1.5, behaviour_cap_mode="mask"))
    assert one_sided.stats["capped"] == 0.0
    # the geometric mean over each sequence's loss tokens, the same for all of them
    geo = policy_loss(logp, behav, adv, mask, LossSpec(behaviour_level="geometric",
                                                       behaviour_cap=None))
    g0, g1 = math.exp((0.2 + 0.4 - 0.1) / 3), math.exp(0.3 / 2)
    assert geo.stats["behav_weight_sum"] == pytest.approx(3 * g0 + 2 * g1)
    assert geo.loss.item() == pytest.approx((-3 * g0 + 2 * g1) / 5)
    # masked as a whole: g0 = 1.181 is above the cap 1.17 (all 3 tokens dropped), g1 = 1.162 not
    drop = policy_loss(logp, behav, adv, mask, LossSpec(
        behaviour_level="geometric", behaviour_cap=1.17, behaviour_cap_mode="mask_both"))
    assert drop.stats["capped"] == 3.0 and drop.stats["behav_weight_sum"] == pytest.approx(
        2 * g1)
    with pytest.raises(ValueError, match="must be > 1"):
        LossSpec(behaviour_cap=0.9, behaviour_cap_mode="mask_both")
    from astraflow.consumers.trainer.config import LossConfig

    with pytest.raises(ValueError, match="behaviour_cap > 1"):
        LossConfig(behaviour_cap=1.0, behaviour_cap_mode="mask_both")
