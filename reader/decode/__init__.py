"""Floor 3, decoding: a record parsed and its image decoded to fixed channels (and
sizes) by the readers' decoding rules, in TensorFlow ops (``tf_decode``) or in Python
(``pydecode``; the pixels, decoded, cropped and resized in numpy: ``pixels``)
(docs/design.md, "The reader's floors")."""
