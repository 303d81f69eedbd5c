#!/usr/bin/env python3
"""Timing model of carried scores (q = k = v, no mask, safe softmax) on rings that do not divide
the tokens (docs/scheduling.md, "Carried scores on rings that do not divide the tokens").

Nothing here is built; it estimates what such loop programs would take.

* Deal: PE p owns the contiguous rows [ceil(p*n/m), ceil((p+1)*n/m)): floor(n/m) or ceil(n/m)
  whole rows, none cut. Its block is the x rows of its tokens.
* Work per PE and head that does not depend on the deal of scores: per row n - 1 maxima, n
  exponentials, n*d products of the values and min(n, d) divisions (deferred normalisation, or
  one division per weight with fewer tokens than d). Scores: the own triangle r(r + 1)/2, then
  for every other PE q the part x[p][q] of the r_p x r_q cross block that p computes when q's
  block visits it (in ring step (p - q) mod m); q computes the rest, r_p*r_q - x[p][q], when p's
  block visits q. Each computed score's mirror rides home with the visiting block (the payload),
  so each row's whole softmax is local after the ring pass: no merge, no rescaling.
* Balance: the cross scores are dealt so that every PE's operations come within d of the
  smallest possible maximum (rows of the larger blocks compute fewer cross scores). The split
  of each pair starts at half plus an even share of both PEs' surplus; for the first timeline a
  hill climb over moves that keep every PE's total (a unit round a triangle of pairs) then
  shortens it.
* Timeline, on the step: step s of PE p starts once its own step s - 1 is done and the visiting
  block's x rows have arrived (the previous PE sends them one word per cycle from the start of its
  step s - 1; the payload follows). A step takes d cycles per score, and at least as many as the
  words it forwards (x rows, payload so far, the fresh mirrors); the maxima over scores already
  held fill link-bound steps and waits. After the ring pass the PE's remaining local work runs
  uninterrupted; the heads run back to back.
* Timeline, relayed: the links carry every block's x rows as soon as they arrive (own block
  first, then each block in the order it came), apart from the score steps; a step starts once
  its block's x rows are all on the PE. The mirrors are timed word by word: each leaves in the
  cycle its score's chain ends and takes, on each link of its way home, the first cycle the x
  rows and earlier mirrors leave free. A meeting enumerates its scores by the visiting rows, and
  after its ring pass a PE takes its rows' softmax one row at a time in the order their mirrors
  are all home. This timeline uses the split as it starts (no search).

Usage: python3 docs/models/uneven_carried.py
Prints per shape the row dataflow's cycles (the shapes table), the lower bound, the balanced
bound, the model's cycles under both timelines, the busiest link's share of the ring pass, the
most cycles a PE waits for mirrors, and words per PE.
"""

import bisect
import heapq
import random

# Cycles of the row dataflow where it is kept for q = k = v on 6 or 12 PEs (README, shapes
# table: n/d/m/heads).
ROWS = {
    "64/32/6/1": 34998,
    "64/32/6/4": 139926,
    "64/32/12/1": 17532,
    "64/32/12/4": 69996,
    "64/64/6/1": 67959,
    "64/64/6/4": 272917,
    "64/64/12/1": 34044,
    "64/64/12/4": 135916,
    "64/128/6/1": 133879,
    "64/128/6/4": 537685,
    "64/128/12/1": 67068,
    "64/128/12/4": 267756,
    "128/32/6/1": 139670,
    "128/32/6/4": 558390,
    "128/32/12/1": 69847,
    "128/32/12/4": 279223,
    "128/64/6/1": 271126,
    "128/64/12/1": 135607,
    "128/128/6/1": 534038,
    "128/128/12/1": 267127,
    "256/32/6/1": 557718,
    "256/32/12/1": 278945,
}


