"""The bench CLI's protocol helpers, workloads, JSON schema, and its CPU mode end to end at a tiny size."""

import json
import logging
from pathlib import Path

import pytest
import torch

import convt3d.__main__ as cli
from convt3d.__main__ import main
from convt3d.bench.protocol import Timing, datasheet_bandwidth, floor_bytes, kernelbench_check, time_interleaved
from convt3d.bench.report import summary_text, sweep_summary, table
from convt3d.bench.workloads import PROBLEM_77, default_sweep_path, load_sweep, parse_config, sweep_layers

TINY = '{"in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, ' \
       '"bias": true, "input_shape": [2, 4, 3, 4, 5]}'


def test_floor_bytes_of_problem_77():
    plan = PROBLEM_77.plan()
    nbytes = floor_bytes(PROBLEM_77.input_shape, PROBLEM_77.weight_shape(), plan.output_shape, False, 4)
    assert nbytes == 4 * (16 * 32 * 16 * 32 * 32 + 32 * 64 * 27 + 16 * 64 * 33 * 65 * 65)
    assert nbytes / 4.8e12 * 1e3 == pytest.approx(0.126, abs=5e-4)  # the 571 MB output dominates


def test_datasheet_bandwidth_is_named_or_absent():
    assert datasheet_bandwidth("NVIDIA H200") == ("H200", 4.8e12)
    assert datasheet_bandwidth("Some Other GPU") is None


def test_timing_statistics():
    t = Timing.of([1.0, 2.0, 3.0])
    assert (t.mean_ms, t.min_ms, t.max_ms, t.median_ms) == (2.0, 1.0, 3.0, 2.0)
    assert t.std_ms == pytest.approx(1.0)
    assert t.slow_calls is None and t.host_median_ms is None  # no host times given (the CPU's timings)
    slow_first = Timing.of([9.0, 1.0, 1.2, 1.1])  # a slow call moves the mean, not the median
    assert (slow_first.mean_ms, slow_first.median_ms) == (pytest.approx(3.075), pytest.approx(1.15))


def test_timing_names_the_slow_calls_with_their_host_times():
    samples = [1.0, 2.5, 1.1, 9.0, 2.0, 3.0]
    host = [0.5, 0.4, 0.6, 8.9, 0.5, 0.7]
    t = Timing.of(samples, host, [None, None, 0, 1, None, None])
    # above twice the fastest, slowest first, with the generation collected during the call
    assert t.slow_calls == [(3, 9.0, 8.9, 1), (5, 3.0, 0.7, None), (1, 2.5, 0.4, None)]
    assert t.host_median_ms == pytest.approx(0.55)  # the median host time of all the timed calls
    assert Timing.of([1.0] * 5, [0.1] * 5).slow_calls == []
    many = Timing.of([1.0] + [5.0 + i for i in range(20)], [0.0] * 21).slow_calls
    assert len(many) == 10 and many[0] == (20, 24.0, 0.0, None)


def test_table_marks_timings_that_include_driver_allocations():
    row = dict(implementation="x", mean_ms=1.0, std_ms=0.1, speedup_vs_eager=None, ratio_to_floor=None,
               rel_err_fp64=None, kernelbench_check=None)
    assert "*" not in table([dict(row, device_allocations=0)])
    marked = table([dict(row, device_allocations=3)]).splitlines()
    assert marked[2].split(" | ")[1].strip().endswith("*") and marked[-1].endswith("x 3")


def test_table_lists_slow_calls_with_their_host_times():
    row = dict(implementation="x", mean_ms=1.0, std_ms=0.1, speedup_vs_eager=None, ratio_to_floor=None,
               rel_err_fp64=None, kernelbench_check=None)
    assert "twice" not in table([row])
    calls = [dict(call=i, ms=2.0 - i / 10, host_ms=1.5, gc_generation=None if i else 1) for i in range(5)]
    last = table([row, dict(row, implementation="y", slow_calls=calls)]).splitlines()[-1]
    assert last.startswith("calls above twice") and "y 0: 2.000 / 1.500 gc1, 1: 1.900 / 1.500, 2:" in last
    assert last.endswith("and 2 more") and "x " not in last


