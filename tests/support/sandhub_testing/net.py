"""Loopback ports."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, then released). A port
    may be taken again before the program binds it: starters retry on "in use"."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Something accepts connections on the port."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
