"""A simulator `Link` as the WAN proxy's two directions, so a proxy and the simulator see one WAN.

The proxy's timing model is `wanspec.link` (`DirectionSpec`, `Shaper`), the very model the
simulator's channels use; it is stated once, in that module's docstring.
"""

from __future__ import annotations

from typing import Any

from wanspec.link import DirectionSpec


def link_specs(link: Any) -> tuple[DirectionSpec, DirectionSpec]:
    """(up, down) specs of a simulator `Link` (anything with its `spec(direction)`)."""
    return link.spec("up"), link.spec("down")
