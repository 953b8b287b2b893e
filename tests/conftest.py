"""Test-wide settings: one torch thread (tiny models gain nothing from more, and CI machines are shared)."""

import torch

torch.set_num_threads(1)
