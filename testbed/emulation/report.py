"""What a job prints and records about the network it ran on: one job, shared by every job.

`network_record` is the network's part of env.json and of the results (backend, routing,
scaling, congestion control, real-time status, the kernel modules the run loaded); `announce`
writes env.json and prints the "network up" line (testbed.emulation.results.record_modules
completes it at teardown); `wan_summary` and `steal_note` are the per-run WAN lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from testbed.emulation import wanstats
from testbed.emulation.registry import live_runs
from testbed.emulation.results import provenance, write_json

if TYPE_CHECKING:
    from testbed.emulation.network import Network


def network_record(net: "Network") -> dict:
    """How the emulated network was run: what shapes every figure of the run beside it."""
    scenario = net.scenario
    return {"backend": net.backend, "routing": scenario.routing, "scale": scenario.scale,
            "time_scale": scenario.time_scale, "congestion_control": dict(net.congestion_control),
            "delay_line_realtime": dict(net.realtime_status), "cpu_idle": net.cpu_idle,
            "kernel_modules_loaded": net.kernel_modules_loaded,
            **({"cluster": c} if (c := net.cluster_record()) is not None else {})}


def announce(net: "Network", run_dir: Path, indent: str = "") -> dict:
    """Once the network is up: env.json in run_dir (machine, versions, the network's record and
    the other runs going on, whose load skews this one's timings), and one progress line.
    Returns the record."""
    record = network_record(net)
    write_json(run_dir / "env.json", dict(provenance(), network=record, other_runs=live_runs()))
    ts = net.scenario.dilation
    print(f"{indent}network up in {net.timings_s['up']:.2f} s (backend {net.backend}, "
          f"{len(net.scenario.host_names())} hosts, {len(net.scenario.wan)} WAN "
          f"link{'' if len(net.scenario.wan) == 1 else 's'}, "
          f"{net.scenario.congestion_control}, {net.scenario.routing} routing"
          + (f", time_scale {ts}" if ts.dilated else "")
          + ")", flush=True)
    for pair, u in record.get("cluster", {}).get("underlay", {}).items():
        print(f"{indent}underlay {pair}: RTT {u['rtt_ms']:.3f} ms (min {u['min_ms']:.3f}, max "
              f"{u['max_ms']:.3f}), jitter {u['mdev_ms']:.3f} ms, taken off each crossing "
              f"link's delay; hosts' MTU {record['cluster']['host_mtu']}", flush=True)
    return record


def steal_note(warnings: list[str], cpu: dict[str, float], indent: str,
               say: Callable[[str], None] | None = None) -> None:
    """Beside late-release warnings, the CPU share this VM's host took (their usual cause)."""
    if warnings and cpu["steal_pct"] > 0:
        (say or (lambda line: print(line, flush=True)))(
            f"{indent}note: this VM's host took {cpu['steal_pct']:g}% of the CPU time (steal) "
            "meanwhile; its stalls delay every process in the guest, the real-time delay "
            "lines included")


def wan_summary(stats: dict[str, dict], cpu: dict[str, float]) -> str:
    """One line: what crossed the WAN, how late the delay lines released it, and how much CPU
    the machine's host took meanwhile (steal: a VM's stalls, which cause late releases)."""
    if not stats:
        return "wan: no delay-line counts (netem backend)"
    packets = sum(s["packets"] for s in stats.values())
    dropped = sum(sum(wanstats.dropped(s)) for s in stats.values())
    worst = max(stats.items(), key=lambda kv: kv[1]["lateness_ms"]["max"])
    return (f"wan: {packets} packets over {len(stats)} directions, {dropped} dropped; "
            f"release lateness max {worst[1]['lateness_ms']['max']:.3f} ms ({worst[0]}), "
            f"p99 up to {max(s['lateness_ms']['p99'] for s in stats.values()):.3f} ms; "
            f"CPU busy {cpu['busy_pct']:g}%, stolen by the host {cpu['steal_pct']:g}%")
