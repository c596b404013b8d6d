# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m tools.inspector`` (``make demo``): the window inspector."""

from tools.inspector.inspector import main

raise SystemExit(main())
