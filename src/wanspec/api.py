"""The Python API: load a model pair once, then generate with any method over a simulated WAN."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from wanspec.jobs import ComputeCost, Executor
from wanspec.models.jobs import session_executor
from wanspec.models.lm import resolve_device
from wanspec.models.registry import prompt_encoder
from wanspec.models.replay import JobReplay, replaying_executor
from wanspec.protocols.endpoints import CloudEndpoint, EdgeMachine, TargetInfo
from wanspec.protocols.registry import build_machines, edge_model_for, get_method, target_info
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import (
    Link,
    MeasuredProfile,
    Profile,
    SimResult,
    load_profile,
    simulate,
)
from wanspec.vocab import VocabAlignment


@dataclass
class Pair:
    """A target and a draft model with their tokenizers and vocabulary alignment, loaded once."""

    target: Any
    draft: Any
    alignment: VocabAlignment
    target_name: str = ""
    draft_name: str = ""

    @property
    def shared_vocab(self) -> bool:
        return self.alignment.is_identity

    def target_encode(self, text: str) -> list[int]:
        return prompt_encoder(self.target.tokenizer)(text)

    def draft_encode(self, text: str) -> list[int]:
        return prompt_encoder(self.draft.tokenizer)(text)

    def decode(self, ids: list[int]) -> str:
        return self.target.tokenizer.decode(ids, skip_special_tokens=True)

    @functools.cached_property
    def cloud_info(self) -> TargetInfo:
        """What a cloud serving this pair's target knows (it can verify this pair's drafts)."""
        return target_info(self.target, self.target_encode, (self.alignment,))

    def machines(
        self,
        method: str,
        prompt: str,
        settings: GenerationSettings,
        tree_seconds: Callable[[int], float] | None = None,
    ) -> tuple[EdgeMachine, CloudEndpoint]:
        """Both machines of one request on this pair, in this process (`generate`, benchmarks).
        Their jobs run on `edge_model(method)` and on the target."""
        return build_machines(
            method,
            draft_lm=self.draft,
            target_lm=self.target,
            alignment=self.alignment,
            draft_encode=self.draft_encode,
            target_encode=self.target_encode,
            target_decode=self.decode,
            prompt=prompt,
            settings=settings,
            tree_seconds=tree_seconds,
        )

    def edge_model(self, method: str) -> Any:
        """The model the edge's jobs run on for `method` (split: the target's layers)."""
        return edge_model_for(method, draft=self.draft, target=self.target)


def _load_lm(
    name_or_model: Any,
    dtype: torch.dtype,
    threads: int | None,
    invariant: bool | None = None,
    device: str | torch.device | None = "cpu",
) -> tuple[Any, str]:
    if hasattr(name_or_model, "extend"):
        if invariant:
            raise ValueError("invariant=True applies when loading: pass names or folders")
        _check_loaded_device(name_or_model, device)
        return name_or_model, getattr(name_or_model, "name", "model")
    from wanspec.models.lm import load_model
    from wanspec.models.registry import resolve_model

    folder = resolve_model(str(name_or_model))
    lm = load_model(folder, dtype=dtype, threads=threads, invariant=invariant, device=device)
    return lm, str(name_or_model)


def _check_loaded_device(lm: Any, device: str | torch.device | None) -> None:
    """A model passed in already loaded stays where it is: a `device` other than its own is an
    error, not a silent no-op (cpu, the default, is taken as "not asked" for such a model)."""
    wanted = resolve_device(device)
    have = getattr(lm, "device", torch.device("cpu"))
    if wanted.type != "cpu" and wanted != have:
        raise ValueError(
            f"device={str(device)!r} applies when loading: {getattr(lm, 'name', 'the model')} is "
            f"already loaded on {have}; pass a name or folder, or load it with that device"
        )


def load_pair(
    target: str | Path | Any,
    draft: str | Path | Any,
    *,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    invariant: bool | None = None,
    device: str | torch.device | None = "cpu",
) -> Pair:
    """Load (pulling registry models on first use) and align a target/draft pair.

    `target` and `draft` are registry names (`wanspec models list`), local Hugging Face folders,
    or already loaded `LanguageModel`s. `invariant`: both models in pass-shape-invariant mode
    (`wanspec.models.invariant`), so a sampled run's tokens do not depend on how passes are cut:
    the asynchronous pipelines then give the same tokens whatever the link or the timing. None
    (default): on for a 16-bit `dtype`, which refuses False (`models.lm.resolve_invariant`).
    `device`: where both models compute ("cpu", "cuda", "cuda:N", "mps"); one not present here
    is a ValueError before anything loads (`models.lm.resolve_device`).
    """
    resolve_device(device)  # both models' device, checked before either loads
    target_lm, target_name = _load_lm(target, dtype, threads, invariant, device)
    draft_lm, draft_name = _load_lm(draft, dtype, threads, invariant, device)
    if draft_lm.tokenizer is None or target_lm.tokenizer is None:
        raise ValueError("both models need a tokenizer")
    alignment = VocabAlignment.build(
        draft_lm.tokenizer,
        target_lm.tokenizer,
        draft_width=draft_lm.vocab_size,
        target_width=target_lm.vocab_size,
    )
    return Pair(target_lm, draft_lm, alignment, target_name, draft_name)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: dict[str, Any] = field(default_factory=dict)
    sim: SimResult | None = None


def _stats(method: str, sim: SimResult, edge: Any, cloud: Any) -> dict[str, Any]:
    n = len(sim.tokens)
    per_round = list(getattr(edge, "accepted_per_round", []))
    rounds = len(per_round)
    up, down = sim.bits["up"], sim.bits["down"]
    gaps = sim.inter_token_s
    decode_tokens, decode_time_s = sim.decode_span
    stats: dict[str, Any] = {
        "method": method,
        "new_tokens": n,
        "finish_reason": sim.finish_reason,
        "time_s": sim.duration_s,
        "tokens_per_s": sim.tokens_per_s,
        "ttft_s": sim.ttft_s,
        "decode_tokens": decode_tokens,
        "decode_time_s": decode_time_s,
        "per_token_latency_s": (sim.duration_s / n) if n else None,
        "mean_inter_token_s": (sum(gaps) / len(gaps)) if gaps else None,
        "rounds": rounds,
        "accepted_per_round": per_round,
        "mean_accepted": (sum(per_round) / rounds) if rounds else None,
        "uplink_bits": up,
        "downlink_bits": down,
        "uplink_bits_per_token": up / n if n else None,
        "downlink_bits_per_token": down / n if n else None,
        "uplink_messages": sim.messages["up"],
        "downlink_messages": sim.messages["down"],
        "bits_by_type": dict(sim.bits_by_type),
        "compute_busy_s": dict(sim.compute_busy_s),
        "retransmissions": dict(sim.retransmissions),
    }
    if sim.protocol_cpu_s is not None:  # the run charged the machines' own CPU
        stats["protocol_cpu_s"] = dict(sim.protocol_cpu_s)
        stats["codec_cpu_s"] = dict(sim.codec_cpu_s or {})
    gamma = getattr(getattr(edge, "settings", None), "gamma", None)
    if rounds and gamma:
        drafted = rounds * gamma
        stats["acceptance_rate"] = sum(per_round) / drafted
    counters = {**getattr(cloud, "counters", {}), **getattr(edge, "counters", {})}
    stats.update(counters)
    stats.setdefault("tv_bound", 0.0)  # AR and split sample the float q: no q is rounded
    stats.update(_pipeline_stats(edge, sim))
    return stats


def _pipeline_stats(edge: Any, sim: SimResult) -> dict[str, Any]:
    """Tree-cache figures of the asynchronous methods: hit rate, budget and shape per round,
    and how long the edge sat idle (neither drafting nor holding a verdict to act on)."""
    if not hasattr(edge, "cache_hit_rate"):
        return {}
    rounds = edge.rounds_log
    return {
        "cache_hit_rate": edge.cache_hit_rate,
        "tree_nodes_per_round": edge.counters.get("tree_nodes", 0) / max(len(rounds), 1),
        "budget_per_round": [sum(r["fanout"]) + 1 for r in rounds],
        "fanout_per_round": [r["fanout"] for r in rounds],
        "edge_idle_s": sim.duration_s - sim.compute_busy_s["edge"],
    }


SAMPLING_SETTINGS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def _model_sampling(pair: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """`settings`, or, when they name no sampling setting at all, the target's own sampling:
    what `model.generate(ids)` does with its `generation_config` (greedy unless it samples)."""
    if any(name in settings for name in SAMPLING_SETTINGS):
        return settings
    model = getattr(getattr(pair, "target", None), "model", None)
    config = getattr(model, "generation_config", None)
    if config is None:
        return settings
    from wanspec.models.generation import sampling_defaults

    return {**sampling_defaults(config), **settings}


def _tree_seconds(profile: str | Profile) -> Any:
    """T_tree(B) of the edge profile for AceSpec's budget, or None where the profile prices
    only what it measures (then the edge prices a pass by the passes it times, `PassCost`)."""
    loaded = load_profile(profile)
    try:
        loaded.seconds(ComputeCost("tree", n=1))
    except (TypeError, ValueError):
        return None
    return lambda n: loaded.seconds(ComputeCost("tree", n=n))


def generate(
    pair: Pair | Any,
    prompt: str,
    method: str = "xcosd-e",
    *,
    link: Link | None = None,
    profile: str | Profile | None = None,
    edge_profile: str | Profile | None = None,
    cloud_profile: str | Profile | None = None,
    trace: bool = False,
    charge_protocol_cpu: bool = False,
    server: str | None = None,
    token: str | None = None,
    tls_ca: str | Path | bool | None = None,
    target_tokenizer: Any = None,
    reuse: JobReplay | None = None,
    **settings: Any,
) -> GenerationResult:
    """Generate with `method` on the discrete-event simulator (virtual time, real models).

    Settings: max_new_tokens, temperature, top_k, top_p, seed, gamma, stop, and the method
    options of `GenerationSettings` (srdv_k, srdv_m, hr_piggyback, tr_k, uhlm_*). Profiles
    price each computation (default "measured": this machine's wall time); `profile` sets both
    sides, `edge_profile` / `cloud_profile` each one. The default link is 100 Mbps, 50 ms RTT.
    `charge_protocol_cpu`: also charge each side's own CPU (its machine's handlers, encoding and
    decoding messages), measured on this machine, on the virtual clock, as a real run pays it
    (`wanspec.sim.simulate(charge_cpu=True)`); the stats then carry `protocol_cpu_s` and
    `codec_cpu_s` per side. Off by default, so the virtual times do not vary from run to run.

    With `server="HOST:PORT"` the target runs on a `wanspec serve` server instead, over real TCP
    (times are wall clock; link, profiles and `charge_protocol_cpu` do not apply). `pair` may
    then also be the draft alone (registry name, folder or LanguageModel) with
    `target_tokenizer` (e.g. "qwen2.5"), or a `wanspec.net.client.RemotePair` from `load_edge`.
    `token` (default $WANSPEC_TOKEN) is the server's bearer token; `tls_ca` turns TLS on: a PEM
    file pins the server's CA, True trusts the system's CAs.

    `reuse`: a `wanspec.models.replay.JobReplay` shared by runs (e.g. a sweep's cells that differ
    only in link or profiles): model jobs an earlier run computed are replayed from it, with
    bit-identical results. Replayed jobs take no time, so profiles must be fixed tables.
    """
    info = get_method(method)
    gen = GenerationSettings(**_model_sampling(pair, settings))
    if reuse is not None:
        _check_reuse(server, charge_protocol_cpu, edge_profile or profile, cloud_profile or profile)
    if server is not None:
        remote = {"token": token, "tls_ca": tls_ca, "target_tokenizer": target_tokenizer}
        return _generate_remote(pair, prompt, info.name, gen, server, **remote)
    edge_profile = edge_profile or profile or "measured"
    edge, cloud = pair.machines(info.name, prompt, gen, _tree_seconds(edge_profile))
    sim = simulate(
        edge,
        cloud,
        link if link is not None else Link(bandwidth_bps=100e6, rtt_s=0.05),
        edge_profile,
        cloud_profile or profile or "measured",
        edge_executor=_executor(pair.edge_model(info.name), reuse),
        cloud_executor=_executor(pair.target, reuse),
        trace=trace,
        charge_cpu=charge_protocol_cpu,
    )
    if sim.cloud_finish is not None and sim.cloud_finish.startswith("error"):
        raise RuntimeError(f"the cloud ended the session: {sim.cloud_finish}")
    tokens = sim.tokens
    return GenerationResult(pair.decode(tokens), tokens, _stats(info.name, sim, edge, cloud), sim)


def _executor(model: Any, reuse: JobReplay | None) -> Executor:
    return session_executor(model) if reuse is None else replaying_executor(model, reuse)


def _check_reuse(
    server: str | None,
    charge_protocol_cpu: bool,
    edge_profile: str | Profile | None,
    cloud_profile: str | Profile | None,
) -> None:
    """Refuse `reuse` where a run's figures would depend on the time its passes take: a
    replayed pass takes none."""
    if server is not None:
        raise ValueError("reuse applies to the simulator, not to a run against a server")
    if charge_protocol_cpu:
        raise ValueError(
            "reuse cannot go with charge_protocol_cpu: the measured CPU would include replays "
            "that take no time; run without reuse"
        )
    for side, spec in (("edge", edge_profile), ("cloud", cloud_profile)):
        if _measures_wall_time(load_profile(spec or "measured")):
            raise ValueError(
                f"reuse needs fixed compute profiles, but the {side} profile "
                f"{getattr(spec, 'name', spec or 'measured')!r} charges measured wall time, and a "
                "replayed pass takes none: give table profiles (e.g. edge-orin, cloud-a100-8b) "
                "or run without reuse"
            )


def _measures_wall_time(profile: Profile) -> bool:
    """Whether `profile` prices a computation from the wall time it took."""
    if isinstance(profile, MeasuredProfile):
        return True
    cost = ComputeCost("forward", n=1)
    try:
        return profile.seconds(cost, 1.0) != profile.seconds(cost, 2.0)
    except (TypeError, ValueError):
        return True


def _generate_remote(
    pair: Any,
    prompt: str,
    method: str,
    gen: GenerationSettings,
    server: str,
    *,
    token: str | None,
    tls_ca: str | Path | bool | None,
    target_tokenizer: Any,
) -> GenerationResult:
    """`generate` against a server: the same result, wall-clock stats plus transport figures."""
    from wanspec.net.client import ClientOptions, RemotePair, generate_remote, load_edge

    options = ClientOptions(token=token, tls_ca=tls_ca)
    if isinstance(pair, RemotePair):
        edge = pair
    elif isinstance(pair, Pair):
        edge = RemotePair.of_pair(pair)
    elif target_tokenizer is None:
        raise ValueError("a remote target needs its tokenizer on the edge: pass target_tokenizer=")
    else:
        draft, name = _load_lm(pair, torch.float32, None)
        edge = load_edge(draft, target_tokenizer, server, options, draft_name=name)
    run = generate_remote(edge, prompt, method, gen, server, options)
    stats = _stats(method, run.record, run.edge, None)
    stats.update(run.transport_stats())
    return GenerationResult(edge.decode(run.tokens), run.tokens, stats)
