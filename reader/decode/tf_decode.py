"""Parsing records and decoding their images to fixed channels (and sizes), in TensorFlow ops."""

from __future__ import annotations

import numpy as np

from reader.records import tfcall
from schemas import features, layout, storage
from schemas.errors import InvalidValueError

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
        decode, channels, image_size, seed: as in ``ReadOptions``.
        augment: ``ReadOptions.augment()``: crop boxes and flips, drawn in Python a
            batch at a time (``reader/order/augment.py``, the boxes every reader draws);
            ``spec`` then holds the images' height and width.
    """

    def __init__(self, kind, spec, root, decode, channels, image_size, augment, seed):
        self.kind, self.spec, self.root = kind, spec, root
        self.decode, self.channels, self.image_size = decode, channels, image_size
        self.augment, self.seed = augment, seed

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

    def _image(self, ex, box):
        data = self._data(ex)
        if not self.decode:
            return data
        if box is not None:
            fmt = ex[features.FORMAT]
            stored = tf.stack([ex[features.HEIGHT], ex[features.WIDTH]])
            image = _decode_box(data, fmt, self.channels, box, stored, self._name(ex))
        else:
            image = decode_full(data, ex[features.FORMAT], self.channels)
        return image  # at its own size: an image_size goes through ``_in_python``

    def _name(self, ex):
        """What names an image in an error: its path (path records) or key."""
        return ex[features.PATH] if features.PATH in ex else ex[features.KEY]

    def _boxes(self, ex, epochs):
        """The crop boxes and flips of a batch: (n, 5) int64 (``Augment.boxes``)."""

        def boxes(keys, epochs, heights, widths):
            views = np.zeros_like(epochs)
            return self.augment.boxes(self.seed, keys, epochs, views, heights, widths)

        inputs = [ex[features.KEY], epochs, ex[features.HEIGHT], ex[features.WIDTH]]
        out = tfcall.call(boxes, [tf.reshape(v, [-1]) for v in inputs], tf.int64)
        out.set_shape([None, 5])
        return out

    def _in_python(self, ex, epochs):
        """A batch's images at ``image_size`` by one Python call (``_pixels``): simplejpeg
        and OpenCV release the GIL, so tf.data's parallel calls decode on every core."""
        if features.ENCODED in ex:
            data = ex[features.ENCODED]
        else:  # local path records: TensorFlow reads the files
            data = tf.map_fn(
                lambda path: tf.io.read_file(tf.strings.join([self.root, "/", path])),
                ex[features.PATH],
                fn_output_signature=tf.string,
            )
        boxed = self.augment is not None
        if boxed:
            sizes = [ex[features.HEIGHT], ex[features.WIDTH], self._boxes(ex, epochs)]
        else:
            empty = tf.zeros([0], tf.int64)
            sizes = [empty, empty, tf.zeros([0, 5], tf.int64)]

        def decoded(*columns):
            return _pixels(self.channels, tuple(self.image_size), boxed, *columns)

        images = tfcall.call(decoded, [data, self._name(ex), *sizes], tf.uint8)
        images.set_shape([data.shape[0], *self.image_size, self.channels])
        return images

    def _features(self, ex, image):
        out = {"image": image, "label": ex[features.LABEL], "key": ex[features.KEY]}
        if self.kind == "path":
            out["path"] = ex[features.PATH]
        return out

    def one(self, serialized, epoch=None):
        ex = tf.io.parse_single_example(serialized, self.spec)
        ex = self._fetched({k: tf.squeeze(v, 0) for k, v in ex.items()})
        if self.decode and self.image_size is not None:  # a batch of one
            one = {k: tf.expand_dims(v, 0) for k, v in ex.items()}
            epochs = None if epoch is None else tf.reshape(epoch, [1])
            return self._features(ex, self._in_python(one, epochs)[0])
        box = None
        if self.augment is not None and self.decode:
            box = self._boxes(ex, tf.reshape(epoch, [1]))[0]
        return self._features(ex, self._image(ex, box))

    def batch(self, serialized, epochs=None):
        """Parses a batch of records and decodes its images; ``epochs`` (the records'
        epochs, which seed the augmentations) only with ``augment``."""
        ex = tf.io.parse_example(serialized, self.spec)
        ex = self._fetched({k: tf.squeeze(v, 1) for k, v in ex.items()})
        if self.decode:
            signature = tf.TensorSpec([*self.image_size, self.channels], tf.uint8)
        else:
            signature = tf.TensorSpec([], tf.string)
        if self.kind == "image" and not self.decode:
            images = ex[features.ENCODED]
        elif self.decode and self.image_size is not None:
            images = self._in_python(ex, epochs)
        else:
            wanted = (features.ENCODED, features.PATH, features.FORMAT, features.KEY)
            wanted += (features.HEIGHT, features.WIDTH)  # parsed when augmenting
            names = [k for k in wanted if k in ex]
            columns = tuple(ex[k] for k in names)
            boxed = self.augment is not None and self.decode
            if boxed:  # each image's box rides along as the last column
                columns += (self._boxes(ex, epochs),)
            images = tf.map_fn(
                lambda one: self._image(dict(zip(names, one)), one[-1] if boxed else None),
                columns,
                fn_output_signature=signature,
            )
        return self._features(ex, images)


