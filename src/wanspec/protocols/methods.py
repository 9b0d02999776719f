"""Every method by name, as plain data: what it is, whether it is lossless, which scheme and
which machines (family) run it. `registry` builds the machines from it."""

from __future__ import annotations

from dataclasses import dataclass

from wanspec.protocols import schemes as spec
from wanspec.protocols.base import shown


@dataclass(frozen=True)
class MethodInfo:
    name: str
    lossless: bool
    description: str
    scheme: type[spec.Scheme] | None  # None: not a draft/verify method
    shared_vocab_only: bool = False
    aliases: tuple[str, ...] = ()
    source: str = ""
    family: str = "speculative"  # speculative | pipeline | ar | split: which machines run it
    sends_ahead: bool = False  # a pipeline that sends the next chain before the verdict
    sends_forks: bool = False  # … and its trees' branches, which the cloud takes on a rejection
    drafts_tree: bool = True  # a pipeline that drafts alternatives while a chain is verified
    # the driver's clock steers what the machines draw (each round's law stays exact), so a
    # seed's tokens, messages and bits depend on the link's and the compute's timing
    tokens_follow_timing: bool = False

    @property
    def needs_draft(self) -> bool:
        """Whether the edge drafts (so the cloud needs the draft/target alignment)."""
        return self.family in ("speculative", "pipeline")


METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in [
        MethodInfo(
            "ar",
            True,
            "cloud-only autoregressive; tokens streamed down",
            None,
            source="baseline",
            family="ar",
        ),
        MethodInfo(
            "split",
            False,
            "split inference at the embedding layer: float16 activations up per token, tokens "
            "down (exact up to float16 activations)",
            None,
            source="AceSpec baseline",
            family="split",
        ),
        MethodInfo(
            "sd",
            True,
            "vanilla stop-and-wait SD; cloud verifies and resamples (asks the "
            "edge for p_j at a rejection)",
            spec.AskForDraftDist,
            True,
            source="baseline",
        ),
        MethodInfo(
            "cosd",
            True,
            "CoSD: edge resamples; full q_j downlink at a rejection",
            spec.ResidualDownlink,
            True,
            ("dssd",),
            "X-CoSD baseline / DSSD",
        ),
        MethodInfo(
            "naive",
            True,
            "TLI drafting + full q_j over V_L downlink; O tokens by id",
            spec.ResidualDownlink,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "ul",
            True,
            "uplink every draft distribution; cloud resamples",
            spec.UplinkDists,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "xcosd",
            True,
            "X-CoSD hybrid resampling (q on C + θ_o; O-sample as a piece)",
            spec.Hybrid,
            source="X-CoSD",
        ),
        MethodInfo(
            "xcosd-e",
            True,
            "X-CoSD-E: SR-DV, K candidates × M rounds; then the edge uploads p̃ of that position "
            "and the cloud draws the residual of its float q",
            spec.ServerResampleDeviceVerify,
            aliases=("srdv",),
            source="X-CoSD",
        ),
        MethodInfo(
            "xcosd-auto",
            True,
            "X-CoSD choosing per round between HR (as xcosd) and SR-DV (as xcosd-e) from the "
            "measured link: the edge times its rejected rounds and keeps the cheaper mechanism; "
            "its tokens for a seed follow that timing",
            spec.AdaptiveResampling,
            source="X-CoSD",
            tokens_follow_timing=True,
        ),
        MethodInfo(
            "gr",
            False,
            "greedy replacement by the cloud's argmax at a rejection",
            spec.GreedyReplacement,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "tr",
            False,
            "top-k truncated q_j downlink, residual over the truncation",
            spec.TruncatedResidual,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "uhlm",
            False,
            "U-HLM: confident draft tokens skip verification (E, η_max, "
            "u_th); uncertain ones upload p",
            spec.UncertaintySkip,
            source="X-CoSD baseline",
        ),
        MethodInfo(
            "picospec",
            True,
            "asynchronous single chain: drafts the continuation while the chain is verified; "
            "flushes and redrafts on a rejection",
            spec.ResidualDownlink,
            True,
            source="AceSpec baseline (PicoSpec)",
            family="pipeline",
            drafts_tree=False,
        ),
        MethodInfo(
            "acespec",
            True,
            "asynchronous tree cache: top-F_k alternatives per depth drafted while the chain is "
            "verified; a rejection becomes a cache lookup (network-aware budget, geometric shape)",
            spec.ResidualDownlink,
            True,
            source="AceSpec",
            family="pipeline",
        ),
        MethodInfo(
            "deepspec",
            True,
            "AceSpec with two chains in flight: the drafted continuation goes to the cloud before "
            "the verdict, so a chain accepted whole is followed at once; a rejection makes it "
            "stale and falls back on the tree cache",
            spec.ResidualDownlink,
            True,
            source="wanspec (in neither paper)",
            family="pipeline",
            sends_ahead=True,
        ),
        MethodInfo(
            "deepspec-tree",
            True,
            "DeepSpec whose cloud also resolves a rejection itself (UL: p̃ travels with the "
            "chain) and goes straight on to the matching branch of the tree, which the edge "
            "sent as a fork once drafted: a rejection costs no round trip when its branch is in "
            "the tree; a chain goes without its p̃ where its forks would not pay for "
            "it (`chain_dists`); on a heterogeneous pair it drafts by TLI, as `ul` does",
            spec.ResidualOrUplink,
            False,
            source="wanspec (in neither paper)",
            family="pipeline",
            sends_ahead=True,
            sends_forks=True,
            tokens_follow_timing=True,  # who draws a residual follows the link (the p̃ per chain)
        ),
        MethodInfo(
            "acespec-x",
            True,
            "AceSpec's pipeline on a heterogeneous pair: TLI drafting, the rejected position "
            "resolved by SR-DV (after M rounds, the residual drawn on the cloud from the uploaded "
            "p̃), so the lookup needs no extra round trip",
            spec.ServerResampleDeviceVerify,
            source="wanspec (in neither paper)",
            family="pipeline",
        ),
        MethodInfo(
            "deepspec-x",
            True,
            "AceSpec-X with two chains in flight: the drafted continuation goes to the cloud "
            "before the verdict, marked as sent ahead, so a chain accepted whole is followed at "
            "once; a rejection (or SR-DV's fallback on the cloud) makes it stale and falls back "
            "on the tree cache",
            spec.ServerResampleDeviceVerify,
            source="wanspec (in neither paper)",
            family="pipeline",
            sends_ahead=True,
        ),
    ]
}

_ALIASES = {alias: m.name for m in METHODS.values() for alias in m.aliases}


def get_method(name: str) -> MethodInfo:
    key = _ALIASES.get(name, name)
    if key not in METHODS:
        known = ", ".join(sorted([*METHODS, *_ALIASES]))
        raise ValueError(f"unknown method {shown(name)}; known methods: {known}")
    return METHODS[key]
