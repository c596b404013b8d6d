# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The lossless check: every run's generated texts against a reference run's (the run
without speculation, or the V2 run with the window where there is none).

Speculative decoding is lossless in principle: greedy, the target decides every token. On
this project's CPU runs (vLLM's CPU worker, float32 or bfloat16) the texts are identical
whatever the batch, so the check there is exact: one divergence fails, and names itself
(workload, prompt, first differing character). On an accelerator in bfloat16 the verify step
runs other batch shapes than plain decoding, and a batch's composition moves rounding, so a
near-tie token can flip and the rest of that text follows it: there the check counts the
prompts whose texts are identical and fails only below ``MIN_IDENTICAL`` of them (vLLM's own
spec-decode end-to-end tests accept 66% identical for the same reason). A fault of the window
that reached the target (its KV or block tables) would change every text past the window,
far below that fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's threshold in tests/v1/e2e/test_spec_decode.py, for the same cause (rounding across
# batch shapes in bfloat16). Not stricter: the study's texts are longer (up to 256 tokens
# after up to 128k of context), and one flipped token diverges the rest of a text.
MIN_IDENTICAL = 0.66
MODES = ("exact", "fraction")


@dataclass(frozen=True)
class Policy:
    """``exact``: every text identical; ``fraction``: at least ``min_identical`` of the
    prompts' texts identical."""

    mode: str = "exact"
    min_identical: float = MIN_IDENTICAL

    @classmethod
    def for_run(cls, device: str, env: dict[str, str]) -> Policy:
        """Exact on CPU (greedy there is bit-exact), the fraction on a device; ``LOSSLESS``
        and ``MIN_IDENTICAL`` choose otherwise. Sampled (``TEMPERATURE`` above 0) the texts
        are not expected to match: counted, never failed (the acceptance is checked)."""
        mode = env.get("LOSSLESS") or ("exact" if device == "cpu" else "fraction")
        if float(env.get("TEMPERATURE") or 0) > 0:
            mode = "sampled"
        return cls(mode, float(env.get("MIN_IDENTICAL") or MIN_IDENTICAL))

    def describe(self) -> str:
        if self.mode == "sampled":
            return "sampled: texts counted, not expected to match"
        if self.mode == "exact":
            return "exact: every text identical"
        return f"fraction: at least {self.min_identical:.0%} of the prompts' texts identical"


def first_difference(a: str, b: str) -> int:
    """The first character where ``a`` and ``b`` differ (the shorter's length when one is the
    other's beginning)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(reference: dict[str, list[str]], texts: dict[str, list[str]]) -> dict:
    """How many of the reference's prompts ``texts`` reproduces exactly, and where each
    other one first diverges (a workload or prompt missing diverges at 0)."""
    total, identical, divergences = 0, 0, []
    for workload, expected in reference.items():
        got = texts.get(workload) or []
        for i, want in enumerate(expected):
            total += 1
            text = got[i] if i < len(got) else None
            if text == want:
                identical += 1
                continue
            at = 0 if text is None else first_difference(text, want)
            divergences.append({"workload": workload, "prompt": i, "character": at})
    return {"identical": identical, "total": total, "divergences": divergences}


def describe_divergences(divergences: list[dict], most: int = 5) -> str:
    shown = [
        f"{d['workload']} prompt {d['prompt']} from character {d['character']}" for d in divergences
    ]
    more = f" and {len(shown) - most} more" if len(shown) > most else ""
    return ", ".join(shown[:most]) + more


def verdict(name: str, reference: str, compared: dict, policy: Policy) -> str | None:
    """The failure of run ``name`` against ``reference`` under ``policy``, or None."""
    identical, total = compared["identical"], compared["total"]
    if total == 0:
        return f"{name}: no texts to compare with {reference}'s"
    if not compared["divergences"] or policy.mode == "sampled":
        return None
    where = describe_divergences(compared["divergences"])
    if policy.mode == "exact":
        return (
            f"greedy outputs of {name} differ from {reference} in {total - identical} of "
            f"{total} prompts: {where}"
        )
    if identical / total < policy.min_identical:
        return (
            f"{name}: {identical} of {total} texts identical to {reference}'s "
            f"({identical / total:.0%}), below MIN_IDENTICAL={policy.min_identical:g}; "
            f"first divergences: {where}"
        )
    return None


def check(
    results: dict[str, dict], reference: str, policy: Policy
) -> tuple[dict[str, dict], list[str]]:
    """Every run's texts (``results[run]["outputs"]``: workload -> texts) against
    ``reference``'s: what each reproduces (kept in the report) and the failures."""
    expected = results[reference]["outputs"]
    found, failures = {}, []
    for name, run in results.items():
        if name == reference:
            continue
        compared = compare(expected, run["outputs"])
        found[name] = {"reference": reference, **compared}
        failure = verdict(name, reference, compared, policy)
        if failure:
            failures.append(failure)
    return found, failures
