# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m e2e``: the end-to-end harness (``make e2e-ascend``, ``make study-cpu``)."""

from e2e.harness import main

if __name__ == "__main__":
    raise SystemExit(main())
