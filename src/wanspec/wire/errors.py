"""The single error type of the codec."""


class WireError(ValueError):
    """A message cannot be encoded, or a frame is malformed, truncated or over a limit."""


class FrameTooLarge(WireError):
    """A frame announces more bytes than `Limits.max_frame` allows (refused at its header)."""
