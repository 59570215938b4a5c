"""``python -m reader DATA_DIR``: reads one batch back from a dataset (the end of ``make demo``)."""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    data_dir = argv[0] if argv else "demo_data/out"
    import reader

    info = reader.load_info(data_dir)
    ds = reader.make_dataset(
        data_dir, split="train", batch_size=8, image_size=(32, 32), seed=0, epochs=1
    )
    batch = next(iter(ds))
    labels = [info["labels"][i] for i in batch["label"].numpy()]
    print(
        f"read one batch from {data_dir}/train: image {tuple(batch['image'].shape)} "
        f"{batch['image'].dtype.name}, labels {labels}"
    )
    print("keys:", json.dumps([k.decode() for k in batch["key"].numpy()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
