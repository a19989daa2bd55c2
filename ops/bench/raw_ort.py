#!/usr/bin/env python3
"""The physical limit: a plain ONNX Runtime loop over Piper's own sentences.

Run with the piper venv's python:
    .deps/piper-venv/bin/python ops/bench/raw_ort.py -m VOICE.onnx -i TEXT.txt [options]

1. Phonemizes every non-empty line of TEXT with piper's own API (PiperVoice.phonemize and
   phonemes_to_ids: the same sentences and ids Piper's CLI synthesizes). Not timed.
2. Creates an onnxruntime.InferenceSession (default SessionOptions unless told otherwise;
   timed as load_seconds).
3. Runs the sentences one by one, batch 1, scales from the voice config (timed as
   loop_seconds). Audio seconds = sum of output samples / sample rate.
Prints one JSON line. total_seconds covers the whole process from interpreter start.

Options for diagnosis (not used by the main benchmark):
  --intra N         SessionOptions.intra_op_num_threads (default 0 = ORT's choice)
  --inter N         SessionOptions.inter_op_num_threads
  --no-spin         session config session.intra_op.allow_spinning = 0
  --frames-output   also request /Ceil_output_0 (the extra output narrator splices in)
  --per-sentence F  write a TSV: index, phoneme ids, audio seconds, inference seconds
"""
import argparse
import json
import os
import sys
import time

T0 = time.time()
try:  # process start, when /proc is there (covers interpreter start-up too)
    with open("/proc/self/stat") as f:
        _start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        _uptime = float(f.read().split()[0])
    T0 = time.time() - (_uptime - _start_ticks / os.sysconf("SC_CLK_TCK"))
except Exception:
    pass

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
from piper import PiperVoice  # noqa: E402
from piper.config import PiperConfig  # noqa: E402

FRAMES = "/Ceil_output_0"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def ld(field, payload):
    """A length-delimited protobuf field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def add_frames_output(model: bytes) -> bytes:
    """Appends a float ValueInfoProto [batch_size, 1, phonemes] for FRAMES to graph.output."""
    dims = ld(1, ld(2, b"batch_size")) + ld(1, varint(1 << 3) + varint(1)) + ld(1, ld(2, b"phonemes"))
    tensor = varint(1 << 3) + varint(1) + ld(2, dims)  # elem_type FLOAT, shape
    value_info = ld(1, FRAMES.encode()) + ld(2, ld(1, tensor))
    i, out = 0, bytearray()
    while i < len(model):
        start = i
        key, i = read_varint(model, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = read_varint(model, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, j = read_varint(model, i)
            i = j + n
            if field == 7:  # ModelProto.graph
                out += ld(7, bytes(model[j:i]) + ld(12, value_info))
                continue
        else:
            raise ValueError(f"unexpected wire type {wire}")
        out += model[start:i]
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-i", "--input", required=True)
    ap.add_argument("--intra", type=int)
    ap.add_argument("--inter", type=int)
    ap.add_argument("--no-spin", action="store_true")
    ap.add_argument("--frames-output", action="store_true")
    ap.add_argument("--per-sentence")
    a = ap.parse_args()

    with open(a.model + ".json", encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    # PiperVoice needs a session object only to synthesize; phonemizing does not use it.
    voice = PiperVoice(session=None, config=config)
    sentences = []
    with open(a.input, encoding="utf-8") as f:
        for line in f:  # line by line, as Piper's CLI does
            line = line.strip()
            if not line:
                continue
            for ph in voice.phonemize(line):
                if ph:
                    sentences.append(voice.phonemes_to_ids(ph))
    t_prep = time.time()

    so = onnxruntime.SessionOptions()
    if a.intra is not None:
        so.intra_op_num_threads = a.intra
    if a.inter is not None:
        so.inter_op_num_threads = a.inter
    if a.no_spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    with open(a.model, "rb") as f:
        model = f.read()
    if a.frames_output:
        model = add_frames_output(model)
    t_load0 = time.time()
    sess = onnxruntime.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
    t_load1 = time.time()
    outputs = ["output", FRAMES] if a.frames_output else ["output"]

    scales = np.array([config.noise_scale, config.length_scale, config.noise_w_scale], dtype=np.float32)
    samples = 0
    rows = []
    t_loop0 = time.time()
    for k, ids in enumerate(sentences):
        t = time.time()
        out = sess.run(outputs, {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales,
        })
        n = out[0].shape[-1]
        samples += n
        rows.append((k, len(ids), n / config.sample_rate, time.time() - t))
    t_loop1 = time.time()

    if a.per_sentence:
        with open(a.per_sentence, "w") as f:
            f.write("index\tids\taudio_s\tinfer_s\n")
            for r in rows:
                f.write("%d\t%d\t%.4f\t%.4f\n" % r)
    audio = samples / config.sample_rate
    loop = t_loop1 - t_loop0
    print(json.dumps({
        "sentences": len(sentences),
        "phoneme_ids": sum(len(s) for s in sentences),
        "audio_seconds": audio,
        "phonemize_seconds": t_prep - T0,
        "load_seconds": t_load1 - t_load0,
        "loop_seconds": loop,
        "loop_x_realtime": audio / loop if loop > 0 else 0.0,
        "total_seconds": time.time() - T0,
        "intra_op_threads": so.intra_op_num_threads,
        "spinning": not a.no_spin,
        "frames_output": a.frames_output,
    }))


if __name__ == "__main__":
    main()
