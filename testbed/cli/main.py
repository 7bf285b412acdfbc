"""The command line: build the emulated multi-DC testbed for a scenario and run something on it.

    sudo python run_testbed.py calibrate topologies/three_dc.yaml [--out results] [--backend B]
    sudo python run_testbed.py run topologies/atlas_paper.yaml [--systems baseline,atlas] [--iterations N]
    sudo python run_testbed.py topologies/two_dc.yaml          # shorthand for run
    sudo python run_testbed.py validate topologies/*.yaml [-q] # check scenario files only
    python run_testbed.py plan topologies/two_dc.yaml [--json] [--systems a,b] [--full]  # no root
    python run_testbed.py predict topologies/atlas_paper.yaml [--json] [--systems a,b] [--plan N]
    python run_testbed.py whatif topologies/paper/gpt70b_3dc.yaml [--json]  # one change at a time
    python run_testbed.py reproduce results/RUN... [--out DIR] # tables and figures from results
    python run_testbed.py list                                 # the shipped scenarios
    python run_testbed.py show topologies/two_dc.yaml [--json] # every setting, resolved
    sudo python run_testbed.py cleanup [--cluster CLUSTER.yaml]  # remove what a killed run left

A scenario with a `sweep:` section runs once per point (testbed/spec/sweep.py): `run -q` prints one
line per point, `run --resume SWEEP_DIR` runs only the points not done yet.
validate, plan, predict, whatif, list, show and reproduce need neither root nor Mininet nor torch.

CLI only: parse flags, load the scenario, call the job, print one line on error. Exit codes:
0 ok, 1 the run failed, 2 bad input (scenario or flags), 130 interrupted (after cleaning up).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import errno
import os
import sys
from pathlib import Path

from testbed.spec.errors import ScenarioError, TestbedError
from testbed.spec.systems import SYSTEMS

COMMANDS = ("run", "calibrate", "validate", "plan", "predict", "whatif", "list", "show",
            "reproduce", "cleanup")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"error: {message} (see --help)\n")


SCENARIO_HELP = ("a scenario file, or a shipped scenario's name (two_dc, atlas_paper, ...; "
                 "`run_testbed.py list` shows them)")
EXAMPLES = {
    "run": ["sudo python run_testbed.py run two_dc",
            "sudo python run_testbed.py run atlas_paper --systems baseline,atlas --iterations 4"],
    "calibrate": ["sudo python run_testbed.py calibrate three_dc",
                  "sudo python run_testbed.py calibrate two_dc --seconds 4 --streams 2"],
    "validate": ["python run_testbed.py validate topologies/*.yaml -q",
                 "python run_testbed.py validate my_scenario.yaml"],
    "plan": ["python run_testbed.py plan atlas_paper",
             "python run_testbed.py plan gpt70b_3dc --systems atlas --json"],
    "predict": ["python run_testbed.py predict two_dc",
                "python run_testbed.py predict atlas_paper --systems baseline,atlas --json"],
    "whatif": ["python run_testbed.py whatif gpt70b_3dc",
               "python run_testbed.py whatif paper_testbed --json"],
    "list": ["python run_testbed.py list", "python run_testbed.py list | grep model"],
    "show": ["python run_testbed.py show two_dc", "python run_testbed.py show atlas_paper --json"],
    "reproduce": ["python run_testbed.py reproduce results/two_dc-* --out /tmp/tables",
                  "python run_testbed.py reproduce results/reference/atlas_bubbletea-* --no-figures"],
    "cleanup": ["sudo python run_testbed.py cleanup",
                "sudo python run_testbed.py cleanup --cluster cluster.yaml"],
}


def _add(sub, name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's word
    """A subcommand whose --help has its one-line help as description and two examples."""
    return sub.add_parser(name, help=help, description=help, epilog="examples:\n" + "\n".join(
        f"  {line}" for line in EXAMPLES[name]), formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="run_testbed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version and the checkout's commit, and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = _add(sub, "run", help="build the network and train on it (default command)")
    run.add_argument("scenario", help=SCENARIO_HELP)
    run.add_argument("--systems", default=None,
                     help="comma-separated, each on a fresh network: "
                          + ", ".join(SYSTEMS) + " (default: the scenario's systems)")
    run.add_argument("--iterations", type=int, default=None, help="override training.iterations")
    run.add_argument("--resume", default=None, metavar="SWEEP_DIR",
                     help="a sweep's results folder: run only its points not done yet (same "
                          "scenario and flags)")
    run.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="train each system N times, each on a fresh network: figures are "
                          "the mean, with their spread and n (default 1)")
    run.add_argument("--timeout-s", type=float, default=None, metavar="S",
                     help="stop a system's training after S seconds (real time; default: 3x "
                          "the model's predicted time plus 120 s, or 600 s in measured mode)")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no progress bar and no per-iteration lines (for CI logs)")
    run.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                     help="spread the DCs over the cluster file's servers (docs/cluster.md)")
    _common(run)
    cal = _add(sub, "calibrate", help="measure every WAN link (ping, iperf3) against its config")
    cal.add_argument("scenario", help=SCENARIO_HELP)
    cal.add_argument("--seconds", type=float, default=6.0, help="per iperf3 test, after a 1 s warm-up (default 6)")
    cal.add_argument("--streams", type=int, default=4, help="parallel TCP flows (default 4)")
    cal.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                     help="spread the DCs over the cluster file's servers (docs/cluster.md)")
    _common(cal)
    val = _add(sub, "validate", help="check scenario files, build nothing")
    val.add_argument("scenario", nargs="+", help="scenario files or names (as run takes them)")
    val.add_argument("-q", "--quiet", action="store_true",
                     help="one line per file: leave out the routes (checked all the same)")
    val.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                     help="also show which server each DC runs on (docs/cluster.md)")
    plan = _add(sub, "plan", help="print each system's placement, WAN crossings and slot "
                          "plan (no root, builds nothing)")
    _scenario_systems_json(plan)
    plan.add_argument("--full", action="store_true",
                      help="every replica, pipeline and host (default: as ranges, such as "
                           "usw-h[1-250]); with --json, each link's slot-by-slot order too")
    plan.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                      help="also show which server each DC runs on and the WAN links that "
                           "cross servers (docs/cluster.md)")
    pred = _add(sub, "predict", help="the model's iteration time, bubbles and WAN use per "
                          "system (no root, builds nothing)")
    _scenario_systems_json(pred)
    pred.add_argument("--plan", type=int, metavar="N", default=None,
                      help="instead: the N fastest assignments of stages to DCs (Atlas's "
                           "connections and sharing)")
    what = _add(sub, "whatif", help="the scenario as given and changed one setting at a "
                          "time: iteration times, Atlas's speedup and BubbleTea's GPU "
                          "utilization beside the paper's, and why (the model; no root)")
    what.add_argument("scenario", help=SCENARIO_HELP)
    what.add_argument("--json", action="store_true", help="print one JSON document")
    _add(sub, "list", help="the scenarios under topologies/, one line each (no root)")
    show = _add(sub, "show", help="a scenario with every setting resolved: DCs, hosts, "
                          "links, routes, training and each system's placement (no root)")
    show.add_argument("scenario", help=SCENARIO_HELP)
    show.add_argument("--json", action="store_true", help="print one JSON document")
    rep = _add(sub, "reproduce", help="rebuild the paper-style tables and figures from "
                         "saved results folders (no root, no network, no torch)")
    rep.add_argument("results", nargs="+", metavar="RESULTS",
                     help="run folders (with metrics.json) or sweep folders (with index.json)")
    rep.add_argument("--out", default="reproduced",
                     help="where the tables (Markdown, CSV) and figures (PNG) go (default "
                          "reproduced/): a new or empty folder, or one reproduce made, which "
                          "is replaced whole; a folder holding other files is refused")
    rep.add_argument("--no-figures", action="store_true", help="tables only (no matplotlib)")
    clean = _add(sub, "cleanup", help="remove namespaces, links and processes left by a "
                           "killed run")
    clean.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                       help="also on every server of the cluster file, over ssh: what killed "
                            "runs started from here left there (docs/cluster.md)")
    return parser


class _Version(argparse.Action):
    """--version, asking git for the commit only when given."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    """The package's version and the checkout's commit (as a run's folder names it)."""
    from importlib.metadata import PackageNotFoundError, version
    from testbed.emulation.results import git_commit
    try:
        v = version("geodc")
    except PackageNotFoundError:
        v = "unknown"
    return f"{v} (commit {git_commit()})"


def _scenario_systems_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help=SCENARIO_HELP)
    p.add_argument("--systems", default=None,
                   help="comma-separated (default: the scenario's systems)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="results", help="results folder (default results/)")
    p.add_argument("--backend", choices=("auto", "netem", "delayline"), default=None,
                   help="link emulation (default: the scenario's, else probe the kernel)")


def main(argv: list[str] | None = None) -> int:
    from testbed.cli.catalog import resolve, scenario_names
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        first = argv[0]
        close = difflib.get_close_matches(first, COMMANDS, n=1, cutoff=0.6)
        if close and resolve(first) == first and not Path(first).exists() \
                and first not in scenario_names():
            print(f"error: {first!r} is not a command; did you mean {close[0]}? (see --help)",
                  file=sys.stderr)
            return 2
        argv.insert(0, "run")  # run_testbed.py SCENARIO
    args = build_parser().parse_args(argv)
    if isinstance(getattr(args, "scenario", None), list):
        args.scenario = [resolve(a) for a in args.scenario]
    elif getattr(args, "scenario", None) is not None:
        args.scenario = resolve(args.scenario)
    if args.command in ("run", "calibrate"):
        from testbed.host.realtime import demote_on_rttime
        from testbed.emulation import interrupts
        interrupts.install()   # Ctrl-C, SIGTERM, SIGHUP: torn down, and never lost in a fork
        demote_on_rttime("run_testbed")   # the fault thread runs real-time
    try:
        if args.command == "cleanup":
            servers = None
            if args.cluster is not None:   # a bad cluster file is refused before anything
                from testbed.spec.cluster import load_cluster
                servers = load_cluster(args.cluster).servers
            from testbed.emulation.registry import cleanup
            done = cleanup()
            if servers is not None:
                from testbed.emulation.serverregistry import cleanup_servers
                done += cleanup_servers(servers)
            print("\n".join(done) if done else "nothing to clean up")
            return 1 if any("could not" in line for line in done) else 0
        if args.command == "list":
            from testbed.cli.catalog import list_text
            print(list_text())
            return 0
        if args.command == "show":
            from testbed.cli.show import show_command
            print(show_command(args.scenario, as_json=args.json))
            return 0
        if args.command == "reproduce":
            _check_out_dir(args.out)
            if not args.no_figures and importlib.util.find_spec("matplotlib") is None:
                raise ModuleNotFoundError("matplotlib", name="matplotlib")
            from testbed.analysis.outfolder import check_out, write_folder
            from testbed.analysis.reproduce import reproduce
            check_out(Path(args.out).absolute())   # before the results are read
            text = ""

            def build(folder: Path) -> list[Path]:
                nonlocal text
                text, files = reproduce(args.results, folder, figures=not args.no_figures)
                return files
            written = write_folder(Path(args.out), build)
            print(text.rstrip())
            print(f"results: {Path(args.out)} ({len(written)} files)")
            return 0
        if args.command == "plan":
            from testbed.cli.planview import plan_command
            systems = _systems(args.systems)
            print(plan_command(args.scenario, systems, as_json=args.json, full=args.full,
                               cluster=args.cluster))
            return 0
        if args.command == "predict":
            from testbed.cli.predict import predict_command
            systems = _systems(args.systems)
            print(predict_command(args.scenario, systems, as_json=args.json,
                                  plan_top=args.plan))
            return 0
        if args.command == "whatif":
            from testbed.cli.whatif import whatif_command
            print(whatif_command(args.scenario, as_json=args.json))
            return 0
        if args.command == "validate":
            failed = 0
            for path in args.scenario:   # every file; with several, each error names its file
                try:
                    print(_validate(path, routes=not args.quiet, cluster=args.cluster))
                except ScenarioError as exc:
                    name = f"{path}: " if len(args.scenario) > 1 else ""
                    print(f"error: {name}{exc}", file=sys.stderr)
                    failed += 1
            return 2 if failed else 0
        # bad input is refused before anything that needs root, Mininet or torch is imported
        _check_out_dir(args.out)
        if args.command == "calibrate":
            from testbed.spec.scenario import load_scenario
            scenario = load_scenario(args.scenario)
            scenario.check_emulable()
            cluster = None
            if args.cluster is not None:   # a bad cluster file is refused before any build
                from testbed.spec.cluster import load_cluster, scenario_placement
                cluster = load_cluster(args.cluster)
                scenario_placement(cluster, scenario)
            _dead_runs_notice()   # first: a bad flag below still shows it, as before the check
            _check_calibrate(args.seconds, args.streams)
            from testbed.run.jobs import calibrate_job
            path = calibrate_job(args.scenario, out_dir=Path(args.out), backend=args.backend,
                                 seconds=args.seconds, streams=args.streams, cluster=cluster)
        else:
            from testbed.features.checks import load_run
            from testbed.spec.scenario import load_scenario
            systems = _systems(args.systems)
            if args.timeout_s is not None and not args.timeout_s > 0:
                raise ScenarioError("--timeout-s", f"{args.timeout_s:g} is not a duration",
                                    "give seconds above 0")
            if not 1 <= args.repeat <= MAX_REPEAT:
                raise ScenarioError("--repeat", f"{args.repeat} is not a repeat count",
                                    f"give 1 to {MAX_REPEAT}")
            load_run(args.scenario, systems=systems, iterations=args.iterations)
            cluster = None
            if args.cluster is not None:   # a bad cluster file is refused before any build
                from testbed.spec.cluster import load_cluster, scenario_placement
                cluster = load_cluster(args.cluster)
                scenario_placement(cluster, load_scenario(args.scenario))
            _dead_runs_notice()
            if load_scenario(args.scenario).sweep:
                from testbed.run.sweeprun import sweep_job
                path = sweep_job(args.scenario, out_dir=Path(args.out), backend=args.backend,
                                 systems=systems, iterations=args.iterations,
                                 resume=None if args.resume is None else Path(args.resume),
                                 quiet=args.quiet, timeout_s=args.timeout_s, cluster=cluster,
                                 repeat=args.repeat)
            else:
                if args.resume is not None:
                    raise ScenarioError("--resume", f"{args.scenario} has no sweep",
                                        "use --resume with a scenario that has a sweep: section")
                from testbed.run.jobs import run_job
                path = run_job(args.scenario, out_dir=Path(args.out), backend=args.backend,
                               systems=systems, iterations=args.iterations, quiet=args.quiet,
                               timeout_s=args.timeout_s, cluster=cluster, repeat=args.repeat)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the testbed was torn down" if args.command in ("run", "calibrate")
              else "interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        print(f"error: `{args.command}` needs {exc.name}, which {sys.executable} lacks; run "
              f"`sudo make setup` (it installs requirements.txt into .venv)", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename:
            print(f"error: {exc.filename}: no space left on its filesystem ({exc.strerror}); "
                  f"free space there or give --out a folder with room", file=sys.stderr)
        else:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line for the user; details in the run's logs
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"results: {path.parent if path.name.endswith('.json') else path}")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _dead_runs_notice() -> None:
    """One line on stderr if killed runs left something behind for `cleanup`."""
    from testbed.emulation.registry import dead_runs_notice
    notice = dead_runs_notice()
    if notice:
        print(notice, file=sys.stderr)


