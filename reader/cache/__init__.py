"""Floor 3, the bucket cache: local copies of a gs:// or s3:// dataset's shards, fetched
ahead in the order the read uses them (``shard_cache``), whole or by runs (``policy``),
each fetch checked (``fetch``), in a folder its readers share (``folder``)
(docs/design.md, "The reader's floors")."""
