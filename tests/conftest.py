"""Test-wide settings: one torch thread (tiny models; two threads fight on the 2-core CI machine),
and without a GPU, Triton kernels run in Triton's interpreter (tests/test_triton_ops.py). The
variable must be set before anything imports Triton: torch's compiler may import it early."""

import os

import torch

torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
