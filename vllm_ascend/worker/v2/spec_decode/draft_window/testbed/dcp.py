"""A reference for the window under decode context parallelism (DCP), for tests and the
inspector: every rank's share of the KV cache in one process, each rank's partial
attention over exactly what its kernel is handed, and their log-sum-exp combination.

Where a token lives is vLLM's layout (``owner``, ``local_position``), stated here from its
definition and checked against vLLM's own slot-mapping kernel in the tests; a rank's read
takes the keys its (cropped table, local length) point at, and their positions from a
position cache written through the same slots, so the causal mask and the comparison with
dense attention use what was written, not what the window computed.
"""

from __future__ import annotations

import torch


def owner(p: torch.Tensor, cp_size: int, interleave: int) -> torch.Tensor:
    """The rank holding token ``p``: chunks of ``interleave`` tokens, round robin."""
    return (p // interleave) % cp_size


def local_position(p: torch.Tensor, cp_size: int, interleave: int, unit: int) -> torch.Tensor:
    """Token ``p``'s position in its rank's local sequence: virtual block ``p // (cp u)``
    holds ``u`` local tokens per rank, in order (``unit``: ``u``)."""
    virtual = cp_size * unit
    offset = p % virtual
    rounds, rest = offset // (cp_size * interleave), offset % interleave
    return (p // virtual) * unit + rounds * interleave + rest


class DcpCaches:
    """Every rank's paged cache of one KV-cache group: K, V and the positions written."""

    def __init__(self, cp_size: int, interleave: int, unit: int, num_blocks: int, heads: int,
                 head_dim: int) -> None:  # fmt: skip
        self.cp_size, self.interleave, self.unit = cp_size, interleave, unit
        slots = num_blocks * unit
        nan = float("nan")
        self.k = torch.full((cp_size, slots, heads, head_dim), nan, dtype=torch.float64)
        self.v = torch.full((cp_size, slots, heads, head_dim), nan, dtype=torch.float64)
        # -1: never written.
        self.pos = torch.full((cp_size, slots), -1, dtype=torch.int64)

    def write(self, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Positions ``[0, len(k))`` of one request through its full table (block ids per
        column, the same on every rank), each to its owner's local slot."""
        p = torch.arange(k.shape[0])
        rank = owner(p, self.cp_size, self.interleave)
        local = local_position(p, self.cp_size, self.interleave, self.unit)
        row = torch.tensor(block_ids, dtype=torch.int64)
        slots = row[local // self.unit] * self.unit + local % self.unit
        self.k[rank, slots], self.v[rank, slots], self.pos[rank, slots] = k, v, p

    def read(self, rank: int, table_row: torch.Tensor, local_len: int, q: torch.Tensor,
             q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Rank ``rank``'s partial causal attention of ``q`` [q_len, H, D] at positions
        ``q_pos`` over the first ``local_len`` local tokens of ``table_row``: (output
        [q_len, H, D], log-sum-exp [q_len, H], the positions read)."""
        j = torch.arange(local_len)
        slots = table_row[j // self.unit].long() * self.unit + j % self.unit
        pos = self.pos[rank, slots]
        assert (pos >= 0).all(), f"rank {rank} read a slot never written"
        out, lse = partial_attention(q, q_pos, self.k[rank, slots], self.v[rank, slots], pos)
        return out, lse, pos


def partial_attention(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Causal attention of ``q`` at ``q_pos`` over keys at positions ``pos``: (output, its
    log-sum-exp, -inf where a query sees no key), what a DCP rank hands the combination."""
    scores = torch.einsum("qhd,khd->qhk", q, k) / q.shape[-1] ** 0.5
    visible = pos[None, :] <= q_pos[:, None]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.where(torch.isinf(lse)[..., None], 0.0, (scores - lse[..., None]).exp())
    return torch.einsum("qhk,khd->qhd", weights, v), lse


def combine(outputs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """The ranks' partial outputs combined as DCP combines them: vLLM's own log-sum-exp
    weighted combination (``_lse_weighted_combine``, its CPU reference)."""
    from vllm.v1.attention.ops.dcp import _lse_weighted_combine

    return _lse_weighted_combine(torch.stack(outputs), torch.stack(lses))
