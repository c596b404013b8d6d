# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The DFlash family's own heads, stood in for both releases' draft model stand-ins."""

import functools
import inspect
from types import SimpleNamespace

import torch

# DFlash2's and LiLiCorr's candidates per draft position.
FAMILY_TOP_K = 4


class FamilyHeads(torch.nn.Module):
    """Stand-in for the DFlash family's own heads (no weights on CPU): XPress's Jacobi
    refiner, DFlash2's candidate selector, LiLiCorr's scorer and norm. Each call records
    whether a forward context was set: one is where a pass can reach attention metadata."""

    def __init__(self, hidden_size: int, top_k: int) -> None:
        super().__init__()
        self.hidden_size, self.top_k = hidden_size, top_k
        # (head, whether a forward context was available) per call.
        self.calls: list[tuple[str, bool]] = []
        self.xpress_head = SimpleNamespace(jacobi_refine_greedy=self._jacobi_refine_greedy)

    def called(self, head: str) -> None:
        from vllm.forward_context import is_forward_context_available

        self.calls.append((head, is_forward_context_available()))

    def _jacobi_refine_greedy(
        self, base_logits, hidden, anchor_ids, previous_ids, num_passes, **kwargs
    ):
        self.called("xpress_head")
        draft = torch.zeros(hidden.shape[0], hidden.shape[1] - 1, dtype=torch.int64)
        return refined(draft, **kwargs)

    def candidate_selector(self, candidate_ids, unary_logits, hidden_states, anchor_ids):
        self.called("candidate_selector")
        return self._scores(candidate_ids)

    def lilicorr(self, embeddings, unary_logits, hidden_states, anchor_hidden, anchor_valid):
        self.called("lilicorr")
        return self._scores(unary_logits)

    def hidden_norm(self, hidden_states):
        self.called("hidden_norm")
        return hidden_states

    def _scores(self, per_candidate):
        """Pairwise scores [requests, steps, K, K] over the candidates (the walk's input)."""
        return torch.zeros(*per_candidate.shape, self.top_k)


@functools.cache
def refiner_returns_logits() -> bool:
    """Where vLLM 0.33 and 0.34 differ, asked of the installed vLLM: 0.34's XPress refiner
    also returns the last pass's logits per draft slot (None unless ``return_logits``),
    0.33's the draft ids alone. Asked at the first call: only XPress calls it, which the
    Ascend releases' vLLM does not have."""
    from vllm.model_executor.models.qwen3_xpress import XPressRefinerHead

    return "return_logits" in inspect.signature(XPressRefinerHead.jacobi_refine_greedy).parameters


def refined(draft: torch.Tensor, return_logits: bool = False) -> object:
    """What XPress's ``jacobi_refine_greedy`` returns for the draft ids ``draft`` on the
    installed vLLM (no logits: the stand-in's drafts come from none)."""
    if not refiner_returns_logits():
        return draft
    assert not return_logits, "no acceptance estimator runs in these tests"
    return draft, None


def candidates(model, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash2's and LiLiCorr's ``compute_candidates`` on a stand-in draft model: the first
    ``top_k`` token ids and zero unary scores, for each hidden state."""
    model.model.called("compute_candidates")
    n, top_k = hidden_states.shape[0], model.model.top_k
    return torch.arange(top_k, dtype=torch.int64).repeat(n, 1), torch.zeros(n, top_k)
