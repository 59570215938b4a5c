"""Reading from a bucket through the cache, and convert bucket to bucket (issue 20).

Against a GCS API server on loopback (``evenshard.emulator``: gcp-storage-emulator,
a Python server, far slower than GCS itself; the ratios are what a slow store
costs, not what GCS does):
- read: the 20,000 JPEGs in 96 shards, decode + resize to 64x64, batch 256,
  seed 0, six epochs, best of 2 round-robin: records/s of epochs 1 and 2 from the
  bucket through the cache
  against the same read of the local folder. With a limit that holds the split,
  the second epoch reads the cached copies (aim >= 0.95x local); with a quarter
  of the split, the first epoch fetches ahead of the reader (aim >= 0.7x); with
  5 % of the split (cycle_length 4), the server's own log of downloads says the
  read fetched at most 1.05x the split an epoch, with the local read's label mix
  (within 5 %) and neighbour repeats within 2x independent shuffles (issue 31).
  The cache folder's size is sampled every 50 ms (never above the limit).
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
from _common import WORK, bench_main, convert_once, make_jpegs, tiny, verdict  # noqa: E402

BATCH = tiny(256, 8)
SIZE = (64, 64)
EPOCHS = tiny(6, 2)  # read each time; rates are epochs 1 and 2's
REPEAT_EPOCHS = tiny(40, 3)  # of the orders alone, for neighbour repeats
IMAGES, FEW, MANY = tiny(20_000, 64), tiny(96, 4), tiny(384, 16)  # images, shards
CONVERTED = tiny(5_000, 16)  # images of the bucket-to-bucket convert
# the cache limits' fractions of the split: a tiny split's few shards need it whole
TIGHT, QUARTER = tiny(20, 1), tiny(4, 1)


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
    from audit.mixing import independent_neighbour_repeats, label_mix_ratio, neighbour_repeats
    from beam_jobs import convert
    from evenshard.emulator import gcs_emulator, upload

    src = make_jpegs(os.path.join(WORK, f"jpegs_{IMAGES}"), IMAGES)
    local = convert_once(
        src,
        os.path.join(WORK, f"bucket{FEW}_{IMAGES}"),
        "--splits=train=1.0",
        f"--num_shards={FEW}",
    )
    info = reader.load_info(local)
    n = info.split("train").num_examples
    total = info.split("train").num_bytes
    # the same images in 384 shards: a 5 % limit holds 16 of them, the default cycle
    local384 = convert_once(
        src,
        os.path.join(WORK, f"bucket{MANY}_{IMAGES}"),
        "--splits=train=1.0",
        f"--num_shards={MANY}",
    )
    total384 = reader.load_info(local384).split("train").num_bytes
    per_epoch = n // BATCH
    result = {"images": n, "split_bytes": total}
    log = os.path.join(WORK, "bucket_requests.log")
    if os.path.exists(log):
        os.remove(log)
    with gcs_emulator(log=log) as client:
        url = upload(client.create_bucket("bench"), local, "ds")
        url384 = upload(client.bucket("bench"), local384, "ds384")

        def repeats_x(keys: list) -> float:
            """Neighbour repeats of consecutive epochs of ``keys`` (n each), pooled over
            every epoch and the next, against independent shuffles: two of those share
            about 2 adjacent pairs of n, too few to judge one pair of epochs by."""
            orders = [keys[e : e + n] for e in range(0, len(keys), n)]
            pairs = sum(neighbour_repeats(a, b) for a, b in zip(orders, orders[1:]))
            return round(pairs / (len(orders) - 1) / independent_neighbour_repeats(n), 2)

        def served() -> tuple[int, int]:
            """(downloads, bytes) the server's log holds."""
            if not os.path.exists(log):  # nothing downloaded yet
                return 0, 0
            with open(log) as f:
                sizes = [int(line.rsplit("\t", 1)[1]) for line in f]
            return len(sizes), sum(sizes)

        def epochs(data_dir, **cache) -> dict:
            """records/s of epochs 1 and 2, the label mix, neighbour repeats and keys of
            all; the cache folder's sampled peak; what the server sent meanwhile."""
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
            before = served()
            ds = reader.make_dataset(
                data_dir, "train", BATCH, seed=0, image_size=SIZE, epochs=EPOCHS, **cache
            )
            # batches run across the epoch boundary: the first n // BATCH are epoch 1's,
            # the next n // BATCH (about) epoch 2's; rates of those two
            rates, start, count = [], time.perf_counter(), 0
            labels, keys = [], []
            for i, batch in enumerate(ds, start=1):
                count += int(batch["label"].shape[0])
                labels.extend(batch["label"].numpy().tolist())
                keys.extend(batch["key"].numpy().tolist())
                if i in (per_epoch, 2 * per_epoch):
                    rates.append(count / (time.perf_counter() - start))
                    start, count = time.perf_counter(), 0
            stop.set()
            after = served()
            return {
                "rates": rates,
                "peak": peak[0],
                "downloads": after[0] - before[0],
                "bytes": after[1] - before[1],
                "label_mix": round(label_mix_ratio(labels[:n], BATCH), 3),
                "neighbour_repeats_x": repeats_x(keys),
                "keys": keys,
            }

        # round-robin, best of 2 each epoch: a slow spell of this noisy machine
        # does not land on one configuration only
        configs = {  # name: (data, options, the local read of the same order)
            "local": (local, {}, None),
            "local_cycle4": (local, dict(cycle_length=4), None),
            "local_384": (local384, {}, None),
            "bucket_whole": (url, dict(cache_limit=total + 1), "local"),
            "bucket_quarter": (url, dict(cache_limit=total // QUARTER), "local"),
            "bucket_5pct": (url, dict(cache_limit=total // TIGHT, cycle_length=4), "local_cycle4"),
            "bucket_5pct_384": (url384, dict(cache_limit=total384 // TIGHT), "local_384"),
        }
        runs, orders = {}, {}
        for _ in range(tiny(2, 1)):
            for name, (data, kwargs, _) in configs.items():
                if data.startswith("gs://"):
                    kwargs["cache_dir"] = os.path.join(WORK, f"cache_{name}")
                got = epochs(data, **kwargs)
                best = runs.setdefault(name, {"records_per_s": [0, 0], "peak_cache_bytes": 0})
                best["records_per_s"] = [
                    max(b, round(r)) for b, r in zip(best["records_per_s"], got["rates"])
                ]
                best["peak_cache_bytes"] = max(best["peak_cache_bytes"], got["peak"])
                best["cache_limit"] = kwargs.get("cache_limit")
                best["cycle_length"] = kwargs.get("cycle_length", 16)
                for key in ("downloads", "bytes", "label_mix", "neighbour_repeats_x"):
                    best[key] = got[key]
                split = total384 if data in (local384, url384) else total
                best["split_per_epoch"] = round(got["bytes"] / EPOCHS / split, 3)
                best["shards"] = MANY if data in (local384, url384) else FEW
                orders.setdefault(name, got["keys"])
        # the bucket reads' order is the folder's, record for record
        for name, (_, _, like) in configs.items():
            runs[name]["order_as_local"] = None if like is None else orders[name] == orders[like]
        result["read"] = runs

        # the orders themselves over many epochs (the reads above give about 2 chance
        # repeats an epoch pair, too few): keys only, no decoding, from the folder
        def repeats_over(data: str, epochs: int, **opts) -> float:
            ds = reader.make_dataset(
                data, "train", 1024, seed=0, decode=False, epochs=epochs, **opts
            )
            return repeats_x([k for b in ds for k in b["key"].numpy().tolist()])

        result["repeats_40_epochs"] = {
            "96 shards, cycle_length 4": repeats_over(local, REPEAT_EPOCHS, cycle_length=4),
            "384 shards, cycle_length 16": repeats_over(local384, REPEAT_EPOCHS),
        }
        # convert: bucket to bucket against local to local, 5,000 images
        five = make_jpegs(os.path.join(WORK, f"jpegs_{CONVERTED}"), CONVERTED)
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
    whole, quarter, tight = read["bucket_whole"], read["bucket_quarter"], read["bucket_5pct"]
    second = whole["records_per_s"][1] / local[1]
    first = quarter["records_per_s"][0] / local[0]
    conv = r["convert_seconds"]
    ratio = conv["bucket_to_bucket"] / conv["local_to_local"]
    server = r.get("convert_server_cpu_seconds", "?")
    peaks_ok = all(
        v["peak_cache_bytes"] <= v["cache_limit"] for v in read.values() if v["cache_limit"]
    )
    tight384 = read["bucket_5pct_384"]
    egress = max(tight["split_per_epoch"], tight384["split_per_epoch"])
    mixes = [
        tight["label_mix"] / read["local_cycle4"]["label_mix"],
        tight384["label_mix"] / read["local_384"]["label_mix"],
    ]
    mix = max(mixes, key=lambda m: abs(m - 1))
    repeats = r["repeats_40_epochs"]
    few, many = repeats["96 shards, cycle_length 4"], repeats["384 shards, cycle_length 16"]

    def bytes_(v: dict, key: str) -> str:
        return "" if v["cache_limit"] is None else f"{v[key]:,}"

    rows = "\n".join(
        f"| {name} | {v['shards']} | {v['cycle_length']} | {v['records_per_s'][0]:,} | "
        f"{v['records_per_s'][1]:,} | {bytes_(v, 'cache_limit')} | "
        f"{bytes_(v, 'peak_cache_bytes')} | {v['downloads']:,} | {v['split_per_epoch']:.2f} | "
        f"{v['label_mix']:.3f} | {v['neighbour_repeats_x']:.2f} | "
        f"{ {None: '—', True: 'yes', False: 'NO'}[v['order_as_local']] } |"
        for name, v in read.items()
    )
    return f"""## reading from a bucket — `benchmarks/bucket_bench.py`

Against a GCS API server on loopback (gcp-storage-emulator, run threaded by
`evenshard/emulator.py`: a Python server on the same 2 cores as the reader,
far slower than GCS; the ratios say what a slow store costs). {r["images"]:,}
JPEGs in 96 shards ({r["split_bytes"]:,} bytes; 384 for the `_384` reads), decode + resize to 64×64,
batch 256, six epochs; each configuration read twice, round-robin, the best
rate of epochs 1 and 2 kept (each read starts with an empty cache folder).
Downloads and bytes are the server's own log of the downloads it answered
during the read ("split/epoch" is bytes ÷ 6 ÷ the split; dataset_info.json and
the indexes are the 0.8 % over 1). Label mix is epoch 1's (1.00 = random
batches); neighbour repeats are the pairs adjacent in an epoch and the next,
pooled over the 5 such pairs of epochs, against two independent shuffles (1.00
= independent: about 2 pairs of 20,000 each time). "Same order" says the read
gave the local read's keys in the local read's order (`bucket_5pct` against
`local_cycle4`, `bucket_5pct_384` against `local_384`, the others against
`local`). Since a bucket read's order is
the folder's, the orders' neighbour repeats are also measured over 40 epochs of
the folder read with `decode=False` (39 epoch pairs, about 78 chance repeats):
the figure the aim is judged by. The default read (96 shards, cycle_length 16,
window 1,000) measured 1.91 so on 2026-11-24.

| read | shards | cycle_length | epoch 1 records/s | epoch 2 records/s | cache_limit (bytes) | cache folder's sampled peak (bytes) | downloads | split/epoch | label mix | neighbour repeats × independent | same order |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
{rows}

| target | measured | aim |
|---|---:|---|
| epoch 2 through a cache that holds the split / local | **{second:.2f}** | ≥ 0.95 — {verdict(second, 0.95, below=False)} |
| epoch 1 with a quarter of the split as the limit / local | **{first:.2f}** | ≥ 0.7 — {verdict(first, 0.7, below=False)} |
| downloaded an epoch at a limit of 5 % of the split / the split (the larger of the two 5 % reads) | **{egress:.2f}** | ≤ 1.05 — {verdict(egress, 1.05)} |
| their label mix / the same dataset's local read's (the farther from 1 of the two; against the default local read: {tight["label_mix"] / read["local"]["label_mix"]:.3f}, {tight384["label_mix"] / read["local"]["label_mix"]:.3f}) | **{mix:.3f}** | within 5 % — {verdict(abs(mix - 1), 0.05)} |
| 384 shards at 5 %, cycle_length 16: the order's neighbour repeats over 40 epochs / independent shuffles | **{many:.2f}** | ≤ 2 — {verdict(many, 2.0)} |
| 96 shards at 5 %, cycle_length 4: the same | **{few:.2f}** | ≤ 2 — {verdict(few, 2.0)} |
| the cache folder never above its limit (sampled every 50 ms) | {"yes" if peaks_ok else "NO"} | yes |
| convert 5,000 JPEGs bucket → bucket / local → local ({conv["bucket_to_bucket"]} s / {conv["local_to_local"]} s) | **{ratio:.2f}** | ≤ 1.5 — {verdict(ratio, 1.5)} |

Under a limit below 70 % of the split the cache fetches runs (byte
ranges of shards, one group's each), not shards, and drops each when its
group is read: every byte once an epoch, with the order unchanged. Before
(commit a929daf) the quarter-split read fetched whole shards, 155 downloads
for 96 shards an epoch (1.6× the split). A limit must hold the
`cycle_length` largest shards (a group may read that many nearly whole
runs), so 5 % of a split of 96 shards allows `cycle_length` 4, and fewer runs
read at once mix less across epochs: the 96-shard 5 % read's order is
`local_cycle4`'s, and its neighbour repeats are that order's. With the
shards of a real dataset (ImageNet at the default 128 MB target is about
1,100 shards a split, 16 of them 1.5 %) a 5 % limit holds the default 16;
`bucket_5pct_384` is that case at this scale: the same images in 384 shards.
Label mix moves a few percent between orders that are all random (1.00 is
a random order; the default local read's 0.947 is a lucky one), so each 5 %
read is judged against the local read of its own dataset and options. Each
request here is answered by a Python server on the reader's 2 cores, so the
384-shard read's 818 requests an epoch cost it most of its rate; on GCS the
answering is not on the reading machine.

Convert makes two requests an image in a bucket (inspect: its size and bytes in
one ranged read; the shard writer: the bytes again), and the server answers
each in Python on the cores the conversion uses: it took {server} CPU seconds of
the {conv["bucket_to_bucket"]} s run, on 2 cores. On GCS that work is not on the
converting machine; what convert costs there needs measuring there.
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
