"""`make gpu-check`: the window's kernels checked and measured on a CUDA GPU (``cli.py``)."""
