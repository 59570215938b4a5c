"""Items crossing a shuffle in batches: a few hundred opaque values cross instead of
one element an item (Beam's cost per element: encode, hand over, decode, group; a
local runner's main process does it alone while the workers wait).

``KeyedBatches`` is a DoFn whose ``keyed(element, *side)`` yields (key, item) pairs: the
items of one key leave in pickled lists of up to ``BATCH``, and a worker holds at most
``MAX_HELD`` before it sends what it has (memory: one bundle's items at most, whatever
the dataset). After the GroupByKey, :func:`unbatched` gives a key's items back; their
order is the runner's, so a step after it sorts them if its output depends on it.
"""

from __future__ import annotations

import pickle

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

BATCH = 512  # items a batch that crosses the shuffle
MAX_HELD = 8192  # items a worker holds at most before it sends what it has


class KeyedBatches(beam.DoFn):
    """Element -> (key, pickled [item]) for the (key, item) pairs ``keyed`` yields."""

    def keyed(self, element, *side):
        raise NotImplementedError

    def start_bundle(self):
        self._held: dict = {}
        self._count = 0

    def process(self, element, *side):
        for key, item in self.keyed(element, *side):
            batch = self._held.setdefault(key, [])
            batch.append(item)
            self._count += 1
            if len(batch) >= BATCH:
                yield self._send(key)
            elif self._count >= MAX_HELD:
                yield from [self._send(key) for key in list(self._held)]

    def finish_bundle(self):
        for key in list(self._held):
            yield GlobalWindows.windowed_value(self._send(key))

    def _send(self, key):
        batch = self._held.pop(key)
        self._count -= len(batch)
        return key, pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)


def unbatched(batches):
    """A key's pickled batches (:class:`KeyedBatches`) -> its items."""
    for batch in batches:
        yield from pickle.loads(batch)
