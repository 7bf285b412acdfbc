"""A cluster file: the servers a scenario's DCs are spread over, and which DCs go where.

    servers:
      - {name: s1, address: 10.250.0.1, user: root, port: 22, key: id_ed25519,
         known_hosts: known_hosts}
      - {name: s2, address: 10.250.0.2, user: root}
    placement:            # optional; default: contiguous blocks of whole DCs in scenario order
      s1: [east, west]
      s2: [central]

It maps onto Mininet's cluster mode (mininet/examples/cluster.py): a server's name, address and
user are RemoteMixin's `server`, `serverIP` and `user` (`Server.mininet_params`); port, key and
known_hosts are ssh options added to its `sshbase` (`Server.ssh_options`). The default placement
is SwitchBinPlacer.bin applied to DCs instead of switches (evenly sized bins in order, the
remainder to the first servers), with every host of a DC on its DC's server, so that only WAN
links cross servers. Paths (key, known_hosts) are relative to the cluster file's folder. Every
bad file is one ScenarioError line naming the field and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.spec.errors import ScenarioError, shown, unknown_field
from testbed.spec.yamlfile import load_yaml

SERVER_NAME = re.compile(r"[a-z][a-z0-9]{0,14}")
SCOPE = re.compile(r"[A-Za-z0-9_.-]{1,15}")     # an IPv6 scope id: an interface name
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
MAX_SERVERS = 64
TOP_FIELDS = ("servers", "placement")
SERVER_FIELDS = ("name", "address", "user", "port", "key", "known_hosts")


@dataclass(frozen=True, kw_only=True, slots=True)
class Server:
    name: str
    address: str                    # an IP address or a host name ssh reaches
    user: str
    port: int = 22
    key: str | None = None          # absolute path of the ssh private key
    known_hosts: str | None = None  # absolute path of a known_hosts file holding the host key

    @property
    def mininet_params(self) -> dict[str, str]:
        """RemoteMixin's keyword arguments for a node on this server."""
        return {"server": self.name, "serverIP": self.address, "user": self.user}

    @property
    def ssh_options(self) -> list[str]:
        """ssh options beyond Mininet's sshbase for this server (port, key, known_hosts)."""
        opts = ["-p", str(self.port)]
        if self.key:
            opts += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}",
                     "-o", "StrictHostKeyChecking=yes"]
        return opts

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    servers: tuple[Server, ...]
    placement: dict[str, tuple[str, ...]] | None = None   # server -> DCs, as written; None: default
    path: str = ""

    def server(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where each DC runs, and the WAN links that cross servers."""
    dc_server: dict[str, str]                       # DC -> server, in scenario order
    crossing: tuple[tuple[str, str, str, str], ...]  # (dc a, dc b, server a, server b)
    default: bool

    def dcs_on(self, server: str) -> list[str]:
        return [dc for dc, s in self.dc_server.items() if s == server]

    def to_dict(self, cluster: Cluster) -> dict[str, Any]:
        return {"placement": "default (contiguous blocks of DCs)" if self.default else "given",
                "servers": [{"name": s.name, "address": s.address, "user": s.user,
                             "port": s.port, "dcs": self.dcs_on(s.name)}
                            for s in cluster.servers],
                "crossing_links": [{"link": f"{a}-{b}", "servers": [sa, sb]}
                                   for a, b, sa, sb in self.crossing]}

    def lines(self, cluster: Cluster) -> list[str]:
        how = "default: contiguous blocks of DCs" if self.default else "as given"
        out = [f"  servers ({len(cluster.servers)}, placement {how}):"]
        for s in cluster.servers:
            dcs = self.dcs_on(s.name)
            out.append(f"    {s.name} ({s.destination}:{s.port}): "
                       f"{', '.join(dcs) if dcs else '(no DCs)'}")
        if self.crossing:
            out.append(f"  WAN links crossing servers ({len(self.crossing)}):")
            out += [f"    {a}-{b}: {sa} <-> {sb}" for a, b, sa, sb in self.crossing]
        else:
            out.append("  WAN links crossing servers: none (every DC on one server)")
        return out


def load_cluster(path: str | Path) -> Cluster:
    """Read and check a cluster file (module docstring); ScenarioError (one line) on any problem."""
    data = load_yaml(path, "give a cluster YAML file (docs/cluster.md)", field="cluster")
    return parse_cluster(data, base=Path(path).resolve().parent, path=str(path))


def parse_cluster(data: Any, base: Path, path: str = "") -> Cluster:
    if not isinstance(data, dict):
        raise ScenarioError("cluster", f"expected a mapping, got {type(data).__name__}",
                            "write servers: and optionally placement: (docs/cluster.md)")
    for key in data:
        if key not in TOP_FIELDS:
            raise unknown_field("cluster", key, TOP_FIELDS)
    raw = data.get("servers")
    if not isinstance(raw, list) or not raw:
        raise ScenarioError("cluster.servers", "missing or not a list of servers",
                            "list at least one server with name, address and user")
    if len(raw) > MAX_SERVERS:
        raise ScenarioError("cluster.servers", f"{len(raw)} servers", f"use at most {MAX_SERVERS}")
    servers = tuple(_server(item, f"cluster.servers[{i}]", base) for i, item in enumerate(raw))
    names = [s.name for s in servers]
    for name in names:
        if names.count(name) > 1:
            raise ScenarioError("cluster.servers", f"server name {name!r} appears twice",
                                "give each server its own name")
    addresses = [s.address.lower() for s in servers]
    for s in servers:
        if addresses.count(s.address.lower()) > 1:
            raise ScenarioError("cluster.servers", f"address {s.address!r} appears twice",
                                "give each server its own address (one server, one entry)")
    places = data.get("placement")
    placement = None
    if places is not None:
        if not isinstance(places, dict) or not places:
            raise ScenarioError("cluster.placement", "expected a mapping of server to DCs",
                                "write placement: {s1: [east], s2: [west]} or leave it out")
        placement = {}
        for server, dcs in places.items():
            if server not in names:
                raise unknown_field("cluster.placement", server, names, "no such server")
            where = f"cluster.placement.{server}"
            if isinstance(dcs, str):
                dcs = [dcs]
            if not isinstance(dcs, list) or not all(isinstance(d, str) for d in dcs):
                raise ScenarioError(where, f"{shown(dcs)} is not a list of DC names",
                                    "write a list such as [east, west]")
            placement[server] = tuple(dcs)
    return Cluster(servers=servers, placement=placement, path=path)


def _server(item: Any, where: str, base: Path) -> Server:
    if not isinstance(item, dict):
        raise ScenarioError(where, f"{shown(item)} is not a mapping",
                            "write {name: s1, address: 10.0.0.1, user: root}")
    for key in item:
        if key not in SERVER_FIELDS:
            raise unknown_field(where, key, SERVER_FIELDS)
    for key in ("name", "address", "user"):
        if key not in item:
            raise ScenarioError(f"{where}.{key}", "missing", f"give the server's {key}")
    name, address, user = item["name"], item["address"], item["user"]
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise ScenarioError(f"{where}.name", f"{shown(name)} is not a server name",
                            "use a lower-case letter then up to 14 letters or digits")
    where = f"cluster.servers.{name}"
    if not isinstance(address, str) or not _is_address(address):
        raise ScenarioError(f"{where}.address", f"{shown(address)} is not an address",
                            "give an IP address or a host name")
    if not isinstance(user, str) or not USER_NAME.fullmatch(user):
        raise ScenarioError(f"{where}.user", f"{shown(user)} is not a user name",
                            "give the ssh login name, such as root")
    port = item.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ScenarioError(f"{where}.port", f"{shown(port)} is not a port",
                            "give a TCP port from 1 to 65535 (default 22)")
    return Server(name=name, address=address, user=user, port=port,
                  key=_file(item.get("key"), f"{where}.key", base),
                  known_hosts=_file(item.get("known_hosts"), f"{where}.known_hosts", base))


def _is_address(text: str) -> bool:
    """An IP address (an IPv6 one's scope an interface name: it reaches a root shell on the
    servers) or a host name."""
    try:
        ipaddress.ip_address(text)
        _, _, scope = text.partition("%")
        return not scope or bool(SCOPE.fullmatch(scope))
    except ValueError:
        return bool(HOST_NAME.fullmatch(text)) and not text.replace(".", "").isdigit()


def _file(value: Any, where: str, base: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise ScenarioError(where, f"{shown(value)} is not a path", "give a file's path")
    if any(c.isspace() or c in "\"'" for c in value):
        raise ScenarioError(where, f"{shown(value)} holds a space or a quote (ssh splits its "
                            "options' values there)", "move the file to a path without them")
    path = (base / Path(value).expanduser()).resolve()
    if not path.is_file():
        raise ScenarioError(where, f"no file {str(path)!r}",
                            "give an existing file (relative paths are from the cluster file)")
    return str(path)


def default_placement(dcs: list[str], servers: list[str]) -> dict[str, str]:
    """DC -> server: evenly sized contiguous blocks in order, the remainder to the first
    servers (Mininet's SwitchBinPlacer.bin, with DCs for switches)."""
    quotient, remainder = divmod(len(dcs), len(servers))
    tickets = [s for i, s in enumerate(servers) for _ in range(quotient + (i < remainder))]
    return dict(zip(dcs, tickets))


def place(cluster: Cluster, dcs: list[str], wan: list[tuple[str, str]]) -> Placement:
    """The placement of a scenario's DCs (in scenario order) and WAN links (a, b) on the
    cluster's servers; ScenarioError naming the field if a given placement misses a DC, names
    one twice or names one the scenario lacks."""
    if cluster.placement is None:
        dc_server = default_placement(dcs, [s.name for s in cluster.servers])
    else:
        given: dict[str, str] = {}
        for server, names in cluster.placement.items():
            for dc in names:
                where = f"cluster.placement.{server}"
                if dc not in dcs:
                    raise unknown_field(where, dc, dcs, "no such DC in the scenario")
                if dc in given:
                    raise ScenarioError(where, f"DC {dc!r} is also placed on {given[dc]}",
                                        "place each DC on one server")
                given[dc] = server
        missing = [dc for dc in dcs if dc not in given]
        if missing:
            raise ScenarioError("cluster.placement", f"DC {missing[0]!r} is on no server"
                                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                                "place every DC of the scenario, or leave placement out")
        dc_server = {dc: given[dc] for dc in dcs}
    crossing = tuple((a, b, dc_server[a], dc_server[b]) for a, b in wan
                     if dc_server[a] != dc_server[b])
    return Placement(dc_server=dc_server, crossing=crossing, default=cluster.placement is None)


def scenario_placement(cluster: Cluster, scenario: Any) -> Placement:
    """place() for a Scenario (testbed.spec.scenario); ScenarioError for what a cluster does not
    build yet: faults (of every kind: the fault controller sets a link's figures on one machine,
    not less the underlay a crossing link carries)."""
    if scenario.faults:
        raise ScenarioError("faults", f"{len(scenario.faults)} faults: faults across servers "
                            "are not built yet", "drop --cluster or the scenario's faults")
    return place(cluster, [dc.name for dc in scenario.dcs], [(w.a, w.b) for w in scenario.wan])
