"""botocore's ``create_loader`` and boto3's sessions, shared: imports botocore and boto3
alone (tests/conftest.py's S3 fixture and the ``evenshard`` command test_buckets runs
use them)."""

from __future__ import annotations

import os
import threading

# What a client takes from the environment: the server, credentials, region.
_ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
)


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


def one_client_a_configuration():
    """A stand-in for ``boto3.session.Session``: each ``client(...)`` of the same
    arguments and the same environment (server, credentials) is one client, made once.
    Beam's S3 file system starts a session and a client for each call (47 in a small
    convert from s3:// to s3://): with the loader shared, still some 30 ms of CPU each,
    most of it the session. boto3's clients are thread-safe; they are made under a
    lock (its sessions are not). Each call still sends its own requests: what reaches
    the server does not change, only fewer sessions are built (and connections reused)."""
    from boto3 import session as boto3_session

    Session = boto3_session.Session
    made, lock = {}, threading.Lock()
    shared = {}

    class SharedSession:
        def __init__(self, *args, **kwargs):
            self._own = (args, tuple(sorted(kwargs.items())))

        def _session(self):
            key = (self._own, tuple(os.environ.get(n) for n in _ENVIRONMENT))
            with lock:
                if key not in shared:
                    shared[key] = Session(*self._own[0], **dict(self._own[1]))
                return key, shared[key]

        def client(self, *args, **kwargs):
            key, session = self._session()
            key = (key, args, tuple(sorted(kwargs.items(), key=lambda kv: kv[0])))
            with lock:
                if key not in made:
                    made[key] = session.client(*args, **kwargs)
                return made[key]

        def __getattr__(self, name):  # get_credentials, region_name, ...
            if name.startswith("_"):  # nothing of boto3's private state, nor _own unset
                raise AttributeError(name)
            return getattr(self._session()[1], name)

    return SharedSession
