"""bf16 greedy: wanspec's output against STOCK transformers `generate` on tiny models.

For each tiny family (Llama, Qwen2, Gemma3: a random target and a draft that is a noisy copy of
it, one tokenizer) and a few prompts, greedy `generate` of the stock bf16 target
(`AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)`, its own sdpa attention
and linear layers) is the reference. Against it:

- `inv`: wanspec's methods with the pair loaded in bf16 (pass-shape invariant, the default);
- `default`: the same methods on the stock bf16 kernels (built by hand: `load_model` refuses
  bf16 without invariance);
- `inv-generate`: transformers' `generate` on the invariant model itself.

At each first divergence from the stock reference it prints the stock logit margin between the
reference token and wanspec's token there, and how far apart the two kernels' logits are on that
row. It then measures the stock model's bf16 pass-shape differences over the reference texts:
the same positions' logits in a one-token decode (generate's), one prefill over the whole text,
and 5-row verification chunks.

    .venv/bin/python scripts/bf16_greedy_vs_stock.py [--tokens 24]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import wanspec
from wanspec.models.lm import HFLanguageModel
from wanspec.models.tiny import FAMILIES, make_tiny_model

PROMPTS = ("def add(a, b):", "The quick brown", "Once upon a time", "Question: what is 12")
METHODS = ("ar", "cosd", "xcosd-e", "acespec")
NOISE = 0.05  # the draft: the target's weights plus 5% of each tensor's std of noise


def make_family_pair(family: str, root: Path) -> tuple[Path, Path]:
    target = make_tiny_model(family, root / f"{family}-target", seed=1)
    model = AutoModelForCausalLM.from_pretrained(target)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(NOISE * param.std() * torch.randn(param.shape, generator=gen))
    draft = root / f"{family}-draft"
    model.save_pretrained(draft)
    AutoTokenizer.from_pretrained(target).save_pretrained(draft)
    return draft, target


def stock_model(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()


def stock_generate(
    model: torch.nn.Module, ids: list[int], n: int
) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits each step saw (one-token decodes after the prefill)."""
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
            output_logits=True, return_dict_in_generate=True,
            pad_token_id=model.generation_config.pad_token_id,
        )  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.cat(out.logits).float()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def row_logits(lm: HFLanguageModel, ids: list[int]) -> torch.Tensor:
    """The logits after `ids` computed by `lm` (prefill of the prefix, one-token decode)."""
    lm.prefill(ids[:-1])
    return lm.extend(ids[-1:])[0]


