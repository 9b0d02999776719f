"""The default pair on a GPU: exactness and timings, for whenever a CUDA machine is at hand.

For each dtype (float32 and bfloat16; a 16-bit pair runs pass-shape invariant, as it must) it:

- loads the pair on --device and checks that the weights and the KV cache live there and that
  the logits a job hands over are float32 CPU tensors;
- decodes a few prompts at temperature 0 with `ar` and lossless speculative methods (a verifying
  one, X-CoSD-E, AceSpec's tree pipeline) and checks each gives exactly the tokens of
  transformers' own greedy `generate` of the same loaded target on the same device;
- runs one sampled generation per lossless method (sd, xcosd-e, acespec; their heterogeneous
  forms on a pair of two vocabularies) and checks it yields its tokens and repeats itself for a
  seed;
- times the target's one-token decode, a 5-row verification and one draft step (median ms).

Prints every failure and exits 1 if there was any (2 for a device this machine lacks).
`--device cpu` runs the same on the CPU (slowly: `--tokens 4 --prompts 1 --repeats 2`).

    .venv/bin/python scripts/cuda_check.py [--device cuda] [--tokens 24] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import wanspec
from wanspec.models.jobs import Forward, run_job
from wanspec.models.lm import HFLanguageModel, resolve_device

PROMPTS = (
    "def fibonacci(n):",
    "The three primary colours are",
    "Übersetze ins Englische: Der Hund schläft. →",
)
LINK = wanspec.Link(bandwidth_bps=2e6, rtt_s=0.08)
CONTEXT = 64  # cached tokens before each timed pass


def reference(pair: wanspec.Pair, prompt: str, tokens: int) -> list[int]:
    """transformers' greedy `generate` of the loaded target, on its own device."""
    lm = pair.target
    ids = torch.tensor([pair.target_encode(prompt)], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(
            ids, max_new_tokens=tokens, do_sample=False, attention_mask=torch.ones_like(ids)
        )
    return out[0, ids.shape[1] :].tolist()


def methods_for(pair: wanspec.Pair) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(greedy methods, sampled methods) the pair supports."""
    if pair.shared_vocab:
        return ("ar", "sd", "xcosd-e", "acespec"), ("sd", "xcosd-e", "acespec")
    return ("ar", "xcosd-e", "acespec-x"), ("xcosd-e", "acespec-x")


def check_placement(pair: wanspec.Pair, device: torch.device) -> list[str]:
    """Weights and KV cache on `device`; job results float32 on the CPU, one row per ask."""
    problems = []
    for role, lm in (("target", pair.target), ("draft", pair.draft)):
        assert isinstance(lm, HFLanguageModel)
        params = {p.device for p in lm.model.parameters()}
        if params != {device}:
            problems.append(f"{role} weights on {sorted(map(str, params))}, not {device}")
        session = lm.new_session()
        logits = run_job(session, Forward(0, tuple(range(1, 9)), rows=1))
        layer = next(layer for layer in session._cache.layers if layer.is_initialized)
        if layer.keys.device != device:
            problems.append(f"{role} KV cache on {layer.keys.device}, not {device}")
        if (logits.dtype, logits.device.type, logits.shape[0]) != (torch.float32, "cpu", 1):
            problems.append(f"{role} logits {logits.dtype} on {logits.device}, {logits.shape}")
    return problems


def check_greedy(pair: wanspec.Pair, prompts: tuple[str, ...], tokens: int) -> list[str]:
    problems = []
    greedy, _ = methods_for(pair)
    for prompt in prompts:
        ref = reference(pair, prompt, tokens)
        for method in greedy:
            res = wanspec.generate(
                pair, prompt, method, temperature=0, gamma=4, max_new_tokens=tokens, link=LINK
            )
            same = res.token_ids == ref
            print(f"  greedy {method:<10} {prompt[:24]!r:<28} {'ok' if same else 'MISMATCH'}")
            if not same:
                problems.append(f"{method} on {prompt!r}: {res.token_ids} != generate's {ref}")
    return problems


def check_sampled(pair: wanspec.Pair, tokens: int) -> list[str]:
    problems = []
    _, sampled = methods_for(pair)
    for method in sampled:
        settings = {"temperature": 0.8, "top_p": 0.95, "seed": 1, "max_new_tokens": tokens}
        began = time.perf_counter()
        first = wanspec.generate(pair, PROMPTS[0], method, link=LINK, gamma=4, **settings)
        took = time.perf_counter() - began
        again = wanspec.generate(pair, PROMPTS[0], method, link=LINK, gamma=4, **settings)
        rate = first.stats.get("acceptance_rate")
        accepted = f"acceptance {rate:.2f}" if rate is not None else "no drafts"
        print(f"  sampled {method:<10} {len(first.token_ids)} tokens, {accepted}, {took:.2f} s")
        if not first.token_ids or first.stats["finish_reason"] not in ("length", "eos", "stop"):
            problems.append(f"sampled {method}: {first.stats['finish_reason']}, no tokens?")
        if first.token_ids != again.token_ids:
            problems.append(f"sampled {method}: the same seed gave other tokens")
    return problems


def median_ms(run: Callable[[], object], repeats: int) -> float:
    run()  # warm: first passes allocate and pick kernels
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()  # returns CPU logits: the copy waits for the device
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def timings(pair: wanspec.Pair, repeats: int) -> dict[str, float]:
    """Median ms of a target one-token decode, a 5-row verification and a draft step, each
    after a CONTEXT-token cache."""
    out = {}
    for label, lm, n in (
        ("target decode (1 row)", pair.target, 1),
        ("target verify (5 rows)", pair.target, 5),
        ("draft step (1 row)", pair.draft, 1),
    ):
        session = lm.new_session()
        context = tuple(range(100, 100 + CONTEXT))
        run_job(session, Forward(0, context, rows=1))
        job = Forward(CONTEXT, tuple(range(200, 200 + n)), rows=n)
        out[label] = median_ms(lambda s=session, j=job: run_job(s, j), repeats)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tokens", type=int, default=24, help="New tokens per greedy run.")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="Greedy prompts.")
    parser.add_argument("--repeats", type=int, default=20, help="Timed passes per figure.")
    args = parser.parse_args()
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(f"device {device} ({name}), torch {torch.__version__}")
    failed = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name.strip())
        began = time.perf_counter()
        pair = wanspec.load_pair(args.target, args.draft, dtype=dtype, device=args.device)
        print(f"\n{dtype_name}: {pair.draft_name} → {pair.target_name} loaded in "
              f"{time.perf_counter() - began:.1f} s")  # fmt: skip
        problems = check_placement(pair, device)
        problems += check_greedy(pair, PROMPTS[: args.prompts], args.tokens)
        problems += check_sampled(pair, args.tokens)
        for label, ms in timings(pair, args.repeats).items():
            print(f"  {label:<24} {ms:8.2f} ms")
        for problem in problems:
            print(f"  FAIL {problem}")
        if problems:
            failed.append(dtype_name)
        del pair
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
