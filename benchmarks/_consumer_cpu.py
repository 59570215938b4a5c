"""The reading process's own CPU an image, steady: ``getrusage(RUSAGE_SELF)`` (its
threads too: the pool's feeder and result threads; the worker processes not) from
the first batch to the last (and to the read's end, its processes and blocks gone:
``with_the_end_us``), over one epoch, the lowest of ROUNDS; ``NumpyReader``
or ``TorchReader(backend="python")`` with 2 worker processes, batches of 128, the
loop touching nothing. No per-batch sampling of other processes (which
``_limit_profile.py`` does, and which costs the reading process CPU of its own).

    .venv/bin/python benchmarks/_consumer_cpu.py DATA SIZE ROUNDS numpy|torch   # JSON
"""

from __future__ import annotations

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _own() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(data: str, size: int, rounds: int, face: str) -> dict:
    import reader

    best = best_end = None
    for _ in range(rounds):
        kw = dict(image_size=(size, size), num_processes=2, seed=0)
        if face == "numpy":
            r = reader.NumpyReader(data, "train", 128, **kw)
        else:
            from reader.torch import TorchReader

            r = TorchReader(data, "train", 128, backend="python", **kw)
        n = first_n = 0
        start = 0.0
        last = 0.0
        for batch in r:
            n += len(batch["key"])
            if not first_n:
                first_n, start = n, _own()
            last = _own()  # the read's end (its pool's shutdown, its blocks unlinked) after
        ended = _own()
        us = 1e6 * (last - start) / max(n - first_n, 1)
        best = us if best is None else min(best, us)
        with_end = 1e6 * (ended - start) / max(n - first_n, 1)
        best_end = with_end if best_end is None else min(best_end, with_end)
    return {
        "data": data,
        "size": size,
        "face": face,
        "steady_consumer_us": round(best, 1),
        "with_the_end_us": round(best_end, 1),
        "load": round(os.getloadavg()[0], 1),
    }


if __name__ == "__main__":
    data, size, rounds, face = sys.argv[1:5]
    print(json.dumps(main(data, int(size), int(rounds), face)))
