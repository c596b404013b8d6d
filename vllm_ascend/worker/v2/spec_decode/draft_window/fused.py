"""One kernel launch per window refresh: the windowed lengths and every group's cropped
table, for the padded batch, written into the window's persistent buffers.

The torch path (``Mrv2DraftWindow.refresh`` with ``fused=None``: ``window_seq_lens`` and one
``BlockTableWindow.gather`` per group) is the reference: this kernel computes the same
integers (window.py's arithmetic, row by row) and must equal it bit for bit. It launches a
fixed grid ``(num_reqs_padded, num_groups)`` from static sizes, reads no device value on the
host and allocates nothing per call, so a graph capture may record it. The groups' full
and cropped tables are reached through a pointer table built once (their buffers are
persistent), as vLLM's own MRV2 block-table kernels do.

Triton is imported lazily: without it the window runs the torch path.
"""

from __future__ import annotations

from typing import Any

import torch

_KERNEL: Any = None


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel() -> Any:
    """Compile-on-first-use: the module imports without Triton."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def refresh_kernel(
        src_lens_ptr,  # [n] int32: the lengths windowed (the draft's own, or a prefill's)
        told_ptr,  # [n] int32: the target's lengths the kernel is told from (TOLD)
        qsl_ptr,  # [n + 1] int32: query_start_loc of a multi-token pass (QUERY)
        seq_lens_out_ptr,  # [n] int32
        skip_out_ptr,  # [n] int32
        told_out_ptr,  # [n] int32: the told lengths, windowed (TOLD)
        src_tables_ptr,  # [G] int64: data_ptr of each group's full table (int32)
        dst_tables_ptr,  # [G] int64: data_ptr of each group's cropped table (int32)
        group_params_ptr,  # [G, 6] int64: src stride, num cols, dst stride, width, b, sinks
        told_step,
        max_model_len,
        window_size,
        alignment,
        future_offset,
        sink_size,
        TOLD: tl.constexpr,
        QUERY: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        g = tl.program_id(1)
        length = tl.load(src_lens_ptr + row)
        base = length
        if TOLD:
            base = tl.minimum(tl.load(told_ptr + row) + told_step, max_model_len)
        skip = tl.maximum(base + future_offset - window_size - sink_size, 0)
        skip = (skip // alignment) * alignment
        if QUERY:
            q = tl.load(qsl_ptr + row + 1) - tl.load(qsl_ptr + row)
            latest = length - q
            if sink_size > 0:
                latest = tl.maximum(latest - sink_size, 0)
            # floor division of a value >= 0 (q <= length)
            latest = (latest // alignment) * alignment
            skip = tl.minimum(skip, latest)
        read = length - skip
        if TOLD:
            read = base - skip
        if g == 0:
            tl.store(seq_lens_out_ptr + row, length - skip)
            tl.store(skip_out_ptr + row, skip)
            if TOLD:
                tl.store(told_out_ptr + row, read)

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
        tokens = read
        if future_offset > 0:
            tokens = read + future_offset * tl.minimum(read, 1)
        needed = (tokens + block_size - 1) // block_size
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

    _KERNEL = refresh_kernel
    return _KERNEL


class FusedRefresh:
    """The pointer table and static sizes of one window's groups, for one set of cropped
    tables (the per-step ones, or a draft prefill's wider ones), built once."""

    def __init__(self, window: Any, windows: dict[int, Any], full_tables: list[torch.Tensor]):
        self.window = window
        self.windows = windows
        device = window.seq_lens.device
        groups = sorted(windows)
        src = [full_tables[g] for g in groups]
        dst = [windows[g].block_table for g in groups]
        for table in (*src, *dst):
            if table.dtype != torch.int32 or table.stride(1) != 1:
                raise ValueError(
                    f"the fused window refresh needs int32 row-major tables, got "
                    f"{table.dtype} with strides {table.stride()}"
                )
        # NOTE: persistent tables: their addresses are fixed for the window's life.
        self.src_tables = torch.tensor([t.data_ptr() for t in src], dtype=torch.int64,
                                       device=device)  # fmt: skip
        self.dst_tables = torch.tensor([t.data_ptr() for t in dst], dtype=torch.int64,
                                       device=device)  # fmt: skip
        self.group_params = torch.tensor(
            [[s.stride(0), s.shape[1], d.stride(0), d.shape[1], windows[g].block_size,
              windows[g]._num_sink_cols]
             for g, s, d in zip(groups, src, dst, strict=True)],
            dtype=torch.int64, device=device,
        )  # fmt: skip
        self.num_groups = len(groups)
        max_width = max(d.shape[1] for d in dst)
        self.block = 1 << (max(max_width, 16) - 1).bit_length()
        self.block = min(self.block, 1024)

    def launch(
        self,
        num_reqs_padded: int,
        source: torch.Tensor,
        query_start_loc: torch.Tensor | None = None,
        told_step: int | None = None,
    ) -> None:
        """Window rows ``[0, num_reqs_padded)``: one launch."""
        window = self.window
        spec = window.spec
        told = told_step is not None
        dummy = window.seq_lens  # an int32 pointer for the inputs a variant does not read
        _kernel()[(num_reqs_padded, self.num_groups)](
            source,
            window.told_source if told else dummy,
            query_start_loc if query_start_loc is not None else dummy,
            window.seq_lens,
            window.window_skip,
            window.told_windowed,
            self.src_tables,
            self.dst_tables,
            self.group_params,
            told_step or 0,
            window.max_model_len,
            spec.window_size,
            spec.alignment,
            spec.future_offset,
            spec.sink_size,
            TOLD=told,
            QUERY=query_start_loc is not None,
            BLOCK=self.block,
        )


def compare_with_torch(
    window: Any,
    num_reqs_padded: int,
    source: torch.Tensor,
    query_start_loc: torch.Tensor | None = None,
    told_step: int | None = None,
) -> list[str]:
    """Refresh ``window`` through the torch path and through the fused kernel on the same
    inputs; return what differs (empty: bit for bit equal). Uses the window's own buffers,
    so only for a window no graph has recorded yet (a self-check's, or a test's)."""
    n = num_reqs_padded
    windows = window.windows if query_start_loc is None else window.chunk_windows
    kept = window.fused_steps, window.fused_chunks
    window.fused_steps = window.fused_chunks = None
    try:
        window.refresh(n, seq_lens=source, query_start_loc=query_start_loc, told_step=told_step)
    finally:
        window.fused_steps, window.fused_chunks = kept
    expected = _outputs(window, windows, n, told_step is not None)
    for buffer in (window.seq_lens, window.window_skip, window.told_windowed):
        buffer.fill_(-7)
    for cropped in windows.values():
        cropped.block_table.fill_(-7)
    fused = window.fused_steps if query_start_loc is None else window.fused_chunks
    fused.launch(n, source, query_start_loc, told_step)
    got = _outputs(window, windows, n, told_step is not None)
    return [name for name in expected if not torch.equal(expected[name], got[name])]


def _outputs(window: Any, windows: dict, n: int, told: bool) -> dict[str, torch.Tensor]:
    out = {"seq_lens": window.seq_lens[:n].clone(), "skip": window.window_skip[:n].clone()}
    if told:
        out["told_windowed"] = window.told_windowed[:n].clone()
    for g, cropped in windows.items():
        out[f"group {g} table"] = cropped.block_table[:n].clone()
    return out


def self_check(window: Any, seed: int = 0) -> list[str]:
    """The start-up check on the window's device: a synthetic window of the same shape (W,
    alignment, future offset, sinks, groups and block sizes; its own small tables and
    lengths) refreshed by both paths, for every variant the window uses. Returns what
    differs, named by variant (empty: the kernel may be used)."""
    from types import SimpleNamespace

    from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow

    spec = window.spec
    device = window.seq_lens.device
    gen = torch.Generator().manual_seed(seed)
    rows = 8
    max_len = 4 * (spec.sink_size + spec.window_size + spec.alignment)
    groups = sorted(window.group_block_sizes)
    num_groups = max(groups) + 1
    tables, sizes = [], []
    for g in range(num_groups):
        b = window.group_block_sizes.get(g, spec.alignment)
        cols = -(-max_len // b) + 3
        ids = torch.randint(1, 10_000, (rows, cols), generator=gen, dtype=torch.int32)
        tables.append(ids.to(device))
        sizes.append(b)
    buffers = SimpleNamespace(seq_lens=torch.zeros(rows, dtype=torch.int32, device=device))
    synthetic = Mrv2DraftWindow(
        window_size=spec.window_size, future_offset=spec.future_offset,
        input_buffers=buffers,
        block_tables=SimpleNamespace(input_block_tables=tables, block_sizes=sizes),
        draft_group_ids=groups, max_num_reqs=rows, device=device,
        max_chunk_len=2 * spec.window_size, attention_sinks=spec.sink_size,
    )  # fmt: skip
    # The values the window passes as kernel arguments where it can (Triton specializes on
    # some integer values): its max_model_len, 0 unless lengths are told.
    synthetic.max_model_len = window.max_model_len
    if window.told_source is not None:
        told = torch.randint(0, min(max_len, window.max_model_len), (rows,), generator=gen,
                             dtype=torch.int32)  # fmt: skip
        synthetic.told_source = told.to(device)
    synthetic.enable_fused()
    lengths = torch.randint(0, max_len, (rows,), generator=gen, dtype=torch.int32)
    lengths[-2:] = 0  # padded rows
    source = lengths.to(device)
    query_lens = torch.minimum(torch.randint(1, 2 * spec.window_size, (rows,), generator=gen,
                                             dtype=torch.int32), lengths)  # fmt: skip
    qsl = torch.zeros(rows + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    variants = {"decode": {}, "prefill": {"query_start_loc": qsl.to(device)}}
    if window.told_source is not None:
        variants["told"] = {"told_step": 1}
    problems = []
    for name, kwargs in variants.items():
        if name == "prefill" and spec.future_offset:
            continue
        diff = compare_with_torch(synthetic, rows, source, **kwargs)
        problems += [f"{name}: {d}" for d in diff]
    return problems


def enable_if_trusted(window: Any, logger: Any, key: str, allow_cpu: bool = False) -> bool:
    """Use the one-launch refresh on the window's device only after the self-check there
    agrees with the torch path; otherwise say why once and keep the torch path. On CPU only
    with ``allow_cpu`` (Triton's interpreter there says nothing about speed)."""
    if window.seq_lens.device.type == "cpu" and not allow_cpu:
        return False
    if not triton_available():
        return False
    try:
        problems = self_check(window)
        if not problems:
            window.enable_fused()
    except Exception as error:  # a compiler, runtime or table layout the kernel cannot take
        window.fused_steps = window.fused_chunks = None
        problems = [f"the kernel did not run ({type(error).__name__}: {error})"]
    if problems:
        logger.warning(
            "%s: the one-launch window refresh disagrees with the torch path on %s (%s); "
            "the window refreshes with the torch path.",
            key,
            window.seq_lens.device,
            "; ".join(problems),
        )
        return False
    logger.info(
        "%s: the window refreshes with one kernel launch on %s.", key, window.seq_lens.device
    )
    return True
