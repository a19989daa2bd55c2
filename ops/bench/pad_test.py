#!/usr/bin/env python3
"""Same process, same sentences: one session.run per sentence vs one padded batch.

Run with the piper venv's python:
    .deps/piper-venv/bin/python ops/bench/pad_test.py -m VOICE.onnx -i TEXT.txt [--reps 3] [--lines 8]

For the first --lines lines of TEXT that espeak splits into 2 to 4 sentences, times
(a) each sentence alone, batch 1 (what Piper does) and (b) all of them in ONE run, padded
to the longest with their true lengths in input_lengths (what narrator does with the
utterances of one segment, even at --max-batch 1). Alternates a/b --reps times and
prints the median of each and their ratio. Default SessionOptions (as Piper).
"""
import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime
from piper import PiperVoice
from piper.config import PiperConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-i", "--input", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lines", type=int, default=8)
    a = ap.parse_args()
    with open(a.model + ".json", encoding="utf-8") as f:
        cfg = PiperConfig.from_dict(json.load(f))
    voice = PiperVoice(session=None, config=cfg)
    groups = []
    for line in open(a.input, encoding="utf-8"):
        if line.strip():
            ids = [voice.phonemes_to_ids(p) for p in voice.phonemize(line.strip()) if p]
            if 2 <= len(ids) <= 4:
                groups.append(ids)
    groups = groups[: a.lines]
    sess = onnxruntime.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    scales = np.array([cfg.noise_scale, cfg.length_scale, cfg.noise_w_scale], dtype=np.float32)

    def run(items):
        t = max(len(x) for x in items)
        arr = np.zeros((len(items), t), dtype=np.int64)
        for r, x in enumerate(items):
            arr[r, : len(x)] = x
        sess.run(["output"], {"input": arr, "input_lengths": np.array([len(x) for x in items], dtype=np.int64),
                              "scales": scales})

    run(groups[0][:1])  # warm-up
    print("| sentence ids | padded ids | one by one s | one padded batch s | ratio |")
    print("|---|---|---|---|---|")
    tot_a = tot_b = 0.0
    for g in groups:
        ta, tb = [], []
        for _ in range(a.reps):
            t = time.perf_counter()
            for x in g:
                run([x])
            ta.append(time.perf_counter() - t)
            t = time.perf_counter()
            run(g)
            tb.append(time.perf_counter() - t)
        ma, mb = statistics.median(ta), statistics.median(tb)
        tot_a += ma
        tot_b += mb
        lens = [len(x) for x in g]
        print(f"| {lens} | {len(g) * max(lens)} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} |")
    print(f"| total | | {tot_a:.2f} | {tot_b:.2f} | {tot_b / tot_a:.2f} |")


if __name__ == "__main__":
    main()
