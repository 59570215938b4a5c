"""The GPU path, checked in one short run: every route reads every image once with the
CPU route's pixels, and its rate against the CPU limit (``limit_bench.limit``).

    .venv/bin/python benchmarks/gpu_check.py [--images 2000] [--size 224]   # make gpu-check
    .venv/bin/python benchmarks/gpu_check.py --smoke   # CPU, 40 images (tests/)

Installs nothing beyond the dev extras. The corpus: the peers corpus where
``benchmarks/_work`` holds it (``peers_bench.make_corpus``, real-photo crops), else
generated JPEGs (``evenshard.synthetic``, 256x256: a machine that reaches nothing
outside still runs it); converted once (one split). The reference: ``make_dataset`` on
the CPU (the pixels every CPU reader gives). The routes:

* ``numpy_cpu``: ``NumpyReader`` on the CPU, pixels equal to the reference (always run).
* ``dali_gpu``: ``TorchReader(backend="dali")`` with a CUDA GPU: nvJPEG (DALI's
  "mixed"), images as CUDA tensors. Its pixels against DALI on the CPU: within the
  IDCT's rounding (mean |difference| under 1; docs/convert.md#decoding); against the
  reference, DALI's resize filter: mean under 12 (tests/test_frameworks.py).
* ``tf_prefetch_to_device``: ``make_dataset(prefetch_to_device=True)`` with a GPU
  TensorFlow sees: the reference's pixels exactly, on the GPU.
* ``numpy_pinned``: ``NumpyReader`` batches through pinned memory
  (``torch.from_numpy(...).pin_memory().to("cuda", non_blocking=True)``): exactly.
* ``torch_device``: ``TorchReader(backend="python", device="cuda")``: its shared blocks
  page-locked once, each batch copied on a side stream two ahead: exactly.
* ``nvjpeg_ceiling``: not a reader route, a ceiling: the same encoded images decoded
  on the GPU by torchvision's nvJPEG and resized by ``torch.nn.functional.interpolate``
  (bilinear, no antialiasing), batches of 64, bytes already in memory. Its pixels are
  reported against the reference (never checked: another decoder and resize).

On a machine without TensorFlow (a GPU machine whose Python holds only PyTorch), the
reference is ``NumpyReader``'s pixels, and ``--reference FILE`` (written here by
``--write-reference FILE`` where TensorFlow is) checks them per key against the
``make_dataset`` pixels of the machine that wrote it: the same pixels on other builds
of OpenCV and numpy.

A route with no GPU to run on is skipped, saying why; every check that runs must
hold (exit status 1 otherwise). Rates are images a second of one epoch, the reader
made inside the clock; one run each (a check, not a benchmark).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import SMOKE, WORK, convert_once, list_images, make_jpegs, tiny  # noqa: E402

BATCH = 64
DALI_VS_DALI_CPU_MEAN = 1.0  # nvJPEG against libjpeg-turbo: the IDCT's rounding
DALI_VS_REFERENCE_MEAN = 12.0  # DALI's resize filter against OpenCV's (test_frameworks)


def corpus(count: int) -> str:
    """The peers corpus when it is here, else ``count`` generated 256x256 JPEGs."""
    peers = os.path.join(WORK, f"peers_photos_{count}")
    if not SMOKE and os.path.exists(os.path.join(peers, ".done")):
        return peers
    return make_jpegs(os.path.join(WORK, f"gpu_check_jpegs_{count}"), count, size=tiny(256, 64))


def _np(x) -> np.ndarray:
    """Host pixels of a numpy array, a torch tensor (on any device) or a TF tensor."""
    if type(x).__module__.startswith("torch"):
        return x.cpu().numpy()
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def _keys(keys) -> list[str]:
    keys = keys.numpy() if hasattr(keys, "numpy") else keys
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


def epoch(batches, count: int) -> tuple[float, dict[str, np.ndarray], list[str]]:
    """Reads ``batches`` (image, keys): its rate, the pixels by key, what went wrong."""
    start, pixels, problems = time.perf_counter(), {}, []
    for images, keys in batches:
        images = _np(images)
        for k, image in zip(_keys(keys), images):
            if k in pixels:
                problems.append(f"{k} read twice")
            pixels[k] = image
    rate = len(pixels) / (time.perf_counter() - start)
    if len(pixels) != count:
        problems.append(f"{len(pixels)} images read of {count}")
    return rate, pixels, problems


def compare(pixels: dict, reference: dict, max_mean: float | None = None) -> dict:
    """Largest and mean |difference| against ``reference``; exact unless ``max_mean``."""
    diffs = [
        np.abs(pixels[k].astype(int) - reference[k].astype(int)) for k in reference if k in pixels
    ]
    worst = max((int(d.max()) for d in diffs), default=0)
    mean = float(np.mean([d.mean() for d in diffs])) if diffs else 0.0
    ok = worst == 0 if max_mean is None else mean < max_mean
    return {"max_diff": worst, "mean_diff": round(mean, 3), "pixels_ok": ok}


def steady(batches) -> float:
    """Images a second from the first batch of the second epoch to the end: the rate
    without start-up (``batches`` yields image, keys, epoch; read with ``epochs`` > 1)."""
    start, count, last = None, 0, None
    for last, keys, ep in batches:  # noqa: B007 (the last batch is waited on below)
        if ep >= 1 and start is None:
            start = time.perf_counter()
        elif start is not None:
            count += len(keys)
    _np(last)  # the last batch has landed (a CUDA copy is asynchronous)
    return count / (time.perf_counter() - start)


def _torch_cuda() -> str | None:
    """Why torch has no CUDA GPU here (None: it has)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA GPU"