def test_table_gives_host_times_where_measured():
    row = dict(implementation="x", mean_ms=1.0, std_ms=0.1, speedup_vs_eager=None, ratio_to_floor=None,
               rel_err_fp64=None, kernelbench_check=None)
    lines = table([dict(row, host_ms=0.0421, timed_host_ms=0.0634), row]).splitlines()
    assert [cell.strip() for cell in lines[0].split(" | ")[-2:]] == ["host ms", "timed host ms"]
    assert [[cell.strip() for cell in line.split(" | ")[-2:]] for line in lines[2:4]] == [["0.0421", "0.0634"],
                                                                                           ["-", "-"]]
    assert lines[-1].startswith("host ms:")
    assert "host ms:" not in table([row])


def test_training_case_pairs_eager_and_convt3d_with_the_same_weights():
    layer = parse_config(TINY)
    eager, ours, x, grad = layer.training_case("cpu")
    assert type(eager) is torch.nn.ConvTranspose3d and type(ours).__module__ == "convt3d.module"
    assert ours.weight is not eager.weight and torch.equal(ours.weight, eager.weight)
    assert torch.equal(ours.bias, eager.bias)
    assert x.requires_grad and tuple(x.shape) == tuple(layer.input_shape)
    assert tuple(grad.shape) == layer.plan().output_shape and not grad.requires_grad


def test_phase_case_gives_the_one_phase_and_fresh_operands():
    """The TINY layer has problem 77's geometry (one phase that taps reach): the phase's output grid is the
    compact convolution of the case's input and weight, which are fresh random draws."""
    import torch.nn.functional as F

    from convt3d.backends import torch_phase

    layer = parse_config(TINY)
    plan, phases, x, w = layer.phase_case("cpu")
    assert plan == layer.plan() and tuple(x.shape) == tuple(layer.input_shape)
    assert tuple(w.shape) == layer.weight_shape() and w.abs().max() > 0
    ((expected_phases, index),) = torch_phase._backward_phases(plan)
    assert phases == expected_phases
    y = F.conv_transpose3d(x, w, None, plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation)
    torch.testing.assert_close(torch_phase._phase_conv(x, w, None, plan, phases), y[index])
    assert not torch.equal(x, layer.phase_case("cpu")[2])


def test_time_interleaved_alternates_and_counts():
    calls = []
    times = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=2)
    assert calls == ["a", "b"] * 5
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}
    assert all(v >= 0 for t in times.values() for v in t)


def test_kernelbench_check_tolerance_by_precision():
    a = torch.rand(100)
    assert kernelbench_check(a + 5e-5, a) and not kernelbench_check(a + 5e-4, a)
    h = a.half()
    assert kernelbench_check(h + 5e-3, h) and not kernelbench_check(h + 5e-2, h)


@pytest.mark.parametrize("text, message", [
    ("{not json", "JSON"),
    ('{"colour": 3}', "unknown fields"),
    ('{"in_channels": 6, "out_channels": 4, "groups": 4}', "groups"),
    ('{"stride": 0}', "stride"),
    ('{"dtype": "int8"}', "dtype"),
    ('[1, 2]', "JSON object"),
])
def test_bad_configs_are_explained(text, message):
    with pytest.raises(ValueError, match=message):
        parse_config(text)


def test_cli_rejects_a_bad_layer_with_exit_code_2(capsys):
    assert main(["bench", "--device", "cpu", "--config", '{"padding": 30}']) == 2
    assert "output size" in capsys.readouterr().err


