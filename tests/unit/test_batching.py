"""pad_batch / token_logprobs / num_micro_batches: the pure tensor plumbing of the train engine.

pytest tests/unit/test_batching.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.core.batch import Batch
from streamrl.core.errors import StreamRLError
from streamrl.core.messages import Rollout
from streamrl.models.logprobs import token_logprobs
from streamrl.train.batching import num_micro_batches, pad_batch, plan_micro_batches

PAD = 0


def make_batch(shapes: list[tuple[int, int]], with_ref: bool = False, seed: int = 0) -> Batch:
    """Rollouts with (prompt_len, completion_len) shapes; ids start at 5 so no real token equals PAD."""
    rng = np.random.default_rng(seed)
    rollouts = [
        Rollout(
            rollout_id=f"g{i}:0",
            group_id=f"g{i}",
            sample=0,
            group_size=1,
            prompt_ids=rng.integers(5, 50, p).astype(np.int32),
            completion_ids=rng.integers(5, 50, c).astype(np.int32),
            logprobs=-rng.random(c).astype(np.float32),
            version=0,
        )
        for i, (p, c) in enumerate(shapes)
    ]
    n = len(rollouts)
    return Batch(
        rollouts=rollouts,
        group_index=np.arange(n),
        rewards=np.zeros(n, np.float32),
        advantages=np.linspace(-1, 1, n).astype(np.float32),
        ref_logprobs=[-rng.random(c).astype(np.float32) for _, c in shapes] if with_ref else None,
        staleness=np.zeros(n, np.int64),
    )


def test_shapes_and_masks():
    batch = make_batch([(3, 4), (5, 1), (1, 6)])
    t = pad_batch(batch, PAD)
    assert t["input_ids"].shape == t["attention_mask"].shape == (3, 7)  # longest prompt+completion
    for key in ("positions", "targets", "mask", "old_logprobs"):
        assert t[key].shape == (3, 6), key  # longest completion
    assert t["advantages"].shape == (3,)
    assert t["attention_mask"].sum(1).tolist() == [7, 6, 7]
    assert t["mask"].sum(1).tolist() == [4.0, 1.0, 6.0]
    assert t["mask"].dtype == torch.float32 and t["input_ids"].dtype == torch.long
    assert "ref_logprobs" not in t
    # padding is right-aligned and uses the pad id
    assert t["input_ids"][1, 6:].tolist() == [PAD]
    assert t["targets"][1, 1:].eq(PAD).all()


def test_completion_token_t_is_predicted_by_prompt_len_plus_t_minus_1():
    batch = make_batch([(3, 4), (5, 2), (1, 6)])
    t = pad_batch(batch, PAD)
    for i, r in enumerate(batch.rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        assert t["positions"][i, :c].tolist() == list(range(p - 1, p + c - 1))
        assert t["positions"][i, c:].eq(0).all()
        # the token at position pos+1 of the full sequence is exactly the target for that position
        for k in range(c):
            pos = int(t["positions"][i, k])
            assert int(t["input_ids"][i, pos + 1]) == int(r.completion_ids[k]) == int(t["targets"][i, k])
        np.testing.assert_array_equal(t["old_logprobs"][i, :c].numpy(), r.logprobs)
        assert t["old_logprobs"][i, c:].eq(0).all()
    np.testing.assert_allclose(t["advantages"].numpy(), batch.advantages)


def test_ref_logprobs_are_padded_like_the_completion():
    batch = make_batch([(2, 3), (2, 1)], with_ref=True)
    t = pad_batch(batch, PAD)
    np.testing.assert_array_equal(t["ref_logprobs"][0].numpy(), batch.ref_logprobs[0])
    assert t["ref_logprobs"][1, 0].item() == pytest.approx(float(batch.ref_logprobs[1][0]))
    assert t["ref_logprobs"][1, 1:].eq(0).all()


def test_ref_logprobs_of_the_wrong_length_name_the_rollout():
    batch = make_batch([(2, 3)], with_ref=True)
    batch.ref_logprobs = [np.zeros(2, np.float32)]
    with pytest.raises(StreamRLError, match="g0:0.*2 reference log-probs for 3"):
        pad_batch(batch, PAD)


def test_empty_prompt_is_rejected_with_the_fix():
    with pytest.raises(StreamRLError, match="at least one token"):
        pad_batch(make_batch([(0, 3)]), PAD)


def test_empty_batch_gives_one_fully_masked_row():
    t = pad_batch(make_batch([]), PAD)
    assert t["input_ids"].shape == (1, 1) and t["mask"].sum() == 0 and t["advantages"].tolist() == [0.0]


def test_zero_length_completion_is_fully_masked():
    t = pad_batch(make_batch([(3, 0), (2, 2)]), PAD)
    assert t["mask"].tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_token_logprobs_match_a_direct_log_softmax():
    torch.manual_seed(0)
    batch = make_batch([(3, 4), (5, 2)])
    t = pad_batch(batch, PAD)
    logits = torch.randn(2, t["input_ids"].shape[1], 50)
    logp, ent = token_logprobs(logits, t["positions"], t["targets"], temperature=0.7, with_entropy=True)
    for i, r in enumerate(batch.rollouts):
        p = len(r.prompt_ids)
        for k, tok in enumerate(r.completion_ids):
            row = torch.log_softmax(logits[i, p + k - 1] / 0.7, -1)
            assert logp[i, k].item() == pytest.approx(row[int(tok)].item(), abs=1e-6)
            assert ent[i, k].item() == pytest.approx(-(row.exp() * row).sum().item(), abs=1e-5)
    assert token_logprobs(logits, t["positions"], t["targets"], 1.0, with_entropy=False)[1] is None


@pytest.mark.parametrize(
    ("n", "world", "mbs", "expected"),
    [
        (8, 1, 8, 1),
        (8, 1, 3, 3),
        (8, 2, 2, 2),
        (5, 2, 2, 2),
        (5, 2, 1, 3),
        (1, 2, 4, 1),
        (64, 4, 64, 1),
    ],
)
def test_micro_batch_count_is_the_same_on_every_rank(n, world, mbs, expected):
    k = num_micro_batches(n, world, mbs)
    assert k == expected
    batch = make_batch([(1, 1)] * n)
    for rank in range(world):
        shard = batch.shard(rank, world)
        sizes = [len(shard.shard(i, k)) for i in range(k)]
        assert sum(sizes) == len(shard) and max(sizes) <= mbs


def test_loss_mask_zeroes_filtered_rows_and_the_normaliser():
    batch = make_batch([(2, 3), (1, 4)])
    batch.loss_mask = np.array([0.0, 1.0], np.float32)
    out = pad_batch(batch, PAD)
    assert out["mask"][0].sum() == 0 and out["mask"][1].sum() == 4
    assert batch.num_loss_tokens == 4 and batch.num_tokens == 7
    assert batch.shard(1, 2).loss_mask.tolist() == [1.0]


def test_episode_observation_tokens_are_masked_out_of_the_loss():
    batch = make_batch([(3, 6), (2, 4)])
    batch.rollouts[0].obs_spans = [[2, 4]]  # two observation tokens inside a 6-token episode
    t = pad_batch(batch, PAD)
    assert t["mask"][0].tolist() == [1, 1, 0, 0, 1, 1]
    assert t["mask"][1].tolist() == [1, 1, 1, 1, 0, 0]
    assert batch.num_loss_tokens == 4 + 4
    batch.loss_mask = np.asarray([1.0, 0.0], np.float32)  # the overlong filter still applies on top
    assert pad_batch(batch, PAD)["mask"].sum().item() == 4 and batch.num_loss_tokens == 4


RAGGED = [(3, 20), (2, 1), (4, 12), (1, 2), (5, 19), (2, 3), (3, 8), (1, 1), (6, 14), (2, 2), (4, 5)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_token_budget_plan_covers_every_row_once_within_the_budget(world):
    batch = make_batch(RAGGED)
    budget, mbs = 40, 4
    plans = plan_micro_batches(batch, world, mbs, budget)
    assert len({len(p) for p in plans}) == 1, "every rank runs the same number of micro-batches"
    for rank, plan in enumerate(plans):
        shard = batch.shard(rank, world)
        assert sorted(i for mb in plan for i in mb) == list(range(len(shard)))
        lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in shard.rollouts]
        for mb in plan:
            assert len(mb) <= mbs
            if len(mb) > 1:  # a single row longer than the budget trains alone
                assert len(mb) * max(lengths[i] for i in mb) <= budget


def _padded_tokens(batch, plans) -> int:
    return sum(
        pad_batch(batch.shard(r, len(plans)).select(mb), PAD)["input_ids"].numel()
        for r, plan in enumerate(plans)
        for mb in plan
        if mb
    )


def test_token_budget_cuts_padding_against_row_count_slices():
    batch = make_batch(RAGGED)
    real = sum(p + c for p, c in RAGGED)
    by_count = _padded_tokens(batch, plan_micro_batches(batch, 1, 4, 0))
    by_tokens = _padded_tokens(batch, plan_micro_batches(batch, 1, 4, 48))
    assert real <= by_tokens < by_count, (real, by_tokens, by_count)
    # The count-based plan is the contiguous slicing the trainer always did.
    assert plan_micro_batches(batch, 2, 4, 0) == [
        [list(range(0, 2)), list(range(2, 5))],
        [list(range(0, 3)), list(range(3, 6))],
    ]


@pytest.mark.parametrize(
    "name,agg",
    [
        (n, a)
        for n in ("grpo", "gspo", "cispo", "decoupled_ppo")
        for a in ("token_mean", "seq_mean", "fixed_horizon")
        if n != "gspo" or a == "seq_mean"
    ],
)  # gspo refuses other aggregations
def test_token_budget_micro_batches_give_the_full_batch_gradient(name, agg):
    """Sorted, token-packed micro-batches on 2 ranks (each re-padded to its own length) give the
    gradient and metrics of one full-batch pass: the losses only sum rows over global normalisers."""
    from streamrl.config.schema import LossConfig
    from streamrl.losses import LossInputs, compute_loss
    from streamrl.train.batching import plan_micro_batches as plan_fn

    batch = make_batch(RAGGED, with_ref=True)
    cfg = LossConfig(name=name, aggregation=agg, horizon=20, kl_beta=0.05, entropy_coef=0.01)
    theta0 = 0.3 * torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    total_tokens, total_seqs = float(batch.num_loss_tokens), float(len(batch))

    def step(mb, world, theta):
        t = pad_batch(mb, PAD)
        ctx = theta[t["input_ids"]].cumsum(-1)  # depends on each row's own earlier tokens only
        logits = torch.log_softmax(theta[None, None, :] + 0.1 * ctx.gather(1, t["positions"])[..., None], -1)
        lp = logits.gather(-1, t["targets"][..., None])[..., 0]
        ent = -(logits.exp() * logits).sum(-1)
        inp = LossInputs(
            lp,
            t["old_logprobs"].double(),
            t["advantages"].double(),
            t["mask"].double(),
            ref_logprobs=t["ref_logprobs"].double(),
            prox_logprobs=lp.detach(),
            entropy=ent,
            total_tokens=total_tokens,
            total_seqs=total_seqs,
            dp_world_size=world,
        )
        loss, metrics = compute_loss(cfg, inp)
        loss.backward()
        return metrics

    full = theta0.clone().requires_grad_(True)
    want = step(batch, 1, full)
    grads, sums = [], {}
    for rank, plan in enumerate(plan_fn(batch, 2, 3, 30)):
        theta = theta0.clone().requires_grad_(True)
        for index in plan:
            for k, v in step(batch.shard(rank, 2).select(index), 2, theta).items():
                sums[k] = sums.get(k, 0.0) + v
        grads.append(theta.grad)
    torch.testing.assert_close(torch.stack(grads).mean(0), full.grad, rtol=1e-10, atol=1e-13)
    assert full.grad.abs().sum() > 0
    for k in want:
        assert sums[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k
