# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft KV window's one-launch refresh as a Triton kernel (``fused.py`` launches it):
one program per (request row, KV-cache group) computes the row's windowed length and skip
(``window.py``'s arithmetic) and writes the group's cropped table row. Imported only where
Triton is."""

import triton
import triton.language as tl


@triton.jit
def draft_window_refresh_kernel(
    src_lens_ptr,  # [n] int32: the lengths windowed (the draft's own, or a prefill's)
    actual_ptr,  # [n] int32: the target's lengths the actual lengths start from (ACTUAL)
    qsl_ptr,  # [n + 1] int32: query_start_loc of a multi-token pass (QUERY)
    seq_lens_out_ptr,  # [n] int32
    skip_out_ptr,  # [n] int32
    actual_out_ptr,  # [n] int32: the actual lengths, windowed (ACTUAL)
    src_tables_ptr,  # [G] int64: data_ptr of each group's full table (int32)
    dst_tables_ptr,  # [G] int64: data_ptr of each group's cropped table (int32)
    group_params_ptr,  # [G, 6] int64: src stride, num cols, dst stride, width, b, sinks
    actual_step,
    max_model_len,
    window_size,
    alignment,
    sink_size,
    min_context,
    ACTUAL: tl.constexpr,
    QUERY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    g = tl.program_id(1)
    length = tl.load(src_lens_ptr + row)
    base = length
    if ACTUAL:
        base = tl.minimum(tl.load(actual_ptr + row) + actual_step, max_model_len)
    skip = tl.maximum(base - window_size - sink_size, 0)
    skip = (skip // alignment) * alignment
    # Below the threshold the whole context is read (min_context 0: never below).
    skip = tl.where(base >= min_context, skip, 0)
    if QUERY:
        q = tl.load(qsl_ptr + row + 1) - tl.load(qsl_ptr + row)
        latest = length - q
        if sink_size > 0:
            latest = tl.maximum(latest - sink_size, 0)
        # floor division of a value >= 0 (q <= length)
        latest = (latest // alignment) * alignment
        skip = tl.minimum(skip, latest)
    read = length - skip
    if ACTUAL:
        read = base - skip
    if g == 0:
        tl.store(seq_lens_out_ptr + row, length - skip)
        tl.store(skip_out_ptr + row, skip)
        if ACTUAL:
            tl.store(actual_out_ptr + row, read)

    params = group_params_ptr + g * 6
    src_stride = tl.load(params)
    num_cols = tl.load(params + 1)
    dst_stride = tl.load(params + 2)
    width = tl.load(params + 3)
    block_size = tl.load(params + 4)
    sink_cols = tl.load(params + 5)
    src = tl.load(src_tables_ptr + g).to(tl.pointer_type(tl.int32))
    dst = tl.load(dst_tables_ptr + g).to(tl.pointer_type(tl.int32))

    skip_blocks = skip // block_size
    needed = (read + block_size - 1) // block_size
    needed = tl.minimum(needed + skip_blocks, num_cols) - skip_blocks
    needed = tl.maximum(needed, 0)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < width
        src_cols = tl.where(cols < sink_cols, cols, cols + skip_blocks)
        src_cols = tl.minimum(src_cols, num_cols - 1)
        ids = tl.load(src + row * src_stride + src_cols, mask=inside, other=0)
        ids = tl.where(cols < needed, ids, 0)
        tl.store(dst + row * dst_stride + cols, ids, mask=inside)
