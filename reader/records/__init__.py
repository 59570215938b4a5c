"""Floor 3, records: a worker's serialized records in read order, as tf.data datasets
(``stream``) or in Python (``source``: batches of records fetched by their offsets,
``record_offsets``), pass-through records' batches (``example_batches``), and the
Python calls tf.data makes (``tfcall``) (docs/design.md, "The reader's floors")."""
