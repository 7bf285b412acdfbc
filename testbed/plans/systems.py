"""How many TCP connections each cross-DC transfer of a system gets, and the paths it uses.

One job: the computations over testbed.spec.systems' table (the systems as data) that the planner
(testbed.plans.placement, testbed.features.temporal.plan) and the runner share. Pure: no kernel, no
Mininet, no torch.

K connections (the scenario's `connections`, default auto): a transfer between DCs X and Y over
one TCP flow is window-limited at window / RTT, so K flows striped over the message move K times
that, up to the path's bottleneck rate. `auto` picks the smallest K that fills the path:

    K = ceil(rate x RTT / window), clamped to 1..16

rate = the lowest configured rate_mbit over the path's links, RTT = the path's one-way delay
there plus back (testbed.plans.routing.dc_paths), window = the receive window the testbed's hosts
advertise per connection = scaled_tcp_rmem_max_bytes(scale) x RCV_WINDOW_FRACTION. Configured,
not time_scale-dilated, values are used: time dilation divides rate and multiplies RTT by the
same T, so rate x RTT (and K) is unchanged.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from testbed.plans.routing import Path, path_table
from testbed.spec.links import LinkDir
from testbed.spec.systems import System
from testbed.spec.scenario import (MAX_CONNECTIONS, NCCL_SOCKETS_PER_PEER, RCV_WINDOW_FRACTION,
                                 max_connections, scaled_tcp_rmem_max_bytes, training_tp)

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario

def window_bytes(scale: float) -> float:
    """The receive window one connection of the testbed's hosts advertises (bytes)."""
    return scaled_tcp_rmem_max_bytes(scale) * RCV_WINDOW_FRACTION


def auto_connections(link_rate_mbit: float, rtt_ms: float, window_bytes: float,
                     cap: int = MAX_CONNECTIONS) -> int:
    """K = ceil(rate x RTT / window), clamped to 1..cap: the fewest window-limited connections
    that together fill a path of this bottleneck rate and round-trip time."""
    if window_bytes <= 0:
        raise ValueError(f"window_bytes must be > 0, got {window_bytes}")
    bdp_bytes = link_rate_mbit * 1e6 / 8 * rtt_ms / 1e3
    # round off float noise before ceil (e.g. exactly 2 windows must give 2, not 3)
    k = math.ceil(round(bdp_bytes / window_bytes, 9))
    return max(1, min(cap, k))


def path_between(scenario: "Scenario", src_dc: str, dst_dc: str) -> Path:
    """The routed path src_dc -> dst_dc (KeyError for an unknown or equal pair)."""
    return path_table(scenario)[(src_dc, dst_dc)]


def path_rtt_ms(scenario: "Scenario", src_dc: str, dst_dc: str) -> float:
    """One-way delay of the path there plus that of the path back (configured values)."""
    return (path_between(scenario, src_dc, dst_dc).delay_ms
            + path_between(scenario, dst_dc, src_dc).delay_ms)


def path_rate_mbit(scenario: "Scenario", src_dc: str, dst_dc: str) -> float:
    """The bottleneck: the lowest configured rate over the path's links."""
    dcs = path_between(scenario, src_dc, dst_dc).dcs
    rate = {frozenset(link.between): link.rate_mbit for link in scenario.wan}
    return min(rate[frozenset(hop)] for hop in zip(dcs, dcs[1:]))


def host_path_rate_mbit(scenario: "Scenario", src_dc: str, dst_dc: str) -> float | None:
    """The lowest rate (Mbit/s, as given in `scenario`: pass `scenario.emulated()` for what the
    network shapes) from a host in src_dc to one in dst_dc: both host links and, between two
    DCs, path_rate_mbit. None when nothing on the way is shaped (one DC's unshaped veths)."""
    dcs = {d.name: d for d in scenario.dcs}
    rates = [dcs[dc].rate_mbit for dc in {src_dc, dst_dc} if dcs[dc].rate_mbit is not None]
    if src_dc != dst_dc:
        rates.append(path_rate_mbit(scenario, src_dc, dst_dc))
    return min(rates) if rates else None


def arrival_bounds_hold(scenario: "Scenario") -> str | None:
    """Why a message's bytes could come faster than the configured rates allow, so that
    BubbleTea's arrival bound would not be a bound (None: they cannot): jitter on a WAN link (a
    message's packets squeezed together), or faults that change a link's delay or rate."""
    jittery = [f"{w.a}-{w.b}" for w in scenario.wan if w.jitter_ms > 0]
    if jittery:
        return f"jitter on {', '.join(jittery)}"
    changed = sorted({f.kind for f in scenario.faults if f.kind in ("delay", "rate")})
    return f"{' and '.join(changed)} faults" if changed else None


def scenario_connections(scenario: "Scenario", src_dc: str, dst_dc: str) -> int:
    """The scenario's K for transfers src_dc -> dst_dc: its `connections`, or the auto rule."""
    if src_dc == dst_dc:
        return 1
    if scenario.connections != "auto":
        return int(scenario.connections)
    return auto_connections(path_rate_mbit(scenario, src_dc, dst_dc),
                            path_rtt_ms(scenario, src_dc, dst_dc), window_bytes(scenario.scale),
                            connection_cap(scenario))


def connection_cap(scenario: "Scenario") -> int:
    """The most connections a transfer of the scenario may use (testbed.spec.scenario's
    max_connections: the emulator's threads, or NCCL's sockets per GPU pair)."""
    return max_connections(scenario.predict_only, training_tp(scenario.training))


def capped_connections(scenario: "Scenario") -> list[str]:
    """A line where `connections: auto` would open more connections than the cap allows on some
    DC pairs (the windows that would fill their paths), saying the cap and why; [] if none."""
    if scenario.connections != "auto":
        return []
    cap = connection_cap(scenario)
    out: list[tuple[int, str]] = []
    names = [dc.name for dc in scenario.dcs]
    for src in names:
        for dst in names:
            if src == dst:
                continue
            want = auto_connections(path_rate_mbit(scenario, src, dst),
                                    path_rtt_ms(scenario, src, dst),
                                    window_bytes(scenario.scale), cap=10**9)
            if want > cap:
                out.append((want, str(LinkDir(src, dst))))
    if not out:
        return []
    why = ("NCCL's socket transport: NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS <= "
           f"{NCCL_SOCKETS_PER_PEER} per GPU pair"
           + (f", x tp {training_tp(scenario.training)}" if cap > NCCL_SOCKETS_PER_PEER else "")
           if scenario.predict_only else "the emulator's sender threads")
    top = max(out)
    return [f"connections auto capped at {cap} ({why}): {len(out)} DC pairs would need more "
            f"windows to fill their paths, up to {top[0]:,} ({top[1]})"]


def connections_for(scenario: "Scenario", system: System, src_dc: str, dst_dc: str) -> int:
    """TCP connections one transfer src_dc -> dst_dc uses under `system`: 1 inside a DC and for
    systems with connections "one"; else the scenario's K (scenario_connections)."""
    if src_dc == dst_dc or system.connections == "one":
        return 1
    return scenario_connections(scenario, src_dc, dst_dc)
