# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What only the plugin form of the window needs: the ``vllm.general_plugins`` entry point,
the hooks it installs around vLLM's and vllm-ascend's speculators, and the releases it serves
besides the one vllm-ascend's tree names at its call sites."""
