#!/usr/bin/env python3
"""Where narrator's inference time goes, utterance by utterance, against the raw ORT loop.

Usage: per_sentence.py WORK_DIR   (a folder kept by `ops/bench-cpu.sh --keep WORK_DIR`)

Inputs per round N: rN-narrator/.narrator/journal.jsonl (narrator's segments: phoneme ids,
inference seconds; narrator is run with --keep-work for this) and
rN-raw_ORT_loop.sentences.tsv (Piper's own sentences: ids, inference seconds, batch 1).

narrator's segments are its own sentences (split at 400 characters); Piper's are
espeak's. The two lists are aligned on their cumulative phoneme-id sums (narrator's ids
match Piper's: same espeak data and rules), giving three kinds of group:
  1:1    the same sentence in both: compares the two sessions on equal work;
  1:k    one narrator segment holding k espeak sentences: narrator sends its k
         utterances to ONE session.run, padded to the longest (a batch of k, even with
         --max-batch 1); the raw loop runs them one by one;
  k:1/k:m  narrator cut a long sentence into several segments.
"""
import glob
import json
import os
import sys


def groups(seg, ps, tol=8):
    i = j = 0
    out = []
    while i < len(seg) and j < len(ps):
        gi, gj, a, b = [i], [j], seg[i], ps[j]
        i += 1
        j += 1
        while abs(a - b) > tol and i <= len(seg) and j <= len(ps):
            if a < b and i < len(seg):
                gi.append(i); a += seg[i]; i += 1
            elif j < len(ps):
                gj.append(j); b += ps[j]; j += 1
            else:
                break
        out.append((gi, gj))
    return out


def main(work):
    rounds = sorted({os.path.basename(p).split("-")[0] for p in glob.glob(os.path.join(work, "r*-narrator"))},
                    key=lambda r: int(r[1:]))
    print("| round | narrator inference s | raw loop inference s | 1:1 groups: narrator / raw s | "
          "1:k groups (padded batches): narrator / raw s, padding ids | long-sentence splits: narrator / raw s |")
    print("|---|---|---|---|---|---|")
    details = []
    for r in rounds:
        j = os.path.join(work, f"{r}-narrator", ".narrator", "journal.jsonl")
        t = os.path.join(work, f"{r}-raw_ORT_loop.sentences.tsv")
        if not (os.path.exists(j) and os.path.exists(t)):
            continue
        recs = sorted((json.loads(l) for l in open(j) if l.strip()), key=lambda x: x["index"])
        seg = [x["phoneme_ids"] for x in recs]
        inf = [x["inference_seconds"] for x in recs]
        rows = [l.split("\t") for l in open(t).read().splitlines()[1:]]
        ps = [int(x[1]) for x in rows]
        pt = [float(x[3]) for x in rows]
        # Piper speaks the heading lines narrator takes as the chapter title: skip them.
        skip = next((k for k in range(len(ps)) if ps[k] == seg[0]), 0)
        head_t = sum(pt[:skip])
        ps, pt = ps[skip:], pt[skip:]
        g = groups(seg, ps)
        kinds = {"1:1": [0, 0.0, 0.0], "1:k": [0, 0.0, 0.0], "split": [0, 0.0, 0.0]}
        pad = 0
        for gi, gj in g:
            k = "1:1" if len(gi) == 1 and len(gj) == 1 else "1:k" if len(gi) == 1 else "split"
            kinds[k][0] += 1
            kinds[k][1] += sum(inf[x] for x in gi)
            kinds[k][2] += sum(pt[x] for x in gj)
            if k == "1:k":
                lens = [ps[x] for x in gj]
                pad += len(lens) * max(lens) - sum(lens)
                if r == rounds[-1]:
                    details.append(f"  segment {gi[0]}: espeak sentences of {lens} ids -> one batch of "
                                   f"{len(lens)} x {max(lens)}; narrator {sum(inf[x] for x in gi):.2f} s, "
                                   f"raw loop one by one {sum(pt[x] for x in gj):.2f} s")
        f = lambda k: f"{kinds[k][0]}: {kinds[k][1]:.1f} / {kinds[k][2]:.1f}"
        print(f"| {r[1:]} | {sum(inf):.1f} | {sum(pt) + head_t:.1f} (heading {head_t:.1f}) | {f('1:1')} | "
              f"{f('1:k')}, {pad} of {sum(seg)} | {f('split')} |")
    if details:
        print()
        print(f"1:k groups in round {rounds[-1][1:]}:")
        print("\n".join(details))


if __name__ == "__main__":
    main(sys.argv[1])
