# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A real vLLM engine on CPU (vLLM's CPU worker, Model Runner V2), with tiny models made
here: ``models`` writes them (seeded random weights, a tokenizer trained locally),
``tools.cpu_engine`` says how the engine runs on a CPU-only host, ``offline`` runs ``LLM``
engines one after another in a process of its own (as a script: the project is imported as
installed, never from this checkout), and ``runs`` drives both from the tests, ``make
demo`` and ``make bench``, and serves with ``vllm serve``; ``study`` runs the long-context
study of a committed drafter in the offline engine (``study_engine.py``), and
``dflash_forward.py`` one DFlash block through vLLM's own model class."""
