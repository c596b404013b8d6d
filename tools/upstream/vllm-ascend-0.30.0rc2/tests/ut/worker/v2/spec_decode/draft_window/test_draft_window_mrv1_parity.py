# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Parity of the Model Runner V2 draft KV window with Model Runner V1's
``SlidingWindowAdapter`` on the same batches: the same windowed device lengths and host
lengths, and the same cropped block table over the columns Model Runner V1 reads. Model
Runner V1 windows with one block size, so the alignment here is that block size."""

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.spec_decode.utils import SlidingWindowAdapter
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    window_seq_lens,
)

HOST_LENGTHS = ("seq_lens_cpu", "_seq_lens_cpu")


def _batch(seed: int, window_size: int, block_size: int, future_offset: int):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3000, (8,), generator=generator, dtype=torch.int32)
    lengths[0] = 0  # a padded row
    num_cols = -(-(int(lengths.max()) + future_offset) // block_size) + 1
    table = torch.randint(1, 1 << 20, (8, num_cols), generator=generator, dtype=torch.int32)
    return lengths, table


def _model_runner_v1(window_size, block_size, future_offset, lengths, table):
    adapter = SlidingWindowAdapter(window_size, block_size, lengths.shape[0], future_offset, torch.device("cpu"))
    metadata = SimpleNamespace(
        block_table_tensor=table,
        seq_lens=lengths.clone(),
        **{name: lengths.clone() for name in HOST_LENGTHS},
    )
    adapter.apply(metadata)
    return metadata


def _model_runner_v2(window_size, block_size, future_offset, lengths, table):
    """The window over metadata that also serves ``future_offset`` later tokens (an EAGLE
    step's): the start of the last read, ``L + K``, applied to the length read now."""
    spec = WindowSpec(window_size, block_size)
    last = lengths + future_offset * (lengths > 0).to(lengths.dtype)
    skip, last_read = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(last, spec, skip_out=skip, out=last_read)
    cropped = BlockTableWindow(spec, block_size, lengths.shape[0], "cpu")
    return lengths - skip, cropped.gather(table, skip, last_read, lengths.shape[0])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "window_size,block_size,future_offset",
    [(128, 64, 0), (50, 16, 0), (1024, 128, 0), (64, 16, 3), (512, 128, 5), (33, 1, 7)],
)
def test_the_window_reads_what_model_runner_v1_reads(seed, window_size, block_size, future_offset):
    lengths, table = _batch(seed, window_size, block_size, future_offset)

    theirs = _model_runner_v1(window_size, block_size, future_offset, lengths, table)
    windowed, cropped = _model_runner_v2(window_size, block_size, future_offset, lengths, table)

    assert torch.equal(windowed, theirs.seq_lens)
    for name in HOST_LENGTHS:
        assert torch.equal(windowed, getattr(theirs, name)), name
    for i, length in enumerate(windowed.tolist()):
        read_cols = -(-length // block_size)
        assert torch.equal(cropped[i, :read_cols], theirs.block_table_tensor[i, :read_cols])
        if future_offset == 0:
            # Nothing is read past the windowed length: both leave the rest null.
            assert not cropped[i, read_cols:].any()
            assert not theirs.block_table_tensor[i, read_cols:].any()


def test_dflash_window_of_128_tokens_in_blocks_of_64():
    lengths = torch.tensor([300], dtype=torch.int32)
    table = torch.arange(1, 11, dtype=torch.int32).reshape(1, 10)

    windowed, cropped = _model_runner_v2(128, 64, 0, lengths, table)
    theirs = _model_runner_v1(128, 64, 0, lengths, table)

    assert windowed.tolist() == theirs.seq_lens.tolist() == [172]
    # The blocks of tokens [128, 320): the window start 300 - 128 = 172 rounded down to 128.
    assert cropped[0].tolist() == theirs.block_table_tensor[0, :3].tolist() == [3, 4, 5]
