"""A draft that aims at its own cache (`draft_reshape`): every row the edge drafts from, in the
chain, in the tree and in a redraft, is the same reshaped p̃, so the tree still only saves draft
work. The law with a reshaped p̃ is checked in test_protocols_exact_law.py and
test_protocols_pooled_law.py."""

from __future__ import annotations

import numpy as np
import pytest

from wanspec.sampling.logits import TorchLogitRows
from worlds import PROMPT_IDS, World, check_the_tree_never_changes_the_tokens

RESHAPE = {"draft_reshape": 0.4, "draft_reshape_top": 2}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_a_reshaped_draft_the_tree_never_changes_the_tokens(
    shared_world: World, seed: int
) -> None:
    settings = dict(seed=seed, max_new_tokens=24, temperature=1.2, gamma=3, **RESHAPE)
    reference = check_the_tree_never_changes_the_tokens(shared_world, **settings)
    plain, _, _ = shared_world.run("picospec", **{**settings, "draft_reshape": 1.0})
    assert plain.tokens != reference  # the reshape is really in play


@pytest.mark.parametrize("method", ["sd", "acespec"])
def test_the_edge_drafts_from_reshaped_rows_alone_and_in_a_block(
    shared_world: World, method: str
) -> None:
    """The edge's rows (one drafted position, or a tree pass's block) are the plain rows
    reshaped, and the chain and the tree get the same row for the same logits."""
    world = shared_world
    world.draft.reset()
    block = world.draft.extend([*PROMPT_IDS, 7, 11, 13])[-4:]
    edge = world.edge(method, **RESHAPE)
    rows = edge._draft_rows(TorchLogitRows(block), ranks=4)
    plain_rows = world.edge(method)._draft_rows(TorchLogitRows(block), ranks=4)
    for i, (row, base) in enumerate(zip(rows, plain_rows, strict=True)):
        np.testing.assert_array_equal(row.counts, base.reshaped(2, 0.4).counts)
        assert not np.array_equal(row.counts, base.counts)
        alone = edge._draft_row(TorchLogitRows(block[i : i + 1]), ranks=4)
        np.testing.assert_array_equal(alone.counts, row.counts)
