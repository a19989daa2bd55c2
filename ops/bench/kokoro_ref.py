"""Helpers of ops/bench-kokoro.sh (run in .deps/kokoro-bench-venv).

  kokoro_ref.py synth MODEL VOICE_BIN TEXT_FILE OUT_WAV   the reference kokoro-onnx reads TEXT
  kokoro_ref.py wer REFERENCE_TEXT WAV                    word error rate of PocketSphinx on WAV

The reference gets the same model file and the same voice file narrator uses (the voice
saved as the one-entry npz kokoro-onnx loads), with its defaults (ONNX Runtime's own thread
count: every core). PocketSphinx (its wheel ships an English model) is a weak recogniser:
its WER is high for any voice, so compare the two voices' WER side by side, never alone.
"""

import json
import re
import sys
import tempfile
import time
import wave

import numpy as np


def synth(model, voice_bin, text_file, out_wav):
    from kokoro_onnx import Kokoro

    styles = np.fromfile(voice_bin, dtype=np.float32).reshape(-1, 1, 256)
    npz = tempfile.NamedTemporaryFile(suffix=".npz", delete=False).name
    np.savez(npz, voice=styles)
    text = open(text_file, encoding="utf-8").read()
    t0 = time.perf_counter()
    k = Kokoro(model, npz)
    t1 = time.perf_counter()
    audio, rate = k.create(text, voice="voice", speed=1.0, lang="en-us")
    t2 = time.perf_counter()
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    with wave.open(out_wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    print(json.dumps({"load_seconds": t1 - t0, "synth_seconds": t2 - t1,
                      "audio_seconds": len(audio) / rate}))


def words(text):
    return re.sub(r"[^a-z' ]+", " ", text.lower().replace("\u2019", "'")).split()


def wer(reference_file, wav_path):
    import subprocess

    from jiwer import wer as jwer
    from pocketsphinx import Decoder

    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", wav_path, "-ac", "1", "-ar", "16000",
                          "-f", "s16le", "-"], check=True, capture_output=True).stdout
    dec = Decoder(samprate=16000, loglevel="FATAL")
    # Utterances of ~20 s: PocketSphinx decodes long single utterances poorly.
    step = 16000 * 2 * 20
    hyp = []
    for i in range(0, len(raw), step):
        dec.start_utt()
        dec.process_raw(raw[i:i + step], full_utt=True)
        dec.end_utt()
        if dec.hyp() is not None:
            hyp.append(dec.hyp().hypstr)
    ref = " ".join(words(open(reference_file, encoding="utf-8").read()))
    print(json.dumps({"wer": jwer(ref, " ".join(words(" ".join(hyp))))}))


if __name__ == "__main__":
    {"synth": synth, "wer": wer}[sys.argv[1]](*sys.argv[2:])
