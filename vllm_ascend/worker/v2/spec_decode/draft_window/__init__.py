"""Draft KV sliding window for vLLM Model Runner V2 speculators.

With ``additional_config={"draft_window_size": W}`` the draft model attends only to the
last W tokens of each request (start aligned down to a block), while the target keeps full
attention and the draft's KV writes stay at absolute positions. ``draft_attention_sinks``
(S) also keeps the first S tokens of each request (rounded up to the block alignment).
"""

from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    align_sinks,
    lcm_alignment,
    seq_lens_upper_bound,
    window_seq_lens,
)

__all__ = [
    "BlockTableWindow",
    "WindowSpec",
    "align_sinks",
    "lcm_alignment",
    "seq_lens_upper_bound",
    "window_seq_lens",
]
