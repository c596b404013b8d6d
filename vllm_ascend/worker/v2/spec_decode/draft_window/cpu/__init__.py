"""vLLM 0.33.0's real Model Runner V2 draft build path, run on CPU.

For the window inspector (``make demo``) and the tests: the two shims that let vLLM's GPU
classes build on a CPU, real ``InputBuffers``/``BlockTables`` filled as vLLM's Triton
kernels fill them, real speculators wired to real attention metadata builders, and a
reference paged attention to check what the draft reads. Nothing in the serving path
imports this package.
"""
