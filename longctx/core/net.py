"""Addresses: whether a host is this machine's loopback (a server listening there is reachable only from here)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; any other address (0.0.0.0 and :: included) reaches beyond this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_words(host: str, machine: str = "this machine") -> str:
    """A listening address as the terminal and the report say it: 0.0.0.0 and :: are every address of the machine."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = False
    return f"{host} (every address of {machine})" if unspecified else host
