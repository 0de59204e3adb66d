"""The direction controls of the solver correction (paper Table 12), each against a hand computation on tiny tensors.

How the untied schedulers use them (`correction_direction`) is tested in test_untied_scheduler.py.
"""

import math

import pytest
import torch

from untied_sc_lab.ablations.correction_functions import moment_projection
from untied_sc_lab.ablations.direction_controls import (
    centred_rms,
    common_direction,
    derangement,
    direction_seed,
    permuted_direction,
    random_direction,
    unit_centred_direction,
)


F64 = torch.float64


def tensor(rows):
    """A (B, L, D) float64 tensor from nested lists."""
    return torch.tensor(rows, dtype=F64)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# ---- unit centred direction and centred RMS ---------------------------------------------------------------------


def test_unit_centred_direction_by_hand():
    # U = [1, 3] over two positions: token mean 2, C U = [-1, 1], RMS = 1.
    # U = [[0, 0], [2, 4]]: mean [1, 2], C U = [[-1, -2], [1, 2]], RMS = sqrt(10 / 4).
    got = unit_centred_direction(tensor([[[1.0], [3.0]]]))
    assert torch.allclose(got, tensor([[[-1.0], [1.0]]]))
    got = unit_centred_direction(tensor([[[0.0, 0.0], [2.0, 4.0]]]))
    assert torch.allclose(got, tensor([[[-1.0, -2.0], [1.0, 2.0]]]) / math.sqrt(2.5))


def test_unit_centred_direction_is_zero_for_a_constant_direction_and_at_inactive_positions():
    u = tensor([[[2.0, 1.0], [2.0, 1.0], [7.0, 7.0]]])
    assert torch.equal(unit_centred_direction(u[:, :2]), torch.zeros(1, 2, 2, dtype=F64))
    mask = torch.tensor([[True, True, False]])
    assert torch.equal(unit_centred_direction(u, mask), torch.zeros(1, 3, 2, dtype=F64))


