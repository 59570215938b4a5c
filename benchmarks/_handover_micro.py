"""A batch's hand-over in the consumer alone: ``Blocks.arrays`` on one block of 128 images,
copied out (``lend_most=0``: what the reader did before issue 44) against lent (views,
no copy), CPU µs a batch, in one process, the lowest of 5 rounds of 20.

    .venv/bin/python benchmarks/_handover_micro.py
"""

from __future__ import annotations

import os
import sys
import time
from multiprocessing import shared_memory

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reader.routes.shared_blocks import Blocks  # noqa: E402


def handover(size: int, lend_most: int) -> float:
    """CPU seconds a batch of 128 ``size`` x ``size`` images takes to hand over."""
    shape = (128, size, size, 3)
    pixels = -(-int(np.prod(shape)) // 64) * 64
    fields = {"image": (0, shape, "|u1"), "label": (pixels, (128,), "<i8")}
    memory = shared_memory.SharedMemory(create=True, size=pixels + 1024)
    np.ndarray(shape, np.uint8, memory.buf)[:] = 7
    blocks, best = Blocks(lend_most), []
    for _ in range(5):
        start = time.process_time()
        for _ in range(20):
            out = blocks.arrays(memory.name, None, fields)
            assert out["image"][5, 5, 5, 0] == 7
            del out  # the block back (lent) or the copy freed
            blocks.free.clear()
        best.append((time.process_time() - start) / 20)
    blocks.mapped.pop(memory.name).close()
    memory.close()
    memory.unlink()
    return min(best)


if __name__ == "__main__":
    for size in (224, 64):
        for lend_most, how in ((0, "copied out"), (4, "lent")):
            cpu = handover(size, lend_most) * 1e6
            print(f"{size}x{size}: {how}: {cpu:,.0f} CPU µs a batch ({cpu / 128:.2f} an image)")
