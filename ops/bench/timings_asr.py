"""How far narrator's sentence timings are from where an independent ear hears them.

PocketSphinx (PyPI; its wheel ships an English model) transcribes the book file with a
start time for every word it hears. The heard words are aligned with the text's words
(difflib, on lower-case words); for every sentence in timings.json whose first word the
recogniser heard and aligned, the error is heard start minus timings.json start. Where
timings.json has words (the model's word timings), every word whose start the recogniser
heard and aligned is measured the same way.

    python timings_asr.py TIMINGS_JSON BOOK_AUDIO
prints one JSON object: sentences, aligned, median/p95/max |error| and the median signed
error (seconds), and the worst few.
"""
import difflib
import json
import re
import statistics
import subprocess
import sys

FRAME = 0.01  # PocketSphinx frames are 10 ms.
CHUNK_SECONDS = 20  # it decodes long single utterances poorly


def words(text):
    return re.sub(r"[^a-z' ]+", " ", text.lower().replace("\u2019", "'")).split()


def heard(audio_path):
    """(word, start seconds) for every word PocketSphinx hears, in order."""
    from pocketsphinx import Decoder

    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", audio_path, "-ac", "1", "-ar",
                          "16000", "-f", "s16le", "-"], check=True, capture_output=True).stdout
    dec = Decoder(samprate=16000, loglevel="FATAL")
    step = 16000 * 2 * CHUNK_SECONDS
    out = []
    for offset in range(0, len(raw), step):
        dec.start_utt()
        dec.process_raw(raw[offset:offset + step], full_utt=True)
        dec.end_utt()
        base = offset / 2 / 16000
        for seg in dec.seg():
            w = re.sub(r"\(\d+\)$", "", seg.word).lower()
            if w.startswith("<") or w.startswith("[") or w == "<sil>":
                continue
            out.append((w, base + seg.start_frame * FRAME))
    return out


def main(timings_path, audio_path):
    timings = json.load(open(timings_path, encoding="utf-8"))
    ref = []  # (word, sentence index or None when not a sentence's first word, word start)
    for n, s in enumerate(timings["sentences"]):
        if s.get("words"):
            k = 0
            for entry in s["words"]:
                for j, w in enumerate(words(entry["text"])):
                    ref.append((w, n if k == 0 else None, entry["start"] if j == 0 else None))
                    k += 1
        else:
            for k, w in enumerate(words(s["text"])):
                ref.append((w, n if k == 0 else None, None))
    hyp = heard(audio_path)
    sm = difflib.SequenceMatcher(a=[r[0] for r in ref], b=[w for w, _ in hyp], autojunk=False)
    errors = []
    word_errors = []
    for block in sm.get_matching_blocks():
        # A word counts where it and the next were heard in a row (one heard word alone
        # is often matched to the same word elsewhere).
        for i in range(block.size - 1):
            _, sentence, start = ref[block.a + i]
            if start is not None:
                word_errors.append((hyp[block.b + i][1] - start, ref[block.a + i][0]))
            if sentence is None:
                continue
            s = timings["sentences"][sentence]
            errors.append((hyp[block.b + i][1] - s["start"], s["text"][:50]))
    absolute = sorted(abs(e) for e, _ in errors)
    p95 = absolute[min(len(absolute) - 1, int(0.95 * len(absolute)))] if absolute else None
    word_abs = sorted(abs(e) for e, _ in word_errors)
    word_report = None
    if word_abs:
        word_report = {
            "aligned": len(word_abs),
            "median_abs_s": statistics.median(word_abs),
            "p95_abs_s": word_abs[min(len(word_abs) - 1, int(0.95 * len(word_abs)))],
            "median_signed_s": statistics.median(e for e, _ in word_errors),
            "worst": sorted(word_errors, key=lambda e: -abs(e[0]))[:3],
        }
    print(json.dumps({
        "sentences": len(timings["sentences"]),
        "aligned": len(errors),
        "heard_words": len(hyp),
        "text_words": len(ref),
        "median_abs_s": statistics.median(absolute) if absolute else None,
        "p95_abs_s": p95,
        "max_abs_s": absolute[-1] if absolute else None,
        "median_signed_s": statistics.median(e for e, _ in errors) if errors else None,
        "worst": sorted(errors, key=lambda e: -abs(e[0]))[:3],
        "words": word_report,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
