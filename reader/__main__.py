"""``python -m reader DATA_DIR``: reads one batch back from a dataset (the end of ``make demo``)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m reader",
        description="Read one batch of a split back from an evenshard dataset and print it.",
    )
    p.add_argument("data_dir", nargs="?", default="demo_data/out", help="the dataset folder")
    p.add_argument("--split", default="train", help="split to read (default: train)")
    p.add_argument("--batch_size", type=int, default=8, help="examples in the batch (8)")
    p.add_argument(
        "--path_root", default=None, help="path records: where the images are now (moved)"
    )
    args = p.parse_args(argv)
    import reader
    from reader.values.split_shards import named_split
    from schemas.dataset_info import load_dataset_info

    try:
        info = load_dataset_info(args.data_dir)
        # a split that is not there, or empty, is one line before TensorFlow starts
        if named_split(info, args.data_dir, args.split).num_examples == 0:
            raise reader.DatasetError(
                f"split {args.split!r} of {args.data_dir} has no examples; it has "
                + ", ".join(f"{s.name} ({s.num_examples})" for s in info.splits)
            )
        ds = reader.make_dataset(
            args.data_dir,
            split=args.split,
            batch_size=args.batch_size,
            image_size=(32, 32),
            seed=0,
            epochs=1,
            path_root=args.path_root,
        )
        batch = next(iter(ds))
    except (reader.DatasetError, ValueError) as e:
        print(f"python -m reader: error: {e}", file=sys.stderr)
        return 2
    labels = [info.labels[i] for i in batch["label"].numpy()]
    print(
        f"read one batch from {args.data_dir}/{args.split}: image "
        f"{tuple(batch['image'].shape)} {batch['image'].dtype.name}, labels {labels}"
    )
    print("keys:", json.dumps([k.decode() for k in batch["key"].numpy()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
