"""The sizes of every experiment: tiny (tests), quick (the default pair, bundled prompts),
moderate (quick's pair with fewer prompts, tokens and grid points: the committed docs/RESULTS.md,
under an hour on one CPU core), full (the shared prompt sets at the papers' scale).

Timing uses the papers' hardware through fixed compute profiles (X-CoSD: a 68M draft on a TITAN
RTX, an 8B target on an A100), never this machine's wall clock, so a cell's result depends only
on its settings and a resumed sweep agrees with an uninterrupted one. The models decide tokens,
acceptance and bits; the profiles price their compute.

Temperatures: the X-CoSD text at hand states none, so its speed and bits runs sample at T = 1
(plain speculative sampling, no top-k/top-p); quality adds greedy T = 0, where every lossless
method must reproduce the target's own text exactly. Uplink 10 Mbit/s, RTT 20 ms and the
downlink grid are wanspec's choice (the paper's exact link values are not in the text either).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from wanspec.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from wanspec.protocols.settings import GenerationSettings

TINY_PAIR = ("tiny-hetero-target", "tiny-hetero-draft")  # built on first use (wanspec.models.tiny)
TINY_SHARED_PAIR = ("tiny-shared-target", "tiny-shared-draft")  # the same, one shared tokenizer
REAL_SHARED = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # (target, draft): AceSpec's pair
REAL_HETERO = (DEFAULT_TARGET, DEFAULT_DRAFT)  # two vocabularies

# what each task needs to be scored (the full configuration's budget; smaller ones cap it)
TASK_TOKENS = {"translation": 64, "summary": 64, "math": 160, "mcq": 4, "code": 128}

PAPER_DATASETS = ("gsm8k", "humaneval", "wmt14_de-en", "xsum", "cnn_dailymail", "mmlu")
QUALITY_DATASETS = ("wmt14_de-en", "xsum", "cnn_dailymail", "gsm8k", "mmlu")
MINI_DATASETS = ("mini-math", "mini-code", "mini-translation", "mini-summary", "mini-mcq")
MINI_QUALITY = ("mini-translation", "mini-summary", "mini-math", "mini-mcq")

# X-CoSD's method options; each lives only in the cells of its method (see runner)
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "xcosd": ("hr_piggyback",),
    "xcosd-e": ("srdv_k", "srdv_m"),
    "xcosd-auto": ("hr_piggyback", "srdv_k", "srdv_m"),
    "acespec-x": ("srdv_k", "srdv_m"),
    "deepspec-x": ("srdv_k", "srdv_m"),
    "tr": ("tr_k",),
    "uhlm": ("uhlm_samples", "uhlm_eta_max", "uhlm_threshold"),
}
# their values unless a command line replaces them: `GenerationSettings`' own defaults
METHOD_OPTION_DEFAULTS: dict[str, Any] = {
    name: getattr(GenerationSettings, name) for names in METHOD_OPTIONS.values() for name in names
}


@dataclass(frozen=True)
class Config:
    """Everything a configuration fixes; command-line options replace single fields."""

    name: str
    target: str
    draft: str
    prompts: int  # per dataset (the first n in file order)
    max_new_tokens: int  # cap for speed/bits runs and for every task's budget
    datasets: tuple[str, ...]  # xcosd-bits
    rate_datasets: tuple[str, ...]  # xcosd-rate
    quality_datasets: tuple[str, ...]
    rates_bps: tuple[float, ...]  # xcosd-rate: downlink rates
    quality_temperatures: tuple[float, ...]
    threads: int | None = None
    tokens_given: int | None = None  # --max-new-tokens: AceSpec's setups take it too
    # how the models load (`wanspec.load_pair`: --dtype, --invariant, --device)
    dtype: str = "float32"
    invariant: bool | None = None
    device: str = "cpu"
    gamma: int = 2  # X-CoSD Table 5: N = γ = 2
    temperature: float = 1.0  # X-CoSD runs (speculative sampling at T = 1)
    seed: int = 0
    edge_profile: str = "edge-titanrtx-68m"
    cloud_profile: str = "cloud-a100-8b"
    uplink_bps: float = 10e6
    downlink_bps: float = 10e6
    rtt_s: float = 0.02
    options: dict[str, Any] = field(default_factory=lambda: dict(METHOD_OPTION_DEFAULTS))
    # analysis (synthetic pair)
    alphas: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 0.9)
    analysis_gammas: tuple[int, ...] = (2, 4, 6)
    analysis_seeds: int = 8
    analysis_tokens: int = 300

    def loading(self) -> dict[str, Any]:
        """`wanspec.load_pair`'s dtype, invariant and device keywords for this configuration."""
        import torch

        return {
            "dtype": getattr(torch, self.dtype),
            "invariant": self.invariant,
            "device": self.device,
        }

    def loading_changes(self) -> dict[str, Any]:
        """The loading options that differ from the defaults. They change a model's logits
        (another dtype, kernels or device rounds differently), so they enter every cell's
        settings, hence its hash; runs with the defaults keep the hashes they always had."""
        given = {"dtype": self.dtype, "invariant": self.invariant, "device": self.device}
        defaults = {"dtype": "float32", "invariant": None, "device": "cpu"}
        return {k: v for k, v in given.items() if v != defaults[k]}

    def task_tokens(self, task: str | None) -> int:
        return min(TASK_TOKENS.get(task or "", self.max_new_tokens), self.max_new_tokens)

    def with_overrides(
        self,
        *,
        datasets: tuple[str, ...] | None = None,
        prompts: int | None = None,
        max_new_tokens: int | None = None,
        **options: Any,
    ) -> Config:
        """`--datasets` replaces every experiment's list, `--max-new-tokens` every token budget
        (AceSpec's setups included); method options merge into `options`."""
        changes: dict[str, Any] = {}
        if datasets:
            changes.update(datasets=datasets, rate_datasets=datasets, quality_datasets=datasets)
        if prompts is not None:
            if prompts < 1:
                raise ValueError(f"--prompts must be >= 1, got {prompts}")
            changes["prompts"] = prompts
        if max_new_tokens is not None:
            if max_new_tokens < 1:
                raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
            changes.update(max_new_tokens=max_new_tokens, tokens_given=max_new_tokens)
        given = {k: v for k, v in options.items() if v is not None}
        unknown = set(given) - set(self.options)
        if unknown:
            raise ValueError(f"unknown method options {sorted(unknown)}")
        if given:
            changes["options"] = {**self.options, **given}
        return replace(self, **changes)