def _validate(path: str, routes: bool = True, cluster: str | None = None) -> str:
    """What `validate` prints for one scenario file (routes: the route lines too; cluster: a
    cluster file, the placement on its servers too); ScenarioError on any problem."""
    from testbed.plans.routing import dc_paths
    from testbed.features.checks import load_run
    from testbed.spec.scenario import load_scenario
    scenario = load_scenario(path)
    what = "network only"
    cfg = None                        # the training checked (a sweep: every point's, not one)
    if scenario.predict_only:
        from testbed.cli.planview import load_training
        cfg = load_training(scenario)
        what = (f"predict only: {sum(dc.hosts for dc in scenario.dcs)} hosts, "
                f"training P={cfg.stages} D={cfg.replicas}"
                + (f" TP={cfg.tp}" if cfg.tp > 1 else ""))
    elif scenario.sweep:
        from testbed.features.checks import check_points
        from testbed.spec.sweep import expand
        points = expand(dict(scenario.raw))
        check_points(points)          # what `run` checks, for every point
        what = f"sweep of {len(points)} points over {', '.join(scenario.sweep)}"
    elif scenario.training is not None:
        _, cfg, systems = load_run(path)  # exactly what `run` checks
        what = f"training P={cfg.stages} D={cfg.replicas}, {', '.join(systems)}"
    head = (f"{path}: ok ({_count(len(scenario.dcs), 'DC')}, "
            f"{_count(len(scenario.wan), 'WAN link')}, {what})")
    if cfg is not None:
        from testbed.rules.memory import stage_memory, summary
        memory = summary(stage_memory(cfg))
        if memory:
            head += "\n  " + memory
    paths = {(p.src, p.dst): p for p in dc_paths(scenario)}   # routed either way: a check too
    servers: list[str] = []
    if cluster is not None:
        from testbed.spec.cluster import load_cluster, scenario_placement
        spec = load_cluster(cluster)
        servers = scenario_placement(spec, scenario).lines(spec)
    if not routes:
        return "\n".join([head] + servers)
    lines = [head] + servers + [f"  routes ({scenario.routing}):"]
    for p in paths.values():
        rtt_ms = p.delay_ms + paths[(p.dst, p.src)].delay_ms
        lines.append(f"    {p.describe()}, RTT {rtt_ms:g} ms")
    return "\n".join(lines)


