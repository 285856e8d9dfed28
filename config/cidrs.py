"""How open a list of CIDR blocks is: standard library only, since the policy pack (policy/, in a
virtualenv of its own with pulumi-policy alone) judges the plan with the same rule as the settings."""

from __future__ import annotations

import ipaddress

WIDEST_PUBLIC_CIDR = 8
"""The widest block a public endpoint may allow without ``allowPublicAccessFromAnywhere``: a /8 is
16.7 million addresses, one of the largest single allocations; anything wider is most of the internet."""


def too_open(cidrs: list[str]) -> str | None:
    """Why a list of CIDRs opens the endpoint to the internet, judged by the address space they
    cover and not by the literal ``0.0.0.0/0`` (``[0.0.0.0/1, 128.0.0.0/1]`` is all of it); None if not."""
    nets = []
    for c in cidrs:
        try:
            nets.append(ipaddress.IPv4Network(c, strict=False))
        except ValueError:
            continue
    covered = sum(n.num_addresses for n in ipaddress.collapse_addresses(nets))
    if covered >= 2**32:
        return "0.0.0.0/0 is all of IPv4" if "0.0.0.0/0" in cidrs else f"{', '.join(cidrs)} cover all of IPv4 (the same as 0.0.0.0/0)"
    wide = [str(n) for n in nets if n.prefixlen < WIDEST_PUBLIC_CIDR]
    if wide:
        return f"{', '.join(wide)} {'is' if len(wide) == 1 else 'are'} wider than /{WIDEST_PUBLIC_CIDR} (a large part of the internet)"
    return None