CONFIGS: dict[str, Config] = {
    "tiny": Config(
        name="tiny",
        target=TINY_PAIR[0],
        draft=TINY_PAIR[1],
        threads=1,
        prompts=2,
        max_new_tokens=6,
        datasets=("mini-translation",),
        rate_datasets=("mini-translation",),
        quality_datasets=("mini-translation", "mini-mcq"),
        rates_bps=(1e5, 1e7),
        quality_temperatures=(0.0,),
        alphas=(0.3, 0.8),
        analysis_gammas=(2,),
        analysis_seeds=2,
        analysis_tokens=60,
    ),
    "quick": Config(
        name="quick",
        target=DEFAULT_TARGET,
        draft=DEFAULT_DRAFT,
        prompts=2,
        max_new_tokens=32,
        datasets=MINI_DATASETS,
        rate_datasets=("mini-translation",),
        quality_datasets=MINI_QUALITY,
        rates_bps=(1e5, 1e6, 1e7, 1e8),
        quality_temperatures=(0.0, 1.0),
    ),
    # the committed docs/RESULTS.md: every experiment in under an hour on one CPU core
    "moderate": Config(
        name="moderate",
        target=DEFAULT_TARGET,
        draft=DEFAULT_DRAFT,
        prompts=1,
        max_new_tokens=16,
        datasets=MINI_DATASETS,
        rate_datasets=("mini-translation",),
        quality_datasets=MINI_QUALITY,
        rates_bps=(1e5, 1e6, 1e7),
        quality_temperatures=(0.0,),
        analysis_seeds=6,
    ),
    "full": Config(
        name="full",
        target="qwen2.5-coder-1.5b",
        draft=DEFAULT_DRAFT,
        prompts=100,
        max_new_tokens=160,
        datasets=PAPER_DATASETS,
        rate_datasets=("wmt14_de-en", "xsum", "cnn_dailymail", "gsm8k", "mmlu"),
        quality_datasets=QUALITY_DATASETS,
        rates_bps=(1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8),
        quality_temperatures=(0.0, 1.0),
        analysis_seeds=24,
        analysis_tokens=600,
    ),
}


def get_config(name: str) -> Config:
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[name]
