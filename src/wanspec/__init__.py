"""wanspec: exactly lossless edge-cloud speculative decoding over a WAN."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wanspec")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = ["__version__"]
