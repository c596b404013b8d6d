# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m tools.inspector`` (``make demo``): the window inspector."""

from tools.inspector.common import quiet_vllm

quiet_vllm()  # before vLLM's first import

from tools.inspector.inspector import main  # noqa: E402

raise SystemExit(main())
