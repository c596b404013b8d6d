# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What vllm-ascend adds to vLLM's speculator families, one module each."""
