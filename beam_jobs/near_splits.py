"""The splits of near-duplicate clusters (``--dedupe near``): at their fractions, each
cluster whole.

A cluster lands where one key's hash puts it (hash mode), so a split is then a sum of
a few dozen clusters of up to 1 % each and misses its fraction by a few points (issue
46: 84.9 / 6.6 / 8.5 for 80 / 10 / 10 at 100,000 crops). Here the hash thresholds are
corrected for the clusters instead:

- every image whose split is fixed keeps it: a manifest ``split``, a cluster's given
  split, and every image in no cluster (its key's or group's hash bucket, as the
  plain convert) -- counted by split;
- the other clusters are laid in hash order (their smallest key's bucket, then the
  key: the order the plain rule cuts) end to end, and cut where each split reaches
  its fraction of all the images less what it holds already; a cluster goes to the
  split its middle falls in.

Each split then misses its fraction by at most half of each of the (one or two)
clusters on its cuts: at most the largest cluster, unless the fixed images alone
pass a split's fraction. Clusters have no size cap (issue 55): a picture with
copies making a fifth of the dataset is one cluster and moves a split by that
much; the summary warns of a cluster over 5 % of the inputs. Most clusters keep the
split their smallest key's hash gives (the cuts move by the clusters' imbalance
only); a cluster near a cut may move when the dataset grows. Memory: one record a
cluster (its smallest key and size), never one an image.
"""

from __future__ import annotations

from itertools import accumulate

from convert_core.fingerprint import fp
from convert_core.split import HASH_BUCKETS, cut_points, hash_split


class SplitRule:
    """Hash mode's split rule (names, fractions, ``--split_seed``), as AssignSplits
    applies it to an image in no cluster."""

    def __init__(self, names: tuple[str, ...], fractions: tuple[float, ...], seed: int):
        self.names, self.fractions, self.seed = tuple(names), tuple(fractions), seed
        self._cuts = cut_points(list(fractions), HASH_BUCKETS)

    def of(self, image) -> str:
        """The split of an image that is in no cluster (or given one)."""
        if image.split is not None:
            return image.split
        return hash_split(image, self.names, self._cuts, self.seed)

    def bucket(self, key: str) -> int:
        return fp(self.seed, "split", key) % HASH_BUCKETS


def fixed_split(image, clusters, rule: SplitRule):
    """Image, the clusters' table (``near_components.clusters_of``) -> the split the image has
    whatever the dealing (none for an image of a cluster without a given split)."""
    found = clusters[0].get(image.key)
    if found is None or image.split is not None:
        yield rule.of(image)
    elif found[1] is not None:
        yield found[1]


def unsplit(clusters) -> dict[str, int]:
    """The clusters' table -> {smallest key: size} of each cluster no split is given."""
    sizes: dict[str, int] = {}
    for smallest, given, _ in clusters[0].values():
        if given is None:
            sizes[smallest] = sizes.get(smallest, 0) + 1
    return sizes


def deal(sizes: dict[str, int], fixed: dict[str, int], rule: SplitRule) -> dict[str, str]:
    """{smallest key: size} of the clusters to place, {split: images fixed there} ->
    {smallest key: split}: the clusters in hash order, cut at each split's need."""
    mass = sum(sizes.values())
    if not mass:
        return {}
    total = mass + sum(fixed.values())
    need = [max(0.0, f * total - fixed.get(n, 0)) for n, f in zip(rule.names, rule.fractions)]
    scale = mass / sum(need) if sum(need) else 0.0
    cuts = list(accumulate(x * scale for x in need))
    order = sorted(sizes, key=lambda key: (rule.bucket(key), key))
    placed, at, i = {}, 0, 0
    for key in order:
        middle = at + sizes[key] / 2
        while i < len(cuts) - 1 and middle >= cuts[i]:
            i += 1
        placed[key] = rule.names[i]
        at += sizes[key]
    return placed
