"""Every figure read back as a person reads it: its titles, axis labels and legend (through matplotlib's own
objects, captured as the figure is saved), the device it was measured on, units on every axis, and no line
drawn outside the axes' range."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

EMULATED = "emulated device: CPU behind RPC with a 129 MiB cap, not a GPU's speed"
# What an axis label must name: a unit, or the count it is (layers, tokens, experts).
UNITS = ("tokens/s", "tok/s", "%", "GB", "MB", "MiB", "per generated token", "share", "tokens", "layer", "n_cpu_moe",
         "experts")  # fmt: skip


@pytest.fixture
def drawn(monkeypatch):
    """The figures saved while the test runs (nothing is written)."""
    figures: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    return figures


def texts(fig: Figure) -> str:
    parts = [fig.get_suptitle(), *(t.get_text() for t in fig.texts)]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.texts)]
        parts += [t.get_text() for t in (*ax.get_xticklabels(), *ax.get_yticklabels())]
        if ax.get_legend():
            parts += [t.get_text() for t in ax.get_legend().get_texts()]
    return "\n".join(parts)


def check(fig: Figure, *must: str) -> str:
    """The figure's text holds `must`; each axis with data has a label with a unit; data lines stay in range."""
    text = texts(fig)
    for needle in must:
        assert needle in text, f"{needle!r} not in the figure's text:\n{text}"
    for ax in fig.axes:
        if not ax.has_data() or not ax.get_visible():
            continue
        for label in (ax.get_xlabel(), ax.get_ylabel()):
            if label:
                assert any(u in label for u in UNITS), f"no unit in axis label {label!r}"
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for line in ax.get_lines():
            if line.get_transform() != ax.transData:  # axvline/axhline: drawn in axes coordinates
                continue
            x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
            keep = np.isfinite(x) & np.isfinite(y)
            assert ((x[keep] >= x0 - 1e-9) & (x[keep] <= x1 + 1e-9)).all(), f"line {line.get_label()!r} leaves x range"
            assert ((y[keep] >= y0 - 1e-9) & (y[keep] <= y1 + 1e-9)).all(), f"line {line.get_label()!r} leaves y range"
    return text


