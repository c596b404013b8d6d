# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every rank of a decode-context-parallel (DCP) layout in one process, on the Ascend pairing.

A rank is vllm-ascend's real speculator and metadata builders over that rank's
``AscendBlockTables`` (cp size, rank, interleave), with only the process groups stood in
(``on_rank``). What a rank's FIA/MLA kernel is handed (its cropped block table and its host
list of local lengths) is read from every rank's reference cache and checked by the test
bed's ``testbed.dcp.assert_ranks_read_the_window``, as on vLLM's own builders.
"""

import pytest
import vllm.distributed.parallel_state as parallel_state

# (cp, interleave) over sizes 2, 4 and 8, interleave 1 and the block size (``BLOCK``: the
# interleave stands for "block-sized").
BLOCK = "block"


class GroupStandIn:
    """Stand-in for a vLLM process group (HCCL collectives between NPUs): the size, rank
    and member ranks vllm-ascend's builders and speculators read; no collective runs here."""

    def __init__(self, name: str, world_size: int, rank: int) -> None:
        self.unique_name, self.world_size, self.rank_in_group = name, world_size, rank
        self.ranks, self.device_group = list(range(world_size)), None


def on_rank(monkeypatch, cp_size: int, rank: int) -> None:
    """Make ``rank`` of ``cp_size`` the DCP rank vllm-ascend reads (``get_dcp_group``), with
    no prefill context parallelism and one tensor-parallel rank (the DCP attention impls of
    the registered layers keep all three groups)."""
    monkeypatch.setattr(parallel_state, "_DCP", GroupStandIn("dcp", cp_size, rank))
    monkeypatch.setattr(parallel_state, "_PCP", GroupStandIn("pcp", 1, 0))
    monkeypatch.setattr(parallel_state, "_TP", GroupStandIn("tp", 1, 0))


@pytest.fixture
def dcp_builders():
    """vllm-ascend picks its DCP metadata builders through ``enable_dcp()``, which caches the
    first config it sees for the process: cleared so that each test's config decides, and
    cleared after it so that later tests get the builders of their own config."""
    from vllm_ascend.attention.utils import enable_dcp

    enable_dcp.cache_clear()
    yield
    enable_dcp.cache_clear()


def interleave_of(interleave, block_size: int) -> int:
    return block_size if interleave == BLOCK else int(interleave)
