#!/usr/bin/env python3
"""Can a causal stream that deals whole rows reach the row dataflow's cycles? A counting bound
(docs/scheduling.md, "What the streams built take where the row dataflow is kept").

Row t of a causal head sees t + 1 keys and costs A*(t + 1) + B cycles of operations:
A = 2d + 2, B = d - 1 with deferred normalisation (d divisions per row), A = 2d + 3, B = -1 with
one division per weight. A PE holding k rows whose numbers t + 1 sum to S does A*S + B*k. For a
busiest PE of at most T, each PE can hold at most floor((T - B*k)/A) of the total S (and no more
than the k largest numbers), so T is feasible only if some split of the n rows into counts k_p
reaches the total n(n + 1)/2: a dynamic programme over the PEs. The smallest such T, times the
heads (every head runs the same programs), is a lower bound on any whole-row deal without idle
cycles; it ignores which sets of numbers are actually reachable, so "no" is a proof and "yes" only
says the count does not exclude it.

The second table asks what the deal whole.rs can build reaches: each PE's tokens are two
progressions of stride 2m, so a PE's load is the sum of two of the 2m residue columns' loads
(tokens t = c mod 2m), and the best such deal pairs the cheapest column with the dearest. Under
each normalisation: deferred (d divisions per row), per weight (t + 1 for row t) and per row the
fewer of the two, against the forced stream measured (`attnc compile --schedule stream --mem
400000`: deferred only, then with per weight, then with per row, the fewest cycles kept).

Usage: python3 docs/models/causal_whole_partition.py
"""

# Cycles of the row dataflow where it is kept for causal layers on 6 or 12 PEs (README, shapes
# table: n/d/m/heads).
ROWS = {
    "64/32/6/1": 23243,
    "64/32/6/4": 92881,
    "64/32/12/1": 11655,
    "64/32/12/4": 46461,
    "64/64/6/1": 45451,
    "64/64/6/4": 181649,
    "64/64/12/1": 22791,
    "64/64/12/4": 90877,
    "64/128/6/1": 89867,
    "64/128/6/4": 359185,
    "64/128/12/1": 45063,
    "64/128/12/4": 179709,
    "128/64/6/1": 180245,
    "128/64/6/4": 720970,
    "128/64/12/1": 90123,
    "128/64/12/4": 360489,
    "128/128/6/1": 356373,
    "128/128/12/1": 178187,
}


def bound(n, m, a, b):
    total = n * (n + 1) // 2
    t = (a * total + b * n) // m
    while True:
        dp = [None] * (n + 1)
        dp[0] = 0
        for _ in range(m):
            nxt = [None] * (n + 1)
            for j, have in enumerate(dp):
                if have is None:
                    continue
                for k in range(n - j + 1):
                    cap = (t - b * k) // a
                    if cap < k * (k + 1) // 2:
                        break
                    cap = min(cap, k * (2 * n - k + 1) // 2)
                    if nxt[j + k] is None or have + cap > nxt[j + k]:
                        nxt[j + k] = have + cap
            dp = nxt
        if dp[n] is not None and dp[n] >= total:
            return t
        t += 1


# Forced whole rows measured (cycles, all heads): deferred only, the fewer of deferred and one
# division per weight, and the fewest of those and per row (release build, `--schedule stream
# --mem 400000`).
FORCED = {
    "64/32/6/1": (23375, 23372, 23282),
    "64/32/6/4": (93500, 93488, 93128),
    "64/32/12/1": (11935, 11935, 11904),
    "64/32/12/4": (47740, 47740, 47616),
    "64/64/6/1": (46063, 45708, 45708),
    "64/64/6/4": (184252, 182832, 182832),
    "64/64/12/1": (23519, 23377, 23377),
    "64/64/12/4": (94076, 93508, 93508),
    "64/128/6/1": (91439, 90380, 90380),
    "64/128/6/4": (365756, 361520, 361520),
    "64/128/12/4": (186748, 184900, 184900),
    "128/64/6/1": (180463, 180463, 180148),
    "128/64/6/4": (721852, 721852, 720592),
    "128/64/12/1": (90783, 90772, 90594),
    "128/64/12/4": (363132, 363088, 362376),
    "128/128/6/1": (358191, 356881, 356881),
    "128/128/12/1": (180191, 179476, 179476),
}


def row_cost(t, d, norm):
    divisions = {"deferred": d, "per weight": t + 1, "per row": min(d, t + 1)}[norm]
    return (2 * d + 2) * (t + 1) - 1 + divisions


def columns(n, d, m, norm):
    """Busiest PE of the best deal of two residue columns (stride 2m) per PE."""
    loads = sorted(sum(row_cost(t, d, norm) for t in range(c, n, 2 * m)) for c in range(2 * m))
    return max(loads[i] + loads[-1 - i] for i in range(m))


def main():
    print("| n/d/m/heads | row dataflow | whole rows, deferred >= | whole rows, per weight >= |")
    print("|---|---:|---:|---:|")
    for shape, rows in ROWS.items():
        n, d, m, heads = map(int, shape.split("/"))
        deferred = bound(n, m, 2 * d + 2, d - 1) * heads
        per_weight = bound(n, m, 2 * d + 3, -1) * heads
        print(f"| {shape} | {rows} | {deferred} ({'no' if deferred > rows else 'not excluded'}) "
              f"| {per_weight} ({'no' if per_weight > rows else 'not excluded'}) |")
    print()
    print("| n/d/m/heads | row dataflow | forced: deferred, + per weight, + per row | two columns "
          "per PE: deferred, per weight, per row |")
    print("|---|---:|---:|---:|")
    for shape, rows in ROWS.items():
        if shape not in FORCED:
            continue
        n, d, m, heads = map(int, shape.split("/"))
        got = " ".join(f"{x:+d}" for x in (c - rows for c in FORCED[shape]))
        cols = " ".join(f"{heads * columns(n, d, m, k) - rows:+d}"
                        for k in ("deferred", "per weight", "per row"))
        print(f"| {shape} | {rows} | {got} | {cols} |")


if __name__ == "__main__":
    main()
