"""The near-duplicate edges joined (``--dedupe near``; ``near_duplicates`` runs these in
its steps, the benchmarks alone): a minimum spanning forest of the matched pairs, its
connected components (where clusters are looked for), and the clusters' table, a
``--group_by`` group joining the clusters it touches whole. Plain Python, no Beam."""

from __future__ import annotations

GROUP = "\x00group\x00"  # a --group_by group's node in the union-find (never a key)


def spanning_forest(edges) -> list:
    """[(weight, key, key)] -> the minimum spanning forest's edges, lightest first (ties:
    by keys; a pair twice: its lightest)."""
    parent: dict[str, str] = {}
    out = []
    for edge in sorted(set(edges)):
        _, a, b = edge
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(parent, a), find(parent, b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
            out.append(edge)
    return out


def components_of(forest) -> dict[str, str]:
    """The forest (``near_duplicates._Forest``'s output) -> {key: its component's
    smallest key} for every key with a near-duplicate: the connected components of the
    matched pairs, whatever their size. A component is where a cluster is looked for,
    not a cluster: a chain of small steps is one component."""
    parent: dict[str, str] = {}
    for _, a, b in forest[0]:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        union(parent, a, b)
    return {k: find(parent, k) for k in parent}


def clusters_of(forest, stars: list):
    """The forest (``near_duplicates._Forest``'s output: its given splits and --group_by
    edges are used here), each component's clusters (``near_duplicates._stars``, in any
    order) -> (table, counts). The table maps every key in a cluster to (the cluster's
    smallest key, its given split, the key to keep); a --group_by group joins the
    clusters it touches whole."""
    _, given, groups = forest
    parent: dict[str, str] = {}
    cut = found = 0
    for _, size, clusters in stars:
        found += len(clusters)
        cut += len(clusters) != 1 or len(clusters[0]) != size  # not one cluster of all
        for keys in clusters:
            for k in keys:  # sorted: its smallest key the root
                parent[k] = keys[0]
    joined = set(parent)
    for a, g in sorted(groups):
        parent.setdefault(a, a)
        parent.setdefault(g, g)
        union(parent, a, g)
    members: dict[str, list[str]] = {}
    for node in parent:
        if not node.startswith(GROUP):
            members.setdefault(find(parent, node), []).append(node)
    table, two, largest = {}, 0, 0
    for keys in members.values():
        if not any(k in joined for k in keys):  # a --group_by group with no near edge
            continue
        keys.sort()
        splits = [given[k] for k in keys if given.get(k) is not None]
        keeper = next((k for k in keys if given.get(k) is not None), keys[0])
        two += len(set(splits)) > 1
        largest = max(largest, len(keys))
        for k in keys:
            table[k] = (keys[0], splits[0] if splits else None, keeper)
    counts = {
        "clusters": found,
        "inputs_in_clusters": len(joined),
        "given_two_splits": two,
        "largest_cluster": largest,  # with the --group_by groups it joins
        "components": len(stars),  # the matched pairs' connected components
        "components_cut": cut,  # ... not one cluster: chains, or pictures side by side
    }
    return table, counts


def find(parent: dict, node):
    while parent[node] != node:
        parent[node] = parent[parent[node]]
        node = parent[node]
    return node


def union(parent: dict, a: str, b: str) -> None:
    ra, rb = find(parent, a), find(parent, b)
    if ra != rb:  # the smaller name is the root: the same table for any edge order
        parent[max(ra, rb)] = min(ra, rb)
