"""The peers of ``peers_bench.py``: what each tool is and how it reads (``TOOLS``), and
the virtual environment they run in (benchmarks/_work/peers-venv, made and filled
with pinned releases, so the project's pins stay).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from _common import SMOKE, WORK

PEERS_VENV = os.path.join(WORK, "peers-venv")
# what the peers' venv gets: torch and torchvision as this machine's disk holds them
# (docs: /work/.library/env/machines/python.md), then one peer at a time
TORCH = {
    "x86_64": ("torch==2.14.1", "torchvision==0.29.1"),
    "aarch64": ("torch==2.9.1", "torchvision==0.24.1"),
}
PEER_PACKAGES = {
    # evenshard's Python route's decode + resize, which every Python peer is given
    "decode": "simplejpeg==1.9.0 opencv-python-headless==5.0.0.93",
    "webdataset": "webdataset==1.0.2",
    "arrayrecord": "array-record==0.8.6",
    "grain": "grain==0.2.18",
    "litdata": "litdata==0.2.76",
    "mds": "mosaicml-streaming==0.13.0",
}

# name: (what, python, writer or None, the data it reads: the tool that wrote it or "src",
#        packages it needs in the peers venv, how it reads)
TOOLS = {
    "evenshard_tf": (
        "evenshard convert + `make_dataset`",
        "project",
        "evenshard",
        "evenshard_tf",
        (),
        "tf.data, its own parallelism (AUTOTUNE); the order convert shuffled, "
        "read with its seeded window shuffle",
    ),
    "evenshard_torch": (
        "evenshard `TorchReader` (default backend)",
        "project",
        None,
        "evenshard_tf",
        (),
        "the default for this machine (resolved: see `backend`), iterated directly",
    ),
    "evenshard_torch_tf": (
        'evenshard `TorchReader(backend="tf")`',
        "project",
        None,
        "evenshard_tf",
        (),
        "tf.data inside, iterated directly",
    ),
    "evenshard_torch_dali": (
        'evenshard `TorchReader(backend="dali")` (CPU)',
        "project",
        None,
        "evenshard_tf",
        (),
        "DALI on the CPU, iterated directly",
    ),
    "evenshard_numpy": (
        "evenshard `NumpyReader` (Python route)",
        "project",
        None,
        "evenshard_tf",
        (),
        "its decode (simplejpeg + OpenCV) in `num_processes=2` processes",
    ),
    "tf_plain": (
        "plain `TFRecordWriter` loop + tf.data",
        "project",
        "tf_plain",
        "tf_plain",
        (),
        "16 files; `list_files(shuffle)`, `interleave` (AUTOTUNE), `shuffle(10000)`, "
        "`map` (AUTOTUNE), `batch(128)`",
    ),
    "webdataset": (
        "WebDataset `ShardWriter` + `WebLoader`",
        "peers",
        "webdataset",
        "webdataset",
        ("torch", "decode", "webdataset"),
        "tars of 1,000; `shardshuffle=100`, `.shuffle(1000)`, `.batched(128)` in "
        "`WebLoader(num_workers=2)`",
    ),
    "grain": (
        "ArrayRecord + Grain `DataLoader`",
        "peers",
        "arrayrecord",
        "grain",
        ("decode", "arrayrecord", "grain"),
        "16 files, `group_size:1`; `IndexSampler(shuffle=True)`, `worker_count=2`",
    ),
    "litdata": (
        "LitData `optimize` + `StreamingDataLoader`",
        "peers",
        "litdata",
        "litdata",
        ("torch", "decode", "litdata"),
        "64 MB chunks, optimize with 2 workers; `shuffle=True` (chunks shuffled, items "
        "within a chunk in shuffled blocks of 256: `item_shuffle_window`'s default), "
        "`num_workers=2`",
    ),
    "mds": (
        "MosaicML `MDSWriter` + `StreamingDataset`",
        "peers",
        "mds",
        "mds",
        ("torch", "decode", "mds"),
        "default shards; `shuffle=True` (py1e), `DataLoader(num_workers=2)`",
    ),
    "torchvision": (
        "torchvision `ImageFolder` + `DataLoader`",
        "peers",
        None,
        "src",
        ("torch", "decode"),
        "the JPEG folders, `loader=` the decode + resize; `DataLoader(shuffle=True, "
        "num_workers=2)`",
    ),
    "torchvision_pil": (
        "torchvision `ImageFolder` + `DataLoader`, Pillow",
        "peers",
        None,
        "src",
        ("torch",),
        "as above with ImageFolder's own Pillow loader and `Resize((224, 224))` "
        "(Pillow's antialiased bilinear), `PILToTensor()`",
    ),
}


def peers_venv() -> dict:
    """Makes benchmarks/_work/peers-venv and installs the pinned peers (each package
    apart: one that fails is recorded and the others go on); returns what is there.
    Under --smoke, none is made: every peer is left out."""
    if SMOKE:
        why = "--smoke makes no peers' environment"
        return {
            "wanted": {},
            "failed": dict.fromkeys(["torch", *PEER_PACKAGES], why),
            "versions": {},
        }
    python = os.path.join(PEERS_VENV, "bin", "python")
    marker = os.path.join(PEERS_VENV, "installed.json")
    torch_pins = TORCH.get(platform.machine(), ("torch", "torchvision"))
    wanted = {"torch": " ".join(torch_pins), **PEER_PACKAGES}
    if os.path.exists(marker):
        with open(marker) as f:
            done = json.load(f)
        if done.get("wanted") == wanted:
            return done
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", PEERS_VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    failed = {}
    groups = [("torch", ["pillow", "numpy"]), *((k, [v]) for k, v in PEER_PACKAGES.items())]
    for name, packages in groups:
        out = subprocess.run(  # torch's pins each time: no peer moves it
            [python, "-m", "pip", "install", "-q", *torch_pins, *" ".join(packages).split()],
            capture_output=True,
            text=True,
        )
        if out.returncode:
            failed[name] = out.stderr.strip().splitlines()[-1:] or ["pip failed"]
    versions = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    keep = {"torch", "torchvision", "pillow", "numpy", "webdataset", "array-record", "array_record"}
    keep |= {"grain", "litdata", "mosaicml-streaming", "simplejpeg", "opencv-python-headless"}
    done = {
        "wanted": wanted,
        "failed": failed,
        "versions": {
            p["name"].lower(): p["version"]
            for p in json.loads(versions.stdout)
            if p["name"].lower() in keep
        },
    }
    with open(marker, "w") as f:
        json.dump(done, f, indent=2)
    return done


def project_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("tensorflow", "torch", "nvidia-dali-cuda120", "pillow", "apache-beam"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
