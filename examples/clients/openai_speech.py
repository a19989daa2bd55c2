#!/usr/bin/env python3
"""Speech from `narrator serve` with OpenAI's own Python package, streamed to a file.

    python3 openai_speech.py BASE_URL OUT_FILE [--format wav|pcm|mp3|opus] [--voice alloy]
                             [--speed 1.0] [--text "..."] [--api-key TOKEN]

BASE_URL is the server's /v1, e.g. http://127.0.0.1:8080/v1 (`narrator serve`). The audio
is written as it arrives (`with_streaming_response`); one JSON line says how it came: the
chunks received, the bytes of the first and of all, the content type and sample rate, and
the seconds to the first and to the last byte. The key is the server's token
(`narrator serve token add NAME`; default $OPENAI_API_KEY, or none on a server without
tokens). A refused request prints its status and
error instead (exit status 1). Needs `pip install openai`. See docs/SERVE.md.
"""
import argparse
import json
import os
import sys
import time

import openai

TEXT = ("The harbour was quiet before dawn. One by one the boats went out, "
        "their lanterns swinging. By noon the gulls had followed them past the point.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_url")
    ap.add_argument("out")
    ap.add_argument("--format", default="mp3")
    ap.add_argument("--voice", default="alloy")
    ap.add_argument("--model", default="tts-1")
    ap.add_argument("--speed", type=float)
    ap.add_argument("--text", default=TEXT)
    # A server without tokens takes any key; the package insists on one.
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    extra = {} if args.speed is None else {"speed": args.speed}
    started = time.monotonic()
    chunks = []
    first_at = None
    try:
        with client.audio.speech.with_streaming_response.create(
            model=args.model, voice=args.voice, input=args.text,
            response_format=args.format, **extra,
        ) as response, open(args.out, "wb") as out:
            for chunk in response.iter_bytes():
                if first_at is None:
                    first_at = time.monotonic() - started
                chunks.append(len(chunk))
                out.write(chunk)
            headers = response.headers
    except openai.APIStatusError as e:
        print(json.dumps({"status": e.status_code, "error": e.body}))
        return 1
    print(json.dumps({
        "chunks": len(chunks), "first_bytes": chunks[0] if chunks else 0, "bytes": sum(chunks),
        "content_type": headers.get("content-type"), "sample_rate": headers.get("x-sample-rate"),
        "first_byte_s": round(first_at or 0.0, 3), "last_byte_s": round(time.monotonic() - started, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