def lines_xy(ax) -> dict[str, list[tuple[float, float]]]:
    """Each labelled line of an axis as its (x, y) points (an axhline's x runs 0 to 1 in axes coordinates)."""
    return {
        line.get_label(): list(
            zip(np.asarray(line.get_xdata(), float).tolist(), np.asarray(line.get_ydata(), float).tolist())
        )
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def sweep() -> tuple[pd.DataFrame, pd.DataFrame]:
    ns = [0, 1, 2, 4, 6, 8]
    measured = pd.DataFrame(
        [
            {
                "model": "tiny",
                "variant": "ncmoe",
                "test": t,
                "n_cpu_moe": n,
                "status": "oom" if n == 0 else "ok",
                "median_ts": None if n == 0 else 100 - 5 * n,
                "ci95_low_ts": None if n in (0, 1) else 98 - 5 * n,  # n = 1: below 6 repetitions, no interval
                "ci95_high_ts": None if n in (0, 1) else 101 - 5 * n,
                "stddev_ts": 1.0,
                "repetitions": 3 + n % 2,
                "device": EMULATED,
            }
            for n in ns
            for t in ("tg", "pp")
        ]  # fmt: skip
    )
    compare = pd.DataFrame(
        [
            {
                "model": "tiny",
                "n_cpu_moe": n,
                "predicted_tg_tok_s": 99 - 5 * n,
                "predicted_tg_low": 90 - 5 * n,
                "predicted_tg_high": 108 - 5 * n,
                "tg_error_pct": 1.0,
                "predicted_pp_tok_s": 98 - 5 * n,
                "predicted_pp_low": 88 - 5 * n,
                "predicted_pp_high": 110 - 5 * n,
                "pp_error_pct": 2.0,
                "budget_min_n": 1,
                "knee_measured": 4,
                "device": EMULATED,
            }
            for n in ns[1:]
        ]  # fmt: skip
    )
    return measured, compare


def test_ncmoe_figures_say_the_device_and_the_out_of_sample_prediction(drawn, tmp_path):
    from moeplace.report.figures.ncmoe import ncmoe_figure

    measured, compare = sweep()
    ncmoe_figure(compare, measured, 32768, "tg", tmp_path / "x.png")
    ncmoe_figure(compare, measured, 32768, "pp", tmp_path / "x.png")
    tg, pp = drawn
    text = check(tg, EMULATED, "32k context", "fitted without it", "budget minimum (n = 1)", "3-4 repetitions")
    assert "right axis" not in text and "η" not in text  # one axis, no scale factor fitted to its own points
    assert len(tg.axes) == 1
    assert "median, 95% interval (± sd below 6)" in text
    bars = tg.axes[0].containers[0].lines[2][0].get_segments()  # each point's vertical bar, n = 1, 2, 4, 6, 8
    assert [tuple(seg[:, 1]) for seg in bars[:2]] == [(94.0, 96.0), (88.0, 91.0)]  # n = 1: ± sd; n = 2: its interval
    check(pp, EMULATED, "Prefill", "prefill (pp) speed, tokens/s")


def test_a_wide_interval_is_cut_at_the_top_and_marked_never_flattening_the_points(drawn, tmp_path):
    """The default run's tiny-gpt-oss panel once had a leave-one-out interval reaching 27,000 tok/s at n = 0,
    which pressed its measured 100-150 tok/s onto the x axis."""
    from moeplace.report.figures.ncmoe import ncmoe_figure

    measured, compare = sweep()
    compare.loc[compare.n_cpu_moe == 1, "predicted_tg_high"] = 27_000.0
    ncmoe_figure(compare, measured, 32768, "tg", tmp_path / "x.png")
    (fig,) = drawn
    text = check(fig, "runs above the axis (cut)")
    ax = fig.axes[0]
    assert ax.get_ylim()[1] == pytest.approx(1.3 * (95 + 1))  # the highest mean + sd, and room
    (cut,) = [line for line in ax.get_lines() if "cut" in line.get_label()]
    assert list(cut.get_xdata()) == [1] and "27" not in text


def test_variants_figure_says_what_it_cannot_tell_apart(drawn, tmp_path):
    from moeplace.measure.placement import variants_table
    from moeplace.report.figures.variants import variants_figure

    base = {"model": "tiny", "ctx": 4096, "status": "ok", "overrides": "", "device": EMULATED}
    records = [
        {**base, "variant": v, "test": t, "samples_ts": s, "avg_ts": float(np.mean(s)), "stddev_ts": 1.0,
         "repetitions": len(s), "baseline_samples_ts": b}
        for t in ("tg", "pp")
        for v, s, b in (("first_n", [50, 51, 49], None), ("last_n", [60, 61, 59], [50, 51, 49]),
                        ("up_down", [50, 52, 49], [50, 51, 50]))
    ]  # fmt: skip
    variants_figure(variants_table(records), 4096, tmp_path / "x.png")
    text = check(drawn[0], EMULATED, "4k context", "not distinguishable", "MDE")
    assert "+20.0%" in text  # last_n, told apart


def test_matrix_fidelity_quants_ram_tier_and_routing_figures_plot_their_tables(drawn, tmp_path):
    from test_quants import meta, records
    from test_ram_tier import synthetic_records
    from test_routing import synthetic

    from moeplace.measure.quants import quant_row, quants_table
    from moeplace.measure.ram_tier_table import ram_tier_table
    from moeplace.measure.routing import routing_table
    from moeplace.report.figures.fidelity import fidelity_figure
    from moeplace.report.figures.matrix import matrix_figure
    from moeplace.report.figures.quants import quants_figure
    from moeplace.report.figures.ram_tier import ram_tier_figure
    from moeplace.report.figures.routing import routing_figure

    matrix = pd.DataFrame(
        [
            {
                "model": "tiny",
                "cache_type": kv,
                "ctx": c,
                "recommended_n": n,
                "tg_tok_s": 10.0 * (n + 1),
                "device": EMULATED,
            }
            for kv in ("f16", "q8_0")
            for c, n in ((4096, 0), (32768, 2))
        ]  # fmt: skip
    )
    matrix_figure(matrix, tmp_path / "x.png")
    check(drawn[-1], EMULATED, "recommended --n-cpu-moe", "32k context")
    # The heatmaps hold the table's cells: rows "tiny · KV f16" and "tiny · KV q8_0", columns 4K and 32K; the
    # recommended n is 0 at 4K and 2 at 32K, the decode speed there 10 x (n + 1) = 10 and 30 tok/s.
    left, right = (ax for ax in drawn[-1].axes if ax.images)
    assert [t.get_text() for t in left.get_yticklabels()] == ["tiny · KV f16", "tiny · KV q8_0"]
    assert np.asarray(left.images[0].get_array()).tolist() == [[0, 2], [0, 2]]
    assert np.asarray(right.images[0].get_array()).tolist() == [[10, 30], [10, 30]]
    assert [t.get_text() for t in right.texts] == ["10.0", "30.0", "10.0", "30.0"]
    fidelity = pd.DataFrame(
        {
            "fit": ["loo", "two_point"],
            "test": ["tg", "pp"],
            "depth": [0, 4096],
            "fit_depth": [None, 0],
            "measured_tok_s": [10.0, 100.0],
            "predicted_tok_s": [11.0, 95.0],
            "error_pct": [10.0, -5.0],
        }  # fmt: skip
    )
    fidelity_figure(fidelity, tmp_path / "x.png", EMULATED)
    check(drawn[-1], EMULATED, "predicted = measured", "median |error|", "two-point, other depth")
    # One point per row at (measured, predicted), named in the legend with its |error|: 10% and 5%.
    (ax,) = drawn[-1].axes
    points = {c.get_label(): np.asarray(c.get_offsets()).tolist() for c in ax.collections}
    assert points == {
        "tg loo: median |error| 10.0%, p90 10.0%": [[10.0, 11.0]],
        "pp two-point, other depth: median |error| 5.0%, p90 5.0%": [[100.0, 95.0]],
    }
    assert ax.get_xscale() == ax.get_yscale() == "log" and "tokens/s" in ax.get_xlabel() + ax.get_ylabel()
    q = [quant_row(name, meta(b, 10**8), records(t, c, f), 50) for name, b, t, c, f in
         (("Q4_K_M", 10**9, 10.0, 1.0, 300.0), ("Q2_K", 6 * 10**8, 14.0, 1.5, 200.0))]  # fmt: skip
    quants_figure(quants_table(q), tmp_path / "x.png", "tiny: quant types")
    check(drawn[-1], "Q2_K")
    # The speed panel's bars are the runs' decode speeds, Q4_K_M then Q2_K: 10 and 14 tok/s with plenty of RAM,
    # 1 and 1.5 under the cap.
    speed = next(ax for ax in drawn[-1].axes if "tok/s" in ax.get_ylabel())
    heights = {bars.get_label(): [bar.get_height() for bar in bars] for bars in speed.containers}
    assert heights == {"plenty of RAM": [10.0, 14.0], "RAM capped at 50%": [1.0, 1.5]}
    assert [t.get_text().split("\n")[0] for t in speed.get_xticklabels()] == ["Q4_K_M", "Q2_K"]
    ram_tier_figure(ram_tier_table(synthetic_records()), tmp_path / "x.png", "tiny under a RAM cap")
    check(drawn[-1], "readahead: 128 KiB", "OOM")
    # tests/test_ram_tier.py's records: 25 tok/s uncapped; 10 and 3 tok/s (300 and 900 faults a token) at 50% and
    # 25% unlocked; 12.5 tok/s (120 faults) at 50% with the non-expert tensors locked, OOM at 25%.
    speed, faults = drawn[-1].axes
    locked = "non-expert tensors mlock'ed"
    assert lines_xy(speed) == {
        "no cap (25)": [(0, 25), (1, 25)],
        "no locking": [(25, 3), (50, 10)],
        locked: [(50, 12.5)],
    }
    assert lines_xy(faults) == {
        "no cap (0)": [(0, 0), (1, 0)],
        "no locking": [(25, 900), (50, 300)],
        locked: [(50, 120)],
    }
    trace = synthetic(np.random.default_rng(0).integers(0, 8, size=(40, 3, 2)), 8, 10)
    routing_figure(trace, routing_table(trace), tmp_path / "x.png", "Expert routing of tiny (random-weight twin)")
    check(drawn[-1], "random-weight twin")
    # Left: each layer's row holds its experts' shares of its 40 x 2 activations, largest first (they sum to 1).
    # Right: the reuse lines are the table's columns, layer by layer.
    traffic, reuse = drawn[-1].axes[:2]  # the colorbar's axis comes after them
    share = np.asarray(traffic.images[0].get_array())
    expected = [sorted(np.bincount(trace.ids[:, layer].ravel(), minlength=8) / 80, reverse=True) for layer in range(3)]
    assert share.ravel().tolist() == pytest.approx(np.ravel(expected)) and share.sum(axis=1) == pytest.approx(1)
    table = routing_table(trace)
    lines = {line.get_label(): line for line in reuse.get_lines()}
    assert lines["token t vs t+1"].get_ydata().tolist() == pytest.approx(table.overlap_d1.tolist())
    assert lines["token t vs t+1"].get_xdata().tolist() == [0, 1, 2]
    assert list(lines["uniform random routing (k/E = 0.250)"].get_ydata()) == [0.25, 0.25]  # k/E = 2/8


def spans(ax) -> list[tuple[float, float]]:
    """The x extent of each shaded band (axvspan) of an axis."""
    return [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]


@pytest.mark.fault(
    fault="a run crashes at one n (not out of memory)",
    injected="a sweep whose n = 1 crashed and n = 0 ran out of memory; another whose every run crashed",
    sees='only n = 0 shaded "does not fit (measured OOM)"; CRASH at n = 1, "crash at n = 1: failed, not for memory"',
    kept="every ok point drawn; the crash row stays in the records and tables",
)
def test_only_a_measured_oom_is_drawn_as_not_fitting(drawn, tmp_path):
    from moeplace.report.figures.ncmoe import ncmoe_figure

    measured, compare = sweep()
    measured.loc[measured.n_cpu_moe == 1, ["status", "median_ts"]] = ["crash", None]
    ncmoe_figure(compare, measured, 32768, "tg", tmp_path / "x.png")
    measured.status, measured.median_ts = "crash", None
    ncmoe_figure(compare, measured, 32768, "tg", tmp_path / "x.png")
    one_crash, all_crash = drawn
    text = check(one_crash, "does not fit (measured OOM)", "crash at n = 1: failed, not for memory")
    ax = one_crash.axes[0]
    assert spans(ax) == [(-0.5, 0.5)]  # n = 0 only: the crash at n = 1 is no evidence that n = 1 does not fit
    assert sorted(t.get_text() for t in ax.texts) == ["CRASH", "OOM"]
    assert list(ax.containers[0].lines[0].get_xdata()) == [2, 4, 6, 8]
    text = check(all_crash, "crash at n = 0, 1, 2, 4, 6, 8: failed, not for memory")
    assert spans(all_crash.axes[0]) == [] and "does not fit" not in text and "OOM" not in text
