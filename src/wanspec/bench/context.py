"""What the cells of one sweep share: loaded model pairs and prompt sets, each built once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanspec.bench.config import TINY_PAIR, TINY_SHARED_PAIR
from wanspec.bench.datasets import PromptSet, load_prompts
from wanspec.models.replay import JobReplay

TINY_SEED = 3  # the heterogeneous tiny pair the protocol tests use


def tiny_pair_folders(shared: bool = False) -> tuple[Path, Path]:
    """(target, draft) folders of the tiny heterogeneous pair (`shared`: the shared-tokenizer
    pair), built once under $WANSPEC_HOME."""
    from wanspec.assets import wanspec_home
    from wanspec.models.tiny import make_tiny_pair

    root = wanspec_home() / "bench" / f"tiny-pair-seed{TINY_SEED}"
    kind = "shared" if shared else "hetero"
    target, draft = root / f"{kind}-target", root / f"{kind}-draft"
    done = root / (".complete-shared" if shared else ".complete")
    if not done.exists():
        draft, target = make_tiny_pair(root, shared=shared, seed=TINY_SEED)
        done.touch()
    return target, draft


def vocab_sizes(pair: Any) -> dict[str, int]:
    """|V| (target), |V_S| (draft) and |C| of a loaded pair, for the paper's accounting."""
    stats = pair.alignment.stats()
    return {"target": stats.target_vocab, "draft": stats.draft_vocab, "common": stats.common}


@dataclass
class Context:
    """`pairs` may be given loaded pairs by (target, draft) name, e.g. a synthetic pair.

    `reuse`: model jobs shared by the generation cells (`wanspec.generate(reuse=)`): cells that
    differ only in link or profiles compute each pass once. None: every cell computes its own.
    """

    threads: int | None = None
    data_dir: Path | None = None
    pairs: dict[tuple[str, str], Any] = field(default_factory=dict)
    loading: dict[str, Any] = field(default_factory=dict)  # load_pair's dtype, invariant, device
    reuse: JobReplay | None = field(default_factory=JobReplay)
    _prompts: dict[tuple[str, int], PromptSet] = field(default_factory=dict)

    def pair(self, target: str, draft: str) -> Any:
        """`wanspec.load_pair`, once per (target, draft); the tiny names build the tiny pair."""
        import wanspec

        key = (target, draft)
        if key not in self.pairs:
            if key in (TINY_PAIR, TINY_SHARED_PAIR):
                target_dir, draft_dir = tiny_pair_folders(shared=key == TINY_SHARED_PAIR)
                loaded = wanspec.load_pair(
                    target_dir, draft_dir, threads=self.threads, **self.loading
                )
            else:
                loaded = wanspec.load_pair(target, draft, threads=self.threads, **self.loading)
            self.pairs[key] = loaded
        return self.pairs[key]

    def prompts(self, dataset: str, n: int) -> PromptSet:
        key = (dataset, n)
        if key not in self._prompts:
            self._prompts[key] = load_prompts(dataset, n, self.data_dir)
        return self._prompts[key]
