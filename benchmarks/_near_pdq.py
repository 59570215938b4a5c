"""PDQ (Meta's 256-bit hash, ``pdqhash``) against evenshard's rule on the near bench's
photos (issue 55.3): pair-level, every (variant, its source) pair positive, every pair
of different pictures negative (other crops of the same wallpaper included).

    pip install --target /tmp/pdq pdqhash      # a folder of its own, never the project's
    .venv/bin/python benchmarks/_near_pdq.py /tmp/pdq [CORPUS]

CORPUS: near_bench's (default benchmarks/_work/near_corpus_0.5: ``near_bench.py`` makes
it). Prints the figures docs/convert.md quotes.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("half", "double", "q60", "cut5", "bright", "other_format", "copy")


def main(pdq_path: str, root: str) -> None:
    sys.path[:0] = [pdq_path, HERE, os.path.dirname(HERE)]  # pdqhash installed apart
    import numpy as np
    import pdqhash
    from _near_measures import fingerprints
    from PIL import Image

    from schemas import near, near_pairs

    images = os.path.join(root, "images")
    with open(os.path.join(root, "truth.json")) as f:
        truth = json.load(f)
    keys = sorted(truth)
    sid = np.array([truth[k][0] for k in keys])
    kind = [truth[k][1] for k in keys]
    origin = {sid[i]: i for i in range(len(keys)) if kind[i] == "source"}
    kind_of = {
        (min(i, origin[sid[i]]), max(i, origin[sid[i]])): kind[i]
        for i in range(len(keys))
        if kind[i] in VARIANTS
    }

    start = time.process_time()
    pdq = []
    for k in keys:
        with Image.open(os.path.join(images, k)) as im:
            bits, _quality = pdqhash.compute(np.asarray(im.convert("RGB")))
        pdq.append(np.packbits(bits.astype(np.uint8)))
    pdq_ms = 1e3 * (time.process_time() - start) / len(keys)
    pdq = np.stack(pdq)
    start = time.process_time()
    hexes = fingerprints(images, keys)
    ours_ms = 1e3 * (time.process_time() - start) / len(keys)

    n = len(keys)
    iu, ju = np.triu_indices(n, 1)
    dp = np.concatenate(
        [
            np.unpackbits(pdq[iu[s : s + 200_000]] ^ pdq[ju[s : s + 200_000]], axis=1).sum(axis=1)
            for s in range(0, len(iu), 200_000)
        ]
    )
    do = near_pairs.distances(near.as_array(hexes), near.as_array(hexes))[iu, ju]
    neg = sid[iu] != sid[ju]
    pairs = list(zip(iu.tolist(), ju.tolist()))
    positive = np.array([p in kind_of for p in pairs])
    print(f"images {n}, positive pairs {positive.sum()}, negative pairs {neg.sum()}")
    print(f"CPU an image: PDQ {pdq_ms:.2f} ms (its own decode), ours {ours_ms:.2f} ms")

    def said(name: str, hit) -> None:
        print(f"  {name}: recall {hit[positive].mean():.3f}, false pairs {int(hit[neg].sum())}")

    for t in (31, 48, 64, 70, 80, 90):
        said(f"PDQ <= {t}", dp <= t)
    for d in (8, 10, 12, 14):
        said(f"our 64-bit hash alone <= {d}", do <= d)
    parsed = [near.parse(h) for h in hexes]
    rule = np.zeros(len(iu), bool)
    for c in np.flatnonzero(do <= near.DEFAULT_DISTANCE + 8).tolist():
        rule[c] = near.matches(parsed[iu[c]], parsed[ju[c]], near.DEFAULT_DISTANCE) is not None
    said(f"convert's rule at {near.DEFAULT_DISTANCE}", rule)
    for t in (56, 64, 70):
        said(f"convert's rule or PDQ <= {t}", rule | (dp <= t))
    print("recall by kind: PDQ <= 70, convert's rule, either")
    index = np.flatnonzero(positive)
    kinds = np.array([kind_of[pairs[c]] for c in index.tolist()])
    for k in VARIANTS:
        m = index[kinds == k]
        cells = [(dp[m] <= 70).mean(), rule[m].mean(), (rule[m] | (dp[m] <= 70)).mean()]
        print(f"  {k:13s} " + " ".join(f"{v:.3f}" for v in cells))


if __name__ == "__main__":
    corpus = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "_work", "near_corpus_0.5")
    main(sys.argv[1], corpus)
