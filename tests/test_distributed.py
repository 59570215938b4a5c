"""torch.distributed on loopback (gloo, 3 and 2 processes): TorchReader takes its ranks
from the process group; ranks read disjoint records with equal step counts, evaluation
sees every example once, and a read saved by 3 ranks resumes on 2 (issue 21)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from dataset_writer import write_dataset

from evenshard import synthetic

pytestmark = pytest.mark.slow

RANK_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
from reader.torch import TorchReader

data_dir, modes, saved = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_* from env
kw = dict(image_size=(8, 8), backend="dali")
out = {}
for mode in modes.split(","):  # the modes in turn, in one process group
    if mode == "eval":
        r = TorchReader(data_dir, "train", 16, shuffle=False, pad_final_batch=True, **kw)
        out[mode] = {"keys": [k for b in r for k, m in zip(b["key"], b["mask"].tolist()) if m],
                     "steps": len(r)}
        continue
    r = TorchReader(data_dir, "train", 16, seed=4, epochs=None, **kw)
    if saved != "-":
        r.load_state_dict(json.load(open(saved)))
    keys, steps = [], 4 if saved == "-" else 6
    for i, b in enumerate(r):
        keys += b["key"]
        if i + 1 == steps:
            break
    out[mode] = {"keys": keys, "state": r.state_dict()}
every = [None] * dist.get_world_size()
dist.all_gather_object(every, out)  # the ranks agree, through the process group
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(every))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, *args: str) -> list[dict]:
    """``world`` processes in one gloo group on 127.0.0.1; rank 0's gathered results
    (each rank's, by mode)."""
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        GLOO_SOCKET_IFNAME="lo",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, *args],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    line = next(line for line in outs[0][0].splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.fixture(scope="module")
def data_200(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist") / "images"
    synthetic.make_image_folder(str(root), num_labels=4, per_label=50, formats=("png",))
    out = str(tmp_path_factory.mktemp("dist_out") / "out")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=6")
    return out


@pytest.fixture(scope="module")
def three_ranks(data_200) -> list[dict]:
    """3 ranks, one process group: the evaluation, then 4 batches of the training read."""
    return run_ranks(3, data_200, "eval,train", "-")


def test_ranks_evaluate_every_example_once_with_equal_steps(three_ranks):
    ranks = [r["eval"] for r in three_ranks]
    keys = [k for r in ranks for k in r["keys"]]
    assert len(keys) == len(set(keys)) == 200
    assert len({r["steps"] for r in ranks}) == 1


def test_a_read_saved_by_three_ranks_resumes_on_two(data_200, three_ranks, tmp_path):
    three = [r["train"] for r in three_ranks]
    states = {json.dumps(r["state"]) for r in three}
    assert len(states) == 1  # every rank stands at the same place: any rank's state will do
    saved = tmp_path / "read_state.json"
    saved.write_text(states.pop())
    before = [k for r in three for k in r["keys"]]  # 3 ranks x 4 batches of 16
    assert len(before) == len(set(before)) == 192
    two = [r["train"] for r in run_ranks(2, data_200, "train", str(saved))]
    assert len({json.dumps(r["state"]) for r in two}) == 1
    # the 8 records the 3 ranks left, 4 a rank, first; then the 2 ranks' own epoch 1
    firsts = [k for r in two for k in r["keys"][:4]]
    epoch0 = before + firsts
    assert len(epoch0) == len(set(epoch0)) == 200
    later = [k for r in two for k in r["keys"][4:]]
    assert len(later) == len(set(later)) == 2 * 6 * 16 - 8  # epoch 1: no repeats yet
