"""botocore's ``create_loader``, shared: imports botocore alone (tests/conftest.py's
S3 fixture and the ``evenshard`` command test_buckets runs use it)."""

from __future__ import annotations


def one_loader_a_data_path():
    """botocore's ``create_loader``, giving every session the same loader (per data
    path), as the clients of one session share theirs. Beam's S3 file system starts a
    boto3 session for each call (64 in a small convert into s3://), and each new loader
    parsed botocore's JSON models again, about 0.3 s of CPU a call. The files are
    read-only and the same: what is sent to the server does not change."""
    from botocore import loaders

    made = {}

    class Paths(list):  # boto3 appends its data folder to each new session's loader
        def append(self, path):
            if path not in self:
                super().append(path)

    def create_loader(search_path_string=None):
        if search_path_string not in made:
            loader = loaders.create_loader(search_path_string)
            loader._search_paths = Paths(loader.search_paths)
            made[search_path_string] = loader
        return made[search_path_string]

    return create_loader
