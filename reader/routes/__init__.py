"""Floor 4, the routes the faces stand on: the tf graph stream (``graph``), the Python
route (``python_route``: its process pool, ``preprocess`` and ``preprocess_worker``,
shared memory blocks, views handed over, the training script's imports preloaded in the
fork server; ``tf_adapter``: its batches as a tf.data dataset), the DALI decode
(``dali_decode``), and a ``TorchReader``'s engine, backends, passes and spread reads
(``torch_*``) (docs/design.md, "The reader's floors").

Nothing is imported here: the fork server imports ``reader.routes.script_preload``."""
