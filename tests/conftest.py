"""Test-wide settings: one torch thread (tiny models; two threads fight on the 2-core CI machine)."""

import torch

torch.set_num_threads(1)