def deal(n, m):
    return [((p + 1) * n + m - 1) // m - (p * n + m - 1) // m for p in range(m)]


def timeline(x, heads, n, d, m, r):
    tri = [rp * (rp + 1) // 2 for rp in r]
    local = [rp * ((n - 1) + n + n * d + min(n, d)) for rp in r]
    xrows = [rq * d for rq in r]
    free = [0] * m
    for _ in range(heads):
        start = [[0] * m for _ in range(m)]
        end = [[0] * m for _ in range(m)]
        payload = [0] * m
        held = [0] * m
        reduced = [0] * m
        for s in range(m):
            for p in range(m):
                q = (p - s) % m
                if s == 0:
                    t0, length, words = free[p], d * tri[p], xrows[p]
                else:
                    ready = start[(p - 1) % m][s - 1] + xrows[q] + 1
                    t0 = max(end[p][s - 1], ready)
                    reduced[p] += min(max(0, ready - end[p][s - 1]), held[p] - reduced[p])
                    length = d * x[p][q]
                    words = payload[q] + x[p][q] + (xrows[q] if s < m - 1 else 0)
                if words > length:
                    reduced[p] += min(words - length, held[p] - reduced[p])
                    length = words
                held[p] += tri[p] - r[p] if s == 0 else x[p][q]
                start[p][s], end[p][s] = t0, t0 + length
            if s > 0:
                for p in range(m):
                    payload[(p - s) % m] += x[p][(p - s) % m]
        free = [end[p][m - 1] + local[p] - reduced[p] for p in range(m)]
    return max(free)


def timeline_relayed(x, heads, n, d, m, r):
    """The links carry every block's x rows as soon as they arrive (own block first, then each
    block relayed in the order it came), independently of the score steps, and the mirrors after
    them; a step starts once its block's x rows are all in. Returns the cycles, the largest
    share of a ring pass that a link is busy (x rows and mirrors) and the most cycles a PE waits
    for a mirror (none where they are home before its maxima over its own scores are done)."""
    tri = [rp * (rp + 1) // 2 for rp in r]
    local = [rp * ((n - 1) + n + n * d + min(n, d)) for rp in r]
    free = [0] * m
    busiest = 0.0
    mirror_wait = 0
    for _ in range(heads):
        # arrive[b][p]: cycle by which block b's x rows are all on PE p
        arrive = [[0] * m for _ in range(m)]
        link_free = free[:]  # link out of p
        spans = [[] for _ in range(m)]
        for b in range(m):
            arrive[b][b] = free[b]
        for hop in range(1, m):
            for p in range(m):
                b = (p - hop + 1) % m  # block that link p sends in its hop-th slot
                src_ready = arrive[b][p]
                words = r[b] * d
                begin = max(link_free[p], free[p] if hop == 1 else src_ready - words + 1)
                end = max(begin + words, src_ready + 1)
                spans[p].append((begin, end))
                link_free[p] = end
                arrive[b][(p + 1) % m] = end
        end = [0] * m
        step_end = [[0] * m for _ in range(m)]
        for p in range(m):
            t = free[p] + d * tri[p]
            for s in range(1, m):
                q = (p - s) % m
                t = max(t, arrive[q][p]) + d * x[p][q]
                step_end[p][s] = t
            end[p] = t
        # The mirrors, word by word: each leaves its PE in the cycle its score's chain ends (as
        # in the carried programs) and takes, on every link of its way home, the first cycle
        # that the x rows (given the whole span of each relayed block) and earlier mirrors leave
        # free; a word that arrives in cycle t can go on from t + 1.
        busy = [sorted(spans[p]) for p in range(m)]
        nxt = [dict() for _ in range(m)]

        def take(j, t):
            while True:
                seen = []
                while t in nxt[j]:
                    seen.append(t)
                    t = nxt[j][t]
                i = bisect.bisect_right(busy[j], (t, float("inf"))) - 1
                if i >= 0 and busy[j][i][0] <= t < busy[j][i][1]:
                    t = busy[j][i][1]
                    continue
                for u in seen:
                    nxt[j][u] = t
                nxt[j][t] = t + 1
                return t

        # A meeting at p enumerates its scores by the visiting rows (each visiting row against
        # all of p's rows in turn), so that the mirrors of a row of q come home together.
        heap = []
        for p in range(m):
            for s in range(1, m):
                q = (p - s) % m
                first = step_end[p][s] - d * x[p][q]
                heap.extend((first + d * (i + 1) - 1, p, q, i // r[p]) for i in range(x[p][q]))
        heapq.heapify(heap)
        done = [[0] * r[q] for q in range(m)]
        while heap:
            t, at, q, row = heapq.heappop(heap)
            if at == q:
                done[q][row] = max(done[q][row], t)
                continue
            sent = take(at, t)
            heapq.heappush(heap, (sent + 1, (at + 1) % m, q, row))
        # After its ring pass each PE takes its rows' softmax and values in the order their
        # mirrors are all home, a row at a time.
        late = [0] * m
        fin = [0] * m
        for p in range(m):
            t = end[p]
            per_row = local[p] // r[p]
            for c in sorted(done[p]):
                t = max(t, c + 1) + per_row
            fin[p] = t + local[p] - per_row * r[p]
            late[p] = fin[p] - (end[p] + local[p])
        mirror_wait = max(mirror_wait, max(late))
        for p in range(m):
            # mirrors on link p: those computed at a for block q whose path a -> q crosses p
            mirrors = sum(x[a][q] for a in range(m) for q in range(m)
                          if a != q and (p - a) % m < (q - a) % m)
            xwords = sum(r[b] * d for b in range(m) if b != (p + 1) % m)
            span = end[(p + 1) % m] - free[(p + 1) % m]
            busiest = max(busiest, (xwords + mirrors) / span)
        free = [end[p] + late[p] + local[p] for p in range(m)]
    return max(free), busiest, mirror_wait


def model(n, d, m, heads, climb=20000):
    r = deal(n, m)
    local = [rp * ((n - 1) + n + n * d + min(n, d)) for rp in r]
    tri = [rp * (rp + 1) // 2 for rp in r]
    cross = sum(r[p] * r[q] for p in range(m) for q in range(p + 1, m))
    total = sum(local) + d * (sum(tri) + cross)
    lb = -(-total // m)
    bound = lb
    while sum(max(0, (bound - local[p] - d * tri[p]) // d) for p in range(m)) < cross:
        bound += 1
    want = [max(0, (bound - local[p] - d * tri[p]) // d) for p in range(m)]
    for _ in range(sum(want) - cross):
        p = max(range(m), key=lambda u: local[u] + d * (tri[u] + want[u]))
        want[p] -= 1
    half = [sum(r[p] * r[q] for q in range(m) if q != p) / 2 for p in range(m)]
    surplus = [want[p] - half[p] for p in range(m)]
    x = [[0] * m for _ in range(m)]
    for p in range(m):
        for q in range(p + 1, m):
            t = r[p] * r[q]
            x[p][q] = min(t, max(0, round(t / 2 + (surplus[p] - surplus[q]) / m)))
            x[q][p] = t - x[p][q]

    def has(p):
        return sum(x[p][q] for q in range(m) if q != p)

    while any(has(p) > want[p] for p in range(m)):
        p = max(range(m), key=lambda u: has(u) - want[u])
        q = max((u for u in range(m) if has(u) < want[u]), key=lambda u: x[p][u] - x[u][p])
        x[p][q] -= 1
        x[q][p] += 1
    rnd = random.Random(1)
    best = timeline(x, 1, n, d, m, r)
    for _ in range(climb if m <= 6 else 2 * climb):
        if best <= bound:
            break
        p, q, u = rnd.sample(range(m), 3)
        k = rnd.choice([1, 1, 2, 4, 8])
        if min(x[p][q], x[q][u], x[u][p]) < k:
            continue
        for a, b in ((p, q), (q, u), (u, p)):
            x[a][b] -= k
            x[b][a] += k
        c = timeline(x, 1, n, d, m, r)
        if c <= best:
            best = c
        else:
            for a, b in ((p, q), (q, u), (u, p)):
                x[a][b] += k
                x[b][a] -= k
    assert all(x[p][q] + x[q][p] == r[p] * r[q] for p in range(m) for q in range(m) if p != q)
    assert all(has(p) == want[p] for p in range(m))
    # Words per PE: x and y rows of every head, score and exponential rows (n per own row), the
    # mirrors that come home, every other block's x rows kept for the values, maxima and sums.
    words = max(2 * heads * r[p] * d + 2 * r[p] * n + sum(x[q][p] for q in range(m) if q != p)
                + (n - r[p]) * d + 2 * r[p] for p in range(m))
    return (lb * heads, bound * heads, timeline(x, heads, n, d, m, r),
            timeline_relayed(x, heads, n, d, m, r), words)


def main():
    print("| n/d/m/heads | row dataflow | lower bound | balanced | on the step | − rows "
          "| relayed | − rows | busiest link | mirrors late | words/PE |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape, rows in ROWS.items():
        n, d, m, heads = map(int, shape.split("/"))
        lb, bound, cycles, _, words = model(n, d, m, heads)
        # Relayed, the closed-form split needs no search.
        _, _, _, (relayed, busy, late), _ = model(n, d, m, heads, climb=0)
        print(f"| {shape} | {rows} | {lb} | {bound} | {cycles} | {cycles - rows:+d} "
              f"| {relayed} | {relayed - rows:+d} | {busy:.2f} | {late} | {words} |")


if __name__ == "__main__":
    main()
