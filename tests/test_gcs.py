"""gs:// against a GCS API server on loopback (issue 20, first part): the format's one
IO layer (schemas/storage.py, google-cloud-storage) reads a dataset in a bucket for
inspect and validate, and names what is wrong in one line."""

from __future__ import annotations

import pytest
from conftest import run_convert

from audit.validate import validate
from evenshard import cli, synthetic
from schemas import storage
from schemas.info import load_info

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("gcs") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=20, formats=("jpeg", "png"))
    out = str(tmp_path_factory.mktemp("gcs_out") / "out")
    run_convert(str(root), out, "--splits=train=0.8,val=0.2")
    return out


def test_inspect_and_validate_read_a_dataset_in_a_bucket(bucket, local_dataset, capsys):
    url = bucket.upload(local_dataset, "data/out")
    assert load_info(url) == load_info(local_dataset)
    assert storage.isdir(url) and storage.listdir(url) == sorted(
        n for n in storage.listdir(local_dataset)
    )
    assert validate(url, full=True) == []
    assert cli.main(["inspect", url]) == 0
    assert "train" in capsys.readouterr().out
    # a shard changed in the bucket is named
    shard = load_info(url)["splits"]["train"]["shards"][0]["file"]
    blob = bucket.bucket.blob(f"data/out/{shard}")
    data = bytearray(blob.download_as_bytes())
    data[-10] ^= 0xFF
    blob.upload_from_string(bytes(data))
    assert any(shard in p for p in validate(url))


def test_a_missing_bucket_or_object_is_one_line_naming_it(bucket, capsys):
    assert cli.main(["inspect", "gs://no-such-bucket-here/out"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gs://no-such-bucket-here/out" in err[0], err
    with pytest.raises(FileNotFoundError, match="bucket gs://no-such-bucket-here does not exist"):
        storage.read_bytes("gs://no-such-bucket-here/x")
    with pytest.raises(FileNotFoundError, match=f"{bucket.url}/missing.json does not exist"):
        storage.open_binary(f"{bucket.url}/missing.json")
    assert not storage.exists(f"{bucket.url}/missing.json")


def test_convert_from_a_bucket_to_a_bucket(bucket, tmp_path, caplog):
    """Folder and manifest inputs in the bucket, output in the bucket: the datasets pass
    validate --full there; no credentials lookup (the emulator needs none): no traceback."""
    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=8, formats=("png",))
    (root / "notes.txt").write_text("not an image")
    images = bucket.upload(str(root), "in/images")
    info = run_convert(images, f"{bucket.url}/out", "--splits=train=0.5,val=0.5")
    assert info["inputs"] == 25 and info["rejects"]["total"] == 1
    lines = ["path,label"] + [
        f"images/label_{i % 3}/img_{i // 3:05d}.png,l{i % 3}" for i in range(9)
    ]
    bucket.bucket.blob("in/manifest.csv").upload_from_string("\n".join(lines) + "\n")
    info = run_convert(f"{bucket.url}/in/manifest.csv", f"{bucket.url}/out_m", "--splits=train=1.0")
    assert info["splits"]["train"]["num_examples"] == 9
    assert "Traceback" not in caplog.text and "credentials" not in caplog.text.lower()