def _pixels(channels, size, boxes, data, names, heights, widths, crops):
    """A batch's images decoded, cropped and resized (``reader.decode.pixels``, the Python
    route's own functions: the same pixels, in a third of TensorFlow's decode and
    resize time); an image that fails, one line naming it."""
    from reader.decode import pixels

    out = np.empty((len(data), *size, channels), np.uint8)
    for i, encoded in enumerate(data):
        name = names[i].decode(errors="replace")
        try:
            image = pixels.decode(encoded, channels)
        except Exception as e:  # noqa: BLE001 - decoders raise many types on bad input
            raise InvalidValueError(f"evenshard: image {name} cannot be decoded: {e}") from None
        if boxes:
            if image.shape[:2] != (heights[i], widths[i]):
                raise InvalidValueError(
                    f"evenshard: image {name} is {image.shape[0]}x{image.shape[1]} but was "
                    f"{heights[i]}x{widths[i]} when converted (replaced since?): convert it again"
                )
            out[i] = pixels.crop_resize(image, crops[i], size)
        else:
            out[i] = pixels.resize(image, size)
    return out


def _decode_box(data, fmt, channels, box, stored, name):
    """The image's ``box`` (top, left, height, width, flip), flipped left-right when
    ``flip`` is 1; a JPEG decodes only the box. The box was drawn for the ``stored``
    (height, width) of the record: an image of another size (a path record's file
    replaced since convert) is an error naming it (``name``), not another box."""
    window = tf.cast(box[:4], tf.int32)

    def same_size(shape):
        check = tf.debugging.Assert(
            tf.reduce_all(tf.equal(tf.cast(shape[:2], tf.int64), stored)),
            [
                "evenshard: image",
                name,
                "is",
                shape[:2],
                "but was",
                stored,
                "when converted (replaced since?): convert it again",
            ],
        )
        return tf.control_dependencies([check])

    def jpeg():
        with same_size(tf.image.extract_jpeg_shape(data)):
            window_ = tf.identity(window)
        cropped = tf.image.decode_and_crop_jpeg(
            data, window_, channels=3 if channels == 3 else 0, dct_method=JPEG_DCT
        )
        return to_channels(cropped, channels)

    def other():
        image = decode_full(data, fmt, channels)
        with same_size(tf.shape(image)):
            begin, size = tf.identity(window[:2]), tf.identity(window[2:])
        return tf.slice(image, [begin[0], begin[1], 0], [size[0], size[1], -1])

    image = tf.cond(tf.equal(fmt, "jpeg"), jpeg, other)
    image = tf.cond(tf.equal(box[4], 1), lambda: tf.reverse(image, [1]), lambda: image)
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


class ExampleDecoder:
    """The decode stage for records that are not images (``record_kind: "example"``):
    a batch parsed by ``tf.io.parse_example`` (``reader.examples.tf_parse_batch``),
    nothing decoded; its ``label`` ids and ``key`` as ``reader.records.example_batches`` says.

    Args:
        spec: the features to parse (``reader.examples.Feature`` values).
        fields: the read's ``example_batches.RecordFields``.
    """

    def __init__(self, spec: dict, fields):
        self.spec, self.fields = spec, fields
        self.parsed = {**spec, **fields.wanted()}

    def batch(self, serialized, epochs=None):
        """``{feature: tensor or Padded, "label", "key"}`` of a batch of records."""
        from reader.examples import tf_parse_batch

        parsed = tf_parse_batch(serialized, self.parsed)
        out = {name: parsed[name] for name in self.spec}
        f = self.fields
        if f.label:
            value = parsed[f.label][:, 0]
            if f.label_kind == "bytes":  # a text label's id: its position in labels.txt
                names = tf.constant(list(f.labels) or [""])
                value = tf.argmax(tf.equal(value[:, None], names[None, :]), 1)
            out["label"] = value
        if f.key:
            out["key"] = parsed[f.key][:, 0]
        return out

    def one(self, serialized, epoch=None):
        """One record's values (``batch_size=None``), without a batch dimension."""
        batch = self.batch(tf.reshape(serialized, [1]))
        return tf.nest.map_structure(lambda v: v[0], batch)
