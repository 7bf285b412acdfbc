"""A TCP socket's congestion control: choose it, read it back (TCP_CONGESTION).

One job, for every socket the testbed opens (trainer transport, traffic.burst, the kernel probe
in testbed.emulation.network). Root may pick any congestion control the kernel has (setting one also
loads its module); others only those in net.ipv4.tcp_allowed_congestion_control. A route's
`congctl` replaces a socket's choice when it connects, so a connecting socket sets it again
once connected.
"""

from __future__ import annotations

import socket


def set_congestion_control(sock: socket.socket, name: str | None) -> None:
    """TCP_CONGESTION on one socket (None: leave the host's). OSError names the choice."""
    if name:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        except OSError as exc:
            raise OSError(exc.errno, f"cannot use TCP congestion control {name!r}: "
                                     f"{exc.strerror}") from None


def congestion_control_of(sock: socket.socket) -> str:
    """The congestion control the kernel runs on this socket."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()
