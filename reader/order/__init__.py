"""Floor 0, the order: which records a worker reads and when, as pure numpy functions
of a few integers (docs/design.md, "The reader's floors")."""