def test_cpu_mode_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONVT3D_FULL_TESTS", "0")  # (a setting the run records; the tests' own, it changes nothing)
    path = tmp_path / "out.json"
    argv = ["bench", "--device", "cuda", "--config", TINY, "--iters", "2", "--json", str(path)]
    plot = None
    try:
        import matplotlib  # noqa: F401

        plot = tmp_path / "out.png"
        argv += ["--plot", str(plot)]
    except ImportError:
        pass
    assert main(argv) == 0
    out = capsys.readouterr()
    if not torch.cuda.is_available():
        assert "GPU timings need CUDA" in out.err + out.out
    data = json.loads(path.read_text())
    assert {"date", "device", "driver", "torch", "triton", "cudnn"} <= set(data["environment"])
    assert data["environment"]["settings"]["CONVT3D_FULL_TESTS"] == "0"
    assert "| CONVT3D_FULL_TESTS=0" in out.out
    names = [r["implementation"] for r in data["results"]]
    assert "PyTorch eager" in names and "convt3d" in names
    for row in data["results"]:
        assert {"implementation", "mean_ms", "std_ms", "min_ms", "max_ms", "speedup_vs_eager", "rel_err_fp64",
                "kernelbench_check"} <= set(row)
        if row["kernelbench_check"] is not None:
            # On a GPU the rows with TF32 allowed (PyTorch's default for convolutions) round their operands to 10
            # mantissa bits: errors near 3e-4 against float64, eager's own included. Elsewhere float32 accuracy.
            tf32 = torch.cuda.is_available() and "TF32 off" not in row["implementation"]
            assert row["rel_err_fp64"] < (1e-3 if tf32 else 1e-5)
            # TF32 allowed is not TF32 used: cuDNN picks the algorithm per shape, and for backend=torch's small phase
            # convolutions it may pick a full-float32 one (measured on the H200 for this layer: 7.8e-8 against
            # eager's 2.4e-4). Such a row is more accurate than eager and so differs from it by eager's own TF32
            # error, beyond KernelBench's 1e-4: it may fail that check, but then only at float32 accuracy.
            full_float32 = tf32 and "backend=torch" in row["implementation"] and row["rel_err_fp64"] < 1e-5
            assert row["kernelbench_check"] is True or full_float32
            # (host times are measured on CUDA only: on the CPU the wall-clock timing is all host)
            for host in ("host_ms", "timed_host_ms"):
                assert (row[host] > 0) if torch.cuda.is_available() else (host not in row)
    if plot is not None:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_carry_the_choices_convt3d_made(monkeypatch):
    # A layer's first call in each mode logs which backend "auto" took (and on a GPU the Triton tile config); the
    # row of the implementation that made the call keeps those lines. A fresh choice cache, so that this call chooses.
    from convt3d import functional
    from convt3d.bench.runner import run_layer
    from convt3d.bench.workloads import Layer

    monkeypatch.setattr(functional, "_choice", {})
    layer = Layer(name="tiny", in_channels=2, out_channels=2, kernel_size=2, stride=2, padding=0, dilation=1,
                  bias=True, input_shape=[1, 2, 2, 3, 3]).validate()
    # The caller's logging as logging.basicConfig(level=INFO) sets it up: a root handler that takes every level
    # (records passed up from convt3d's logger skip the root's own level). The debug lines must not reach it.
    shown = []
    root_handler = logging.Handler()
    root_handler.emit = shown.append
    monkeypatch.setattr(logging.getLogger(), "handlers", [root_handler])
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    rows = {r["implementation"]: r for r in run_layer(layer, torch.device("cpu"), compile=False, iters=1)}
    assert any("auto chose" in line for line in rows["convt3d"]["decisions"])
    assert "decisions" not in rows["PyTorch eager"]
    assert not [r for r in shown if r.levelno < logging.INFO]
    assert not logging.getLogger("convt3d").handlers and logging.getLogger("convt3d").propagate


def test_every_implementation_is_checked_before_any_is_timed_with_garbage_collected_and_the_host_left_idle_between(
        monkeypatch):
    # The checks' first calls compile and autotune; the GPU machine's host then ran slower for seconds, and their
    # garbage, left to the collector, was collected inside some timed call. So the runner checks all, collects,
    # sleeps settle_s once, then times all.
    import gc

    from convt3d.bench import runner
    from convt3d.bench.workloads import Layer

    events = []
    real_correctness = runner._correctness
    monkeypatch.setattr(runner, "_correctness", lambda *a: events.append("check") or real_correctness(*a))
    monkeypatch.setattr(runner, "_time", lambda fn, on_gpu, iters: events.append("time") or Timing.of([1.0, 1.0]))
    monkeypatch.setattr(runner.time, "sleep", lambda seconds: events.append(("sleep", seconds)))
    monkeypatch.setattr(gc, "collect", lambda *generation: events.append("collect") or 0)
    layer = Layer(name="tiny", in_channels=2, out_channels=2, kernel_size=2, stride=2, padding=0, dilation=1,
                  bias=True, input_shape=[1, 2, 2, 3, 3]).validate()
    rows = runner.run_layer(layer, torch.device("cpu"), compile=False, iters=2, settle_s=0.25)
    assert events == ["check", "check", "collect", ("sleep", 0.25), "time", "time"]
    assert [r["implementation"] for r in rows] == ["PyTorch eager", "convt3d"]
    assert all(r["kernelbench_check"] for r in rows)
    events.clear()
    runner.run_layer(layer, torch.device("cpu"), compile=False, iters=2)  # on the CPU no pause by default
    assert events == ["check", "check", "time", "time"]
    assert main(["bench", "--device", "cpu", "--config", TINY, "--settle", "-1"]) == 2


