"""Floor 1, other libraries' private names, one module a library (``torch``, ``tf``,
``mp``: multiprocessing), each checked against the installed version
(docs/design.md, "The reader's floors")."""