def _dali_gpu() -> str | None:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return "DALI is not installed"
    return _torch_cuda()


def _tf_gpu() -> str | None:
    try:
        import tensorflow as tf
    except ImportError:
        return "TensorFlow is not installed"

    return None if tf.config.list_physical_devices("GPU") else "TensorFlow sees no GPU"


def _nvjpeg() -> str | None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return "torchvision is not installed"
    return _torch_cuda()


def nvjpeg_ceiling(encoded: list[bytes], size: int) -> tuple[float, list[np.ndarray]]:
    """Images a second of nvJPEG decode + bilinear resize on the GPU, bytes in memory."""
    import torch
    import torchvision.io as tio

    RGB = tio.ImageReadMode.RGB
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in encoded]
    tio.decode_jpeg(data[:BATCH], mode=RGB, device="cuda")  # warm: the nvJPEG handle, CUDA context
    torch.cuda.synchronize()
    out, start = [], time.perf_counter()
    for i in range(0, len(data), BATCH):
        for image in tio.decode_jpeg(data[i : i + BATCH], mode=RGB, device="cuda"):
            small = torch.nn.functional.interpolate(
                image[None].float(), size=(size, size), mode="bilinear", antialias=False
            )
            out.append(small[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0))
    torch.cuda.synchronize()
    rate = len(out) / (time.perf_counter() - start)
    return rate, [o.cpu().numpy() for o in out]


def _digest(image: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:16]


