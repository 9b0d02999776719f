"""wanspec: exactly lossless edge-cloud speculative decoding over a WAN.

pair = wanspec.load_pair(target="qwen2.5-coder-0.5b", draft="smollm2-135m")
res = wanspec.generate(pair, "def f(x):", method="xcosd-e",
                       link=wanspec.Link(bandwidth_bps=1e6, rtt_s=0.1))
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("wanspec")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

_LAZY = {
    "load_pair": "wanspec.api",
    "generate": "wanspec.api",
    "Pair": "wanspec.api",
    "GenerationResult": "wanspec.api",
    "Link": "wanspec.sim.link",
    "GenerationSettings": "wanspec.protocols.settings",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import the heavy parts (torch, transformers) only when they are used."""
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'wanspec' has no attribute {name!r}")
