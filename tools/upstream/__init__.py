# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window as a patch to vllm-ascend (``make upstream-patch``): the second form of the
serving package, generated from it (design/upstream.md).

A patch for one vllm-ascend release is made of
- the package's core as new files under ``vllm_ascend/worker/v2/spec_decode/draft_window/``
  (everything but ``overlay/``, the plugin form's own folder);
- the explicit call sites in vllm-ascend's own files (``<release>/call_sites.diff``: each
  calls the function of the package the overlay's hook calls);
- the patch's own unit tests in vllm-ascend's layout (``<release>/tests/ut/...``).
"""
