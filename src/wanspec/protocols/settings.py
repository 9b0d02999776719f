"""Per-request generation settings, shared by every method and sent in StartRequest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from wanspec.sampling import SamplingParams

MAX_GAMMA = 64


@dataclass(frozen=True)
class GenerationSettings:
    """Everything a request needs; validated on construction so bad settings fail early."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    gamma: int = 4
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    srdv_k: int = 4  # X-CoSD-E: candidates per round
    srdv_m: int = 2  # X-CoSD-E: candidate rounds before the HR fallback
    hr_piggyback: bool = True  # X-CoSD: pre-drawn O-sample rides on the reply
    tr_k: int = 8  # TR: top-k of q that travels
    uhlm_samples: int = 20
    uhlm_eta_max: float = 2.0
    uhlm_threshold: float = 0.5
    split_layers: int = 2  # split inference: layers on the edge

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        self.sampling  # noqa: B018 - validates temperature / top-k / top-p
        checks = {
            "max_new_tokens": self.max_new_tokens >= 1,
            "gamma": 1 <= self.gamma <= MAX_GAMMA,
            "srdv_k": self.srdv_k >= 1,
            "srdv_m": self.srdv_m >= 1,
            "tr_k": self.tr_k >= 1,
            "uhlm_samples": self.uhlm_samples >= 1,
            "uhlm_eta_max": self.uhlm_eta_max > 0,
            "split_layers": self.split_layers >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid setting {name}={getattr(self, name)!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        return cls(**data)
