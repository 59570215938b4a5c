"""NearDuplicates (``--dedupe near``): clusters of near-duplicate images, each kept in
one split (or reduced to one image with ``--near_keep one``).

A re-encoded, resized or slightly cut copy of a photo has another key and other
bytes, so neither the key's hash nor ``--dedupe content`` keeps it out of the
other split. Here each image's 64-bit fingerprint (``schemas.near``, taken
while inspection decodes it) is compared with the others that share one of its
bands:

1. Every image's (key, fingerprint, given split) -> one table, in key order (a side
   input: 93 bytes and a key an image; about 190 bytes an image held, and a part's
   arrays about 410 more: 0.6 GB a running part at 1M images). Two
   fingerprints within ``distance`` bits share one of the ``distance + 1`` band
   values (``near_pairs``); the table's band values are found in arrays, and the
   buckets (the values two or more share) are dealt to ``TABLE_PARTS`` parts, each
   part a task that reads the table. (Until issue 55's last round each image sent
   about 20 copies of itself through a shuffle, one a band value: the local runner
   held them in its controller, 1.3 GB at 100,000 images. The user's embedding,
   hundreds of bytes a vector, still goes that way.)
2. Per bucket: the pairs that match (``schemas.near.matches``: hashes within
   ``distance`` bits, then the thumbnails alike: a second, independent measure;
   an image below the quality gate matches only a closer one),
   thinned to the bucket's minimum spanning forest, each edge weighted (bits
   apart, then thumbnail levels apart).
3. All edges -> their minimum spanning forest (a CombineFn whose accumulators are
   thinned to their forest as they grow: about two edges a clustered key, never
   every edge) -> its connected components, whatever their size (a side input:
   {key: its component's smallest key}). A component is where clusters are looked
   for, not a cluster: a chain of small steps (sliding crops, a fade) is one.
   Memory: the keys that have a near-duplicate, never the dataset.
4. Each image in a component -> (component, (key, fingerprint)) -> GroupByKey: one
   component's fingerprints in one place, cut into star clusters
   (:func:`star_clusters`): candidates in order of how many members they match,
   each one not yet taken becoming a centre that takes every member left that
   matches it (``near.matches``, the pair rule). Every member of a cluster is a
   near-duplicate of its centre. A large component compares every member with a
   sample, and the sample and the members matching most of it with every member,
   never all pairs. Memory: one
   component's fingerprints.
5. The clusters, all together (the keys in them) -> each key in a cluster ->
   (the cluster's smallest key, the split given to its smallest key that has one).
   With ``--group_by``, also the keys in a group.
6. The clusters no split is given are dealt to the splits at their fractions
   (``near_splits``: one record a cluster; the images in no cluster keep the
   plain convert's split). Each image, with the table and the dealing as side
   inputs: in a cluster, its ``group`` becomes the cluster's smallest key, and an
   image without a given split takes the cluster's (given, else dealt).
   ``--near_keep one`` keeps the cluster's smallest key given a split by the
   manifest (else its smallest key) and rejects the others as ``near_duplicate``.

Why stars (issue 55). Until then clusters were the components joined lightest
edge first up to 1 % of the inputs (at least 16): the cap stopped chains but cut
a picture with many copies in pieces (104 forms of one wallpaper: 16 at most a
cluster, in two splits; 1,000 copies: 22 clusters of at most 16 holding 168 of
them, 853 joins refused). Measured on tests/test_near_linkage.py's fixtures
(104 forms of one picture, 30 pictures x 8 forms, 41 sliding crops, a brightness
ramp of 100 steps: 485 images), four linkages of the same matched pairs:

=================  ============  ===========  =============  ==================
linkage            the 104: in   crops: clus- pairs matched  pairs in a cluster
                   pieces        ters, span   but cut apart  that do not match
=================  ============  ===========  =============  ==================
cap (1 %, 16)      41            3, 15        7,174          153
components         1             1, 40        0              2,797
stars (taken)      1             7, 9         451            1,012
complete linkage   1             9, 4         1,546          0
=================  ============  ===========  =============  ==================

Components chain (the 41 crops, whose ends share little, are one cluster).
Complete linkage (a member joins a cluster only if it matches every member)
never holds two images that do not match, but cuts three times the pairs stars
do (each cut pair may land in two splits: a leak), splits a true cluster whose
extreme forms (the smallest cut copy, the brightest) do not match each other,
and costs each member a check against every member of a cluster: the square of
a picture with 100,000 copies. Stars hold every member within the distance of
one centre (two members at most twice it apart, plus the centre's weak bits):
the copies of one picture, which all match its most matched copy, are one
cluster (above ``GRID_CELLS`` pairs, the copy that matches most of a sample is
found: 20,000 copies around one picture, one cluster), at the cost of members
times centres.

A manifest ``split`` value still wins; a cluster whose members are given two
splits keeps them as given (counted in the summary as ``given_two_splits``).
With ``--group_by``, a cluster that joins two groups joins them whole.
Deterministic on every runner: the components depend on the set of edges only,
each component's clusters on its set of members only (sorted first; ties broken by
keys; a sample chosen by a hash of the fingerprints), and the dealing on the table
and the split counts.
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs import near_splits
from beam_jobs.dead_letters import SplitRejects
from beam_jobs.near_buckets import TABLE_PARTS, bucket_edges, in_bands, member, part_edges, table_of
from beam_jobs.near_components import GROUP, clusters_of, components_of, spanning_forest
from beam_jobs.near_splits import SplitRule
from beam_jobs.near_stars import star_clusters
from beam_jobs.near_vectors import Centre, Lengths, of_one_length, with_centre
from convert_core import paths
from convert_core.records import Image, make_reject
from schemas import near_embedding, near_pairs

FOREST_SLACK = 1 << 16  # edges an accumulator takes in before it is thinned again


class _Forest(beam.CombineFn):
    """Edges -> (the minimum spanning forest of the near edges [(weight, key, key)],
    given splits {key: split}, --group_by edges {(key, group)}), whatever the order the
    edges come in: an accumulator is thinned to its forest whenever it doubles (the
    forest of a union of forests is the forest of all the edges; weights tied are
    ordered by keys, so it is one forest). Memory: two edges a key in a cluster (with
    ``--group_by``, also one a grouped key), never the edges of the dense regions."""

    def create_accumulator(self):
        return [], {}, set(), [0]

    def add_input(self, acc, edge):
        edges, given, groups, thinned = acc
        weight, a, split_a, b, split_b = edge
        if split_a is not None:
            given[a] = split_a
        if b.startswith(GROUP):
            groups.add((a, b))
            return acc
        if split_b is not None:
            given[b] = split_b
        edges.append((weight, a, b))
        if len(edges) > 2 * thinned[0] + FOREST_SLACK:
            edges[:] = spanning_forest(edges)
            thinned[0] = len(edges)
        return acc

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for edges, given, groups, _ in accs:
            merged[0].extend(edges)
            merged[1].update(given)
            merged[2].update(groups)
            if len(merged[0]) > 2 * merged[3][0] + FOREST_SLACK:
                merged[0][:] = spanning_forest(merged[0])
                merged[3][0] = len(merged[0])
        return merged

    def extract_output(self, acc):
        return spanning_forest(acc[0]), acc[1], acc[2]


def _to_component(im: Image, components: dict[str, str]):
    found = components.get(im.key)
    if found is not None:
        yield found, (im.key, bytes.fromhex(im.near))


def _stars(element, rule) -> tuple[str, int, list[list[str]]]:
    """(component, [(key, fingerprint's bytes)]) -> (component, its size, its clusters)."""
    component, members = element
    members = list(members)
    return component, len(members), star_clusters(members, rule)


def _group_edges(im: Image):
    if im.group is not None:
        yield 0, im.key, im.split, GROUP + im.group, None


class _Assign(beam.DoFn):
    """Image -> Image in its cluster (group and split set), or a ``near_duplicate``
    Reject (``--near_keep one``: the cluster's first key given a split is kept, else its
    smallest key)."""

    def __init__(self, keep_one: bool, source_root: str | None):
        self._keep_one, self._root = keep_one, source_root

    def process(self, im: Image, clusters, dealt):
        found = clusters[0].get(im.key)
        if found is None:  # no near-duplicate
            yield im
            return
        smallest, split, keeper = found
        if not self._keep_one:
            split = im.split or split or dealt.get(smallest)
            yield im._replace(group=smallest, split=split)
        elif im.key == keeper:
            yield im
        else:
            source = paths.full_source(self._root, im.source, im.key)
            detail = f"in the cluster of near-duplicates of {keeper}, which is kept"
            yield make_reject(im.key, source, "near_duplicate", detail)


def summary(clusters: tuple, rule: dict, keep: str) -> dict:
    """What dataset_info.json says of the clusters found (``rule``: {"distance": bits},
    or {"embedding": MODULE:FUNCTION, "threshold": cosine}, which the audit reads)."""
    counts = clusters[1]
    rejected = counts["inputs_in_clusters"] - counts["clusters"] if keep == "one" else 0
    return {**rule, "keep": keep, **counts, "rejected": rejected}


class NearDuplicates(beam.PTransform):
    """Image (with ``near``) -> {main: Image, rejects: Reject, summary: one dict}.

    ``distance``: bits within which two fingerprints are near-duplicates; ``keep``:
    "all" (a cluster in one split) or "one" (one image a cluster, the others rejected);
    ``group_by``: whether images carry manifest groups (joined by their clusters);
    ``rule``: hash mode's split rule, by which the clusters are dealt to the splits at
    their fractions (``near_splits``; None: each where its smallest key's hash puts it);
    ``embedding``: (MODULE:FUNCTION, cosine threshold) when ``Image.near`` holds the
    user's embedding (``schemas.near_embedding``) rather than the hash's fingerprint:
    the same steps, pairs by cosine.
    """

    def __init__(
        self,
        distance: int,
        keep: str,
        group_by: bool,
        source_root: str | None,
        rule: SplitRule | None = None,
        embedding: tuple[str, float] | None = None,
    ):
        super().__init__()
        self._distance, self._keep, self._groups = distance, keep, group_by
        self._root, self._rule, self._embedding = source_root, rule, embedding

    def expand(self, images):
        keep = self._keep
        if self._embedding is None:
            pair_rule = near_pairs.HashRule(self._distance)
            described = {"distance": self._distance}
        else:
            spec, threshold = self._embedding
            pair_rule = near_embedding.EmbeddingRule(threshold)
            described = {"embedding": spec, "threshold": threshold}
        centred: tuple = ()  # the embedding's bands are taken from the run's mean vector
        if self._embedding is not None:
            centre = images | "VectorMean" >> beam.CombineGlobally(Centre())
            centred = (beam.pvalue.AsSingleton(centre),)
        if self._embedding is None:  # the buckets found in a table of every fingerprint
            table = (
                images
                | "Fingerprints" >> beam.Map(member)
                | "AllFingerprints" >> beam.combiners.ToList()
                | "Table" >> beam.Map(table_of)
            )
            edges = (
                images.pipeline
                | "Parts" >> beam.Create(range(TABLE_PARTS))
                | "DealParts" >> beam.Reshuffle()
                | "PairsInParts"
                >> beam.FlatMap(part_edges, beam.pvalue.AsSingleton(table), pair_rule, TABLE_PARTS)
            )
        else:  # the embedding's buckets shuffled: a vector is hundreds of bytes
            edges = (
                images
                | "InBands" >> beam.FlatMap(in_bands, pair_rule, *centred)
                | "GroupByBand" >> beam.GroupByKey()
                | "PairsInBand" >> beam.FlatMap(bucket_edges, pair_rule, *centred)
            )
        if self._groups and keep == "all":
            groups = images | "GroupEdges" >> beam.FlatMap(_group_edges)
            edges = (edges, groups) | "AllEdges" >> beam.Flatten()
        forest = edges | "Forest" >> beam.CombineGlobally(_Forest())
        components = forest | "Components" >> beam.Map(components_of)
        # each component's members, with their fingerprints, in one place
        stars = (
            images
            | "ToComponent" >> beam.FlatMap(_to_component, beam.pvalue.AsSingleton(components))
            | "GroupByComponent" >> beam.GroupByKey()
            | "Stars" >> beam.Map(_stars, pair_rule)
            | "AllStars" >> beam.combiners.ToList()
        )
        stars_found = beam.pvalue.AsSingleton(stars)
        if self._embedding is not None:  # every vector one length, checked over them all
            lengths = images | "VectorLengths" >> beam.CombineGlobally(Lengths())
            stars_found = beam.pvalue.AsSingleton(
                stars
                | "OneLength"
                >> beam.Map(of_one_length, beam.pvalue.AsSingleton(lengths), self._embedding[0])
            )
        clusters = forest | "Clusters" >> beam.Map(clusters_of, stars_found)
        table = beam.pvalue.AsSingleton(clusters)
        dealt = images.pipeline | "NoneToDeal" >> beam.Create([{}])
        if self._rule is not None and keep == "all":
            rule = self._rule
            # Image -> the split it has whatever the dealing -> {split: count}
            fixed = (
                images
                | "FixedSplit" >> beam.FlatMap(near_splits.fixed_split, table, rule)
                | "CountFixed" >> beam.combiners.Count.PerElement()
            )
            # one {smallest key: size} a cluster to deal -> {smallest key: split}
            dealt = clusters | "DealClusters" >> beam.Map(
                lambda found, fixed: near_splits.deal(near_splits.unsplit(found), fixed, rule),
                beam.pvalue.AsDict(fixed),
            )
        assigned = images | "Assign" >> beam.ParDo(
            _Assign(keep == "one", self._root), table, beam.pvalue.AsSingleton(dealt)
        )
        out = assigned | "SplitRejects" >> SplitRejects()
        return {
            "main": out["main"],
            "rejects": out["rejects"],
            "summary": clusters
            | "Summary"
            >> beam.Map(
                lambda found, *centre: summary(found, with_centre(described, centre), keep),
                *centred,
            ),
        }
