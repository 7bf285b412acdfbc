"""reproduce's figures and CSVs (testbed.analysis.series, reproduce_plots, reproduce_tables,
timeline_plot): a line never joins two scenarios, a figure names its scenario, a system has one
colour everywhere, a time_scale run's timeline is drawn in real time, and the CSV holds the raw
numbers of metrics.json. On the committed reference runs (results/reference/)."""

from __future__ import annotations

import csv
import importlib.util
import io
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.analysis.reproduce import Run, finished_only, load_runs
from testbed.analysis.series import delay_points, lines, panels, rate_points, scenario_of
from testbed.spec.systems import BUBBLETEA_SUFFIX, SYSTEMS
from testbed.spec.timescale import TimeScale

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results" / "reference"


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    return finished_only(load_runs([str(p) for p in sorted(REFERENCE.iterdir())
                                    if p.is_dir() and p.name != "tables"]))


def _slower(m: dict, factor: float) -> dict:
    """A system's block with its iteration time (and its repeats' times) factor times longer."""
    out = dict(m, iteration_time_s=m["iteration_time_s"] * factor)
    times = (m.get("repeats") or {}).get("iteration_time_s")
    if times:
        scaled = {k: ([v * factor for v in x] if k == "values" else x * factor)
                  for k, x in times.items()}
        out["repeats"] = dict(m["repeats"], iteration_time_s=scaled)
    return out


def twin(runs: list[Run], name: str, factor: float) -> list[Run]:
    """sweep_delay's runs as another scenario's: same delays, other speedups (multitcp and
    atlas `factor` times slower)."""
    out = []
    for r in runs:
        if scenario_of(r) != "sweep_delay":
            continue
        systems = {n: _slower(m, 1 if n == "baseline" else factor)
                   for n, m in r.metrics["systems"].items()}
        out.append(replace(r, name=f"{name}/{r.name}", scenario=dict(r.scenario, name=name),
                           metrics=dict(r.metrics, systems=systems)))
    return out


def check_one_scenario_per_line(grouped: dict, runs: list[Run]) -> None:
    scenario = {r.name: scenario_of(r) for r in runs}
    for name, by_panel in grouped.items():
        for by_system in by_panel.values():
            for system, pts in by_system.items():
                assert {scenario[p.run] for p in pts} == {name}, (name, system, pts)
                xs = [p.x for p in pts]
                assert len(xs) == len(set(xs)), f"{name} {system}: two points at one x {xs}"


def test_a_line_never_joins_two_scenarios(runs):
    """The committed tables joined atlas_paper's run (40 ms) to sweep_delay's lines and
    atlas_bubbletea's (x40) to sweep_bubbletea_rate's: each scenario is its own figure now, and
    one with a single delay (or rate) draws none."""
    both = runs + twin(runs, "sweep_delay_slow", 1.5)
    by_delay = lines(delay_points(both))
    check_one_scenario_per_line(by_delay, both)
    assert sorted(by_delay) == ["sweep_delay", "sweep_delay_slow", "sweep_paper_testbed"]
    for name in by_delay:
        (only_panel,) = by_delay[name].values()        # the sweep varies the delay alone
        assert sorted(only_panel) == ["atlas", "baseline", "multitcp"]   # what the sweep ran
        assert [p.x for p in only_panel["atlas"]] == (
            [10, 20, 30, 40] if name == "sweep_paper_testbed" else [5, 20, 40])
    fast = [p.y["speedup"] for p in next(iter(by_delay["sweep_delay"].values()))["atlas"]]
    slow = [p.y["speedup"] for p in next(iter(by_delay["sweep_delay_slow"].values()))["atlas"]]
    assert slow == pytest.approx([s / 1.5 for s in fast])
    by_rate = lines(rate_points(runs))
    check_one_scenario_per_line(by_rate, runs)
    assert sorted(by_rate) == ["sweep_bubbletea_rate"]
    (only_panel,) = by_rate["sweep_bubbletea_rate"].values()
    assert sorted(only_panel) == ["atlas", "atlas+bubbletea"]
    assert len(only_panel["atlas+bubbletea"]) == 2


