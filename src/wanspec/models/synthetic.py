"""A synthetic draft/target pair with a known acceptance rate α, for analysis and fast tests.

Both "models" are deterministic functions of (seed, context): the next-token distribution after a
context depends only on the seed, the context length and its last few tokens, hashed into two
disjoint token sets A (m tokens) and B (m_b tokens). The target is q = w on A (fixed decreasing
weights w, so greedy decoding has a unique argmax); the draft is

    p = α·q + (1 − α)·uniform(B).

Hence Σ_x min(p(x), q(x)) = α·Σ_A q = α at every position: under standard speculative sampling at
temperature 1 each drafted token is accepted independently with probability exactly α (a draft in
A is always accepted since q/p = 1/α ≥ 1, a draft in B never), and the residual max(q − p, 0) is
∝ q on A. With `alpha_alt`, α alternates between two values in stretches of `regime_tokens`
positions (each stretch's α drawn from the seed and its index): acceptance is then correlated
along the text, as a real pair's is, so the acceptance of a draft's k-th token given the k − 1
before it were accepted grows with k. With the default m = 5 and weights 5:4:3:2:1 the target
survives 16-bit quantisation exactly (65535 is divisible by 15) and the quantised α is off by
less than 5/65535.

They implement `LanguageModel` (prefix cache, rollback, tree forward, path keeping) with the same
tree conventions as the transformers backend, but with no weights and no tokenizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from wanspec.models.lm import LanguageModel, as_token_ids

Role = Literal["draft", "target"]
NEG_LOGIT = -1e9  # "probability 0": exp underflows to exactly 0 after any max-subtraction


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters shared by both models of a pair (they must agree on the token sets)."""

    alpha: float
    vocab_size: int = 1000
    target_support: int = 5  # m = |A|
    draft_extra: int = 5  # m_b = |B|, where the draft puts its 1 − α of mass the target lacks
    context_tokens: int = 3  # how many trailing tokens (plus the position) key the distribution
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    alpha_alt: float | None = None  # the other regime's α (None: α at every position)
    regime_tokens: int = 16  # positions per stretch of one regime

    def __post_init__(self) -> None:
        for alpha in (self.alpha, self.alpha_alt):
            if alpha is not None and not 0.0 <= alpha <= 1.0:
                raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
        if self.regime_tokens < 1:
            raise ValueError(f"regime_tokens must be >= 1, got {self.regime_tokens}")
        if self.target_support < 1 or self.draft_extra < 1:
            raise ValueError("target_support and draft_extra must be >= 1")
        if self.target_support + self.draft_extra > self.vocab_size:
            raise ValueError(
                f"vocab_size={self.vocab_size} cannot hold {self.target_support} target and "
                f"{self.draft_extra} draft-only tokens"
            )
        if self.context_tokens < 0 or self.seed < 0:
            raise ValueError("context_tokens and seed must be >= 0")
        if any(not 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must lie in [0, {self.vocab_size})")

    @property
    def target_weights(self) -> np.ndarray:
        """q over A in the hashed order of A: m, m−1, …, 1, normalised."""
        w = np.arange(self.target_support, 0, -1, dtype=np.float64)
        return w / w.sum()

    def supports(self, context: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The token sets (A, B) after `context`; A is ordered by decreasing target weight."""
        k = self.context_tokens
        tail = list(context[-k:]) if k else []
        h = _mix(self.seed)
        for value in (len(context), *([self.vocab_size] * (k - len(tail))), *tail):
            h = _mix(h ^ (int(value) + _GOLDEN))
        chosen: dict[int, None] = {}  # insertion-ordered set
        while len(chosen) < self.target_support + self.draft_extra:
            h = _mix(h + _GOLDEN)
            chosen.setdefault(h % self.vocab_size)
        ids = np.fromiter(chosen, dtype=np.int64)
        return ids[: self.target_support], ids[self.target_support :]

    def alpha_at(self, position: int) -> float:
        """The acceptance rate of the token drafted at `position` (the context's length)."""
        if self.alpha_alt is None:
            return self.alpha
        stretch = _mix(_mix(self.seed) ^ (position // self.regime_tokens + _GOLDEN))
        return self.alpha_alt if stretch & 1 else self.alpha

    def probs(self, context: Sequence[int], role: Role) -> np.ndarray:
        """The float64 next-token distribution of `role` after `context`."""
        a, b = self.supports(context)
        out = np.zeros(self.vocab_size, dtype=np.float64)
        if role == "target":
            out[a] = self.target_weights
        else:
            alpha = self.alpha_at(len(context))
            out[a] = alpha * self.target_weights
            out[b] = (1.0 - alpha) / self.draft_extra
        return out


@dataclass(frozen=True)
class FixedLaw(SyntheticSpec):
    """A synthetic model with one next-token distribution after every context (`law`: token id,
    mass): its tokens are i.i.d., so an exact method's tokens at every position have that one
    law and can be pooled over positions and runs."""

    law: tuple[tuple[int, float], ...] = ()

    def probs(self, context: Sequence[int], role: Role) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.float64)
        for token, mass in self.law:
            out[token] = mass
        return out


def small_residual_laws(alignment: Any, alpha: float = 0.8) -> tuple[FixedLaw, FixedLaw]:
    """The (target, draft) laws of a pair of two vocabularies (`alignment`: a
    `VocabAlignment`) whose rejections leave little residual mass: q on 100 common tokens (0.9
    of its mass, so HR's q over C is a kilobyte or so) and 5 LLM-only ones; the draft α·q on C
    and the rest on 10 common tokens q lacks. SR-DV's candidates are then often all refused."""
    common = [int(t) for t in alignment.common_target_ids]
    llm_only = [int(t) for t in np.flatnonzero(alignment.llm_only)][:5]
    weights = np.arange(100, 0, -1) / np.arange(100, 0, -1).sum()
    q = {t: 0.9 * float(w) for t, w in zip(common[:100], weights, strict=True)}
    q.update({t: 0.1 / len(llm_only) for t in llm_only})
    to_draft = {t: int(alignment.target_to_draft[t]) for t in common}
    p = {to_draft[t]: alpha * float(w) for t, w in zip(common[:100], weights, strict=True)}
    p.update({to_draft[t]: (1 - alpha) / 10 for t in common[100:110]})
    return (
        FixedLaw(0.0, alignment.target_width, law=tuple(q.items())),
        FixedLaw(0.0, alignment.draft_width, law=tuple(p.items())),
    )


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    """SplitMix64 finaliser: a stable, platform-independent 64-bit hash step."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _logits(probs: np.ndarray) -> np.ndarray:
    logits = np.full(probs.shape, NEG_LOGIT, dtype=np.float64)
    positive = probs > 0
    logits[positive] = np.log(probs[positive])
    return logits


@dataclass
class _Tree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # pending index, or -1 for a root
    attach: list[int] = field(default_factory=list)  # last visible cache position of the root


class SyntheticLM(LanguageModel):
    """One side of a synthetic pair; its "KV cache" is the token list itself."""

    def __init__(self, spec: SyntheticSpec, role: Role) -> None:
        if role not in ("draft", "target"):
            raise ValueError(f"role must be 'draft' or 'target', got {role!r}")
        self.spec = spec
        self.role: Role = role
        regimes = "" if spec.alpha_alt is None else f"/{spec.alpha_alt}:{spec.regime_tokens}"
        self.name = f"synthetic-{role}(alpha={spec.alpha}{regimes}, seed={spec.seed})"
        self.vocab_size = spec.vocab_size
        self.eos_token_ids = tuple(spec.eos_token_ids)
        self.tokenizer = None
        self.config = None
        self._clear_state()

    def _clear_state(self) -> None:
        self._ids: list[int] = []
        self._tree = _Tree()

    def __repr__(self) -> str:
        return f"SyntheticLM({self.name!r}, length={len(self._ids)})"

    @property
    def length(self) -> int:
        return len(self._ids)

    @property
    def pending_tree_size(self) -> int:
        return len(self._tree.tokens)

    @property
    def ids(self) -> tuple[int, ...]:
        """The committed sequence (what a real model's KV cache stands for)."""
        return tuple(self._ids)

    def rows(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """float32 logits [n, V], one row per context (the distribution after it)."""
        out = np.empty((len(contexts), self.vocab_size), dtype=np.float64)
        for i, context in enumerate(contexts):
            out[i] = _logits(self.spec.probs(context, self.role))
        return torch.from_numpy(out.astype(np.float32))

    def extend(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        ids = self.check_tokens(ids, "ids")
        rows = self._check_rows(rows, len(ids))
        if self.pending_tree_size:
            raise RuntimeError(
                "tree nodes are pending: call keep_tree_path() or truncate() before extend()"
            )
        start = len(self._ids)
        self._ids.extend(ids)
        first = len(ids) - rows
        return self.rows([self._ids[: start + i + 1] for i in range(first, len(ids))])

    def truncate(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= len(self._ids):
            raise ValueError(f"truncate length must be an int in [0, {len(self._ids)}]: {length!r}")
        del self._ids[length:]
        self._tree = _Tree()

    def tree_forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        tokens = self.check_tokens(tokens, "tokens")
        parents = as_token_ids(parents, "parents")
        if len(tokens) != len(parents):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
        first = self.pending_tree_size
        for offset, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
            self._add_node(first + offset, token, parent)
        return self.rows([self._node_context(n) for n in range(first, first + len(tokens))])

    def keep_tree_path(self, nodes: Sequence[int], keep_descendants: bool = False) -> None:
        nodes = as_token_ids(nodes, "nodes")
        if not self.pending_tree_size:
            raise RuntimeError("keep_tree_path() needs pending tree nodes from tree_forward()")
        if not nodes:
            self._tree = _Tree()
            return
        self._check_chain(nodes)
        old, path = self._tree, {node: k for k, node in enumerate(nodes)}
        below = []
        if keep_descendants:
            below = [
                n
                for n in range(len(old.tokens))
                if n not in path and path.keys() & set(self._chain_of(n))
            ]
        self._ids[:] = self._node_context(nodes[-1])
        first = len(self._ids) - len(nodes)  # where the path's first node now stands
        renumber = {n: k for k, n in enumerate(below)}
        self._tree = _Tree()
        for n in below:
            parent = old.parents[n]
            on_path = parent in path
            self._tree.tokens.append(old.tokens[n])
            self._tree.parents.append(-1 if on_path else renumber[parent])
            attach = first + path[parent] if on_path else self._tree.attach[renumber[parent]]
            self._tree.attach.append(attach)

    def _chain_of(self, node: int) -> list[int]:
        """The node and its pending ancestors."""
        chain = []
        while node >= 0:
            chain.append(node)
            node = self._tree.parents[node]
        return chain

    # -- internals ---------------------------------------------------------------------------

    def _add_node(self, node: int, token: int, parent: int) -> None:
        tree, length = self._tree, len(self._ids)
        if parent >= node or parent < -(length + 1):
            raise ValueError(
                f"parent {parent} of node {node} must be a pending node < {node} or a cache "
                f"offset in [-{length + 1}, -1]"
            )
        tree.tokens.append(token)
        tree.parents.append(-1 if parent < 0 else parent)
        tree.attach.append(length + parent if parent < 0 else tree.attach[parent])

    def _node_context(self, node: int) -> list[int]:
        """Cache up to the node's root attachment, then its ancestors' tokens, then itself."""
        tree, chain = self._tree, []
        while node >= 0:
            chain.append(tree.tokens[node])
            root_attach = tree.attach[node]
            node = tree.parents[node]
        return self._ids[: root_attach + 1] + chain[::-1]

    def _check_chain(self, nodes: list[int]) -> None:
        tree = self._tree
        if any(not 0 <= n < len(tree.tokens) for n in nodes):
            raise ValueError(
                f"nodes must be pending tree indices in [0, {len(tree.tokens)}): {nodes}"
            )
        if tree.parents[nodes[0]] != -1:
            raise ValueError(f"path must start at a root (a node with a negative parent): {nodes}")
        for prev, node in itertools.pairwise(nodes):
            if tree.parents[node] != prev:
                raise ValueError(f"node {node} is not a child of node {prev}; path {nodes}")


def synthetic_pair(alpha: float, **spec: object) -> tuple[SyntheticLM, SyntheticLM]:
    """(draft, target) sharing one `SyntheticSpec(alpha, **spec)`."""
    shared = SyntheticSpec(alpha, **spec)  # type: ignore[arg-type]
    return SyntheticLM(shared, "draft"), SyntheticLM(shared, "target")
