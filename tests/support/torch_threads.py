"""diffusers reference pipelines in the tests: their tiny modules run far faster on one torch
thread on a shared machine."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread():
    """torch on one thread inside the block, its previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
