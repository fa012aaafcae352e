"""End-to-end check of Sluice with the official `openai` Python package.

Run by `tests/e2e/sdk.rs` against a real Sluice in front of the mock upstream:

    python tests/sdk/openai_client.py --base-url http://127.0.0.1:PORT/v1 \
        --key VIRTUAL_KEY --model acme/chat --expect-text "..."

Exits 0 and prints `sdk ok` when every check passed; any failure raises (non-zero exit).
"""

import argparse
import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expect-text", required=True)
    args = ap.parse_args()

    # No SDK retries, bounded waits: a failure must show up as a failure, quickly.
    client = OpenAI(base_url=args.base_url, api_key=args.key, max_retries=0, timeout=20.0)
    messages = [{"role": "user", "content": "Say hello"}]

    # 1. Streaming: reassemble the text; every chunk names the standard model.
    stream = client.chat.completions.create(
        model=args.model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, chunks, usage = [], 0, None
    for chunk in stream:
        chunks += 1
        check(chunk.model == args.model, f"stream chunk model {chunk.model!r} != {args.model!r}")
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object!r}")
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                text.append(choice.delta.content)
    text = "".join(text)
    check(text == args.expect_text, f"streamed text {text!r} != {args.expect_text!r}")
    check(chunks >= 3, f"only {chunks} chunks")
    check(usage is not None and usage.completion_tokens > 0, f"usage chunk: {usage!r}")
    print(f"stream: {chunks} chunks, text {text!r}, usage {usage.total_tokens}")

    # 2. Non-streaming, with the raw response for headers.
    raw = client.chat.completions.with_raw_response.create(model=args.model, messages=messages)
    check(raw.headers.get("x-request-id"), "no x-request-id header")
    resp = raw.parse()
    check(resp.model == args.model, f"model {resp.model!r} != {args.model!r}")
    content = resp.choices[0].message.content
    check(content == args.expect_text, f"text {content!r} != {args.expect_text!r}")
    check(resp.usage is not None and resp.usage.total_tokens > 0, f"usage {resp.usage!r}")
    print(f"unary: text {content!r}, x-request-id {raw.headers.get('x-request-id')}")

    # 3. The model list.
    ids = [m.id for m in client.models.list()]
    check(args.model in ids, f"{args.model!r} not in models {ids!r}")
    print(f"models: {ids}")

    # 4. Errors map to the SDK's exception classes.
    bad = OpenAI(base_url=args.base_url, api_key="sk-sluice-not-a-key", max_retries=0, timeout=20.0)
    try:
        bad.chat.completions.create(model=args.model, messages=messages)
        raise AssertionError("an unknown key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")
        check(isinstance(e.body, dict) and e.body.get("type") == "authentication_error",
              f"401 body {e.body!r}")
    try:
        client.chat.completions.create(model="acme/no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"status {e.status_code}")
        check(e.code == "model_not_found", f"code {e.code!r}")
    try:
        client.chat.completions.create(model=args.model, messages=[])
        raise AssertionError("empty messages were accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"status {e.status_code}")
    # The same errors while streaming (raised before the first chunk).
    try:
        for _ in bad.chat.completions.create(model=args.model, messages=messages, stream=True):
            pass
        raise AssertionError("an unknown key was accepted (stream)")
    except openai.AuthenticationError:
        pass
    print("errors: 401 AuthenticationError, 404 NotFoundError, 400 BadRequestError")

    print("sdk ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