def check(a) -> dict:
    from limit_bench import limit

    src = a.corpus or corpus(a.images)
    count = len(list_images(src))
    encoded = []
    for path, _ in list_images(src):
        with open(path, "rb") as f:
            encoded.append(f.read())
    cpu_limit = limit(encoded, a.size, os.cpu_count() or 1)  # forks: before TensorFlow starts
    import reader

    data = a.data or convert_once(
        src, os.path.join(WORK, f"gpu_check_{count}_out"), "--splits=train=1.0"
    )
    kw = dict(seed=0, epochs=1, image_size=(a.size, a.size))
    out: dict = {"images": count, "size": a.size, "corpus": os.path.basename(src), "routes": {}}
    routes, skipped = out["routes"], {}

    def tf_batches(**more):
        for b in reader.make_dataset(data, "train", BATCH, **kw, **more):
            yield b["image"], b["key"]

    def numpy_batches(move=None, epochs=1):
        for b in reader.NumpyReader(data, "train", BATCH, **dict(kw, epochs=epochs)):
            image = b["image"] if move is None else move(b["image"])
            yield (image, b["key"]) if epochs == 1 else (image, b["key"], int(b["epoch"][0]))

    if _tf_gpu() == "TensorFlow is not installed":
        rate, reference, problems = epoch(numpy_batches(), count)
        routes["numpy_cpu"] = {"rate": round(rate), "problems": problems, "pixels_ok": True}
        skipped["tf_cpu"] = "TensorFlow is not installed: NumpyReader is the reference"
    else:
        rate, reference, problems = epoch(tf_batches(), count)
        routes["tf_cpu"] = {"rate": round(rate), "problems": problems, "pixels_ok": True}
        rate, got, problems = epoch(numpy_batches(), count)
        routes["numpy_cpu"] = {
            "rate": round(rate),
            "problems": problems,
            **compare(got, reference),
        }
    if a.steady > 1:
        routes["numpy_cpu"]["steady_rate"] = round(steady(numpy_batches(epochs=a.steady)))
    digests = {k: _digest(v) for k, v in reference.items()}
    if a.write_reference:
        with open(a.write_reference, "w") as f:
            json.dump({"size": a.size, "digests": digests}, f, sort_keys=True)
    if a.reference:
        with open(a.reference) as f:
            theirs = json.load(f)["digests"]
        differ = sorted(k for k in theirs if digests.get(k) != theirs[k])
        out["reference_check"] = {"keys": len(theirs), "differ": len(differ), "some": differ[:5]}
        routes["numpy_cpu"]["pixels_ok"] &= not differ

    why = _dali_gpu()
    if why is None:
        from reader.torch import TorchReader

        r = TorchReader(data, "train", BATCH, backend="dali", **kw)
        rate, got, problems = epoch(((b["image"], b["key"]) for b in r), count)
        cpu = reader.make_dali_pipeline(data, "train", BATCH, device="cpu", **kw)
        _, on_cpu, _ = epoch(((b["image"], b["key"]) for b in cpu), count)
        routes["dali_gpu"] = {
            "rate": round(rate),
            "problems": problems,
            "vs_dali_cpu": compare(got, on_cpu, DALI_VS_DALI_CPU_MEAN),
            **compare(got, reference, DALI_VS_REFERENCE_MEAN),
        }
        routes["dali_gpu"]["pixels_ok"] &= routes["dali_gpu"]["vs_dali_cpu"]["pixels_ok"]
    else:
        skipped["dali_gpu"] = why

    why = _tf_gpu()
    if why is None:
        rate, got, problems = epoch(tf_batches(prefetch_to_device=True), count)
        routes["tf_prefetch_to_device"] = {
            "rate": round(rate),
            "problems": problems,
            **compare(got, reference),
        }
    else:
        skipped["tf_prefetch_to_device"] = why

    why = _torch_cuda()
    if why is None:
        import torch

        def pinned(images):
            return torch.from_numpy(images).pin_memory().to("cuda", non_blocking=True)

        rate, got, problems = epoch(numpy_batches(pinned), count)
        routes["numpy_pinned"] = {
            "rate": round(rate),
            "problems": problems,
            **compare(got, reference),
        }
        if a.steady > 1:
            rate = steady(numpy_batches(pinned, a.steady))
            routes["numpy_pinned"]["steady_rate"] = round(rate)

        def device_batches(epochs=1):
            from reader.torch import TorchReader

            r = TorchReader(
                data, "train", BATCH, backend="python", device="cuda", **dict(kw, epochs=epochs)
            )
            for b in r:
                image = b["image"]
                if not image.is_cuda:
                    raise RuntimeError(f"TorchReader(device='cuda') gave {image.device}")
                yield (image, b["key"]) if epochs == 1 else (image, b["key"], int(b["epoch"][0]))

        rate, got, problems = epoch(device_batches(), count)
        routes["torch_device"] = {
            "rate": round(rate),
            "problems": problems,
            **compare(got, reference),
        }
        if a.steady > 1:
            routes["torch_device"]["steady_rate"] = round(steady(device_batches(a.steady)))
    else:
        skipped["numpy_pinned"] = skipped["torch_device"] = why

    why = _nvjpeg()
    if why is None:
        keys = [os.path.relpath(path, src) for path, _ in list_images(src)]
        rate, images = nvjpeg_ceiling(encoded, a.size)
        for _ in range(max(0, a.steady - 1)):
            rate = max(rate, nvjpeg_ceiling(encoded, a.size)[0])
        diff = [
            np.abs(image.astype(int) - reference[k]).mean()
            for k, image in zip(keys, images)
            if k in reference and image.shape == reference[k].shape
        ]
        routes["nvjpeg_ceiling"] = {
            "rate": round(rate),
            "problems": [],
            "pixels_ok": True,
            "mean_diff_vs_reference": round(float(np.mean(diff)), 3) if diff else None,
            "compared": len(diff),
        }
    else:
        skipped["nvjpeg_ceiling"] = why

    out["cpu_limit"] = round(cpu_limit)
    out["cpus"] = os.cpu_count()
    for r in routes.values():
        r["over_cpu_limit"] = round(r["rate"] / cpu_limit, 2)
        if "steady_rate" in r:
            r["steady_over_cpu_limit"] = round(r["steady_rate"] / cpu_limit, 2)
    out["skipped"] = skipped
    out["ok"] = all(not r["problems"] and r["pixels_ok"] for r in routes.values())
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="40 small images: the checks, quickly")
    p.add_argument("--images", type=int, default=tiny(2_000, 40), help="images to read")
    p.add_argument("--size", type=int, default=tiny(224, 32), help="square output size")
    p.add_argument(
        "--steady", type=int, default=0, help="also read this many epochs: the rate after the first"
    )
    p.add_argument("--corpus", help="a folder of label folders of JPEGs (default: see above)")
    p.add_argument("--data", help="its conversion, made earlier (default: converted here)")
    p.add_argument("--write-reference", help="write the reference pixels' digests here")
    p.add_argument("--reference", help="check the reference against these digests")
    out = check(p.parse_args(argv))
    for name, why in out["skipped"].items():
        print(f"skipped {name}: {why}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
