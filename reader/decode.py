"""Parsing records and decoding their images to fixed channels (and sizes), in TensorFlow ops."""

from __future__ import annotations

import numpy as np

from reader import tfcall
from schemas import features, layout, storage

tf = storage.tensorflow()

# libjpeg's accurate integer IDCT, as Pillow and DALI (with fancy upsampling)
# use: TensorFlow's default, the fast one, differs from them by up to 26 levels
# on a 4:2:0 JPEG where the accurate one differs by 1 (tests/test_decoders.py).
JPEG_DCT = "INTEGER_ACCURATE"


class Decoder:
    """Parses records (one, or a batch at once) and decodes their images.

    Args:
        kind: the record kind (image or path).
        spec: ``tf.io.parse_example`` spec of the features to parse.
        root: path kind: the folder stored paths are relative to.
        decode, channels, image_size, random_crop, seed: as in ``ReadOptions``.
    """

    def __init__(self, kind, spec, root, decode, channels, image_size, random_crop, seed):
        self.kind, self.spec, self.root = kind, spec, root
        self.decode, self.channels, self.image_size = decode, channels, image_size
        self.random_crop, self.seed = random_crop, seed

    def _data(self, ex):
        if features.ENCODED in ex:  # image records, or path records fetched from a bucket
            return ex[features.ENCODED]
        return tf.io.read_file(tf.strings.join([self.root, "/", ex[features.PATH]]))

    def _fetched(self, ex):
        """Path records whose images are in a bucket: each batch's images fetched at once,
        through the store (``schemas.storage``), never TensorFlow's own GCS client."""
        if self.kind != "path" or not storage.is_url(self.root):
            return ex
        paths = ex[features.PATH]
        data = tfcall.call(self._fetch, [tf.reshape(paths, [-1])], tf.string, stateful=False)
        return {**ex, features.ENCODED: tf.reshape(data, tf.shape(paths))}

    def _fetch(self, paths):
        from concurrent.futures import ThreadPoolExecutor

        urls = [layout.join(self.root, p.decode()) for p in paths]
        with ThreadPoolExecutor(min(16, max(len(urls), 1))) as pool:
            return np.array(list(pool.map(storage.read_bytes, urls)), dtype=object)

    def _image(self, ex, epoch):
        data = self._data(ex)
        if not self.decode:
            return data
        if self.random_crop:
            image = _decode_random_crop(
                data, ex[features.FORMAT], self.channels, self._crop_seed(ex, epoch)
            )
        else:
            image = decode_full(data, ex[features.FORMAT], self.channels)
        if self.image_size is not None:
            image = tf.image.resize(image, self.image_size)
            image = tf.saturate_cast(tf.round(image), tf.uint8)
        return image

    def _crop_seed(self, ex, epoch):
        """A crop's seed from (seed, key, epoch): the same crop for the same example and
        epoch whatever the worker count, parallelism or resume point; new each epoch."""
        key = tf.strings.to_hash_bucket_strong(ex[features.KEY], 2**63 - 1, [self.seed, 0])
        return tf.stack([key, tf.cast(epoch, tf.int64)])

    def _features(self, ex, image):
        out = {"image": image, "label": ex[features.LABEL], "key": ex[features.KEY]}
        if self.kind == "path":
            out["path"] = ex[features.PATH]
        return out

    def one(self, serialized, epoch=None):
        ex = tf.io.parse_single_example(serialized, self.spec)
        ex = self._fetched({k: tf.squeeze(v, 0) for k, v in ex.items()})
        return self._features(ex, self._image(ex, epoch))

    def batch(self, serialized, epochs=None):
        """Parses a batch of records and decodes its images; ``epochs`` (a crop's epoch)
        only with random_crop."""
        ex = tf.io.parse_example(serialized, self.spec)
        ex = self._fetched({k: tf.squeeze(v, 1) for k, v in ex.items()})
        if self.decode:
            signature = tf.TensorSpec([*self.image_size, self.channels], tf.uint8)
        else:
            signature = tf.TensorSpec([], tf.string)
        if self.kind == "image" and not self.decode:
            images = ex[features.ENCODED]
        else:
            names = [
                k
                for k in (features.ENCODED, features.PATH, features.FORMAT, features.KEY)
                if k in ex
            ]
            if epochs is None:  # no random crop: no epoch
                epochs = tf.zeros(tf.shape(ex[features.KEY]), tf.int64)
            images = tf.map_fn(
                lambda one: self._image(dict(zip(names, one[:-1])), one[-1]),
                (*(ex[k] for k in names), epochs),
                fn_output_signature=signature,
            )
        return self._features(ex, images)


def _decode_random_crop(data, fmt, channels, seed):
    """Random crop (8%-100% of the area, 3/4-4/3 aspect); JPEG decodes only the crop.

    ``seed``: a shape [2] int64 tensor for the stateless box sampler.
    """

    def box(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            tf.zeros([0, 0, 4]),
            seed=seed,
            min_object_covered=0.08,
            aspect_ratio_range=(0.75, 1.33),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, size

    def jpeg():
        begin, size = box(tf.image.extract_jpeg_shape(data))
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        cropped = tf.image.decode_and_crop_jpeg(
            data, window, channels=3 if channels == 3 else 0, dct_method=JPEG_DCT
        )
        return to_channels(cropped, channels)

    def other():
        image = decode_full(data, fmt, channels)
        begin, size = box(tf.shape(image))
        return tf.slice(image, begin, size)

    image = tf.cond(tf.equal(fmt, "jpeg"), jpeg, other)
    image.set_shape([None, None, channels])
    return image


def decode_full(data, fmt, channels):
    """Decodes any supported format to ``channels`` channels.

    Decoders differ in the channel counts they accept (GIF gives RGB only,
    WebP 3 or 4, libjpeg cannot turn CMYK into gray), so images are decoded
    as stored and converted here. JPEG asked for 3 channels decodes straight
    to RGB (CMYK included) in libjpeg: the common case, and the fastest.
    The rules every reader follows are in docs/convert.md#decoding.
    """
    if channels == 3:
        image = tf.cond(
            tf.equal(fmt, "jpeg"),
            lambda: tf.io.decode_jpeg(data, channels=3, dct_method=JPEG_DCT),
            lambda: to_channels(_decode_native(data, fmt), 3),
        )
    else:
        image = to_channels(_decode_native(data, fmt), channels)
    image.set_shape([None, None, channels])
    return image


def _decode_native(data, fmt):
    # expand_animations=False: the first frame of a GIF/WebP, always 3-D.
    return tf.cond(
        tf.equal(fmt, "jpeg"),
        lambda: tf.io.decode_jpeg(data, channels=0, dct_method=JPEG_DCT),
        lambda: tf.io.decode_image(data, channels=0, expand_animations=False),
    )


def to_channels(image, channels):
    """Converts an image of 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA) channels."""
    c = tf.shape(image)[-1]
    gray = image[..., :1]
    rgb = tf.cond(c >= 3, lambda: image[..., :3], lambda: tf.tile(gray, [1, 1, 3]))
    if channels == 3:
        return rgb
    if channels == 1:
        return tf.cond(c >= 3, lambda: tf.image.rgb_to_grayscale(rgb), lambda: gray)
    opaque = tf.fill(tf.shape(gray), tf.constant(255, image.dtype))
    alpha = tf.case(
        [(tf.equal(c, 4), lambda: image[..., 3:4]), (tf.equal(c, 2), lambda: image[..., 1:2])],
        default=lambda: opaque,
    )
    return tf.concat([rgb, alpha], axis=-1)
