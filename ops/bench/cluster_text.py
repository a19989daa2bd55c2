#!/usr/bin/env python3
"""Generate the control-plane benchmark text: N short, distinct sentences in Markdown.

Usage: cluster_text.py N OUT.md [--chapters C] [--first K]   (default C = 10, K = 0)

Each sentence is one narrator segment (narrator splits at ". " + capital letter, and these
sentences are far below its length cap); --first K numbers them from K + 1, so books
made with different K share no sentence. Sentences are grouped 5 to a paragraph under
"# Chapter k" headings (the heading becomes the chapter title, not a segment). Every
sentence differs (a counter and rotating words), so no two segments share a text.
"""
import sys

ADJ = ["red", "quiet", "old", "bright", "small", "tall", "green", "slow", "warm", "cold", "brave", "shy"]
NOUN = ["fox", "river", "lamp", "garden", "clock", "letter", "bridge", "window", "kettle", "train", "cat", "door"]
VERB = ["waits by", "looks at", "runs past", "sings to", "rests near", "points at", "walks round", "leans on"]
START = ["The", "A", "That", "One", "Every", "This"]


def sentence(i):
    return "%s %s %s %d %s the %s %s." % (
        START[i % len(START)],
        ADJ[i % len(ADJ)],
        NOUN[(i // len(ADJ)) % len(NOUN)],
        i + 1,
        VERB[(i // 7) % len(VERB)],
        ADJ[(i // 3) % len(ADJ)],
        NOUN[(i // 5) % len(NOUN)],
    )


def main(argv):
    chapters, first = 10, 0
    if "--chapters" in argv:
        k = argv.index("--chapters")
        chapters = int(argv[k + 1])
        del argv[k : k + 2]
    if "--first" in argv:
        k = argv.index("--first")
        first = int(argv[k + 1])
        del argv[k : k + 2]
    if len(argv) != 2:
        sys.exit(__doc__)
    n, out = int(argv[0]), argv[1]
    if n < 1 or chapters < 1:
        sys.exit("N and C must be positive")
    chapters = min(chapters, n)
    per = [n // chapters + (1 if c < n % chapters else 0) for c in range(chapters)]
    lines, i = [], first
    for c, count in enumerate(per):
        lines.append("# Chapter %d\n" % (c + 1))
        sents = [sentence(i + k) for k in range(count)]
        i += count
        for p in range(0, count, 5):
            lines.append(" ".join(sents[p : p + 5]) + "\n")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("%d sentences in %d chapters" % (n, chapters), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
