"""The language-model interface every protocol drives, and its transformers backend.

A `LanguageModel` owns the KV cache of one sequence. Besides plain extension and rollback it can
score a whole token tree in one forward pass (tree attention) and then keep one root-to-leaf path
of that tree in place (AceSpec's COMPACT_KV), so a drafted branch never has to be recomputed.

Tree nodes are numbered globally among the *pending* nodes (those appended by `tree_forward`
since the last `extend`, `truncate` or `keep_tree_path`): a first call numbers its nodes 0..n-1,
a second call continues at n and may attach to any earlier node. A negative parent `-k` attaches
a root to the cached token at position `length - k` (so `-1` is the last cached token); the node
then sees the cache only up to that token. This lets a drafter grow a tree depth by depth and
branch off any point of an already cached main chain.

Sessions of one transformers model can also grow together: `HFLanguageModel.extend_batch` runs
several sessions' new tokens as ONE forward pass over their own caches (a cloud verifying many
edges' drafts reads the weights once for all of them), each session's logits as it gets alone.

Weights and KV caches live on the model's device (`load_model(device=...)`: cpu, cuda, cuda:N,
mps); every input a pass needs is created there, and only the logits rows a caller asked for come
back, once, as float32 CPU tensors: the form the protocols receive, whatever the device and dtype.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import itertools
import operator
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never reach the hub

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

DEFAULT_THREADS = 2
DEVICE_TYPES = ("cpu", "cuda", "mps")
_WINDOWED_TYPES = {"sliding_attention"}
_FULL_TYPES = {"full_attention"}


def default_threads() -> int:
    """Torch intra-op threads: $WANSPEC_THREADS, else 2 (the edge-device budget we model)."""
    value = os.environ.get("WANSPEC_THREADS", str(DEFAULT_THREADS))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"WANSPEC_THREADS must be a positive integer, got {value!r}")
    return int(value)


def available_devices() -> list[str]:
    """The devices a model can be loaded on here, spelled as `load_model(device=...)` takes them."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` ("cpu", "cuda", "cuda:N", "mps"; None means cpu) as a torch device present here.

    Checked before any weights are read, so a misspelt or absent device is one ValueError that
    names it and what this machine has, not a torch error from deep inside the first pass.
    "cuda" alone is the current CUDA device (cuda:0 unless CUDA_VISIBLE_DEVICES says otherwise).
    """
    if device is None:
        return torch.device("cpu")
    here = ", ".join(available_devices())
    expected = f"expected one of cpu, cuda, cuda:N, mps (available here: {here})"
    if not isinstance(device, str | torch.device):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {str(device)!r}: {expected}") from None
    if resolved.type not in DEVICE_TYPES:
        raise ValueError(f"unsupported device {str(device)!r}: {expected}")
    if resolved.type == "cpu":
        return torch.device("cpu")
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            why = "sees no CUDA GPU" if torch.version.cuda else "is a build without CUDA"
            raise ValueError(
                f"device {str(device)!r} is not available: torch {torch.__version__} {why} "
                f"(available here: {here})"
            )
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if index >= count:
            raise ValueError(
                f"device {str(device)!r} is not available: this machine has {count} CUDA "
                f"GPU(s), cuda:0..cuda:{count - 1} (available here: {here})"
            )
        return torch.device("cuda", index)
    if "mps" not in available_devices():
        raise ValueError(
            f"device {str(device)!r} is not available: torch {torch.__version__} has no usable "
            f"Apple-silicon GPU here (available here: {here})"
        )
    return torch.device("mps")


def to_host(rows: torch.Tensor) -> torch.Tensor:
    """`rows` as a float32 CPU tensor of its own: the one copy (on an accelerator, the one
    transfer) of a pass's result, never a view, so it does not keep a pass's logits alive."""
    return rows.to(device="cpu", dtype=torch.float32, copy=True)


class LanguageModel(ABC):
    """KV-cached causal LM over one sequence (the batch dimension is kept, fixed at 1).

    Results are float32 CPU tensors whatever `device` the model computes on."""

    name: str
    device: torch.device = torch.device("cpu")
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: Any
    config: Any

    @property
    @abstractmethod
    def length(self) -> int:
        """Tokens in the committed cache (pending tree nodes excluded)."""

    @property
    @abstractmethod
    def pending_tree_size(self) -> int:
        """Tree nodes appended by `tree_forward` and not yet kept or dropped."""

    @abstractmethod
    def extend(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        """Append `ids`; float32 logits [n, V], row i predicting the token after ids[i].

        `rows`: only the last `rows` of those (a prefill's decision needs its last row alone,
        and the others are never copied off the device)."""

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Roll the cache back to `length` tokens; drops any pending tree nodes."""

    @abstractmethod
    def tree_forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Score tree nodes in one pass; float32 logits [n, V] (see the module docstring)."""

    @abstractmethod
    def keep_tree_path(self, nodes: Sequence[int], keep_descendants: bool = False) -> None:
        """Keep the chain `nodes` (root first) behind the prefix it hangs from; drop the rest.

        With `keep_descendants`, every pending node below a node of the chain stays pending,
        re-rooted: such nodes are renumbered 0.. in their old order, and a former child of the
        chain's k-th node now hangs from that node's place in the cache. Drafting thus goes on
        from a cached branch without recomputing what was already drafted below it (the trees
        of chains sent before their verdict hang along the branch, not only at its end)."""

    @staticmethod
    def _check_rows(rows: int | None, n: int) -> int:
        """How many trailing logits rows `extend` returns: `rows`, or all n for None."""
        if rows is None:
            return n
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= n:
            raise ValueError(f"rows must be an int in [0, {n}] for {n} new tokens, got {rows!r}")
        return rows

    def check_tokens(self, ids: Sequence[int], what: str = "ids") -> list[int]:
        """Token ids as ints, each within the logits width, else a ValueError naming `what`: one
        check for every backend, which a caller can also run before it touches any session."""
        ids = as_token_ids(ids, what)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{what} contains ids outside [0, {self.vocab_size}): {bad[:5]}")
        return ids

    @property
    def fingerprint(self) -> str:
        """Identifies the weights a cloud serves, for the handshake (not a security measure)."""
        return hashlib.sha256(f"{self.name}|{self.vocab_size}".encode()).hexdigest()

    def reset(self) -> None:
        """Forget the whole sequence."""
        self.truncate(0)

    def new_session(self) -> LanguageModel:
        """An independent, empty KV-cache session over the same weights.

        One loaded model serves many requests at once (a cloud with many edges): each request
        owns a session; only the per-sequence state is new, the weights are shared, not copied.
        """
        session = copy.copy(self)
        session._clear_state()
        return session

    @abstractmethod
    def _clear_state(self) -> None:
        """Start this object's sequence state afresh (called on a shallow copy)."""

    def prefill(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        """`reset()` then `extend(ids, rows)`."""
        self.reset()
        return self.extend(ids, rows)


@dataclass
class _PendingTree:
    """Bookkeeping for tree nodes that sit in the KV cache behind the committed prefix."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # tree index, or -1 for a root
    attach: list[int] = field(default_factory=list)  # last visible cache position of the root
    positions: list[int] = field(default_factory=list)
    ancestors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))

    def __len__(self) -> int:
        return len(self.tokens)


def _descendants(ancestors: np.ndarray, path: Sequence[int]) -> list[int]:
    """Pending nodes below some node of `path` and not on it, in their numbering order."""
    on_path = set(path)
    below = np.flatnonzero(ancestors[:, list(path)].any(axis=1))
    return [int(n) for n in below if n not in on_path]


def _rerooted(tree: _PendingTree, kept: list[int], path: Sequence[int], first: int) -> _PendingTree:
    """The pending tree of the `kept` nodes (all below `path`) once the path is in the cache
    from position `first` on: renumbered in order, a child of the path's k-th node now a root
    attached at `first + k`."""
    new = {old: k for k, old in enumerate(kept)}
    at = {node: first + k for k, node in enumerate(path)}
    out = _PendingTree(ancestors=tree.ancestors[np.ix_(kept, kept)].copy())
    for old in kept:
        parent = tree.parents[old]
        out.tokens.append(tree.tokens[old])
        out.parents.append(-1 if parent in at else new[parent])
        out.attach.append(at[parent] if parent in at else out.attach[new[parent]])
        out.positions.append(tree.positions[old])
    return out


def as_token_ids(values: Sequence[int], what: str) -> list[int]:
    """`values` as a list of ints, or a TypeError naming `what` (tokens, parents, nodes)."""
    try:
        return [operator.index(v) for v in values]
    except TypeError as exc:
        raise TypeError(f"{what} must be a sequence of integers, got {values!r}") from exc


def _layer_windows(config: Any) -> dict[str, int | None]:
    """Attention window per layer type (None = full causal), from a transformers config."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if not types:
        uses = getattr(text, "use_sliding_window", True)
        window = getattr(text, "sliding_window", None) if uses else None
        return {"full_attention": window}
    windows: dict[str, int | None] = {}
    for kind in set(types):
        if kind in _FULL_TYPES:
            windows[kind] = None
        elif kind in _WINDOWED_TYPES:
            windows[kind] = int(text.sliding_window)
        else:
            raise NotImplementedError(f"layer type {kind!r} is not supported by tree attention")
    return windows


def tree_bias(
    length: int,
    attach: np.ndarray,
    key_positions: np.ndarray,
    query_positions: np.ndarray,
    ancestors: np.ndarray,
    window: int | None,
    dtype: torch.dtype,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Additive attention bias [1, 1, n, length + T] for n new tree nodes, on `device`.

    A query sees cache slots up to its root's `attach` position and the tree slots marked in its
    `ancestors` row (itself included); a window W also hides keys W or more positions back.
    Only the boolean mask crosses to the device; the bias is filled there.
    """
    cache_visible = np.arange(length)[None, :] <= attach[:, None]
    visible = np.concatenate([cache_visible, ancestors], axis=1)
    if window is not None:
        visible &= (query_positions[:, None] - key_positions[None, :]) < window
    hidden = torch.from_numpy(~visible).to(device)
    bias = torch.zeros(visible.shape, dtype=dtype, device=device)
    bias.masked_fill_(hidden, torch.finfo(dtype).min)
    return bias[None, None]


class HFLanguageModel(LanguageModel):
    """`LanguageModel` over a transformers causal LM with a `DynamicCache` of full layers.

    Every layer keeps all of its keys (no sliding-window eviction), so rollback and compaction are
    plain tensor slicing; sliding-window layers get their window through the attention mask. The
    cache lives on the weights' `device`, where every pass's inputs are built.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: Any, name: str) -> None:
        self.model = model.eval()
        self.config = model.config
        self.tokenizer = tokenizer
        self.name = name
        first = next(model.parameters())
        self.dtype, self.device = first.dtype, first.device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self._windows = _layer_windows(model.config)
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._clear_state()

    def _clear_state(self) -> None:
        self._cache = DynamicCache()
        self._length = 0
        self._tree = _PendingTree()

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the config, the dtype and the first rows of the output embedding: two
        folders that agree on these are, for the handshake's purpose, the same model."""
        digest = hashlib.sha256(self.config.to_json_string(use_diff=False).encode())
        digest.update(str(self.dtype).encode())
        head = to_host(self.model.get_output_embeddings().weight[:64].detach())
        digest.update(head.numpy().tobytes())  # the same bytes on every device
        return digest.hexdigest()

    def __repr__(self) -> str:
        return (
            f"HFLanguageModel({self.name!r}, length={self._length}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    @property
    def length(self) -> int:
        return self._length

    @property
    def pending_tree_size(self) -> int:
        return len(self._tree)

    @torch.inference_mode()
    def extend(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        ids = self.check_tokens(ids, "ids")
        rows = self._check_rows(rows, len(ids))
        if len(self._tree):
            raise RuntimeError(
                "tree nodes are pending: call keep_tree_path() or truncate() before extend()"
            )
        if not ids:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        positions = list(range(self._length, self._length + len(ids)))
        logits = self._forward(ids, positions, mask=None, rows=rows)
        self._length += len(ids)
        return logits

    @torch.inference_mode()
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """Input embeddings [n, hidden] of `ids` (float32, CPU): what the first split point of
        split inference sends (the activations entering layer 0)."""
        ids = self.check_tokens(ids, "ids")
        table = self.model.get_input_embeddings()
        return to_host(table(torch.tensor([ids], device=self.device))[0])

    @torch.inference_mode()
    def extend_embeddings(self, embeddings: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """`extend` from activations instead of ids (split inference's cloud half)."""
        if len(self._tree):
            raise RuntimeError("tree nodes are pending: keep or drop them first")
        hidden = self.config.hidden_size
        if embeddings.ndim != 2 or embeddings.shape[1] != hidden:
            raise ValueError(f"embeddings must be [n, {hidden}], got {tuple(embeddings.shape)}")
        n = embeddings.shape[0]
        rows = self._check_rows(rows, n)
        positions = list(range(self._length, self._length + n))
        out = self.model(
            inputs_embeds=embeddings.to(device=self.device, dtype=self.dtype)[None],
            position_ids=torch.tensor([positions], device=self.device),
            use_cache=True,
            **{self._cache_kwarg: self._cache},
        )
        self._length += n
        return to_host(out.logits[0, n - rows :])

    @torch.inference_mode()
    def truncate(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= self._length:
            raise ValueError(f"truncate length must be an int in [0, {self._length}]: {length!r}")
        for layer in self._layers():
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
        self._length = length
        self._tree = _PendingTree()

    @torch.inference_mode()
    def tree_forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        tokens = self.check_tokens(tokens, "tokens")
        parents = as_token_ids(parents, "parents")
        if len(tokens) != len(parents):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
        if not tokens:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        grown = self._grow_tree(tokens, parents)
        mask = self._tree_mask(grown, len(tokens))
        logits = self._forward(tokens, grown.positions[-len(tokens) :], mask, len(tokens))
        self._tree = grown
        return logits

    @torch.inference_mode()
    def keep_tree_path(self, nodes: Sequence[int], keep_descendants: bool = False) -> None:
        nodes = as_token_ids(nodes, "nodes")
        tree = self._tree
        if not len(tree):
            raise RuntimeError("keep_tree_path() needs pending tree nodes from tree_forward()")
        if not nodes:
            self.truncate(self._length)
            return
        self._check_chain(nodes)
        keep_prefix = tree.attach[nodes[0]] + 1
        below = _descendants(tree.ancestors, nodes) if keep_descendants else []
        slots = [*range(keep_prefix), *(self._length + n for n in [*nodes, *below])]
        index = torch.tensor(slots, device=self.device)
        for layer in self._layers():
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
        self._length = keep_prefix + len(nodes)
        self._tree = _rerooted(tree, below, nodes, keep_prefix)

    # -- several sessions in one pass --------------------------------------------------------

    @staticmethod
    def can_batch(sessions: Sequence[LanguageModel]) -> bool:
        """Whether `extend_batch` can run these sessions in one pass: transformers sessions over
        the very same weights, none with a pending tree, no session twice."""
        if not sessions or not all(isinstance(s, HFLanguageModel) for s in sessions):
            return False
        first = sessions[0]
        return (
            all(s.model is first.model for s in sessions)  # type: ignore[attr-defined]
            and not any(s.pending_tree_size for s in sessions)
            and len({id(s) for s in sessions}) == len(sessions)
        )

    @classmethod
    @torch.inference_mode()
    def extend_batch(
        cls,
        sessions: Sequence[LanguageModel],
        token_lists: Sequence[Sequence[int]],
        rows: Sequence[int] | None = None,
    ) -> list[torch.Tensor]:
        """Append `token_lists[i]` to `sessions[i]` for every i in ONE forward pass; returns each
        session's float32 CPU logits, as `sessions[i].extend(token_lists[i], rows[i])` would (rows
        None: every row), bit for bit in invariant mode (`_RaggedCache` says why). The rows asked
        for leave the device together, in one copy.

        Needs `can_batch(sessions)` and at least one token per session. On failure every session is
        rolled back to where it was and the error propagates.
        """
        if not cls.can_batch(sessions):
            raise ValueError("extend_batch needs distinct transformers sessions of one model")
        hf: list[HFLanguageModel] = list(sessions)  # type: ignore[arg-type]
        ids = [s.check_tokens(t, "ids") for s, t in zip(hf, token_lists, strict=True)]
        if any(not row for row in ids):
            raise ValueError("every session of a batched pass needs at least one new token")
        lengths, new = [s.length for s in hf], [len(row) for row in ids]
        if rows is not None and len(rows) != len(new):
            raise ValueError(f"{len(rows)} row counts for {len(new)} sessions")
        given = new if rows is None else rows
        wanted = [cls._check_rows(given[i], n) for i, n in enumerate(new)]
        lead = hf[0]
        inputs = lead._ragged_inputs(ids, lengths, _RaggedCache(hf, new))
        try:
            out = lead.model(**inputs)
        except BaseException:
            for session, length in zip(hf, lengths, strict=True):
                session._length = length
                session.truncate(length)
            raise
        for session, n in zip(hf, new, strict=True):
            session._length += n
        picked = [out.logits[row, n - wanted[row] : n] for row, n in enumerate(new)]
        return list(to_host(torch.cat(picked)).split(wanted))  # one copy off the device

    def _ragged_inputs(
        self, ids: list[list[int]], lengths: list[int], cache: _RaggedCache
    ) -> dict[str, Any]:
        """The model's arguments for one pass over several sessions' new `ids` after their
        `lengths` cached tokens, through `cache`; every tensor built on the model's device."""
        new = [len(row) for row in ids]
        masks = {
            kind: _batch_bias(lengths, new, cache.width, window, self.dtype, self.device)
            for kind, window in self._windows.items()
        }
        positions = [range(length, length + n) for length, n in zip(lengths, new, strict=True)]
        return {
            "input_ids": _padded(ids, [0] * len(ids), self.device),
            "position_ids": _padded(positions, lengths, self.device),
            "attention_mask": masks if len(masks) > 1 else next(iter(masks.values())),
            "use_cache": True,
            self._cache_kwarg: cache,
        }

    # -- internals ---------------------------------------------------------------------------

    def _layers(self) -> list[Any]:
        return [layer for layer in self._cache.layers if layer.is_initialized]

    def _check_chain(self, nodes: list[int]) -> None:
        tree = self._tree
        if any(not 0 <= n < len(tree) for n in nodes):
            raise ValueError(f"nodes must be pending tree indices in [0, {len(tree)}): {nodes}")
        if tree.parents[nodes[0]] != -1:
            raise ValueError(f"path must start at a root (a node with a negative parent): {nodes}")
        for prev, node in itertools.pairwise(nodes):
            if tree.parents[node] != prev:
                raise ValueError(f"node {node} is not a child of node {prev}; path {nodes}")

    def _grow_tree(self, tokens: list[int], parents: list[int]) -> _PendingTree:
        """The pending tree with `tokens` appended; validates `parents`."""
        old = self._tree
        total = len(old) + len(tokens)
        ancestors = np.zeros((total, total), dtype=bool)
        ancestors[: len(old), : len(old)] = old.ancestors
        grown = _PendingTree(
            list(old.tokens), list(old.parents), list(old.attach), list(old.positions), ancestors
        )
        for offset, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
            node = len(old) + offset
            if parent >= node or parent < -(self._length + 1):
                raise ValueError(
                    f"parent {parent} of node {node} must be a pending node < {node} or a cache "
                    f"offset in [-{self._length + 1}, -1]"
                )
            if parent < 0:
                attach, position = self._length + parent, self._length + parent + 1
                grown.parents.append(-1)
            else:
                attach, position = grown.attach[parent], grown.positions[parent] + 1
                ancestors[node] = ancestors[parent]
                grown.parents.append(parent)
            ancestors[node, node] = True
            grown.tokens.append(token)
            grown.attach.append(attach)
            grown.positions.append(position)
        return grown

    def _tree_mask(self, tree: _PendingTree, n: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """One bias per attention-layer type; a dict only when the model mixes layer types."""
        attach = np.asarray(tree.attach[-n:])
        positions = np.asarray(tree.positions)
        keys = np.concatenate([np.arange(self._length), positions])
        masks = {
            kind: tree_bias(
                self._length,
                attach,
                keys,
                positions[-n:],
                tree.ancestors[-n:],
                window,
                self.dtype,
                self.device,
            )
            for kind, window in self._windows.items()
        }
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def _forward(
        self,
        ids: list[int],
        positions: list[int],
        mask: torch.Tensor | dict[str, torch.Tensor] | None,
        rows: int,
    ) -> torch.Tensor:
        """One pass over `ids` at `positions`; the last `rows` logits rows, on the CPU."""
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            attention_mask=mask,
            use_cache=True,
            **{self._cache_kwarg: self._cache},
        )
        return to_host(out.logits[0, len(ids) - rows :])


class _RaggedCache(DynamicCache):
    """The cache the layers of one pass over several sessions see; each session keeps its own.

    When a layer hands it the new keys and values of the whole batch, it appends row i's real
    (unpadded) ones to session i's cache and gives the layer back every session's full keys and
    values packed row by row, **each starting at slot 0, exactly where they sit when that session
    runs alone**, zero-padded at the end to the longest row. The attention mask (one additive bias
    per row from `tree_bias`, a chain being a tree without branches) shows each query its own
    session's cache and its own earlier new tokens only; positions come from `position_ids`.

    Why slot 0 and not the usual left padding: the pass-shape-invariant attention of
    `wanspec.models.invariant` sums keys in fixed blocks counted from the first slot, so a
    session's keys must occupy the same slots as alone for its logits to come out bitwise the
    same. With `make_batch_invariant` on, a session's logits in a batch therefore equal its logits
    alone bit for bit; with the default kernels they agree to float rounding (the summation order
    of a [B, n] pass differs from a [1, n] one), which can flip an exact tie but not a law.
    """

    def __init__(self, sessions: Sequence[HFLanguageModel], new: Sequence[int]) -> None:
        super().__init__()
        self.sessions, self.new = sessions, new
        self.width = max(s.length + n for s, n in zip(sessions, new, strict=True))

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_zeros((batch, heads, self.width, dim))
        values = value_states.new_zeros((batch, heads, self.width, value_states.shape[-1]))
        for row, (session, n) in enumerate(zip(self.sessions, self.new, strict=True)):
            own_keys, own_values = session._cache.update(
                key_states[row : row + 1, :, :n], value_states[row : row + 1, :, :n], layer_idx
            )
            keys[row, :, : own_keys.shape[-2]] = own_keys[0]
            values[row, :, : own_values.shape[-2]] = own_values[0]
        return keys, values


def _row_bias(length: int, n: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """[n, length + n] additive bias of n new chain tokens after `length` cached ones."""
    return tree_bias(
        length,
        attach=np.full(n, length - 1),
        key_positions=np.arange(length + n),
        query_positions=np.arange(length, length + n),
        ancestors=np.tril(np.ones((n, n), dtype=bool)),
        window=window,
        dtype=dtype,
    )[0, 0]


def _batch_bias(
    lengths: Sequence[int],
    new: Sequence[int],
    width: int,
    window: int | None,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """[B, 1, N, width] on `device`: each row's own bias, everything else hidden; a padding query
    sees slot 0 only (its output is dropped, but a row that sees nothing would be NaN). Built on
    the CPU row by row, then moved in one copy."""
    bias = torch.full((len(new), 1, max(new), width), torch.finfo(dtype).min, dtype=dtype)
    bias[:, :, :, 0] = 0
    for row, (length, n) in enumerate(zip(lengths, new, strict=True)):
        bias[row, 0, :n, : length + n] = _row_bias(length, n, window, dtype)
    return bias.to(device)


def _padded(
    rows: Sequence[Sequence[int]], fill: Sequence[int], device: torch.device
) -> torch.Tensor:
    """[B, N] integer tensor of ragged rows on `device`, row i padded with fill[i]."""
    width = max(len(r) for r in rows)
    padded = [[*r, *[f] * (width - len(r))] for r, f in zip(rows, fill, strict=True)]
    return torch.tensor(padded, device=device)


class _SwappedLinear(torch.nn.Linear):
    """nn.Linear computing x Wᵀ as (W xᵀ)ᵀ, with one row padded to two when threads are many.

    On CPU (MKL, fp32) the skinny `x @ Wᵀ` gemm that F.linear uses is 2-6x slower for a few rows
    than `W @ xᵀ`: for a 0.5B model this halves the cost of verifying 2-4 tokens. One row is
    a gemv, which MKL runs on one thread: with several threads the two-row gemm is ~20 %
    faster, with one thread the gemv is ~1.8x faster than it, so one row goes to F.linear
    there. Same math, only the summation order differs (~1e-6 relative).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if rows == 1:
            if torch.get_num_threads() == 1:
                return super().forward(x)
            flat = flat.repeat(2, 1)
        out = torch.mm(self.weight, flat.T)[:, :rows].T
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.weight.shape[0])


def use_swapped_linear(model: torch.nn.Module) -> int:
    """Switch every fp32 CPU nn.Linear of `model` to `_SwappedLinear`; returns how many (an
    accelerator's own kernels need no such help, so its layers stay as they are)."""
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            type(module) is torch.nn.Linear
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
        ):
            module.__class__ = _SwappedLinear
            count += 1
    return count


def uses_swapped_linear(model: torch.nn.Module) -> bool:
    """Whether `use_swapped_linear` switched any of `model`'s layers (profiles record it)."""
    return any(isinstance(m, _SwappedLinear) for m in model.modules())


def _eos_token_ids(model: PreTrainedModel, tokenizer: Any) -> tuple[int, ...]:
    """Stop tokens as `generate` would use them: generation config, else config, else tokenizer."""
    generation = getattr(model, "generation_config", None)
    for source in (
        getattr(generation, "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if source is not None:
            values = source if isinstance(source, (list, tuple)) else [source]
            return tuple(sorted({int(v) for v in values}))
    return ()


def resolve_invariant(dtype: torch.dtype, invariant: bool | None) -> bool:
    """Whether a model loaded in `dtype` runs in pass-shape-invariant mode: `invariant` as given,
    and None means "on unless float32". A 16-bit model must be invariant: its default kernels
    change a position's logits with the pass shape enough to flip greedy choices, which the
    exactness contract forbids (a position's q may not depend on the pass that computes it)."""
    if invariant is None:
        return dtype != torch.float32
    if not invariant and dtype != torch.float32:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"{name} models run only in pass-shape-invariant mode (invariant=True, --invariant; "
            f"the default for 16-bit dtypes): the default kernels change a position's logits "
            f"with the pass shape (decode, verification, tree) enough to flip greedy tokens, "
            f"which breaks the exactness contract; use float32 to run without it"
        )
    return invariant


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    attn_implementation: str = "sdpa",
    fast_linear: bool = True,
    invariant: bool | None = None,
    device: str | torch.device | None = "cpu",
) -> HFLanguageModel:
    """Load a local Hugging Face folder (model + tokenizer) as a `LanguageModel`.

    `threads` sets torch's process-wide intra-op thread count (default `default_threads()`).
    `fast_linear` swaps fp32 CPU linear layers to `_SwappedLinear` (faster, see there).
    `invariant` makes every pass pass-shape invariant (`wanspec.models.invariant`): a position's
    logits are bitwise the same in a one-token decode, a verification and a tree pass, at
    1.0-2x the CPU time per pass; it replaces `fast_linear`. None (default): on for a 16-bit
    `dtype`, off for float32; False with a 16-bit dtype is a ValueError (`resolve_invariant`),
    on any device. `device`: where the weights and KV caches live ("cpu", "cuda", "cuda:N",
    "mps"); one not present here is a ValueError before anything is read (`resolve_device`).
    Results still come back as float32 CPU tensors.
    """
    invariant = resolve_invariant(dtype, invariant)
    where = resolve_device(device)
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json)")
    threads = default_threads() if threads is None else threads
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=dtype,
        attn_implementation=attn_implementation,
        local_files_only=True,
    )
    model.to(where)  # before the linear swaps below, which look at where each weight lives
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if invariant:
        from wanspec.models.invariant import make_batch_invariant

        make_batch_invariant(model)
    elif fast_linear:
        use_swapped_linear(model)
    return HFLanguageModel(model, tokenizer, name=folder.name)