MAX_CALIBRATE_S = 3600.0   # per iperf3 test
MAX_STREAMS = 128          # iperf3 -P's own limit
MAX_REPEAT = 100


def _check_calibrate(seconds: float, streams: int) -> None:
    """calibrate's --seconds and --streams; ScenarioError before any work."""
    if not 2 <= seconds <= MAX_CALIBRATE_S:   # nan and inf too
        raise ScenarioError("--seconds", f"{seconds:g} is not a test length",
                            f"use 2 to {MAX_CALIBRATE_S:g} (goodput is the steady state from "
                            f"2 s on)")
    if not 1 <= streams <= MAX_STREAMS:
        raise ScenarioError("--streams", f"{streams} is not a flow count",
                            f"use 1 to {MAX_STREAMS} (iperf3's -P limit)")


def _systems(text: str | None) -> list[str] | None:
    """--systems as a list (None: the scenario's); ScenarioError if it names none."""
    if text is None:
        return None
    names = [x.strip() for x in text.split(",")]
    if not all(names):
        raise ScenarioError("--systems", f"{text!r} has an empty name",
                            "give a comma-separated list such as baseline,atlas (or leave "
                            "--systems out for the scenario's)")
    return names


def _check_out_dir(out: str) -> None:
    """--out must be a folder, or a path to create one at, that we can write; ScenarioError
    before any work."""
    path = Path(out)
    if path.is_symlink() and not path.exists():
        raise ScenarioError("--out", f"{out!r} is a link to nothing ({os.readlink(path)!r})",
                            "give a folder (it is created if missing)")
    if path.exists() and not path.is_dir():
        raise ScenarioError("--out", f"{out!r} exists and is not a folder",
                            "give a folder (it is created if missing)")
    where = path.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise ScenarioError("--out", f"{str(where)!r} cannot be written here"
                            + (" (a read-only filesystem)" if _read_only(where) else ""),
                            "give a folder you can write")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
