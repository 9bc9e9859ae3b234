"""Environment, terminal table, JSON and PNG chart."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import textwrap

import torch


def environment(device: torch.device) -> dict:
    env = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        device=platform.processor() or platform.machine(),
        driver=None,
        torch=torch.__version__,
        triton=None,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        python=platform.python_version(),
        # convt3d's settings as set in the environment (README, Settings): a run with a kernel switched is not the
        # defaults' run.
        settings={name: value for name, value in sorted(os.environ.items()) if name.startswith("CONVT3D_")},
    )
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver_version()
    else:
        env["threads"] = torch.get_num_threads()
    return env


def _driver_version():
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        return None


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    header = ("implementation", "mean ± std ms", "speed-up", "× floor", "rel err fp64", "KB check", "host ms",
              "timed host ms")
    lines = []
    for r in rows:
        timing = f"{r['mean_ms']:.4f} ± {r['std_ms']:.4f}" if r["mean_ms"] is not None else "-"
        if r.get("device_allocations"):
            timing += " *"
        check = {True: "pass", False: "FAIL", None: "-"}[r["kernelbench_check"]]
        lines.append((_name(r), timing, _fmt(r["speedup_vs_eager"], ".2f") + "×" if r["speedup_vs_eager"] else "-",
                      _fmt(r["ratio_to_floor"], ".2f"), _fmt(r["rel_err_fp64"], ".1e"), check,
                      _fmt(r.get("host_ms"), ".4f"), _fmt(r.get("timed_host_ms"), ".4f")))
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]
    out = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    if any(r.get("host_ms") is not None for r in rows):
        out.append("host ms: the median host time of a call that starts on an idle GPU, from a synchronisation to "
                   "its return; a timed call's mean includes what of it exceeds the L2 flush's GPU time before it. "
                   "timed host ms: the same median over the timed calls themselves (a slow spell of the host while "
                   "they ran shows there)")
    if any(r.get("device_allocations") for r in rows):
        out.append("* the caching allocator called cudaMalloc/cudaFree (which synchronise) during the timed calls: "
                   + ", ".join(f"{r['implementation']} {r['device_allocations']}" for r in rows
                               if r.get("device_allocations")))
    slow = [r for r in rows if r.get("slow_calls")]
    if slow:
        out.append("calls above twice their row's fastest (call: ms / host ms, slowest first; gcN: the garbage "
                   "collector collected generation N during the call): " + "; ".join(map(_slow_calls, slow)))
    return "\n".join(out)


def _name(row: dict) -> str:
    return row["implementation"] if "layer" not in row else f"{row['layer']}: {row['implementation']}"


def _slow_calls(row: dict) -> str:
    return f"{_name(row)} {slow_calls_text(row['slow_calls'])}"


def slow_calls_text(calls: list[dict], shown: int = 3) -> str:
    """A row's slow_calls, the first `shown` of them, as "call: ms / host ms" (and "gcN" where the garbage collector
    collected generation N during the call)."""
    text = ", ".join(f"{c['call']}: {c['ms']:.3f} / {c['host_ms']:.3f}"
                     + ("" if c.get("gc_generation") is None else f" gc{c['gc_generation']}") for c in calls[:shown])
    return text + (f" and {len(calls) - shown} more" if len(calls) > shown else "")


def markdown_table(header: list[str], rows: list[tuple]) -> str:
    """The rows as a Markdown table, as the diagnostic scripts print them for benchmarks/RESULTS.md: floats (times in
    ms) to 4 decimals, anything else as it prints."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# A sweep's two comparisons, as issue 3 judges them: convt3d against eager in PyTorch's default mode (TF32 allowed
# for convolutions), and both with TF32 off.
SUMMARY_MODES = (("default mode", "PyTorch eager", "convt3d"),
                 ("TF32 off", "PyTorch eager, TF32 off", "convt3d, TF32 off"))


def sweep_summary(rows: list[dict]) -> list[dict]:
    """Per mode that a sweep's rows hold (SUMMARY_MODES): over the layers with both rows, the median of convt3d's
    speed-up over eager by the means (KernelBench's figure) and by the median calls (which a few slow calls of
    either side do not move: on the H200, fifty-third session, eager's first four timed calls of k3s1p1 took 0.9-2.2
    ms against its 0.08 ms minimum, and the median by the means rested on them), the lowest layer by the means, and
    the layers where convt3d's mean was above eager's."""
    summary = []
    for mode, eager_name, ours_name in SUMMARY_MODES:
        pairs: dict = {}
        for r in rows:
            if r["implementation"] in (eager_name, ours_name) and r.get("mean_ms") is not None:
                pairs.setdefault(r.get("layer"), {})[r["implementation"]] = r
        by_means, by_medians = {}, {}
        for layer, pair in pairs.items():
            if len(pair) == 2:
                eager, ours = pair[eager_name], pair[ours_name]
                by_means[layer] = eager["mean_ms"] / ours["mean_ms"]
                if eager.get("median_ms") and ours.get("median_ms"):
                    by_medians[layer] = eager["median_ms"] / ours["median_ms"]
        if not by_means:
            continue
        lowest = min(by_means, key=by_means.get)
        summary.append(dict(
            mode=mode, layers=len(by_means), median_speedup=statistics.median(by_means.values()),
            median_speedup_by_median_calls=(statistics.median(by_medians.values())
                                            if len(by_medians) == len(by_means) else None),
            lowest=dict(layer=lowest, speedup=by_means[lowest]),
            slower_than_eager=[layer for layer, speedup in by_means.items() if speedup < 1]))
    return summary


def summary_text(summary: list[dict]) -> str:
    """sweep_summary as one line per mode."""
    lines = []
    for s in summary:
        line = f"{s['mode']}: median speed-up over eager {s['median_speedup']:.2f}x by the means, {s['layers']} layers"
        if s["median_speedup_by_median_calls"] is not None:
            line += f" ({s['median_speedup_by_median_calls']:.2f}x by the median calls)"
        line += (f"; lowest {s['lowest']['layer']} at {s['lowest']['speedup']:.2f}x; slower than eager: "
                 + (", ".join(s["slower_than_eager"]) or "none"))
        lines.append(line)
    return "\n".join(lines)


def write_json(path: str, env: dict, rows: list[dict], workload: dict | list,
               summary: list[dict] | None = None) -> None:
    """The run as JSON: environment, workload, results (the rows) and, for a sweep, its summary (sweep_summary)."""
    data = dict(environment=env, workload=workload, results=rows)
    if summary is not None:
        data["summary"] = summary
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def write_plot(path: str, rows: list[dict], title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from None
    bars = [r for r in rows if not r["implementation"].startswith("floor")]
    floors = [r for r in rows if r["implementation"].startswith("floor: write")]
    names = [r["implementation"] if "layer" not in r else f"{r['layer']}\n{r['implementation']}" for r in bars]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.8))
    colors = ["tab:green" if "convt3d" in n else "tab:gray" for n in names]
    ax.barh(names, [r["mean_ms"] for r in bars], xerr=[r["std_ms"] for r in bars], color=colors)
    for floor in floors:
        ax.axvline(floor["mean_ms"], color="tab:red", linestyle="--",
                   label=f"floor: write the output once ({floor['mean_ms']:.3f} ms)")
    if floors:
        ax.legend(loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel("latency, ms (mean ± std)")
    ax.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
