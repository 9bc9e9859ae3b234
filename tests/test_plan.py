import itertools
import random

import pytest

from convt3d.plan import make_plan, output_padding_for_size, plan_axis, triple


def brute_force_reach(in_size, kernel, stride, padding, dilation, output_padding):
    """For every output index: the set of (input index, tap) pairs that reach it, by the definition."""
    out_size = (in_size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
    reach = {o: set() for o in range(out_size)}
    for i, t in itertools.product(range(in_size), range(kernel)):
        o = i * stride - padding + t * dilation
        if 0 <= o < out_size:
            reach[o].add((i, t))
    return out_size, reach


@pytest.mark.parametrize("seed", range(200))
def test_axis_plan_matches_definition(seed):
    rng = random.Random(seed)
    s, d = rng.randint(1, 4), rng.randint(1, 4)
    args = dict(in_size=rng.randint(1, 7), kernel=rng.randint(1, 5), stride=s, padding=rng.randint(0, 4),
                dilation=d, output_padding=rng.randint(0, max(s, d) - 1))
    out_size, reach = brute_force_reach(**args)
    axis = plan_axis(**args)
    assert axis.out_size == out_size
    covered = []
    for ph in axis.phases:
        for j in range(ph.out_count):
            o = ph.out_start + j * s
            assert 0 <= o < out_size and (o + args["padding"]) % s == ph.residue
            covered.append(o)
            got = set()
            for k, t in enumerate(ph.taps):
                i = ph.input_start + j + k * ph.input_dilation
                if 0 <= i < args["in_size"]:
                    got.add((i, t))
            assert got == reach[o], (o, ph)
        if not ph.reads_input(args["in_size"]):
            assert all(not reach[ph.out_start + j * s] for j in range(ph.out_count))
    assert sorted(covered) == list(range(out_size)), "every output index belongs to exactly one phase"


def test_problem_77_has_one_nonempty_phase_of_eight():
    plan = make_plan((16, 32, 16, 32, 32), (32, 64, 3, 3, 3), stride=2, padding=1, dilation=2)
    assert plan.output_shape == (16, 64, 33, 65, 65)
    assert len(plan.phases) == 8 and len(plan.nonempty_phases) == 1
    (phase,) = plan.nonempty_phases
    assert [a.taps for a in phase.axes] == [(2, 1, 0)] * 3
    assert [a.out_count for a in phase.axes] == [16, 32, 32]
    assert plan.empty_fraction == pytest.approx(1 - 16 * 32 * 32 / (33 * 65 * 65))
    # The brief's 29 GFLOP is M*N*K with every tap counted; taps that fall outside the input are not useful work.
    assert 0.9 * 2 * 262144 * 64 * 864 < plan.flops < 2 * 262144 * 64 * 864


@pytest.mark.parametrize("seed", range(20))
def test_flops_counts_every_useful_multiply_add(seed):
    rng = random.Random(seed)
    s, d = rng.randint(1, 3), rng.randint(1, 3)
    axes = [dict(in_size=rng.randint(1, 5), kernel=rng.randint(1, 4), stride=s, padding=rng.randint(0, 2),
                 dilation=d, output_padding=0) for _ in range(3)]
    pairs = 1
    for a in axes:
        out_size, reach = brute_force_reach(**a)
        pairs *= sum(len(v) for v in reach.values())
    if any((a["in_size"] - 1) * s - 2 * a["padding"] + d * (a["kernel"] - 1) + 1 < 1 for a in axes):
        return
    plan = make_plan((2, 6, *(a["in_size"] for a in axes)), (6, 2, *(a["kernel"] for a in axes)), stride=s,
                     padding=tuple(a["padding"] for a in axes), dilation=d, groups=3)
    assert plan.flops == 2 * 2 * 6 * 2 * pairs  # batch * out_channels * in_channels per group * pairs


def test_stride_one_is_a_single_full_phase():
    plan = make_plan((1, 4, 5, 6, 7), (4, 2, 3, 3, 3), padding=1)
    assert len(plan.phases) == 1 and plan.empty_fraction == 0


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(stride=0), ValueError, "stride"),
        (dict(dilation=0), ValueError, "dilation"),
        (dict(padding=-1), ValueError, "padding"),
        (dict(output_padding=-1), ValueError, "output_padding"),
        (dict(stride=2, output_padding=2), ValueError, "output_padding"),
        (dict(groups=0), ValueError, "groups"),
        (dict(groups=3), ValueError, "groups"),
        (dict(groups=2.0), TypeError, "groups"),
        (dict(stride=(1, 2)), ValueError, "stride"),
        (dict(padding=(1, 1, 1, 1)), ValueError, "padding"),
        (dict(dilation="2"), TypeError, "dilation"),
        (dict(stride=(1, 1.5, 1)), TypeError, "stride"),
        (dict(padding=5), ValueError, "output size"),
        (dict(groups=True), TypeError, "groups"),
    ],
)
def test_bad_parameters_are_named(kwargs, error, text):
    with pytest.raises(error, match=text):
        make_plan((1, 4, 3, 3, 3), (4, 2, 3, 3, 3), **kwargs)


def test_triple_accepts_ints_and_tuples():
    assert triple(2, "x") == (2, 2, 2)
    assert triple([1, 2, 3], "x") == (1, 2, 3)
    with pytest.raises(TypeError, match="x"):
        triple(True, "x")


def test_triple_and_groups_take_what_pytorch_takes_for_an_int():
    """PyTorch's convolutions take anything with __index__ for an int (numpy's integers, a 0-d integer tensor: see
    test_functional; nn.ConvTranspose3d keeps numpy integers given to it): the plan holds them as Python ints."""
    np = pytest.importorskip("numpy")

    class Index:
        def __index__(self):
            return 3

    for value, expected in [(np.int64(2), (2, 2, 2)), (Index(), (3, 3, 3)), ((np.int32(1), Index(), 2), (1, 3, 2))]:
        result = triple(value, "x")
        assert result == expected and all(type(v) is int for v in result)
    for value in [np.float64(2.0), np.array([2, 2, 2]), (1, True, 1), (1, 2.0, 1)]:
        with pytest.raises(TypeError, match="x must be an int or a tuple of 3 ints"):
            triple(value, "x")
    plan = make_plan((1, 4, 3, 3, 3), (4, 1, 3, 3, 3), stride=np.int64(2), groups=np.int64(2))
    assert plan.stride == (2, 2, 2) and plan.groups == 2 and type(plan.groups) is int


def test_output_padding_for_size():
    assert output_padding_for_size((1, 1, 3, 3, 3), (8, 7, 7), (3, 3, 3), (2, 2, 2), (0, 0, 0), (1, 1, 1)) == (1, 0, 0)
    with pytest.raises(ValueError, match="output_size"):
        output_padding_for_size((1, 1, 3, 3, 3), (9, 7, 7), (3, 3, 3), (2, 2, 2), (0, 0, 0), (1, 1, 1))
