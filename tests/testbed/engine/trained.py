# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Moved: the tiny models and their recipe are ``trained_models/`` (committed fixtures). Kept
only for ``tests/test_engine_load.py`` until it reads ``trained_models.committed()``; it then
goes."""

from trained_models import committed
from trained_models.recipe import (
    DRAFT_CONTEXT,
    NUM_SPEC,
    TARGET_CONTEXT,
    TrainedModels,
    trained_models,
)

__all__ = [
    "DRAFT_CONTEXT",
    "NUM_SPEC",
    "TARGET_CONTEXT",
    "TrainedModels",
    "committed",
    "trained_models",
]
