"""Where a server of ours may listen: the one rule the Order API (``order-api``) and the Dagster UI
(``dev``) both apply before serving without a login on an address others can reach."""

import ipaddress


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    host = host.strip().strip("[]")
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything: not loopback
