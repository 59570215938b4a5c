"""The loop a user writes instead of convert, as its own process, imports included:
walk a ``label/image`` folder, read each file, tf.train.Example (image bytes, label)
-> tf.io.TFRecordWriter, one file. ``--verify`` decodes each image with Pillow first
(``Image.open`` + ``load``), the check convert's ``--verify full`` makes.

    _plain_loop.py INPUT_DIR OUT_FILE [--verify]
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("input_dir")
    parser.add_argument("out_file")
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()
    import io

    import tensorflow as tf

    if args.verify:
        from PIL import Image

    labels = sorted(d.name for d in os.scandir(args.input_dir) if d.is_dir())
    with tf.io.TFRecordWriter(args.out_file) as writer:
        for label_id, label in enumerate(labels):
            folder = os.path.join(args.input_dir, label)
            for name in sorted(os.listdir(folder)):
                with open(os.path.join(folder, name), "rb") as f:
                    data = f.read()
                if args.verify:
                    with Image.open(io.BytesIO(data)) as im:
                        im.load()
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label_id])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())


if __name__ == "__main__":
    main()
