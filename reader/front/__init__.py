"""Floor 2, the read's front door: ``read.resolve`` turns what a user asked for into
one typed ``Read`` (each worker's ``Share`` of each source, the order, a mixture's
schedule, a state resumed), which every face only turns into batches; the keys of a
split's shards, and the excluded keys it does not hold (docs/design.md, "The reader's
floors")."""
