#!/usr/bin/env python3
"""Timing and memory model of a causal stream that deals whole rows on rings that do not
divide the tokens (docs/scheduling.md, "Whole rows under a causal mask").

Nothing here is built; it estimates what such loop programs would take, for one head:

* Deal: the tokens from the last one down, in zigzag order over periods of 2m (the costliest
  rows spread evenly), the n mod 2m first tokens to the least loaded PE (largest first). PE b's
  k/v block is the k/v rows of its own tokens.
* k ring: in step s, PE p computes the scores (d cycles each) and running maxima (1 each) of
  its rows against the keys of block (p - s) mod m they see, one maximum fewer per row, and
  forwards the block's k half (K*d words) one word per cycle from the start of the step.
* v ring, the whole ring behind: step s takes expd (1) and the weighted values (d) of those
  scores against the v half of the same block, forwarding it the same way; then d divisions
  per row (deferred normalisation).
* Waits: a step starts once its block has arrived (read after write) and, before forwarding,
  once the next PE has finished the step that read the buffer being written (write after read).
  Buffers: the own k (v) region, dead after the ring's step 0, and `spares` more of the largest
  block's half, shared by the two rings.
* Memory per PE: q, k, v, y rows of its tokens, every score of its rows (the whole ring's lag
  keeps them all), the buffers and 3 words per row (maximum, sum, spare); the default allowance
  is 1.05 x (inputs and outputs) + 4096 words.

Usage: python3 docs/models/causal_whole_rows.py
"""


def row_cost(t, d):
    # Deferred safe softmax, row t sees t + 1 keys.
    return (2 * d + 2) * (t + 1) - 1 + d


def deal(n, m, d):
    rows = [[] for _ in range(m)]
    load = [0] * m
    full = n // (2 * m) * 2 * m
    for i, t in enumerate(range(n - 1, n - full - 1, -1)):
        c = i % (2 * m)
        p = c if c < m else 2 * m - 1 - c
        rows[p].append(t)
        load[p] += row_cost(t, d)
    for t in range(n - full - 1, -1, -1):
        p = min(range(m), key=lambda q: (load[q], q))
        rows[p].append(t)
        load[p] += row_cost(t, d)
    return [sorted(r) for r in rows]


def simulate(n, d, m, rows, spares, late=False):
    # late: forward in the last cycles of each step (the block arrives as the step ends).
    seen = [[sum(sum(1 for k in rows[b] if k <= r) for r in rows[p]) for b in range(m)]
            for p in range(m)]
    steps = 2 * m  # k ring 0 .. m-1, v ring m .. 2m-1

    def buf(u):
        s = u % m
        if s == 0:
            return None
        j = s % (spares + 1)
        return ("own", u < m) if j == 0 else ("spare", j)

    st = [[0] * steps for _ in range(m)]
    en = [[0] * steps for _ in range(m)]
    for u in range(steps):
        for p in range(m):
            s = u % m
            b = (p - s) % m
            work = seen[p][b] * (d + 1) - (len(rows[p]) if u == 0 else 0)
            words = len(rows[b]) * d
            fwd = s < m - 1
            if fwd:
                work = max(work, words)
            t0 = 0 if u == 0 else en[p][u - 1]
            if s > 0:
                q = (p - 1) % m
                sent = en[q][u - 1] if late else st[q][u - 1] + len(rows[(q - s + 1) % m]) * d
                t0 = max(t0, sent + 1)
            if fwd:
                nb = buf(u + 1)
                last = [v for v in range(u + 1) if buf(v) == nb]
                if last:
                    t0 = max(t0, en[(p + 1) % m][last[-1]] - (work - words if late else 0))
            st[p][u] = t0
            en[p][u] = t0 + work
    done = [en[p][-1] + d * len(rows[p]) for p in range(m)]
    busy = [sum(en[p][u] - st[p][u] for u in range(steps)) + d * len(rows[p]) for p in range(m)]
    return max(done), max(x - y for x, y in zip(done, busy))


def n_of(rows):
    return sum(len(r) for r in rows)


def memory(d, rows, spares, heads=1, layout="packed"):
    # layout: the scores packed row after row, `n` words per row, or pairs of rows (the i-th
    # with the i-th from the end) in rows as long as the longest pair.
    half = max(len(r) for r in rows) * d
    worst = None
    for r in rows:
        io = 4 * len(r) * d * heads
        allow = int(1.05 * io) + 4096
        if layout == "packed":
            scores = sum(t + 1 for t in r)
        elif layout == "rows":
            scores = len(r) * n_of(rows)
        else:
            s = sorted(r)
            pairs = [(s[i], s[len(s) - 1 - i]) for i in range((len(s) + 1) // 2)]
            scores = len(pairs) * max(a + 1 + (b + 1 if a != b else 0) for a, b in pairs)
        words = io + scores + spares * half + 3 * len(r) + 2
        if worst is None or words - allow > worst[0] - worst[1]:
            worst = (words, allow)
    return worst


# n, d, m and the row dataflow's cycles (README's shapes table, one head).
SHAPES = [(64, 32, 6, 23243), (64, 32, 12, 11655), (128, 32, 6, 92181), (128, 32, 12, 46091),
          (128, 64, 6, 180245), (128, 64, 12, 90123), (256, 32, 6, 367336),
          (256, 32, 12, 183761), (256, 64, 6, 718248), (256, 64, 12, 359190)]

# Four heads (n, d, m, the cycles kept now): each head as one, the heads ending together.
HEADS4 = [(128, 32, 6, 368714), (128, 32, 12, 184361), (128, 64, 6, 720970),
          (128, 64, 12, 360489), (256, 32, 6, 1574500), (256, 32, 12, 775372),
          (256, 64, 6, 3066276), (256, 64, 12, 1527244), (256, 128, 6, 6085028),
          (256, 128, 12, 3030988), (128, 128, 6, 1515580), (128, 128, 12, 901272)]

if __name__ == "__main__":
    print("n/d/m  rows  mean  | spares: cycles idle words/allowance  | late forwarding, spares: cycles idle")
    for n, d, m, kept in SHAPES:
        mean = -(-sum(row_cost(t, d) for t in range(n)) // m)
        rows = deal(n, m, d)
        line = f"{n}/{d}/{m}  {kept}  {mean}"
        for spares in (1, 2):
            cycles, idle = simulate(n, d, m, rows, spares)
            words, allow = memory(d, rows, spares)
            line += f"  | {spares}: {cycles} {idle} {words}/{allow}"
        for spares in (1, 2):
            cycles, idle = simulate(n, d, m, rows, spares, late=True)
            line += f"  | {spares}: {cycles} {idle}"
        print(line)
    print("four heads, two spares: n/d/m  kept  cycles  words/allowance (packed, rows of n, paired)")
    for n, d, m, kept in HEADS4:
        rows = deal(n, m, d)
        cycles, _ = simulate(n, d, m, rows, 2)
        w = [memory(d, rows, 2, heads=4, layout=x) for x in ("packed", "rows", "paired")]
        print(f"{n}/{d}/{m}  {kept}  {4 * cycles}  " + "  ".join(f"{x}/{y}" for x, y in w))
    print("score layouts, two spares, the PE furthest over: n/d/m  packed  rows of n  paired")
    for n, d, m, _ in SHAPES:
        rows = deal(n, m, d)
        w = [memory(d, rows, 2, layout=x) for x in ("packed", "rows", "paired")]
        print(f"{n}/{d}/{m}  " + "  ".join(f"{x}/{y}" for x, y in w))
