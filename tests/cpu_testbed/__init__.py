# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What only the CPU tests use: speculators started, stepped and captured as a server does,
their checks, and the dry run's commands read by vLLM's own command line."""