def shape_differences(model: torch.nn.Module, ids: list[int], steps: torch.Tensor) -> dict:
    """One text's positions: decode logits (`steps`) vs one prefill and 5-row chunks."""
    n = steps.shape[0]
    with torch.inference_mode():
        prefill = model(torch.tensor([ids])).logits[0, -n - 1 : -1].float()
        chunks, start = [], len(ids) - n
        cache = model(torch.tensor([ids[: start - 1]]), use_cache=True).past_key_values
        pos = start - 1
        while pos < len(ids) - 1:
            part = ids[pos : min(pos + 5, len(ids) - 1)]
            out = model(torch.tensor([part]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            chunks.append(out.logits[0].float())
            pos += len(part)
        chunked = torch.cat(chunks)
    res = {}
    for name, other in (("prefill", prefill), ("chunks5", chunked)):
        delta = (other - steps).abs().amax(-1)
        tv = 0.5 * (other.softmax(-1) - steps.softmax(-1)).abs().sum(-1)
        flips = (other.argmax(-1) != steps.argmax(-1)).sum().item()
        res[name] = (delta, tv, flips)
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.tokens
    counts: Counter[str] = Counter()
    deltas: dict[str, list[torch.Tensor]] = {"prefill": [], "chunks5": []}
    tvs: dict[str, list[torch.Tensor]] = {"prefill": [], "chunks5": []}
    flips: Counter[str] = Counter()
    kernel_gaps: list[float] = []
    margins: list[torch.Tensor] = []
    kernels: list[torch.Tensor] = []  # per position: max|inv - stock| of the decode logits
    kernel_flips = 0
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            draft, target = make_family_pair(family, Path(tmp))
            inv = wanspec.load_pair(target, draft, dtype=torch.bfloat16, threads=1)
            tok = AutoTokenizer.from_pretrained(target)
            default = wanspec.load_pair(
                HFLanguageModel(stock_model(target), tok, "target"),
                HFLanguageModel(stock_model(draft), tok, "draft"),
            )
            stock = stock_model(target)
            for prompt in PROMPTS:
                ids = inv.target_encode(prompt)
                ref, steps = stock_generate(stock, ids, n)
                top2 = steps.topk(2, dim=-1).values
                margins.append(top2[:, 0] - top2[:, 1])
                inv_rows = inv.target.prefill(ids + ref)[len(ids) - 1 : -1]  # invariant: = decodes
                kernels.append((inv_rows - steps).abs().amax(-1))
                kernel_flips += (inv_rows.argmax(-1) != steps.argmax(-1)).sum().item()
                for name, d in shape_differences(stock, ids + ref, steps).items():
                    deltas[name].append(d[0])
                    tvs[name].append(d[1])
                    flips[name] += d[2]
                    flips[name + "_positions"] += len(d[0])
                own = inv.target.model
                own_ref, _ = stock_generate(own, ids, n)
                runs = {"inv-generate": own_ref}
                for method in METHODS:
                    for label, pair in (("inv", inv), ("default", default)):
                        res = wanspec.generate(
                            pair, prompt, method, temperature=0, gamma=4, max_new_tokens=n
                        )
                        runs[f"{label}:{method}"] = res.token_ids
                for label, tokens in runs.items():
                    kind = label.split(":")[0]
                    counts[kind + " runs"] += 1
                    counts[f"{kind} {family} runs"] += 1
                    at = first_divergence(tokens, ref)
                    if at is None:
                        continue
                    counts[kind + " differ"] += 1
                    counts[f"{kind} {family} differ"] += 1
                    a, b = ref[at], tokens[at] if at < len(tokens) else None
                    row = steps[at]
                    top2 = row.topk(2).values
                    inv_row = row_logits(inv.target, ids + ref[:at])
                    gap = (inv_row - row).abs().max().item()
                    kernel_gaps.append(gap)
                    lead = "" if b is None else f" stock margin ref-wanspec {row[a] - row[b]:.4f};"
                    print(
                        f"{family:<6} {prompt!r:<24} {label:<16} differs at token {at:>2}:"
                        f"{lead} stock top1-top2 {top2[0] - top2[1]:.4f}; "
                        f"max|inv - stock| on that row {gap:.4f}"
                    )
                for label, tokens in runs.items():
                    if label.startswith("inv:"):
                        counts["inv vs inv-generate runs"] += 1
                        if first_divergence(tokens, own_ref) is not None:
                            counts["inv vs inv-generate differ"] += 1
                            print(f"   !! {family} {prompt!r} {label} differs from inv-generate")
    print()
    for kind in ("inv", "default", "inv-generate"):
        per_family = ", ".join(
            f"{f} {counts[f'{kind} {f} differ']}/{counts[f'{kind} {f} runs']}" for f in FAMILIES
        )
        print(
            f"{kind:<13} differ from stock generate: {counts[kind + ' differ']}"
            f"/{counts[kind + ' runs']} runs ({per_family})"
        )
    print(
        f"inv methods differ from the invariant model's own generate: "
        f"{counts['inv vs inv-generate differ']}/{counts['inv vs inv-generate runs']} runs"
    )
    m = torch.cat(margins)
    print(
        f"stock top1-top2 logit margin over {len(m)} positions: median {m.median():.4f}; "
        + ", ".join(f"<= {t}: {(m <= t).sum().item()}" for t in (0.0, 0.0625, 0.125, 0.25))
    )
    for name in ("prefill", "chunks5"):
        d, tv = torch.cat(deltas[name]), torch.cat(tvs[name])
        print(
            f"stock bf16, decode vs {name}: max|dlogit| median {d.median():.4f} "
            f"max {d.max():.4f}; TV median {tv.median():.2e} max {tv.max():.2e}; "
            f"argmax flips {flips[name]}/{flips[name + '_positions']} positions"
        )
    k = torch.cat(kernels)
    print(
        f"invariant vs stock kernels, same positions: max|dlogit| median {k.median():.4f} "
        f"max {k.max():.4f}; argmax differs at {kernel_flips}/{len(k)} positions"
    )
    if kernel_gaps:
        gaps = torch.tensor(kernel_gaps)
        print(f"max|inv - stock| logits at the divergences: median {gaps.median():.4f}")


if __name__ == "__main__":
    main()
