# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Random paged batches for the window-math tests: full tables, caches and true K/V."""

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from testbed.reference import PagedKVCache
from vllm_ascend.worker.v2.spec_decode.draft_window.window import align_sinks, lcm_alignment

NUM_HEADS, HEAD_DIM = 2, 4


@dataclass
class Group:
    block_size: int
    # [num_reqs, num_cols] int32: the full table, stale ids past each request's blocks
    full_block_table: torch.Tensor
    cache: PagedKVCache


@dataclass
class Case:
    window_size: int
    # [num_reqs] int32: 0 marks a padded row
    seq_lens: torch.Tensor
    groups: list[Group]
    # per request: true K and V [seq_len + lookahead, H, D] at absolute positions
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    # draft_attention_sinks as configured (rounded up to the alignment by the window)
    sink_tokens: int = 0
    # draft_window_min_context, above the window's reach (0: every context is windowed)
    min_context: int = 0

    @property
    def alignment(self) -> int:
        return lcm_alignment([g.block_size for g in self.groups])

    @property
    def sink_size(self) -> int:
        return align_sinks(self.sink_tokens, self.alignment)


@st.composite
def cases(
    draw, max_len: int = 400, max_window: int = 200, sinks: bool = True, threshold: bool = False
) -> Case:
    """``threshold``: a ``min_context`` above the window's reach, lengths around it too."""
    block_sizes = draw(
        st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=2, unique=True)
    )
    window_size = draw(st.integers(1, max_window))
    # Half without sinks, half with up to a few alignments of them.
    sink_tokens = draw(st.one_of(st.just(0), st.integers(1, 100))) if sinks else 0
    # Where the first tokens start to be left out.
    edge = window_size + align_sinks(sink_tokens, lcm_alignment(block_sizes))
    reach = edge + lcm_alignment(block_sizes)
    min_context = draw(st.integers(reach + 1, max(max_len, reach + 1) + 40)) if threshold else 0
    # 0 is a padded row; bias towards lengths around block, window and threshold boundaries.
    lengths = st.one_of(
        st.just(0),
        st.integers(1, max_len),
        st.integers(max(edge - 40, 1), edge + 40),
        *([st.integers(max(min_context - 40, 1), min_context + 40)] if threshold else []),
    )
    seq_lens = draw(st.lists(lengths, min_size=1, max_size=4))
    # 0 extra columns: the table ends right after the last block a request needs,
    # inside the cropped table's width.
    extra_cols = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    case = build_case(block_sizes, window_size, seq_lens, extra_cols, seed)
    case.sink_tokens = sink_tokens
    case.min_context = min_context
    return case


def build_case(
    block_sizes: list[int],
    window_size: int,
    seq_lens: list[int],
    extra_cols: int,
    seed: int,
    lookahead: int = 0,
) -> Case:
    """``lookahead``: tokens past each request's length that its table and K/V also hold
    (the later steps MRV1's one window per propose serves, for the MRV1 comparisons)."""
    gen = torch.Generator().manual_seed(seed)
    ends = [length + lookahead if length > 0 else 0 for length in seq_lens]
    k = [torch.randn(end, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64) for end in ends]
    v = [torch.randn(end, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64) for end in ends]
    groups = []
    for b in block_sizes:
        blocks_per_req = [-(-end // b) for end in ends]
        num_cols = max(max(blocks_per_req), 1) + extra_cols
        num_blocks = sum(blocks_per_req) + 2
        ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).to(torch.int32)
        # Stale ids past a request's own blocks, as the gathered tables keep them.
        table = torch.randint(1, num_blocks, (len(seq_lens), num_cols), generator=gen)
        table = table.to(torch.int32)
        cache = PagedKVCache(num_blocks, b, NUM_HEADS, HEAD_DIM)
        used = 0
        for i, n in enumerate(blocks_per_req):
            table[i, :n] = ids[used : used + n]
            used += n
            if seq_lens[i] == 0:
                table[i] = 0  # a padded row of the gathered table is zero
            else:
                positions = torch.arange(ends[i])
                cache.write(table[i], positions, k[i], v[i])
        groups.append(Group(b, table, cache))
    return Case(
        window_size=window_size,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        groups=groups,
        k=k,
        v=v,
    )
