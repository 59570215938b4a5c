"""The writers of ``peers_bench.py``'s tools, each fed the label-sorted listing
(``_peers_io.listing``) and storing each image's index beside its label."""

from __future__ import annotations

import os
import pickle
import shutil

from _peers_io import LIT_CHUNK, SHARDS, WDS_MAXCOUNT, WORKERS, read_bytes


def fresh(out: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)


def _contiguous(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` runs in order, as a writing loop fills one file after another."""
    return [items[len(items) * p // parts : len(items) * (p + 1) // parts] for p in range(parts)]


# ----------------------------------------------------------------------------- writes


def write_tf_plain(items, out: str) -> dict:
    """A plain loop: tf.train.Example records through tf.io.TFRecordWriter, 16 files."""
    import tensorflow as tf

    def feature(**values):
        out = {}
        for k, v in values.items():
            if isinstance(v, bytes):
                out[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
            else:
                out[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        return tf.train.Features(feature=out)

    for s, part in enumerate(_contiguous(items, SHARDS)):
        with tf.io.TFRecordWriter(os.path.join(out, f"data-{s:05d}.tfrecord")) as w:
            for path, label, index in part:
                example = tf.train.Example(
                    features=feature(image=read_bytes(path), label=label, index=index)
                )
                w.write(example.SerializeToString())
    return {"files": SHARDS}


def write_webdataset(items, out: str) -> dict:
    """``wds.ShardWriter``: tar shards of 1,000 samples (``.jpg`` bytes, ``.cls``)."""
    import webdataset as wds

    with wds.ShardWriter(
        os.path.join(out, "shard-%06d.tar"), maxcount=WDS_MAXCOUNT, verbose=0
    ) as w:
        for path, label, index in items:
            w.write({"__key__": f"{index:06d}", "jpg": read_bytes(path), "cls": label})
    return {"files": len(os.listdir(out))}


def write_arrayrecord(items, out: str) -> dict:
    """``ArrayRecordWriter`` (``group_size:1``, for random access), 16 files, each
    record a pickled dict (the JPEG's bytes, label, index)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    for s, part in enumerate(_contiguous(items, SHARDS)):
        w = ArrayRecordWriter(os.path.join(out, f"data-{s:05d}.array_record"), "group_size:1")
        for path, label, index in part:
            w.write(pickle.dumps({"image": read_bytes(path), "label": label, "index": index}))
        w.close()
    return {"files": SHARDS}


def _lit_sample(item):
    path, label, index = item
    return {"index": index, "label": label, "image": read_bytes(path)}


def write_litdata(items, out: str) -> dict:
    """``litdata.optimize`` in 2 worker processes, chunks of 64 MB."""
    import litdata

    litdata.optimize(
        fn=_lit_sample,
        inputs=[tuple(i) for i in items],
        output_dir=out,
        chunk_bytes=LIT_CHUNK,
        num_workers=WORKERS,
        verbose=False,
    )
    return {"files": len([n for n in os.listdir(out) if n.endswith(".bin")])}


def write_mds(items, out: str) -> dict:
    """MosaicML ``MDSWriter``, its default shard size (67 MB), no compression."""
    from streaming import MDSWriter

    columns = {"image": "bytes", "label": "int", "index": "int"}
    with MDSWriter(out=out, columns=columns, progress_bar=False) as w:
        for path, label, index in items:
            w.write({"image": read_bytes(path), "label": label, "index": index})
    return {"files": len([n for n in os.listdir(out) if n.endswith(".mds")])}


WRITERS = {
    "tf_plain": write_tf_plain,
    "webdataset": write_webdataset,
    "arrayrecord": write_arrayrecord,
    "litdata": write_litdata,
    "mds": write_mds,
}
