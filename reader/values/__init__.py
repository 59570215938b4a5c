"""Floor 1, values: the read options (``ReadOptions`` and its groups), the state a
trainer saves, a mixture of sources, a split's checked shards, an error in one line;
frozen, self-checking objects that import no engine (docs/design.md, "The reader's
floors")."""
