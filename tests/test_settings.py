"""Bad generation settings fail when the settings are built, with a message naming the setting."""

from __future__ import annotations

import math

import pytest

from wanspec import wire
from wanspec.protocols.settings import MAX_GAMMA, MAX_NEW_TOKENS, MAX_SRDV_M, GenerationSettings
from wanspec.sampling.proposal import MAX_CANDIDATES

BAD = [
    ("seed", -1),
    ("seed", 1.5),
    ("seed", "7"),
    ("seed", True),
    ("seed", 1 << 63),
    ("max_new_tokens", 0),
    ("max_new_tokens", MAX_NEW_TOKENS + 1),
    ("max_new_tokens", 10.0),
    ("gamma", 0),
    ("gamma", MAX_GAMMA + 1),
    ("srdv_k", 0),
    ("srdv_k", wire.DEFAULT_LIMITS.max_candidates + 1),
    ("srdv_m", 0),
    ("srdv_m", MAX_SRDV_M + 1),
    ("tr_k", 0),
    ("uhlm_samples", 0),
    ("uhlm_eta_max", 0.0),
    ("uhlm_eta_max", math.inf),
    ("uhlm_threshold", 1.5),
    ("ignore_eos", "yes"),
    ("hr_piggyback", 1),
    ("temperature", -0.5),
    ("top_k", -1),
    ("top_p", 0.0),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", math.nan),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.1),
    ("draft_reshape", 0.0),
    ("draft_reshape", 1.5),
    ("draft_reshape", math.nan),
    ("draft_reshape", "0.5"),
    ("draft_reshape_top", 0),
    ("draft_reshape_top", MAX_CANDIDATES + 1),
    ("draft_reshape_top", 2.0),
    ("restart_length", -1),
    ("restart_length", MAX_GAMMA + 1),
    ("restart_length", "2"),
    ("stop", "###"),
    ("stop", ("ok", "")),
    ("stop", ("ok", 3)),
    ("stop", ("\ud800",)),
    ("stop", ("x" * wire.DEFAULT_LIMITS.max_string,)),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=lambda v: repr(v)[:20])
def test_bad_setting_is_rejected_by_name(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"setting {name}"):
        GenerationSettings(**{name: value})


def test_limits_follow_the_wire() -> None:
    edge = GenerationSettings(
        gamma=MAX_GAMMA,
        srdv_k=wire.DEFAULT_LIMITS.max_candidates,
        srdv_m=MAX_SRDV_M,
        seed=(1 << 63) - 1,
        max_new_tokens=MAX_NEW_TOKENS,
        stop=("x" * (wire.DEFAULT_LIMITS.max_string - 1000),),
        draft_reshape=1e-300,
        draft_reshape_top=MAX_CANDIDATES,
    )
    # the largest settings still travel: StartRequest encodes and decodes them unchanged
    frame = wire.encode(wire.StartRequest(0, "hi", edge.to_dict()))
    assert GenerationSettings.from_dict(wire.decode(frame).settings) == edge


def test_new_sampling_settings_reach_sampling_params() -> None:
    settings = GenerationSettings(
        temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2
    )
    params = settings.sampling
    assert (params.min_p, params.repetition_penalty) == (0.05, 1.2)
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 5, 0.9)
    assert GenerationSettings.from_dict(settings.to_dict()) == settings


def test_split_layers_is_gone_and_unknown_settings_are_named() -> None:
    with pytest.raises(ValueError, match="split_layers"):
        GenerationSettings.from_dict({"split_layers": 2})
