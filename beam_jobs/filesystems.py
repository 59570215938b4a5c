"""Beam's FileSystems as convert's file access: the core's URL reads (``FILES``, a
``convert_core.files.Files``) and the writer's IO (``write_atomically``,
``folder_files``)."""

from __future__ import annotations

import os
import uuid
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from convert_core.files import Files
from schemas import layout, storage, stores
from schemas.storage import is_url

if os.environ.get("EVENSHARD_GCP_ANONYMOUS"):  # a worker of a job the driver found anonymous
    from beam_jobs.runners import anonymous_beam

    anonymous_beam()


class BeamUrls:
    """URLs through Beam's FileSystems (``convert_core.files.UrlFiles``)."""

    def open(self, url: str) -> BinaryIO:
        return FileSystems.open(url, compression_type=CompressionTypes.UNCOMPRESSED)

    def exists(self, url: str) -> bool:
        return FileSystems.exists(url)

    def match(self, pattern: str, limit: int | None = None) -> list[tuple[str, int]]:
        found = FileSystems.match([pattern], limits=[limit] if limit else None)[0]
        return [(m.path, m.size_in_bytes) for m in found.metadata_list]

    def reads(self, url: str) -> bool:
        try:
            FileSystems.get_filesystem(url)
        except ValueError:
            return False
        return True


FILES = Files(BeamUrls())


def folder_files(folder: str) -> list[str]:
    """What removing ``folder`` takes, for ``FileSystems.delete``: the folder itself where
    it exists (local: removed with its files), else the objects under its prefix (a
    bucket has no folders: ``FileSystems.exists`` is False for a prefix)."""
    if FileSystems.exists(folder):
        return [folder]
    if not is_url(folder):
        return []
    return sorted(m.path for m in FileSystems.match([folder + "/*"])[0].metadata_list)


def write_atomically(path: str, data: bytes) -> None:
    """Writes to a unique temp name beside ``path`` and renames it into place; in a
    bucket (gs://, s3://), one put, which is atomic itself (and the empty file Beam's
    S3 filesystem cannot create: a multipart upload of no parts)."""
    if stores.store(path):
        storage.put(path, data)
        return
    tmp = layout.temp_name(path, uuid.uuid4().hex)
    with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)
    FileSystems.rename([tmp], [path])


# the core's reads, each through Beam's FileSystems for URLs (``convert_core.files.Files``)
open_binary = FILES.open_binary
open_text = FILES.open_text
read_bytes = FILES.read_bytes
read_range = FILES.read_range