def test_centred_rms_by_hand_over_active_positions():
    # Sample 0: C U = [[-1, -2], [1, 2]] → sqrt(10 / (2·2)). Sample 1, position 2 inactive: U = [1, 5] → C U = [-2, 2]
    # in one channel and [0, 0] in the other → sqrt(8 / (2·2)).
    u = tensor([[[0.0, 0.0], [2.0, 4.0], [0.0, 0.0]], [[1.0, 3.0], [5.0, 3.0], [100.0, -100.0]]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    assert torch.allclose(centred_rms(u, mask), tensor([math.sqrt(2.5), math.sqrt(2.0)]))


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_centred_rms_survives_extreme_magnitudes(scale):
    u = randn(2, 5, 3)
    assert torch.allclose(centred_rms(u * scale) / scale, centred_rms(u), rtol=1e-12)


# ---- common component ---------------------------------------------------------------------------------------------


def test_common_direction_by_hand_leaves_out_samples_without_a_direction():
    # Sample 0: U = [0, 0, 3], C U = [-1, -1, 2], RMS sqrt(2) → unit [-1, -1, 2]/sqrt(2).
    # Sample 1: U = [2, 0, 1], C U = [1, -1, 0], RMS sqrt(2/3) → unit [1, -1, 0]·sqrt(3/2).
    # Sample 2: constant, no centred direction: not counted. The mean is over the two others.
    u = tensor([[[0.0], [0.0], [3.0]], [[2.0], [0.0], [1.0]], [[5.0], [5.0], [5.0]]])
    a, b = 1 / math.sqrt(2), math.sqrt(1.5)
    expected = tensor([[(-a + b) / 2], [(-a - b) / 2], [(2 * a + 0) / 2]])
    got = common_direction(u)
    assert got.shape == u.shape
    for sample in range(3):
        assert torch.allclose(got[sample], expected)


def test_common_direction_of_a_batch_without_any_direction_is_zero():
    u = tensor([[[1.0], [1.0]], [[0.0], [0.0]]])
    assert torch.equal(common_direction(u), torch.zeros_like(u))


@pytest.mark.parametrize("batch", [1, 4])
def test_common_direction_reduces_to_the_history_direction_when_the_samples_share_it(batch):
    # One sample, or samples with the same direction at different scales: Π_k(Ū) = Π_k(U) for every sample.
    base = randn(1, 6, 4)
    u = torch.cat([base * (2.0**i) for i in range(batch)])
    mean, sigma = randn(4, seed=1), 0.7
    assert torch.allclose(
        moment_projection(common_direction(u), mean, sigma), moment_projection(u, mean, sigma), atol=1e-12
    )


def test_common_direction_differs_from_each_sample_when_they_differ():
    u = randn(3, 6, 4)
    projected = moment_projection(common_direction(u), torch.zeros(4, dtype=F64), 1.0)
    assert not torch.allclose(projected, moment_projection(u, torch.zeros(4, dtype=F64), 1.0))


# ---- permutation --------------------------------------------------------------------------------------------------


def test_derangement_closes_a_random_order_into_one_cycle():
    order = torch.randperm(5, generator=torch.Generator().manual_seed(3))
    got = derangement(5, torch.Generator().manual_seed(3))
    for i in range(5):
        assert got[order[i]] == order[(i + 1) % 5]


@pytest.mark.parametrize("batch", [2, 3, 8])
def test_derangement_has_no_fixed_point_and_is_one_cycle(batch):
    for seed in range(5):
        pi = derangement(batch, torch.Generator().manual_seed(seed))
        assert sorted(pi.tolist()) == list(range(batch)) and all(pi[b] != b for b in range(batch))
        seen, b = set(), 0
        while b not in seen:
            seen.add(b)
            b = int(pi[b])
        assert len(seen) == batch


def test_derangement_of_one_sample_is_the_identity_and_bad_sizes_are_refused():
    assert derangement(1, torch.Generator()).tolist() == [0]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        derangement(0, torch.Generator())


def test_permuted_direction_gives_each_sample_the_direction_of_its_partner():
    u = randn(3, 2, 2)
    got = permuted_direction(u, torch.tensor([2, 0, 1]))
    assert torch.equal(got[0], u[2]) and torch.equal(got[1], u[0]) and torch.equal(got[2], u[1])
    assert torch.equal(permuted_direction(u[:1], torch.tensor([0])), u[:1])
    with pytest.raises(ValueError, match=r"`permutation` must have shape \(B,\)"):
        permuted_direction(u, torch.tensor([0, 1]))


# ---- random direction with equal RMS ------------------------------------------------------------------------------


def test_random_direction_by_hand():
    # U = [0, 4]: C U = [-2, 2], RMS 2. ξ = [1, 2]: C ξ = [-1/2, 1/2], RMS 1/2 → U' = 2·[-1, 1].
    got = random_direction(tensor([[[0.0], [4.0]]]), tensor([[[1.0], [2.0]]]))
    assert torch.allclose(got, tensor([[[-2.0], [2.0]]]))


def test_random_direction_has_the_centred_rms_of_the_direction_and_zero_where_it_has_none():
    u, noise = randn(3, 7, 4), randn(3, 7, 4, seed=1)
    u[1] = 5.0  # constant: no centred direction → no random one either
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[2, 4:] = False
    got = random_direction(u, noise, mask)
    assert torch.allclose(centred_rms(got, mask), centred_rms(u, mask))
    assert torch.equal(got[1], torch.zeros_like(got[1])) and torch.equal(got[2, 4:], torch.zeros_like(got[2, 4:]))
    # the noise's centred direction, not U's
    unit = unit_centred_direction(noise, mask)
    assert torch.allclose(unit_centred_direction(got, mask)[[0, 2]], unit[[0, 2]])


def test_random_direction_refuses_noise_of_another_shape():
    with pytest.raises(ValueError, match="`noise` must have the direction's shape"):
        random_direction(randn(2, 3, 4), randn(2, 3, 5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_controls_keep_the_dtype(dtype):
    u, noise = randn(2, 5, 3).to(dtype), randn(2, 5, 3, seed=1)
    assert common_direction(u).dtype == dtype and random_direction(u, noise).dtype == dtype
    assert torch.isfinite(random_direction(u, noise).float()).all()


# ---- the seed of the draws ----------------------------------------------------------------------------------------


def test_direction_seed_reads_the_generator_without_drawing_from_it():
    generator = torch.Generator().manual_seed(11)
    state = generator.get_state().clone()
    first = direction_seed(0, generator)
    assert torch.equal(generator.get_state(), state)
    assert direction_seed(0, torch.Generator().manual_seed(11)) == first  # same seed, same draws
    assert direction_seed(0, torch.Generator().manual_seed(12)) != first  # each batch's generator: its own draws
    assert direction_seed(1, torch.Generator().manual_seed(11)) != first  # `direction_seed` picks another draw
    generator.manual_seed(11)
    torch.randn(1, generator=generator)
    assert direction_seed(0, generator) != first  # a generator used on: another state, another seed
    assert direction_seed(0) == direction_seed(0) != direction_seed(1)
    pair = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    assert direction_seed(0, pair) != direction_seed(0, pair[:1])
    assert 0 <= first < 2**64
