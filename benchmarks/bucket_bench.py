"""Reading from a bucket through the cache, and convert bucket to bucket (issue 20).

Against a GCS API server on loopback (``evenshard.emulator``: gcp-storage-emulator,
a Python server, far slower than GCS itself; the ratios are what a slow store
costs, not what GCS does):
- read: the 20,000 JPEGs in 96 shards, decode + resize to 64x64, batch 256,
  seed 0, two epochs, best of 2 round-robin: records/s of each epoch from the
  bucket through the cache
  against the same read of the local folder. With a limit that holds the split,
  the second epoch reads the cached copies (aim >= 0.95x local); with a quarter
  of the split, the first epoch fetches ahead of the reader (aim >= 0.7x). The
  cache folder's size is sampled every 50 ms (never above the limit).
- convert: 5,000 JPEGs, bucket to bucket against local to local, the same flags
  (aim <= 1.5x).

    .venv/bin/python benchmarks/bucket_bench.py
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, make_jpegs, verdict  # noqa: E402

BATCH = 256
SIZE = (64, 64)


def _disk(folder: str) -> int:
    seen = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        try:
            st = os.stat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        if not name.endswith(".lock"):
            seen[st.st_ino] = st.st_size
    return sum(seen.values())


def _server_cpu() -> float:
    """CPU seconds the loopback GCS server's process has used (Linux /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"evenshard.emulator" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reader
    from beam_jobs import convert
    from evenshard.emulator import gcs_emulator, upload

    src = make_jpegs(os.path.join(WORK, "jpegs_20000"), 20_000)
    local = convert_once(
        src, os.path.join(WORK, "bucket96_20000"), "--splits=train=1.0", "--num_shards=96"
    )
    info = reader.load_info(local)
    n = info["splits"]["train"]["num_examples"]
    total = info["splits"]["train"]["num_bytes"]
    per_epoch = n // BATCH
    result = {"images": n, "split_bytes": total}
    with gcs_emulator() as client:
        url = upload(client.create_bucket("bench"), local, "ds")

        def epochs(data_dir, **cache) -> tuple[list[float], int]:
            """records/s of each of two epochs; the cache folder's sampled peak."""
            folder = cache.get("cache_dir")
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            peak, stop = [0], threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], _disk(folder))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            if folder:
                sampler.start()
            ds = reader.make_dataset(
                data_dir, "train", BATCH, seed=0, image_size=SIZE, epochs=2, **cache
            )
            # batches run across the epoch boundary: the first n // BATCH are epoch 1's
            rates, start, count = [], time.perf_counter(), 0
            for i, batch in enumerate(ds, start=1):
                count += int(batch["label"].shape[0])
                if i == per_epoch:
                    rates.append(count / (time.perf_counter() - start))
                    start, count = time.perf_counter(), 0
            rates.append(count / (time.perf_counter() - start))
            stop.set()
            return rates, peak[0]

        # round-robin, best of 2 each epoch: a slow spell of this noisy machine
        # does not land on one configuration only
        configs = {
            "local": {},
            "bucket_whole": dict(cache_limit=total + 1),
            "bucket_quarter": dict(cache_limit=total // 4),
        }
        runs = {}
        for _ in range(2):
            for name, kwargs in configs.items():
                data = local if name == "local" else url
                if name != "local":
                    kwargs["cache_dir"] = os.path.join(WORK, f"cache_{name}")
                rates, peak = epochs(data, **kwargs)
                best = runs.setdefault(
                    name,
                    {"records_per_s": [0, 0], "peak_cache_bytes": 0, "cache_limit": None},
                )
                best["records_per_s"] = [
                    max(b, round(r)) for b, r in zip(best["records_per_s"], rates)
                ]
                best["peak_cache_bytes"] = max(best["peak_cache_bytes"], peak)
                best["cache_limit"] = kwargs.get("cache_limit")
        result["read"] = runs
        # convert: bucket to bucket against local to local, 5,000 images
        five = make_jpegs(os.path.join(WORK, "jpegs_5000"), 5_000)
        images = upload(client.bucket("bench"), five, "images")
        flags = ["--splits=train=1.0", "--num_shards=4", "--overwrite"]
        times = {}
        for name, (i, o) in {
            "local_to_local": (five, os.path.join(WORK, "bucket_convert_local")),
            "bucket_to_bucket": (images, "gs://bench/converted"),
        }.items():
            server, start = _server_cpu(), time.perf_counter()
            convert.run([f"--input={i}", f"--output_dir={o}", *flags])
            times[name] = round(time.perf_counter() - start, 1)
            if name == "bucket_to_bucket":  # what the server on these 2 cores took
                result["convert_server_cpu_seconds"] = round(_server_cpu() - server, 1)
        result["convert_seconds"] = times
    return result


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    read = r["read"]
    local = read["local"]["records_per_s"]
    whole, quarter = read["bucket_whole"], read["bucket_quarter"]
    second = whole["records_per_s"][1] / local[1]
    first = quarter["records_per_s"][0] / local[0]
    conv = r["convert_seconds"]
    ratio = conv["bucket_to_bucket"] / conv["local_to_local"]
    server = r.get("convert_server_cpu_seconds", "?")
    peaks_ok = all(v["peak_cache_bytes"] <= v["cache_limit"] for v in (whole, quarter))

    def bytes_(v: dict, key: str) -> str:
        return "" if v["cache_limit"] is None else f"{v[key]:,}"

    rows = "\n".join(
        f"| {name} | {v['records_per_s'][0]:,} | {v['records_per_s'][1]:,} | "
        f"{bytes_(v, 'cache_limit')} | {bytes_(v, 'peak_cache_bytes')} |"
        for name, v in read.items()
    )
    return f"""## reading from a bucket — `benchmarks/bucket_bench.py`

Against a GCS API server on loopback (gcp-storage-emulator, run threaded by
`evenshard/emulator.py`: a Python server on the same 2 cores as the reader,
far slower than GCS; the ratios say what a slow store costs). {r["images"]:,}
JPEGs in 96 shards ({r["split_bytes"]:,} bytes), decode + resize to 64×64,
batch 256, two epochs; each configuration read twice, round-robin, the best
rate of each epoch kept (each read starts with an empty cache folder).

| read | epoch 1 records/s | epoch 2 records/s | cache_limit (bytes) | cache folder's sampled peak (bytes) |
|---|---:|---:|---:|---:|
{rows}

| target | measured | aim |
|---|---:|---|
| epoch 2 through a cache that holds the split / local | **{second:.2f}** | ≥ 0.95 — {verdict(second, 0.95, below=False)} |
| epoch 1 with a quarter of the split as the limit / local | **{first:.2f}** | ≥ 0.7 — {verdict(first, 0.7, below=False)} |
| the cache folder never above its limit (sampled every 50 ms) | {"yes" if peaks_ok else "NO"} | yes |
| convert 5,000 JPEGs bucket → bucket / local → local ({conv["bucket_to_bucket"]} s / {conv["local_to_local"]} s) | **{ratio:.2f}** | ≤ 1.5 — {verdict(ratio, 1.5)} |

Convert makes two requests an image in a bucket (inspect: its size and bytes in
one ranged read; the shard writer: the bytes again), and the server answers
each in Python on the cores the conversion uses: it took {server} CPU seconds of
the {conv["bucket_to_bucket"]} s run, on 2 cores. On GCS that work is not on the
converting machine; what convert costs there needs measuring there.
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
