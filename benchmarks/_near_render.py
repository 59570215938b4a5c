"""The section of RESULTS.md that ``near_bench.py`` writes, from its results alone."""

# ruff: noqa: E501 - one table row a line, as in the *_bench.py files (pyproject.toml)

from __future__ import annotations

from collections import Counter

from _common import table_rows, verdict

SPLITS = ("train", "val", "test")  # convert's default splits


def render(r: dict, doc: str) -> str:
    """The section of RESULTS.md from the results ``r``; ``doc``: the bench's docstring
    (its text up to the commands opens the section)."""
    text = doc.split(chr(10), 1)[1].split("    .venv")[0].strip()
    c = r["corpus"]
    rows = table_rows(
        ((row["distance"], row) for row in r["curve"]),
        lambda dist, v: [
            f"**{dist}**" if dist in r["recommended"].values() else str(dist),
            f"{v['precision']:.3f}",
            f"{v['recall']:.3f}",
            f"{v['f1']:.3f}",
            f"{v['variant_recall']:.3f}",
            f"{v['clusters']:,}",
            f"{v['largest_cluster']}",
            f"{v['false_clusters']}",
            *(
                [
                    f"{v['rule']['precision']:.3f}",
                    f"{v['rule']['recall']:.3f}",
                    f"{v['rule']['variant_recall']:.3f}",
                ]
                if "rule" in v
                else ["", "", ""]
            ),
        ],
    )
    default = r["default_distance"]
    by_kind = r["curve"][default]["variant_recall_by_kind"]
    rule = r["curve"][default].get("rule", {})
    rule_by_kind = rule.get("variant_recall_by_kind", {})
    kinds = table_rows(
        r["variant_distances"].items(),
        lambda k, v: [
            k,
            f"{v['median']:g}",
            f"{v['p95']:g}",
            str(v["max"]),
            f"{by_kind.get(k, 0):.3f}",
            f"{rule_by_kind.get(k, 0):.3f}",
        ],
    )
    negatives = table_rows(
        r["negative_distances"].items(),
        lambda k, v: [
            k.replace("_", " "),
            f"{v['pairs']:,}",
            str(v["min"]),
            f"{v['median']:g}",
            f"{v['within_10']:,}",
            f"{v['within_14']:,}",
        ],
    )
    best, precise = r["recommended"]["best_f1"], r["recommended"]["best_precision_recall_95"]
    leak_rows = []
    for run, name in (
        ("plain", "default flags"),
        ("near", f"`--dedupe near` (distance {default})"),
    ):
        for held in ("val", "test"):
            v = r["leakage"][run][held]
            leak_rows.append(
                f"| {name} | {held} | {v['images']:,} | {v['near_duplicate_in_train']:,} "
                f"({v['leaking_sources']} source{'' if v['leaking_sources'] == 1 else 's'}) | {v['identical_copy_in_train']:,} |"
            )
    still = Counter()
    for held in ("val", "test"):
        still.update(r["leakage"]["near"][held]["leaking_kinds"])
    still_text = ", ".join(f"{k} {c}" for k, c in still.most_common())
    false = []
    for dist, found in r["false_clusters"].items():
        for x in found:
            bits, one, two = x["closest_across"]
            std = " / ".join(f"{v:.0f}" for v in x["std"])
            false.append(
                f"| {dist} | {x['size']} | {len(x['sources'])} | `{one}` – `{two}` | {bits} "
                f"| {std} |"
            )
    if best == precise:
        pick = f"Both rules give {best}: the recommended default."
    else:
        pick = (
            f"Recommended: {precise}, the rule that puts recall first (a missed pair "
            "is a leak; a false pair only keeps two images in one split)."
        )
    out = f"""## near-duplicates on real photos — `benchmarks/near_bench.py`

{text}

The corpus: {c["files"]:,} files from {c["wallpapers"]} wallpapers: {c["sources"]} source
crops, {c["sources_with_variants"]} of them with 7 variants ({c["variants"]:,} variants,
{c["in_another_label"]} in another label folder), {c["offset_crops"]} offset crops;
{c["flat_skipped"]} flat crops skipped. Convert's `.near` fingerprints differ from the
bench's on {r["fingerprints_unlike_convert"]} files.

| distance | precision | recall | F1 | variant recall | clusters | largest | clusters joining 2+ sources | rule: precision | rule: recall | rule: variant recall |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

The first seven columns: the 64-bit hash alone, its connected components (the
rule before issue 46). The last three: the rule `--dedupe near` uses now
(`schemas.near.matches`: the hash with its weak bits left out, the 8x8 gray
thumbnails and 2x2 colours alike, the quality gate), its pairs joined as convert
clusters them (`beam_jobs.near_stars.star_clusters`: each connected component of
matched pairs cut into stars, every member a near-duplicate of its cluster's centre;
before issue 55, joined lightest edge first and bounded at 1 % of the inputs). At the default distance ({default}) the rule's variant
recall is **{rule.get("variant_recall", 0):.3f}** (aim ≥ 0.99 —
{verdict(rule.get("variant_recall", 0), 0.99, below=False)}), precision
**{rule.get("precision", 0):.3f}** (aim ≥ 0.99 —
{verdict(rule.get("precision", 0), 0.99, below=False)}) with {rule.get("false_pairs", 0):,} false pairs; the
hash alone: {r["curve"][default]["variant_recall"]:.3f}, {r["curve"][default]["precision"]:.3f},
{r["curve"][default]["false_pairs"]:,}. The weak bits left out bring pairs in at
fewer bits (the rule at 4 bits comes near the hash at 8). Smooth crops (a mean
step between neighbouring pixels under one gray level: the quality gate) match
only within 4 bits and 3 gray levels, brightness included, unless both
thumbnails show a shape (their grays 6 levels from their mean on average: a
sky's gradient, not a plain square), whose brightness may differ (until issue
46's third round they matched only an identical thumbnail, and the rule's
variant recall was 0.959; until issue 55's last round a brightened smooth crop
was lost: 0.990 at precision 0.992).

![precision and recall against the distance]({r["png"]})

Bits between each variant and its source, and the variants caught at the
default distance ({default}):

| variant | median | 95th percentile | max | in its source's cluster at {default}: hash alone | convert's rule |
|---|---:|---:|---:|---:|---:|
{kinds}

Bits between crops of two different sources (the hard negatives):

| pairs | count | min | median | within 10 bits | within 14 bits |
|---|---:|---:|---:|---:|---:|
{negatives}

Every fingerprint has exactly 32 of its 64 bits set (the coefficients above
their median), so two fingerprints differ in an even number of bits: an odd
distance finds what the even one below it finds (the rows come in equal pairs).
The best precision with recall ≥ 0.95 is at distance **{precise}** (precision
{r["curve"][precise]["precision"]:.3f}, recall {r["curve"][precise]["recall"]:.3f}); the highest F1 at
**{best}** (F1 {r["curve"][best]["f1"]:.3f}). {pick}

Clusters joining two or more source crops (the closest pair across sources,
and the grayscale standard deviation of each of its two images: the false
pairs are smooth gradients, whatever their colours):

| distance | cluster size | sources | closest pair | bits | std |
|---:|---:|---:|---|---:|---:|
{chr(10).join(false)}

Leakage: the same corpus converted with the default splits (train 0.8, val
0.1, test 0.1):

| convert | held-out split | images | with a true near-duplicate in train | with a byte-identical copy in train |
|---|---|---:|---:|---:|
{chr(10).join(leak_rows)}

The held-out images that still have a near-duplicate in train after `--dedupe
near`, by what they are: {still_text or "none"}. Each is a source crop whose
files did not all fall in one cluster (a variant beyond {default} bits of the
others: the recall above).
"""
    if r["scale"]:
        scale = table_rows(
            r["scale"].items(),
            lambda n, v: [
                f"{int(n):,}",
                f"{v['plain']['seconds']:.1f}",
                f"{v['near']['seconds']:.1f}",
                f"{v['time_ratio']:.2f}",
                f"{v['plain']['cpu_seconds']:.1f}",
                f"{v['near']['cpu_seconds']:.1f}",
                f"**{v['cpu_ratio']:.2f}** (≤ 1.5 — {verdict(v['cpu_ratio'], 1.5)})",
                f"{v['plain']['peak_rss_mb']:,}",
                f"{v['near']['peak_rss_mb']:,}",
                f"**{v['rss_ratio']:.2f}** (≤ 1.5 — {verdict(v['rss_ratio'], 1.5)})",
            ],
        )
        found = table_rows(
            r["scale"].items(),
            lambda n, v: [
                f"{int(n):,}",
                f"{v['near']['near_duplicates']['clusters']:,}",
                f"{v['near']['near_duplicates']['inputs_in_clusters']:,}",
                _share(v["near"]["near_duplicates"]["largest_cluster"], int(n)),
                f"{_cut(v['near']['near_duplicates']):,}",
                _share(v["near"]["largest_cluster"], int(n)),
                " / ".join(f"{v['plain']['examples'].get(k, 0):,}" for k in SPLITS),
                " / ".join(f"{v['near']['examples'].get(k, 0):,}" for k in SPLITS),
                f"{_drift(v['near']['examples'], int(n)):.2f}",
                f"{v['near']['buckets']['pairs_compared'] / 1e6:,.0f} M",
                f"{v['near']['buckets']['pairs_found']:,}",
                f"{v['near']['buckets']['largest_bucket']:,}",
            ],
        )
        big_n, big = max(((int(n), v) for n, v in r["scale"].items()), key=lambda x: x[0])
        largest = big["near"]["largest_cluster"]
        bounded = big["near"]["near_duplicates"]["largest_cluster"]
        drift = max(_drift(v["near"]["examples"], int(n)) for n, v in r["scale"].items())
        growth = ""
        if len(r["scale"]) > 1:
            (n1, a), (n2, b) = sorted((int(n), v) for n, v in r["scale"].items())[
                :: len(r["scale"]) - 1
            ]
            per = {
                name: (b[name]["peak_rss_mb"] - a[name]["peak_rss_mb"]) * 1e3 / (n2 - n1)
                for name in ("plain", "near")
            }
            growth = (
                f"Peak RSS grows {per['plain']:.2f} KB an input from {n1:,} to {n2:,} inputs "
                f"without `--dedupe near`, {per['near']:.2f} KB with it (the local runner "
                "keeps every PCollection until the job ends: see the scale section)."
            )
        if r.get("scale_from"):
            old = r["scale_from"]
            out += f"""
Scale was not rerun with this run: the figures below are those measured
{old["date"]} at commit {old["commit"]} (`{old["command"]}`).
"""
        out += f"""
Scale: small crops of the wallpapers (convert's defaults; the default runner,
every core), the best of {(r.get("scale_from") or r).get("repeats", 1)} run(s) of each, round-robin:

| inputs | plain (s) | `--dedupe near` (s) | near / plain | plain CPU (s) | near CPU (s) | CPU near / plain | plain peak RSS (MB) | near peak RSS (MB) | RSS near / plain |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{scale}

{growth} Each run waits (up to {(r.get("scale_from") or r).get("quiet_wait", 300):g} s) until other work keeps under a
quarter of the cores busy: the machine is shared. The share busy in the 3 s
before each kept run: at most
{max(v[k]["busy_before"] for v in r["scale"].values() for k in ("plain", "near")):.2f}.

What `--dedupe near` found there (distance {default}), the examples a split
(train / val / test) without and with it, and the pair checks in the band
buckets (pairs compared, pairs within {default} bits, the largest bucket; counted
by the bench on the output's `.near` files, as convert buckets them):

| inputs | clusters | inputs in clusters | largest cluster | components cut (before issue 55: joins refused) | largest, the hash alone's components | plain splits | near splits | furthest split from its fraction (points) | pairs compared | pairs found | largest bucket |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{found}

Aims: every split within 1 point of its fraction ({drift:.2f} at most:
{verdict(drift, 1.0)}), the largest cluster at most 1 % of the inputs
({100 * bounded / big_n:.2f} % at {big_n:,}: {verdict(bounded / big_n, 0.01)}). The hash
alone's connected components (images each within {default} bits of the next,
counted by the bench) show what the bound holds back: small crops of simple
content (the low-poly artworks' two-tone crops, a straight edge between two
smooth areas, gradients) crowd one region of the fingerprints and chain, at
{big_n:,} inputs into one component of {largest:,} ({100 * largest / big_n:.0f}%). Convert's
rule confirms each pair by its thumbnails and cuts each component into star clusters
(every member a near-duplicate of its cluster's centre: nothing chains; before issue
55, clusters were joined strongest pair first and a join past 1 % of the inputs refused). The pairs compared in
the band buckets still grow with the square of the inputs in such a dense region.
"""
    return out


def _cut(found: dict) -> int:
    """The components cut into several clusters (results from before issue 55: the
    joins a size bound refused)."""
    return found.get("components_cut", found.get("bridges_refused", 0))


def _share(count: int, n: int) -> str:
    return f"{count:,} ({100 * count / n:.1f}%)"


def _drift(examples: dict, n: int) -> float:
    """How far the split furthest from its default fraction (0.8 / 0.1 / 0.1) is, in
    percentage points."""
    fractions = dict(zip(SPLITS, (0.8, 0.1, 0.1)))
    return max(abs(100 * examples.get(k, 0) / n - 100 * f) for k, f in fractions.items())
