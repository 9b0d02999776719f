"""A target model's own sampling settings, read from its `generation_config` as transformers does.

When a request names no sampling settings, "the target's own sampling" is what
`model.generate(input_ids)` would do with no arguments: every field the model's generation config
leaves unset takes transformers' global default (so an unset `top_k` is 50, not off), and
`do_sample` not True means greedy, whatever temperature / top-k / top-p / min-p say (transformers
applies the sampling warpers only when sampling; the repetition penalty applies either way).
"""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig

from wanspec.sampling import SamplingParams

# Fields whose non-neutral value changes the next-token law in ways wanspec does not reproduce.
# Each maps to the values that leave the law alone (after filling transformers' defaults).
_UNSUPPORTED_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "num_beams": (None, 1),
    "penalty_alpha": (None, 0, 0.0),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1, 1.0),
    "watermarking_config": (None,),
    "dola_layers": (None,),
}


def _global_defaults() -> dict[str, Any]:
    """transformers' defaults for fields a generation config leaves unset.

    transformers 5 keeps them in `GenerationConfig._get_default_generation_params()` (its
    generate fills unset fields from there); older versions put them on a fresh GenerationConfig.
    """
    getter = getattr(GenerationConfig, "_get_default_generation_params", None)
    if getter is not None:
        return dict(getter())
    return GenerationConfig().to_dict()


def _resolved(config: GenerationConfig, name: str, defaults: dict[str, Any]) -> Any:
    value = getattr(config, name, None)
    return defaults.get(name) if value is None else value


def sampling_defaults(generation_config: GenerationConfig) -> dict[str, Any]:
    """temperature / top_k / top_p / min_p / repetition_penalty that `generate` would use.

    Greedy (`do_sample` not True) comes back as temperature 0 with every warper off. Raises
    ValueError for a config transformers itself would reject (sampling at temperature 0) or
    whose values are out of range, naming the field.
    """
    if not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"expected a transformers GenerationConfig, got {type(generation_config).__name__}"
        )
    defaults = _global_defaults()

    def get(name: str) -> Any:
        return _resolved(generation_config, name, defaults)

    penalty = get("repetition_penalty")
    penalty = 1.0 if penalty is None else float(penalty)
    if get("do_sample") is not True:
        settings = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    else:
        temperature = get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if temperature == 0:
            raise ValueError(
                "generation_config samples (do_sample=True) at temperature 0, which transformers "
                "rejects; set do_sample=False for greedy decoding"
            )
        top_k, top_p, min_p = get("top_k"), get("top_p"), get("min_p")
        settings = {
            "temperature": temperature,
            "top_k": 0 if top_k is None else int(top_k),
            "top_p": 1.0 if top_p is None else float(top_p),
            "min_p": 0.0 if min_p is None else float(min_p),
        }
    settings["repetition_penalty"] = penalty
    try:
        SamplingParams(**settings)
    except ValueError as exc:
        raise ValueError(f"generation_config: {exc}") from exc
    return settings


def unsupported_generation_settings(generation_config: GenerationConfig) -> dict[str, Any]:
    """Fields of `generation_config` that change transformers' next-token law beyond what
    `sampling_defaults` covers (beam search, typical-p, n-gram bans, ...), with their values.

    Empty for the usual configs; a caller that promises the target's own sampling should refuse
    or warn when it is not.
    """
    defaults = _global_defaults()
    found = {}
    for name, neutral in _UNSUPPORTED_NEUTRAL.items():
        value = _resolved(generation_config, name, defaults)
        if value not in neutral:
            found[name] = value
    return found
