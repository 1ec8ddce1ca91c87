"""What a value must look like, whatever variable holds it: a whole number, an IPv4 address of a host, an
absolute path the services and Ray's command line can take."""

from __future__ import annotations

import ipaddress
import re
from typing import Any


def is_int(value: Any) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and value.strip().isdigit()


def whole(value: Any) -> bool:
    """A whole number that is not a boolean."""
    return is_int(value) and not isinstance(value, bool)


def ipv4_problem(value: Any) -> str | None:
    """Why `value` is not a usable node address, or None."""
    text = str(value).strip() if isinstance(value, str) else None
    if text is None:
        return "must be an IPv4 address written as a string, e.g. 10.0.0.5"
    if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", text):
        what = "a host name" if re.fullmatch(r"[A-Za-z0-9.-]+", text) and re.search(r"[A-Za-z]", text) else \
            "a network, not an address" if "/" in text else "not an IPv4 address"
        return f"must be an IPv4 address such as 10.0.0.5 ({what}: Ray's --node-ip-address takes an IP)"
    octets = [int(o) for o in text.split(".")]
    if any(o > 255 for o in octets):
        return "must be an IPv4 address: each of the four numbers is 0-255"
    if any(len(o) > 1 and o.startswith("0") for o in text.split(".")):
        return "must be an IPv4 address without leading zeros (they read as octal in some tools)"
    ip = ipaddress.ip_address(text)
    if ip.is_unspecified or text == "255.255.255.255" or ip.is_multicast:
        return "must be the address of this host (not 0.0.0.0, a broadcast or a multicast address)"
    return None


def path_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a path (a string)"
    if not value:
        return "is empty: expected an absolute path"
    if value.startswith("~"):
        return "starts with ~, which nothing expands here: write the absolute path (e.g. {{ ansible_env.HOME }}/...)"
    if not value.startswith("/"):
        return "must be an absolute path (it starts with /)"
    if re.search(r"\s", value):
        return "contains white space, which the service files and Ray's command line cannot take: use a path "\
               "without spaces"
    if any(part == ".." for part in value.split("/")):
        return "contains '..': write the path it means"
    if re.search(r"[\x00-\x1f\"'$`\\;|&<>*?]", value):
        return "contains a character a shell or a unit file treats specially: use letters, digits, / . _ - only"
    return None