def test_kernel_case_is_the_seeded_module_and_its_float64_result():
    from convt3d.bench.workloads import Layer

    layer = Layer(name="tiny", in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1, dilation=1,
                  bias=True, input_shape=[2, 3, 2, 3, 4]).validate()
    module, x, w, b, reference = layer.kernel_case("cpu")
    again = layer.kernel_case("cpu")[0]
    assert torch.equal(module.weight, again.weight)  # seeded: every script times the same weights
    assert w is not module.weight and torch.equal(w, module.weight) and not w.requires_grad
    expected = torch.nn.functional.conv_transpose3d(x.double(), w.double(), b.double(), stride=2, padding=1)
    assert reference.dtype == torch.float64 and torch.equal(reference, expected)


def test_markdown_table_prints_times_to_four_decimals():
    from convt3d.bench.report import markdown_table

    text = markdown_table(["layer", "offset KB", "mean ms", "check"], [("vae", 4, 0.12346, "KB True"),
                                                                      ("k3", 0, float("nan"), "")])
    assert text.splitlines() == ["| layer | offset KB | mean ms | check |", "|---|---|---|---|",
                                 "| vae | 4 | 0.1235 | KB True |", "| k3 | 0 | nan |  |"]


def test_the_public_sweep_ships_with_the_package_and_benchmarks_links_to_it():
    """`convt3d bench --sweep` runs from an installed package too (its wheel once lacked the sweep, so that the command
    failed outside a checkout): the file lies in the package, pyproject.toml lists it as package data, and the
    checkout's benchmarks/sweep.json is that file."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 and later)
    package = Path(cli.__file__).resolve().parent
    assert default_sweep_path() == package / "bench" / "sweep.json"
    root = package.parents[1]
    if not (root / "pyproject.toml").is_file():
        pytest.skip("convt3d imported from an installation, not from a checkout's src/")
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "bench/sweep.json" in setuptools["package-data"]["convt3d"]
    assert (root / "benchmarks" / "sweep.json").resolve() == default_sweep_path()
    assert len(load_sweep(None)) >= 12


def test_a_missing_sweep_file_is_named(tmp_path, monkeypatch):
    from convt3d.bench import workloads

    with pytest.raises(ValueError, match="--sweep: no file .*absent.json"):
        load_sweep(str(tmp_path / "absent.json"))
    monkeypatch.setattr(workloads, "default_sweep_path", lambda: tmp_path / "sweep.json")
    with pytest.raises(ValueError, match="public sweep .* is missing from this installation"):
        load_sweep(None)


def test_sweep_layers_come_in_the_order_named_and_unknown_names_are_named():
    by_name = {layer.name: layer for layer in load_sweep(None)}
    assert sweep_layers("k3s1p1,unet3d_k2s2") == [by_name["k3s1p1"], by_name["unet3d_k2s2"]]
    with pytest.raises(ValueError, match="no sweep layer named k3s1, vae"):
        sweep_layers("unet3d_k2s2,k3s1,vae")


def _timed(layer, implementation, mean_ms, median_ms):
    return dict(layer=layer, implementation=implementation, mean_ms=mean_ms, median_ms=median_ms)


def test_sweep_summary_gives_each_modes_median_speedup_lowest_layer_and_layers_slower_than_eager():
    rows = [
        _timed("a", "PyTorch eager", 0.30, 0.30), _timed("a", "convt3d", 0.10, 0.10),
        _timed("a", "PyTorch eager, TF32 off", 0.40, 0.40), _timed("a", "convt3d, TF32 off", 0.10, 0.10),
        # eager's mean pulled up by slow calls: 5x by the means, 2x by the median calls
        _timed("b", "PyTorch eager", 0.50, 0.20), _timed("b", "convt3d", 0.10, 0.10),
        _timed("b", "convt3d, backend=triton", 0.01, 0.01),  # not in the comparison
        _timed("b", "PyTorch eager, TF32 off", 0.09, 0.09), _timed("b", "convt3d, TF32 off", 0.10, 0.10),
        _timed("c", "PyTorch eager", 0.20, 0.20), _timed("c", "convt3d", 0.10, 0.10),  # half precision: one mode
        _timed("d", "PyTorch eager", 0.20, 0.20),  # no convt3d row (a sweep cut short): left out
    ]
    default, off = sweep_summary(rows)
    assert default == dict(mode="default mode", layers=3, median_speedup=pytest.approx(3.0),
                           median_speedup_by_median_calls=pytest.approx(2.0),
                           lowest=dict(layer="c", speedup=pytest.approx(2.0)), slower_than_eager=[])
    assert off["layers"] == 2 and off["median_speedup"] == pytest.approx((4.0 + 0.9) / 2)
    assert off["lowest"] == dict(layer="b", speedup=pytest.approx(0.9)) and off["slower_than_eager"] == ["b"]
    text = summary_text([default, off]).splitlines()
    assert text[0] == ("default mode: median speed-up over eager 3.00x by the means, 3 layers (2.00x by the median "
                       "calls); lowest c at 2.00x; slower than eager: none")
    assert text[1].startswith("TF32 off: median speed-up over eager 2.45x") and text[1].endswith("eager: b")
    # Rows without medians (written before they were kept) give no median by the median calls.
    no_medians = [dict(r, median_ms=None) for r in rows[:4]]
    assert sweep_summary(no_medians)[0]["median_speedup_by_median_calls"] is None
    assert sweep_summary([_timed(None, "PyTorch eager", 1.0, 1.0)]) == []


def test_cli_prints_and_writes_a_sweeps_summary(tmp_path, capsys, monkeypatch):
    speeds = {"k3s1p1": 3.0, "unet3d_k2s2": 0.5}
    monkeypatch.setattr(cli, "run_layer", lambda layer, *args, **kwargs: [
        dict(_timed(None, "PyTorch eager", 1.0, 1.0), std_ms=0.0, speedup_vs_eager=1.0, ratio_to_floor=None,
             rel_err_fp64=None, kernelbench_check=None),
        dict(_timed(None, "convt3d", 1.0 / speeds[layer.name], 1.0 / speeds[layer.name]), std_ms=0.0,
             speedup_vs_eager=speeds[layer.name], ratio_to_floor=None, rel_err_fp64=None, kernelbench_check=None)])
    path = tmp_path / "sweep.json"
    assert main(["bench", "--device", "cpu", "--sweep", "--layers", "k3s1p1,unet3d_k2s2", "--json", str(path)]) == 0
    assert ("default mode: median speed-up over eager 1.75x by the means, 2 layers (1.75x by the median calls); "
            "lowest unet3d_k2s2 at 0.50x; slower than eager: unet3d_k2s2") in capsys.readouterr().out
    assert json.loads(path.read_text())["summary"] == [dict(
        mode="default mode", layers=2, median_speedup=1.75, median_speedup_by_median_calls=1.75,
        lowest=dict(layer="unet3d_k2s2", speedup=0.5), slower_than_eager=["unet3d_k2s2"])]


def test_cli_runs_the_named_sweep_layers_and_rejects_unknown_names_or_layers_without_a_sweep(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "run_layer", lambda layer, *args, **kwargs: ran.append(layer.name) or [])
    assert main(["bench", "--device", "cpu", "--sweep", "--layers", "k3s1p1,unet3d_k2s2"]) == 0
    assert ran == ["k3s1p1", "unet3d_k2s2"]
    assert main(["bench", "--device", "cpu", "--sweep", "--layers", "k3s1p1,k3s9"]) == 2
    assert "no sweep layer named k3s9" in capsys.readouterr().err
    assert main(["bench", "--device", "cpu", "--layers", "k3s1p1"]) == 2
    assert "pass --sweep too" in capsys.readouterr().err
    assert ran == ["k3s1p1", "unet3d_k2s2"]
