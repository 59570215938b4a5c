"""The rewrite a user writes instead of convert (records_bench.py's baseline): tf.data over
the files with ``interleave``, ``shuffle(10000)``, 100-example files written with
``tf.io.TFRecordWriter``. Run as its own process so its peak memory is measured.

    _plain_rewrite.py PATTERN OUT_DIR [--per_file 100] [--buffer 10000]

A gs:// PATTERN's files are listed and read through google-cloud-storage, 16 downloads
in flight, anonymously (TensorFlow's own GCS client does not honour
``STORAGE_EMULATOR_HOST``, the loopback server).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gcs_files(tf, pattern: str):
    """The records of a gs:// glob's files, each file one download, 16 in flight."""
    import fnmatch
    import io
    from concurrent.futures import ThreadPoolExecutor

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    from schemas import storage, tfrecord

    # the loopback server takes anonymous calls; listed the way its downloads go, not
    # through Beam (whose credential lookup retries for about 30 s with none found)
    client = gcs.Client(project="plain", credentials=AnonymousCredentials())
    bucket, _, glob = pattern[len("gs://") :].partition("/")
    prefix = glob.split("*", 1)[0]
    names = sorted(
        f"gs://{bucket}/{blob.name}"
        for blob in client.list_blobs(bucket, prefix=prefix)
        if fnmatch.fnmatchcase(blob.name, glob)
    )

    def records():
        with ThreadPoolExecutor(16) as pool:
            for data in pool.map(storage.read_bytes, names):
                yield from tfrecord.iter_records("x.tfrecord", io.BytesIO(data))

    return tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.string))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("pattern")
    p.add_argument("out")
    p.add_argument("--per_file", type=int, default=100)
    p.add_argument("--buffer", type=int, default=10_000)
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    if a.pattern.startswith("gs://"):
        ds = _gcs_files(tf, a.pattern)
    else:
        files = tf.data.Dataset.list_files(a.pattern, shuffle=False)
        ds = files.interleave(
            tf.data.TFRecordDataset, cycle_length=16, num_parallel_calls=tf.data.AUTOTUNE
        )
    ds = ds.shuffle(a.buffer, seed=0).prefetch(tf.data.AUTOTUNE)
    os.makedirs(a.out, exist_ok=True)
    writer, n = None, 0
    for record in ds:
        if n % a.per_file == 0:
            if writer:
                writer.close()
            name = f"part-{n // a.per_file:06d}.tfrecord"
            writer = tf.io.TFRecordWriter(os.path.join(a.out, name))
        writer.write(record.numpy())
        n += 1
    if writer:
        writer.close()


if __name__ == "__main__":
    main()
