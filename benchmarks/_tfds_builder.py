"""TFDS builders over an image folder: the competitor in tfds_bench.py (benchmark tooling only).

    python _tfds_builder.py SRC OUT single|beam [WORKERS]

``single``: a ``GeneratorBasedBuilder`` whose generator yields paths (TFDS
reads the bytes, hashes keys to shuffle, writes TFRecord shards; no decode).
``beam``: the same builder with ``_generate_examples`` returning a Beam
PTransform, run by TFDS on the DirectRunner with 2 worker processes (WORKERS).
"""

from __future__ import annotations

import os
import sys

import tensorflow_datasets as tfds


def _items(src: str) -> list[tuple[str, dict]]:
    labels = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    return [
        (f"{label}/{name}", {"image": os.path.join(src, label, name), "label": label})
        for label in labels
        for name in sorted(os.listdir(os.path.join(src, label)))
    ]


def make_builder(src: str, beam: bool):
    labels = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))

    # not registered: a smoke run builds one more than once in a process (_common.run_here)
    class Folder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(encoding_format="jpeg"),
                        "label": tfds.features.ClassLabel(names=labels),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(src)}

        def _generate_examples(self, folder):
            yield from _items(folder)

    class FolderBeam(Folder, skip_registration=True):
        def _generate_examples(self, folder):
            import apache_beam as b

            return b.Create(_items(folder))

    return FolderBeam if beam else Folder


def main(argv: list[str]) -> None:
    src, out, mode, *workers = argv  # workers: the Beam path's (2; --smoke's bench: 1)
    beam = mode == "beam"
    builder = make_builder(src, beam)(data_dir=out)
    config = None
    if beam:
        from apache_beam.options.pipeline_options import PipelineOptions

        config = tfds.download.DownloadConfig(
            beam_options=PipelineOptions(
                [
                    f"--direct_num_workers={workers[0] if workers else 2}",
                    "--direct_running_mode=multi_processing",
                ]
            )
        )
    builder.download_and_prepare(download_config=config)


if __name__ == "__main__":
    main(sys.argv[1:])
