#!/usr/bin/env python3
"""Extract the benchmark text: Chapter I of alice29.txt with each paragraph on ONE line.

Usage: prepare_text.py SOURCE OUT.txt            (default cut: "CHAPTER I" .. "CHAPTER II")
       prepare_text.py --as-is SOURCE OUT.txt    (any text: only re-join hard-wrapped lines)

Piper's CLI synthesizes line by line, so hard-wrapped lines would cut sentences in
pieces; joining each blank-line-separated block into one line gives both tools whole
sentences. Blocks are kept separated by a blank line, which is how narrator's .txt
reader finds paragraphs. Blocks without a letter or digit ("*  *  *") are dropped
(narrator skips them; Piper would feed them to espeak). A line ending in "-" is joined
without a space ("WAISTCOAT-" + "POCKET"), as narrator's reader does.
"""
import re
import sys


def blocks(lines):
    cur = []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            yield cur
            cur = []
    if cur:
        yield cur


def join(block):
    out = ""
    for line in block:
        if out and not out.endswith("-"):
            out += " "
        out += line
    return re.sub(r"\s+", " ", out)


def main(argv):
    as_is = "--as-is" in argv
    args = [a for a in argv if a != "--as-is"]
    if len(args) != 2:
        sys.exit(__doc__)
    src, dst = args
    with open(src, encoding="utf-8", errors="replace") as f:
        lines = f.read().replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if not as_is:
        start = next(i for i, l in enumerate(lines) if re.fullmatch(r"\s*CHAPTER I\.?\s*", l))
        end = next(i for i, l in enumerate(lines) if i > start and re.fullmatch(r"\s*CHAPTER II\.?\s*", l))
        lines = lines[start:end]
    paras = [join(b) for b in blocks(lines)]
    paras = [p for p in paras if re.search(r"\w", p)]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n\n".join(paras) + "\n")
    words = sum(len(p.split()) for p in paras)
    print(f"{len(paras)} paragraphs, {words} words", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
