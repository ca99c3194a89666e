"""The sampler's distribution (temperature, top-k, top-p) against hand-computed probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.workers.rollout import RolloutConfig, resolve_sampling_params
from hybridrl.workers.rollout.sampling import SamplingParams, processed_log_probs, sample_tokens

PROBS = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
LOGITS = PROBS.log()  # softmax(log p) = p


def test_temperature_only():
    # T = 2: p^(1/2) renormalised. sqrt: .70711 .54772 .38730 .22361, sum 1.86574
    expected = torch.tensor([[0.70711, 0.54772, 0.38730, 0.22361]]) / 1.86574
    torch.testing.assert_close(processed_log_probs(LOGITS, 2.0, -1, 1.0).exp(), expected, atol=1e-4, rtol=0)


def test_top_k_keeps_k_largest_and_renormalises():
    # k = 3 drops 0.05; the rest / 0.95 = .52632 .31579 .15789
    got = processed_log_probs(LOGITS, 1.0, 3, 1.0).exp()
    torch.testing.assert_close(got, torch.tensor([[0.52632, 0.31579, 0.15789, 0.0]]), atol=1e-4, rtol=0)


def test_top_p_keeps_smallest_prefix_reaching_p():
    # mass before each token (descending): 0, .5, .8, .95. top_p = .7 keeps tokens with mass-before < .7:
    # {0.5, 0.3} (0.5 alone is below 0.7). Renormalised by 0.8: .625 .375
    got = processed_log_probs(LOGITS, 1.0, -1, 0.7).exp()
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6, rtol=0)
    # top_p = 0.5 exactly: mass before token 1 is 0.5, not below 0.5, so only the top token stays
    assert processed_log_probs(LOGITS, 1.0, -1, 0.5).exp()[0, 0].item() == pytest.approx(1.0)
    # a shuffled vocabulary order gives the same kept set
    perm = torch.tensor([2, 0, 3, 1])
    shuffled = processed_log_probs(LOGITS[:, perm], 1.0, -1, 0.7).exp()
    torch.testing.assert_close(shuffled, got[:, perm])


def test_samples_follow_the_filtered_distribution():
    params = SamplingParams(greedy=False, temperature=1.0, top_k=-1, top_p=0.7, n=1, response_length=1,
                            stop_token_ids=(), seed=None)
    generator = torch.Generator().manual_seed(0)
    tokens, log_probs = sample_tokens(LOGITS.expand(40000, 4), params, generator)
    freq = torch.bincount(tokens, minlength=4).float() / 40000
    # expected .625 / .375 / 0 / 0; the binomial std at n = 40000 is ~0.0024
    torch.testing.assert_close(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.012, rtol=0)
    assert torch.allclose(log_probs[tokens == 0], torch.tensor(math.log(0.625)))


def test_draw_tokens_follows_the_probabilities_and_never_draws_a_zero():
    from hybridrl.workers.rollout.sampling import draw_tokens

    # zeros at the ends and in the middle (what top-k / top-p leave), unnormalised rows
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0]) * 3.0
    generator = torch.Generator().manual_seed(1)
    tokens = draw_tokens(probs.expand(60000, 6), generator)
    freq = torch.bincount(tokens, minlength=6).float() / 60000
    # binomial std at n = 60000 is <= 0.0021
    torch.testing.assert_close(freq, probs / probs.sum(), atol=0.01, rtol=0)
    assert freq[[0, 2, 5]].sum() == 0
    # a row with all its mass on one token, first or last, always gives that token
    one_hot = torch.eye(5)[[0, 4, 2]]
    for _ in range(50):
        assert draw_tokens(one_hot, generator).tolist() == [0, 4, 2]
    # the largest uniform below 1 still lands on a token with mass (u is kept below the row's total)
    import unittest.mock as mock

    edge = torch.tensor([[0.25, 0.75, 0.0, 0.0]], dtype=torch.float32)
    with mock.patch("torch.rand", lambda *a, **k: torch.full((1, 1), 1 - 2**-24)):
        assert draw_tokens(edge, None).tolist() == [1]
    # a diverged model's NaN probabilities stop sampling with the reason, not an index error later
    with pytest.raises(ValueError, match="not finite"):
        draw_tokens(torch.tensor([[0.5, 0.5], [float("nan"), 0.5]]), generator)


def test_greedy_takes_argmax_with_plain_log_probs():
    params = SamplingParams(greedy=True, temperature=0.5, top_k=1, top_p=0.1, n=1, response_length=1,
                            stop_token_ids=(), seed=None)
    tokens, log_probs = sample_tokens(LOGITS, params, None)
    assert tokens.tolist() == [0] and log_probs.item() == pytest.approx(math.log(0.5))


def test_resolve_overrides_and_stop_ids():
    config = RolloutConfig(n=4, temperature=0.9, stop_token_ids=[7], val_kwargs={"temperature": 0.3, "n": 2,
                                                                                  "do_sample": True})
    base = resolve_sampling_params(config, {}, [3])
    assert (base.n, base.temperature, base.greedy, base.stop_token_ids) == (4, 0.9, False, (3, 7))
    val = resolve_sampling_params(config, {"validate": True}, [3])
    assert (val.n, val.temperature, val.greedy) == (2, 0.3, False)
    greedy = resolve_sampling_params(config, {"do_sample": False}, [3])
    assert greedy.greedy and greedy.n == 1
    assert resolve_sampling_params(config, {"temperature": 0.0}, [3]).greedy  # T = 0 means greedy
    assert resolve_sampling_params(config, {"eos_token_id": [5, 6]}, [3]).stop_token_ids == (5, 6, 7)
    ignoring = resolve_sampling_params(RolloutConfig(ignore_eos=True, stop_token_ids=[7]), {}, [3])
    assert ignoring.stop_token_ids == (7,)
    with pytest.raises(ValueError, match="top_p"):
        resolve_sampling_params(config, {"top_p": 0.0}, [3])


@pytest.mark.parametrize("greedy,top_k,top_p", [(True, 0, 1.0), (False, 0, 1.0), (False, 2, 0.8)])
def test_sampling_computes_on_the_logits_device(greedy, top_k, top_p):
    # on `meta`: a mask, index or sample made on the CPU would fail to mix with the logits, as on a GPU
    params = SamplingParams(greedy=greedy, temperature=0.7, top_k=top_k, top_p=top_p, n=1, response_length=4,
                            stop_token_ids=(3,), seed=None)
    tokens, log_probs = sample_tokens(torch.empty(6, 11, device="meta"), params, generator=None)  # (rows, vocab)
    assert (tokens.device.type, log_probs.device.type) == ("meta", "meta")
    assert tokens.shape == log_probs.shape == (6,)