def test_a_figure_per_scenario_titled_with_it_and_a_colour_per_system(runs):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex
    from matplotlib.container import ErrorbarContainer

    from testbed.analysis.reproduce_plots import SYSTEM_COLOURS, colour_of, line_figure_plan

    names = [*SYSTEMS, *(n + BUBBLETEA_SUFFIX for n in SYSTEMS)]
    assert len({colour_of(n) for n in names}) == len(names) and set(names) == set(SYSTEM_COLOURS)
    plan = line_figure_plan(runs + twin(runs, "sweep_delay_slow", 1.5))
    assert [name for name, *_ in plan] == [
        "speedup_vs_delay-sweep_delay.png", "speedup_vs_delay-sweep_delay_slow.png",
        "speedup_vs_delay-sweep_paper_testbed.png", "bubbletea_vs_rate-sweep_bubbletea_rate.png"]
    for _, draw, scenario, by_panel in plan:
        fig = draw(scenario, by_panel)
        assert fig._suptitle.get_text().startswith(f"{scenario}: ")
        # plain lines, and lines with error bars (repeated runs: the label is the container's)
        drawn = [(line.get_label(), line) for ax in fig.axes for line in ax.get_lines()
                 if line.get_label()[0] != "_"]
        drawn += [(c.get_label(), c.lines[0]) for ax in fig.axes for c in ax.containers
                  if isinstance(c, ErrorbarContainer) and c.get_label()[0] != "_"]
        assert len(drawn) >= len(next(iter(by_panel.values())))
        for label, line in drawn:
            system = label.split(" ")[0]
            assert to_hex(line.get_color()) == colour_of(system), label
            xs = list(line.get_xdata())
            assert xs == sorted(xs) and len(xs) == len(set(xs)), (scenario, label)
        plt.close(fig)


