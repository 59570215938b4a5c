"""evenshard: globally shuffled, split, balanced TFRecord shards with Apache Beam.

One distribution installs the five packages (``schemas`` the format,
``convert_core`` convert's steps as plain functions, ``beam_jobs`` running them with
Beam, ``reader`` reading the format, ``audit`` checking and measuring it) and the
``evenshard`` command (package ``evenshard``, on top).
Dataflow workers install the same distribution from ``--setup_file ./setup.py``.
"""

from setuptools import find_packages, setup

setup(
    name="evenshard",
    version="0.1.0",
    description=(
        "Image folders and manifests to globally shuffled, split, balanced "
        "TFRecord shards (Apache Beam), with tf.data readers and TFMD schemas."
    ),
    python_requires=">=3.10,<3.13",
    # reader's floors are sub-packages (reader.order, ...): a wheel holds them too
    packages=find_packages(
        include=["schemas", "convert_core", "beam_jobs", "reader", "reader.*", "audit", "evenshard"]
    ),
    package_data={"schemas": ["*.pbtxt"]},
    install_requires=[
        # tfx-bsl 1.21 pins tensorflow 2.21 and tensorflow-metadata 1.21.
        "apache-beam[gcp]>=2.60,<3",
        "tensorflow>=2.21,<2.22",
        "tfx-bsl>=1.21,<1.22",
        "tensorflow-metadata>=1.21,<1.22",
        "pillow>=10",
        # the Python route (NumpyReader, transform=): libjpeg-turbo without Pillow's
        # overhead, and OpenCV's bilinear resize (tf.image.resize's, within a level)
        "simplejpeg>=1.8",
        "opencv-python-headless>=4.9",
        "numpy>=2.0",  # bitwise_count: near-duplicate fingerprints
        "google-crc32c>=1.5",
        "matplotlib>=3.7",  # evenshard shuffle-report plots
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # make test runs the test files on every core
            "pytest-timeout>=2.3",  # a test that hangs fails, its threads' stacks shown
            "ruff>=0.6",
            "scipy>=1.11",
            "apache-beam[dask]>=2.60,<3",
            "dask[distributed]",  # the Dask runner test
            "gcp-storage-emulator",  # a GCS API server on loopback: the gs:// tests
            "boto3>=1.34",  # s3://, tested against moto's server
            "moto[server]>=5.1",  # an S3 API server on loopback: the s3:// tests
            # the DALI, PyTorch and JAX readers are tested too (make test)
            "nvidia-dali-cuda120>=2.4",
            "torch>=2.4",
            "torchdata>=0.10",  # StatefulDataLoader: TorchReader's state per worker
            "jax>=0.4.30",
            # record inputs (issue 42) written by their own libraries in the tests
            "datasets>=3",  # Hugging Face Parquet
            "webdataset>=0.2",  # WebDataset tars
            "tensorflow-datasets>=4.9",  # a TFDS-prepared dataset
        ],
        "dask": ["apache-beam[dask]>=2.60,<3", "dask[distributed]"],
        # s3:// datasets and conversions (schemas.stores: boto3's client, one a process)
        "s3": ["boto3>=1.34"],
        # DALI decodes on the GPU (nvJPEG); its CPU pipelines run anywhere
        "dali": ["nvidia-dali-cuda120>=2.4"],
        "torch": ["torch>=2.4"],
        "jax": ["jax>=0.4.30"],
        # benchmark tooling only: TFDS is the competitor in benchmarks/tfds_bench.py
        "bench": ["tensorflow-datasets>=4.9"],
    },
    entry_points={"console_scripts": ["evenshard=evenshard.cli:run"]},
)