def test_panels_split_by_what_else_differs_like_the_benchmark_draws():
    """A sweep of delay x D x rate (bench/bench_atlas_sweep.py's scenarios as run folders):
    one figure, a panel per (D, rate) named by training.replicas (dcs.N.hosts splits alike)
    and wan.0.rate_mbit, which are the panels the benchmark draws from its sweep.json."""
    spec = importlib.util.spec_from_file_location("bench_atlas_sweep",
                                                  REPO / "bench" / "bench_atlas_sweep.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs, rows = [], []
    for D in (2, 4):
        for rate in (50, 200):
            for delay in (10, 50, 100):
                name = f"run-d{delay}-D{D}-r{rate}"
                metrics = {"systems": {"baseline": {"iteration_time_s": delay / 10},
                                       "atlas": {"iteration_time_s": D / rate}}}
                runs.append(Run(name=name, path=Path(name), metrics=metrics, values={},
                                scenario=bench.scenario(delay, D, rate, 3)))
                rows += [{"delay_ms": delay, "D": D, "rate_mbit": rate, "system": s,
                          "speedup": (delay / 10) / m["iteration_time_s"], "run_dir": name}
                         for s, m in metrics["systems"].items()]
    assert set(panels(runs, lambda k: k.endswith("delay_ms")).values()) == {
        (("training.replicas", D), ("wan.0.rate_mbit", rate)) for D in (2, 4) for rate in (50, 200)}
    from_runs, from_rows = lines(delay_points(runs)), lines(bench.figure_points(rows))
    assert list(from_runs) == [bench.NAME] and list(from_rows) == [bench.NAME]
    assert {k: {s: [(p.x, p.y) for p in v] for s, v in by.items()}
            for k, by in from_runs[bench.NAME].items()} == {
        k: {s: [(p.x, p.y) for p in v] for s, v in by.items()}
        for k, by in from_rows[bench.NAME].items()}


def test_timeline_of_a_time_scale_run_is_drawn_in_real_time(runs):
    """atlas_bubbletea ran at time_scale 4: its iteration 1 lasted 1.52 s emulated, 0.380 s
    real (metrics.json's iteration_walls_s); the timeline spans the real 380 ms and says so."""
    import matplotlib.pyplot as plt

    from testbed.analysis.reproduce_plots import time_scale_of
    from testbed.analysis.timeline_plot import timeline_figure
    from testbed.host.spans import read_jsonl
    run = next(r for r in runs if scenario_of(r) == "atlas_bubbletea")
    assert time_scale_of(run) == TimeScale(4)
    spans = list(read_jsonl(run.path / "atlas" / "trainer_spans.jsonl"))
    real = timeline_figure(spans, iteration=1, title="atlas_bubbletea atlas",
                           time_scale=time_scale_of(run))
    emulated = timeline_figure(spans, iteration=1, title="atlas_bubbletea atlas")
    (ax4,), (ax1,) = real.axes, emulated.axes
    wall_ms = 1000 * run.metrics["systems"]["atlas"]["iteration_walls_s"][1]
    assert ax4.get_xlim()[1] == pytest.approx(wall_ms, rel=1e-3)    # its spans' window
    assert ax1.get_xlim()[1] == pytest.approx(4 * ax4.get_xlim()[1], rel=1e-12)
    assert ax4.get_xlabel() == "real time since iteration 1 start (ms)"
    assert ax4.get_title().startswith("atlas_bubbletea atlas (time_scale 4: ")
    assert ax1.get_xlabel() == "time since iteration 1 start (ms)"      # time_scale 1: as before
    bars1 = sorted((p.get_x(), p.get_width()) for p in ax1.patches)
    bars4 = sorted((p.get_x(), p.get_width()) for p in ax4.patches)
    assert len(bars4) > 50 and bars4 == pytest.approx([(x / 4, w / 4) for x, w in bars1])
    plt.close(real)
    plt.close(emulated)


def test_csv_holds_the_raw_numbers_with_units_in_the_header(runs):
    from testbed.analysis.reproduce_tables import (BUBBLETEA, TRAINING, TRAINING_CSV_ONLY,
                                                 bubbletea_records, csv_text, training_records)
    text = csv_text(TRAINING + TRAINING_CSV_ONLY, training_records(runs))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0])[3:] == ["iteration_s", "iteration_stdev_s", "repeats",
                                 "model_iteration_s", "model_error_frac", "speedup_vs_baseline_x", "bubble_frac", "model_bubble_frac",
                                 "gpu_utilization_frac", "status"]
    by_name = {r.name: r for r in runs}
    for row in rows:
        m = by_name[row["results"]].metrics["systems"][row["system"]]
        assert float(row["iteration_s"]) == m["iteration_time_s"]
        assert float(row["model_error_frac"]) == m["model"]["error"]["iteration_time_rel"]
        assert float(row["gpu_utilization_frac"]) == m["gpu_utilization"]
        has_baseline = "baseline" in by_name[row["results"]].metrics["systems"]
        assert (row["speedup_vs_baseline_x"] == "") == (not has_baseline)
        assert row["point"] == "" or "=" in row["point"]
        assert row["status"] == "complete"
        for key, cell in row.items():
            assert "%" not in cell and cell != "-", (key, cell)
    bt = list(csv.DictReader(io.StringIO(csv_text(BUBBLETEA, bubbletea_records(runs)))))
    assert [float(r["training_slowdown_frac"]) for r in bt] == [
        by_name[r["results"]].metrics["systems"][r["system"]]["bubbletea"]["training_slowdown"]
        for r in bt]
    # a stopped system: its reason, and empty cells where the figures would be
    stopped = replace(runs[0], metrics=dict(runs[0].metrics, systems={"atlas": {
        "complete": False, "iterations_done": 2, "iterations_planned": 4}}))
    (row,) = csv.DictReader(io.StringIO(csv_text(TRAINING + TRAINING_CSV_ONLY,
                                                 training_records([stopped]))))
    assert row["status"] == "stopped after 2 of 4 iterations" and row["iteration_s"] == ""


def test_committed_figures_are_the_ones_reproduce_writes(runs):
    """No figure left from an earlier reproduce (speedup_vs_delay.png pooled every scenario)."""
    expected = ({f"speedup_vs_delay-{s}.png" for s in lines(delay_points(runs))}
                | {f"bubbletea_vs_rate-{s}.png" for s in lines(rate_points(runs))})
    committed = {p.name for p in (REFERENCE / "tables").glob("*.png")
                 if not p.name.startswith("timeline-")}
    assert committed == expected == {"speedup_vs_delay-sweep_delay.png",
                                     "speedup_vs_delay-sweep_paper_testbed.png",
                                     "bubbletea_vs_rate-sweep_bubbletea_rate.png"}
